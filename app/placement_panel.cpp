#include "app/placement_panel.h"

#include <QAction>
#include <QComboBox>
#include <QFrame>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMenu>
#include <QPainter>
#include <QPainterPath>
#include <QPushButton>
#include <QSlider>
#include <QSpinBox>
#include <QStandardItemModel>
#include <QStyledItemDelegate>
#include <QTableView>
#include <QVBoxLayout>

#include "app/placement_model.h"
#include "app/theme.h"

namespace {

// A cell: a rounded chip tinted with its backend's colour, the precision as
// text; a pending change gets an accent outline and a dot.
class CellDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;
  void paint(QPainter* p, const QStyleOptionViewItem& option, const QModelIndex& index) const override {
    const QVariant colorVar = index.data(PlacementModel::BackendColorRole);
    if (!colorVar.isValid()) return;
    const QColor c = colorVar.value<QColor>();
    const bool dirty = index.data(PlacementModel::DirtyRole).toBool();
    const bool edge = index.data(PlacementModel::EdgeRowRole).toBool();
    const bool hover = option.state & QStyle::State_MouseOver;
    p->save();
    p->setRenderHint(QPainter::Antialiasing);
    const QRectF r = QRectF(option.rect).adjusted(3, 2.5, -3, -2.5);
    QPainterPath path;
    path.addRoundedRect(r, 6, 6);
    QColor fill = c;
    fill.setAlphaF(hover ? 0.30f : 0.18f);
    p->fillPath(path, fill);
    // The backend's colour as a solid bar on the left: readable even for colour-blind users with the label.
    QPainterPath bar;
    bar.addRoundedRect(QRectF(r.left(), r.top(), 4, r.height()), 2, 2);
    p->fillPath(bar, c);
    if (dirty) {
      p->setPen(QPen(theme::kAccent, 1.6, Qt::DashLine));
      p->drawPath(path);
    }
    p->setPen(theme::kText);
    QFont f = theme::uiFont(8.5);
    f.setWeight(QFont::DemiBold);
    p->setFont(f);
    const QString backend = index.data(PlacementModel::BackendLabelRole).toString();
    const QString text = edge ? QStringLiteral("%1 · %2").arg(backend, index.data().toString()) : index.data().toString();
    p->drawText(r.adjusted(8, 0, -4, 0), Qt::AlignCenter, text);
    if (dirty) {
      p->setBrush(theme::kAccent);
      p->setPen(Qt::NoPen);
      p->drawEllipse(QPointF(r.right() - 6, r.top() + 6), 2.5, 2.5);
    }
    p->restore();
  }
  QSize sizeHint(const QStyleOptionViewItem&, const QModelIndex&) const override { return {88, 28}; }
};

// As tall as its rows (so a small model's grid does not float in empty space),
// shrinking to scroll when the panel is shorter than that.
class GridView : public QTableView {
 public:
  using QTableView::QTableView;
  QSize sizeHint() const override {
    const int rows = model() ? model()->rowCount() : 0;
    const int h = horizontalHeader()->sizeHint().height() + rows * verticalHeader()->defaultSectionSize() + 2 * frameWidth() + 4;
    return {QTableView::sizeHint().width(), h};
  }
  QSize minimumSizeHint() const override { return {200, 140}; }
};

QFrame* card(QWidget* parent, const QString& title, QVBoxLayout** body) {
  auto* f = new QFrame(parent);
  f->setObjectName(QStringLiteral("Card"));
  auto* v = new QVBoxLayout(f);
  v->setContentsMargins(14, 12, 14, 12);
  v->setSpacing(8);
  auto* t = new QLabel(title, f);
  t->setObjectName(QStringLiteral("CardTitle"));
  v->addWidget(t);
  *body = v;
  return f;
}

}  // namespace

PlacementPanel::PlacementPanel(PlacementModel* model, QWidget* parent) : QWidget(parent), m_model(model) {
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(16, 16, 16, 16);
  v->setSpacing(12);

  QVBoxLayout* sv = nullptr;
  v->addWidget(card(this, tr("Strategy"), &sv));
  auto* row1 = new QHBoxLayout;
  m_strategy = new QComboBox(this);
  m_strategy->setModel(new QStandardItemModel(m_strategy));
  m_layers = new QSpinBox(this);
  m_layers->setPrefix(tr("GPU layers: "));
  m_layers->setToolTip(tr("For “First N layers on GPU”"));
  row1->addWidget(m_strategy, 1);
  row1->addWidget(m_layers);
  sv->addLayout(row1);
  auto* row2 = new QHBoxLayout;
  m_budgetLabel = new QLabel(this);
  m_budgetLabel->setObjectName(QStringLiteral("Muted"));
  m_budget = new QSlider(Qt::Horizontal, this);
  row2->addWidget(new QLabel(tr("VRAM budget"), this));
  row2->addWidget(m_budget, 1);
  row2->addWidget(m_budgetLabel);
  sv->addLayout(row2);
  m_legendBox = new QWidget(this);
  m_legend = new QHBoxLayout(m_legendBox);
  m_legend->setContentsMargins(0, 0, 0, 0);
  m_legend->setSpacing(14);
  sv->addWidget(m_legendBox);

  QVBoxLayout* gv = nullptr;
  v->addWidget(card(this, tr("Placement by layer"), &gv));
  auto* hint = new QLabel(tr("Each cell is one op group of one layer, coloured by the backend that runs it, "
                             "with its precision. Click a cell to change it, then Apply."),
                          this);
  hint->setObjectName(QStringLiteral("Muted"));
  hint->setWordWrap(true);
  gv->addWidget(hint);
  m_grid = new GridView(this);
  m_grid->setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
  m_grid->setObjectName(QStringLiteral("PlacementGrid"));
  m_grid->setModel(m_model);
  m_grid->setItemDelegate(new CellDelegate(m_grid));
  m_grid->setShowGrid(false);
  m_grid->setMouseTracking(true);
  m_grid->setSelectionMode(QAbstractItemView::NoSelection);
  m_grid->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_grid->setFocusPolicy(Qt::NoFocus);
  m_grid->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  m_grid->horizontalHeader()->setHighlightSections(false);
  m_grid->verticalHeader()->setSectionResizeMode(QHeaderView::Fixed);
  m_grid->verticalHeader()->setDefaultSectionSize(30);
  m_grid->verticalHeader()->setHighlightSections(false);
  m_grid->verticalHeader()->setDefaultAlignment(Qt::AlignRight | Qt::AlignVCenter);
  m_grid->setCornerButtonEnabled(false);
  connect(m_grid, &QTableView::clicked, this, [this](const QModelIndex& i) { openCellMenu(i.row(), i.column()); });
  gv->addWidget(m_grid);

  auto* actions = new QHBoxLayout;
  m_note = new QLabel(this);
  m_note->setObjectName(QStringLiteral("Muted"));
  m_note->setWordWrap(true);
  m_revert = new QPushButton(tr("Revert"), this);
  m_apply = new QPushButton(tr("Apply"), this);
  m_apply->setObjectName(QStringLiteral("Primary"));
  m_apply->setToolTip(tr("Re-place the model now; the chat is kept"));
  actions->addWidget(m_note, 1);
  actions->addWidget(m_revert);
  actions->addWidget(m_apply);
  gv->addLayout(actions);
  v->addStretch(1);

  connect(m_apply, &QPushButton::clicked, this, &PlacementPanel::applyRequested);
  connect(m_revert, &QPushButton::clicked, m_model, &PlacementModel::revertPending);
  connect(m_strategy, &QComboBox::currentIndexChanged, this, &PlacementPanel::emitStrategy);
  connect(m_layers, &QSpinBox::valueChanged, this, &PlacementPanel::emitStrategy);
  connect(m_budget, &QSlider::valueChanged, this, &PlacementPanel::emitStrategy);
  connect(m_model, &PlacementModel::pendingChanged, this, &PlacementPanel::syncFromModel);
  connect(m_model, &QAbstractItemModel::modelReset, this, &PlacementPanel::syncFromModel);
  rebuildControls();
  syncFromModel();
}

void PlacementPanel::rebuildControls() {
  m_syncing = true;
  auto* items = static_cast<QStandardItemModel*>(m_strategy->model());
  items->clear();
  for (const StrategyInfo& s : m_model->strategies()) {
    auto* it = new QStandardItem(s.label);
    it->setData(s.id, Qt::UserRole);
    if (!s.available) {
      it->setFlags(it->flags() & ~Qt::ItemIsEnabled & ~Qt::ItemIsSelectable);
      it->setToolTip(s.reason);
    }
    items->appendRow(it);
  }
  // Legend: every backend, the absent ones muted with their reason.
  while (QLayoutItem* li = m_legend->takeAt(0)) {
    delete li->widget();
    delete li;
  }
  for (const BackendInfo& b : m_model->backends()) {
    auto* l = new QLabel(m_legendBox);
    const QString dot = QStringLiteral("<span style='color:%1;font-size:13pt'>●</span>").arg(theme::css(b.color));
    l->setText(b.available ? QStringLiteral("%1 %2").arg(dot, b.label)
                           : QStringLiteral("%1 <span style='color:%2'>%3 — %4</span>")
                                 .arg(dot, theme::css(theme::kMuted), b.label,
                                      b.reason.section(QStringLiteral(": "), 1).section(QLatin1Char(';'), 0, 0)));
    l->setToolTip(b.available ? tr("%1: available").arg(b.label) : b.reason);
    m_legend->addWidget(l);
  }
  m_legend->addStretch(1);
  m_syncing = false;
}

void PlacementPanel::syncFromModel() {
  m_syncing = true;
  if (m_strategy->count() != m_model->strategies().size()) {
    m_syncing = false;
    rebuildControls();
    m_syncing = true;
  }
  const PlacementPlan& p = m_model->pending();
  for (int i = 0; i < m_strategy->count(); ++i) {
    if (m_strategy->itemData(i, Qt::UserRole).toString() == p.strategy) m_strategy->setCurrentIndex(i);
  }
  const StrategyInfo* cur = nullptr;
  for (const StrategyInfo& s : m_model->strategies()) {
    if (s.id == p.strategy) cur = &s;
  }
  // Layer count and budget only mean something for GPU strategies; without a GPU they say why not.
  bool gpu = false;
  QString whyNoGpu;
  for (const BackendInfo& b : m_model->backends()) {
    if (b.id == QLatin1String("cpu")) continue;
    if (b.available) gpu = true;
    else whyNoGpu += (whyNoGpu.isEmpty() ? QString() : QStringLiteral("; ")) + b.reason;
  }
  m_layers->setRange(0, std::max(0, p.layerCount()));
  m_layers->setValue(p.gpuLayers);
  m_layers->setEnabled(gpu && cur && cur->usesLayerCount);
  m_layers->setToolTip(gpu ? tr("For “First N layers on GPU”") : tr("Needs a GPU backend (%1)").arg(whyNoGpu));
  m_budget->setEnabled(gpu && cur && cur->usesBudget);
  m_budget->setValue(p.vramBudgetMiB);
  m_budget->setToolTip(gpu ? tr("GPU memory the placement may use") : tr("Needs a GPU backend (%1)").arg(whyNoGpu));
  m_budgetLabel->setText(gpu ? tr("%1 MiB").arg(p.vramBudgetMiB) : tr("no GPU"));
  m_budgetLabel->setToolTip(m_budget->toolTip());
  for (int r = 0; r < m_model->rowCount(); ++r) {
    if (m_model->pending().isEdgeRow(r)) m_grid->setSpan(r, 0, 1, kColCount);
  }
  m_apply->setEnabled(m_model->isDirty() && !m_busy);
  m_revert->setEnabled(m_model->isDirty());
  m_grid->updateGeometry();
  m_grid->viewport()->update();
  m_syncing = false;
}

void PlacementPanel::emitStrategy() {
  if (m_syncing) return;
  emit strategyChosen(m_strategy->currentData(Qt::UserRole).toString(), m_layers->value(), m_budget->value());
}

void PlacementPanel::setNote(const QString& text, bool isError) {
  m_note->setText(text);
  m_note->setStyleSheet(isError ? QStringLiteral("color:%1;").arg(theme::css(theme::kDanger)) : QString());
}

void PlacementPanel::refreshChoices() {
  rebuildControls();
  syncFromModel();
}

void PlacementPanel::setBusy(bool busy) {
  m_busy = busy;
  m_apply->setEnabled(m_model->isDirty() && !m_busy);
  m_apply->setToolTip(busy ? tr("Waits for the reply to finish") : tr("Re-place the model now; the chat is kept"));
}

void PlacementPanel::openCellMenu(int row, int column) {
  const QModelIndex idx = m_model->index(row, column);
  if (!idx.isValid() || !(m_model->flags(idx) & Qt::ItemIsEnabled)) return;
  const PlacementCell& cell = m_model->pending().rows[row][column];
  QMenu menu(this);
  menu.setToolTipsVisible(true);
  menu.addSection(tr("%1 · %2").arg(m_model->rowTitle(row),
                                    m_model->pending().isEdgeRow(row) ? tr("weights") : PlacementModel::columnTitle(column)));
  for (const BackendInfo& b : m_model->backends()) {
    QAction* a = menu.addAction(tr("Run on %1").arg(b.label));
    a->setCheckable(true);
    a->setChecked(cell.backend == b.id);
    a->setEnabled(b.available);
    a->setToolTip(b.available ? QString() : b.reason);
    QPixmap dot(10, 10);
    dot.fill(Qt::transparent);
    QPainter dp(&dot);
    dp.setRenderHint(QPainter::Antialiasing);
    dp.setBrush(b.color);
    dp.setPen(Qt::NoPen);
    dp.drawEllipse(0, 0, 10, 10);
    a->setIcon(QIcon(dot));
    const QString id = b.id;
    connect(a, &QAction::triggered, this, [this, row, column, id] { m_model->setCellBackend(row, column, id); });
  }
  menu.addSection(tr("Precision"));
  for (const QString& p : cell.precisions) {
    QAction* a = menu.addAction(p);
    a->setCheckable(true);
    a->setChecked(p == cell.precision);
    connect(a, &QAction::triggered, this, [this, row, column, p] { m_model->setCellPrecision(row, column, p); });
  }
  if (!cell.precisionNote.isEmpty()) {
    QAction* note = menu.addAction(cell.precisionNote);
    note->setEnabled(false);
  }
  const QRect r = m_grid->visualRect(m_grid->model()->index(row, column));
  menu.exec(m_grid->viewport()->mapToGlobal(r.bottomLeft()));
}
