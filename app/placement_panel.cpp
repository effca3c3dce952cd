#include "app/placement_panel.h"

#include <QAction>
#include <QComboBox>
#include <QFrame>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QInputDialog>
#include <QLabel>
#include <QLineEdit>
#include <QLocale>
#include <QMenu>
#include <QPainter>
#include <QPainterPath>
#include <QPushButton>
#include <QRegularExpression>
#include <QSlider>
#include <QSpinBox>
#include <QStandardItemModel>
#include <QStyledItemDelegate>
#include <QTableView>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>
#include <algorithm>

#include "app/elided_label.h"
#include "app/live_stats.h"
#include "app/placement_model.h"
#include "app/preset_list_model.h"
#include "app/theme.h"

namespace {

QString bytesText(qint64 bytes) {
  return QLocale::system().formattedDataSize(bytes, bytes >= (qint64{1} << 30) ? 2 : 1,
                                             QLocale::DataSizeTraditionalFormat);
}

// Milliseconds with as many decimals as a small value needs.
QString msShort(double ms) {
  if (ms <= 0) return QStringLiteral("—");
  if (ms < 0.001) return QStringLiteral("<0.001");
  if (ms < 0.1) return QString::number(ms, 'f', 3);
  if (ms < 10) return QString::number(ms, 'f', 2);
  return QString::number(ms, 'f', 1);
}

// A cell: a rounded chip tinted with its unit's colour, "GPU Q4_K" as text; a
// pending change gets an accent outline and a dot. The timing column: the
// predicted time (muted) over the measured P50 / P99 (their colours).
class CellDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;
  void paint(QPainter* p, const QStyleOptionViewItem& option,
             const QModelIndex& index) const override {
    if (index.column() == kColTiming) return paintTiming(p, option, index);
    if (index.column() > kColTiming) return QStyledItemDelegate::paint(p, option, index);
    const QVariant colorVar = index.data(PlacementModel::BackendColorRole);
    if (!colorVar.isValid()) return;
    const QColor c = colorVar.value<QColor>();
    const bool dirty = index.data(PlacementModel::DirtyRole).toBool();
    const bool hover = option.state & QStyle::State_MouseOver;
    p->save();
    p->setRenderHint(QPainter::Antialiasing);
    const QRectF r = QRectF(option.rect).adjusted(3, 2.5, -3, -2.5);
    QPainterPath path;
    path.addRoundedRect(r, 6, 6);
    QColor fill = c;
    fill.setAlphaF(hover ? 0.32f : 0.20f);
    p->fillPath(path, fill);
    // The unit's colour as a solid bar on the left: with the label, readable without colour vision.
    QPainterPath bar;
    bar.addRoundedRect(QRectF(r.left(), r.top(), 4, r.height()), 2, 2);
    p->fillPath(bar, c);
    if (dirty) {
      p->setPen(QPen(theme::kAccent, 1.6, Qt::DashLine));
      p->drawPath(path);
    }
    // Just moved to this unit (an applied placement, or the adaptive auto's
    // change): an accent glow that fades out.
    const double moved = index.data(PlacementModel::MovedRole).toDouble();
    if (moved > 0) {
      QColor glow = theme::kAccent;
      glow.setAlphaF(static_cast<float>(0.35 * moved));
      p->fillPath(path, glow);
      glow.setAlphaF(static_cast<float>(moved));
      p->setPen(QPen(glow, 2.2));
      p->drawPath(path);
    }
    p->setPen(theme::kText);
    // Narrow columns (many layers' worth of panel, a mixture's "+"): a smaller font before eliding.
    const QRectF textRect = r.adjusted(6, 0, -2, 0);
    QString text = index.data().toString();
    QFont f = theme::uiFont(8.5);
    f.setWeight(QFont::DemiBold);
    for (qreal pt : {8.0, 7.5, 7.0}) {
      if (QFontMetrics(f).horizontalAdvance(text) <= textRect.width()) break;
      f.setPointSizeF(pt);
    }
    // Still too narrow (the panel at its minimum width): the precision alone;
    // the unit is the colour and the bar, and the tooltip says both.
    if (QFontMetrics(f).horizontalAdvance(text) > textRect.width() &&
        text.contains(QLatin1Char(' ')))
      text = text.section(QLatin1Char(' '), 1);
    p->setFont(f);
    p->drawText(
        textRect, Qt::AlignCenter,
        QFontMetrics(f).elidedText(text, Qt::ElideRight, static_cast<int>(textRect.width())));
    if (dirty) {
      p->setBrush(theme::kAccent);
      p->setPen(Qt::NoPen);
      p->drawEllipse(QPointF(r.right() - 6, r.top() + 6), 2.5, 2.5);
    }
    p->restore();
  }

  static void paintTiming(QPainter* p, const QStyleOptionViewItem& option,
                          const QModelIndex& index) {
    const QVariant pred = index.data(PlacementModel::PredictedMsRole);
    const QVariant p50 = index.data(PlacementModel::P50MsRole);
    const QVariant p99 = index.data(PlacementModel::P99MsRole);
    p->save();
    const QRect r = option.rect.adjusted(6, 1, -4, -1);
    const int half = r.height() / 2;
    QFont f = theme::uiFont(7.5);
    p->setFont(f);
    p->setPen(theme::kMuted);
    p->drawText(QRect(r.left(), r.top(), r.width(), half), Qt::AlignLeft | Qt::AlignBottom,
                QStringLiteral("≈ %1").arg(pred.isValid() ? msShort(pred.toDouble())
                                                          : QStringLiteral("—")));
    const QRect low(r.left(), r.top() + half, r.width(), r.height() - half);
    if (!p50.isValid()) {
      p->drawText(low, Qt::AlignLeft | Qt::AlignTop, QStringLiteral("—"));
    } else {
      f.setWeight(QFont::DemiBold);
      p->setFont(f);
      const QString a = msShort(p50.toDouble()), b = msShort(p99.toDouble());
      const QFontMetrics fm(f);
      p->setPen(theme::kP50);
      p->drawText(low, Qt::AlignLeft | Qt::AlignTop, a);
      const int x = fm.horizontalAdvance(a);
      p->setPen(theme::kMuted);
      p->drawText(low.adjusted(x, 0, 0, 0), Qt::AlignLeft | Qt::AlignTop, QStringLiteral(" / "));
      p->setPen(theme::kP99);
      p->drawText(low.adjusted(x + fm.horizontalAdvance(QStringLiteral(" / ")), 0, 0, 0),
                  Qt::AlignLeft | Qt::AlignTop, b);
    }
    p->restore();
  }

  QSize sizeHint(const QStyleOptionViewItem&, const QModelIndex&) const override {
    return {88, 30};
  }
};

constexpr int kGridMaxRows = 24;

// As tall as its rows (so a small model's grid does not float in empty space),
// never shorter than kGridMinRows rows (fewer only when the model has fewer):
// it scrolls inside, and the panel around it scrolls when the window is shorter.
class GridView : public QTableView {
 public:
  using QTableView::QTableView;
  QSize sizeHint() const override {
    // At most kGridMaxRows tall: an 80-layer model's grid scrolls inside,
    // and Apply and the cost stay near (the panel's scroll area takes the
    // preferred height of what it holds).
    const int rows = model() ? model()->rowCount() : 0;
    return {QTableView::sizeHint().width(), heightFor(std::min(rows, kGridMaxRows))};
  }
  QSize minimumSizeHint() const override {
    const int rows = model() ? model()->rowCount() : 0;
    return {200, heightFor(std::min(rows, PlacementPanel::kGridMinRows))};
  }

 private:
  int heightFor(int rows) const {
    return horizontalHeader()->sizeHint().height() +
           std::max(rows, 1) * verticalHeader()->defaultSectionSize() + 2 * frameWidth() + 4;
  }
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

QLabel* mutedLabel(QWidget* parent) {
  auto* l = new QLabel(parent);
  l->setObjectName(QStringLiteral("Muted"));
  l->setWordWrap(true);
  return l;
}

}  // namespace

PlacementPanel::PlacementPanel(PlacementModel* model, PresetListModel* presets,
                               std::shared_ptr<LiveStats> stats, QWidget* parent)
    : QWidget(parent), m_model(model), m_presets(presets), m_stats(std::move(stats)) {
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(16, 16, 16, 16);
  v->setSpacing(12);

  QVBoxLayout* sv = nullptr;
  v->addWidget(card(this, tr("Strategy"), &sv));
  auto* row1 = new QHBoxLayout;
  m_strategy = new QComboBox(this);
  m_strategy->setModel(new QStandardItemModel(m_strategy));
  // Combo boxes as wide as the panel gives them, not as their longest entry:
  // the panel fits its minimum width.
  m_strategy->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  m_strategy->setMinimumContentsLength(10);
  m_layers = new QSpinBox(this);
  m_layers->setPrefix(tr("GPU layers: "));
  row1->addWidget(m_strategy, 1);
  row1->addWidget(m_layers);
  sv->addLayout(row1);
  auto* row2 = new QHBoxLayout;
  m_budgetLabel = new QLabel(this);
  m_budgetLabel->setObjectName(QStringLiteral("Muted"));
  m_budgetLabel->setMinimumWidth(80);
  m_budgetLabel->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
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
  m_units = mutedLabel(this);
  sv->addWidget(m_units);
  auto* row3 = new QHBoxLayout;
  m_presetBox = new QComboBox(this);
  m_presetBox->setModel(m_presets);
  m_presetBox->setPlaceholderText(tr("Load a preset…"));
  m_presetBox->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  m_presetBox->setMinimumContentsLength(8);
  m_presetBox->setCurrentIndex(-1);
  m_presetBox->setToolTip(tr("Placements saved by name: choosing one applies it"));
  m_savePreset = new QPushButton(tr("Save as preset…"), this);
  m_savePreset->setToolTip(
      tr("Save the grid's placement (units, precisions, KV cache) under a name"));
  m_presetMenu = new QToolButton(this);
  m_presetMenu->setText(QStringLiteral("⋯"));
  m_presetMenu->setToolTip(tr("Delete presets"));
  m_presetMenu->setAutoRaise(true);
  row3->addWidget(m_presetBox, 1);
  row3->addWidget(m_savePreset);
  row3->addWidget(m_presetMenu);
  sv->addLayout(row3);

  QVBoxLayout* gv = nullptr;
  v->addWidget(card(this, tr("Placement by layer"), &gv));
  m_hint = mutedLabel(this);
  gv->addWidget(m_hint);
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
  m_grid->setContextMenuPolicy(Qt::CustomContextMenu);
  m_grid->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  m_grid->horizontalHeader()->setHighlightSections(false);
  m_grid->horizontalHeader()->setMinimumSectionSize(40);
  m_grid->verticalHeader()->setSectionResizeMode(QHeaderView::Fixed);
  m_grid->verticalHeader()->setDefaultSectionSize(32);
  m_grid->verticalHeader()->setHighlightSections(false);
  m_grid->verticalHeader()->setDefaultAlignment(Qt::AlignRight | Qt::AlignVCenter);
  m_grid->setCornerButtonEnabled(false);
  connect(m_grid, &QTableView::clicked, this,
          [this](const QModelIndex& i) { clickCell(i.row(), i.column()); });
  connect(m_grid, &QWidget::customContextMenuRequested, this, [this](const QPoint& pos) {
    const QModelIndex i = m_grid->indexAt(pos);
    if (i.isValid()) openCellMenu(i.row(), i.column());
  });
  gv->addWidget(m_grid);

  auto* actions = new QHBoxLayout;
  m_note = mutedLabel(this);
  m_note->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_revert = new QPushButton(tr("Revert"), this);
  m_check = new QPushButton(tr("Check precision"), this);
  m_check->setObjectName(QStringLiteral("CheckPrecisionButton"));
  m_check->setToolTip(
      tr("Fill the error and outliers columns: each layer of this placement against a "
         "double-precision reference on a short text, and its activations' outliers"));
  m_apply = new QPushButton(tr("Apply"), this);
  m_apply->setObjectName(QStringLiteral("Primary"));
  actions->addWidget(m_note, 1);
  actions->addWidget(m_check, 0, Qt::AlignTop);
  actions->addWidget(m_revert, 0, Qt::AlignTop);
  actions->addWidget(m_apply, 0, Qt::AlignTop);
  gv->addLayout(actions);

  QVBoxLayout* cv = nullptr;
  v->addWidget(card(this, tr("Cost"), &cv));
  m_bytes = new QLabel(this);
  m_bytes->setWordWrap(true);
  m_bytes->setTextFormat(Qt::RichText);
  m_times = new QLabel(this);
  m_times->setWordWrap(true);
  m_times->setTextFormat(Qt::RichText);
  cv->addWidget(m_bytes);
  cv->addWidget(m_times);
  auto* kvRow = new QHBoxLayout;
  m_kvTiers = new ElidedLabel(this);
  m_kvTiers->setObjectName(QStringLiteral("KvTiersSummary"));
  m_kvTiersButton = new QPushButton(tr("KV memory…"), this);
  m_kvTiersButton->setObjectName(QStringLiteral("KvTiersButton"));
  m_kvTiersButton->setToolTip(
      tr("Where a long context's KV cache may go beyond the GPU: host RAM, then the SSD"));
  kvRow->addWidget(m_kvTiers, 1);
  kvRow->addWidget(m_kvTiersButton);
  cv->addLayout(kvRow);
  v->addStretch(1);

  connect(m_apply, &QPushButton::clicked, this, &PlacementPanel::applyRequested);
  connect(m_kvTiersButton, &QPushButton::clicked, this, &PlacementPanel::kvTiersRequested);
  connect(m_check, &QPushButton::clicked, this, &PlacementPanel::precisionCheckRequested);
  m_grid->setColumnHidden(kColKvTiers, true);  // while the KV cache has no tiers (refreshMeasured)
  m_grid->setColumnHidden(kColError, true);    // until the first check (setChecking)
  m_grid->setColumnHidden(kColOutliers, true);
  connect(m_revert, &QPushButton::clicked, m_model, &PlacementModel::revertPending);
  connect(m_strategy, &QComboBox::currentIndexChanged, this, &PlacementPanel::emitStrategy);
  connect(m_layers, &QSpinBox::valueChanged, this, &PlacementPanel::emitStrategy);
  connect(m_budget, &QSlider::valueChanged, this, [this](int mib) {
    m_budgetLabel->setText(bytesText(qint64{mib} << 20));
    emitStrategy();
  });
  connect(m_presetBox, &QComboBox::activated, this, [this](int row) {
    const qint64 id = m_presetBox->itemData(row, PresetListModel::PresetIdRole).toLongLong();
    m_presetBox->setCurrentIndex(-1);
    if (id) emit presetChosen(id);
  });
  connect(m_savePreset, &QPushButton::clicked, this, &PlacementPanel::askPresetName);
  connect(m_presetMenu, &QToolButton::clicked, this, &PlacementPanel::showPresetMenu);
  connect(m_model, &PlacementModel::pendingChanged, this, &PlacementPanel::syncFromModel);
  connect(m_model, &PlacementModel::timingChanged, this, &PlacementPanel::updateSummary);
  connect(m_model, &QAbstractItemModel::modelReset, this, &PlacementPanel::syncFromModel);
  if (m_presets)
    connect(m_presets, &QAbstractItemModel::modelReset, this, &PlacementPanel::syncFromModel);

  // While moved cells fade, the grid repaints at about 30 frames a second.
  m_moveTimer = new QTimer(this);
  m_moveTimer->setInterval(33);
  connect(m_moveTimer, &QTimer::timeout, this, [this] {
    m_grid->viewport()->update();
    if (!m_model->moving()) m_moveTimer->stop();
  });
  connect(m_model, &QAbstractItemModel::dataChanged, this, [this] {
    if (m_model->moving() && !m_moveTimer->isActive()) m_moveTimer->start();
  });

  m_timer = new QTimer(this);
  m_timer->setInterval(500);
  connect(m_timer, &QTimer::timeout, this, [this] {
    if (m_stats && m_stats->version() != m_statsVersion) refreshMeasured();
  });
  m_timer->start();
  rebuildControls();
  syncFromModel();
}

QString PlacementPanel::noteText() const {
  return m_note->text();
}

QString PlacementPanel::unitsText() const {
  return m_units->text();
}

QString PlacementPanel::summaryText() const {
  QString s = m_bytes->text() + QStringLiteral("\n") + m_times->text();
  s.replace(QRegularExpression(QStringLiteral("<[^>]*>")), QString());
  return s.replace(QStringLiteral("&nbsp;"), QStringLiteral(" "));
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
    const QString dot =
        QStringLiteral("<span style='color:%1;font-size:13pt'>●</span>").arg(theme::css(b.color));
    if (b.available) {
      const bool gpu = b.id != QLatin1String("cpu");
      l->setText(gpu ? QStringLiteral("%1 %2 <span style='color:%3'>(%4)</span>")
                           .arg(dot, b.label, theme::css(theme::kMuted),
                                QFontMetrics(l->font())
                                    .elidedText(b.device.section(QStringLiteral(" ("), 0, 0),
                                                Qt::ElideRight, 140)
                                    .toHtmlEscaped())
                     : QStringLiteral("%1 %2").arg(dot, b.label));
    } else {
      l->setText(QStringLiteral("%1 <span style='color:%2'>%3 — %4</span>")
                     .arg(dot, theme::css(theme::kMuted), b.label,
                          b.reason.section(QStringLiteral(": "), 1)
                              .section(QLatin1Char(';'), 0, 0)
                              .section(QLatin1Char('('), 0, 0)
                              .trimmed()));
    }
    l->setToolTip(b.available ? tr("%1: %2").arg(b.label, b.device) : b.reason);
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
    if (m_strategy->itemData(i, Qt::UserRole).toString() == p.strategy)
      m_strategy->setCurrentIndex(i);
  }
  const StrategyInfo* cur = nullptr;
  for (const StrategyInfo& s : m_model->strategies()) {
    if (s.id == p.strategy) cur = &s;
  }
  // Layer count and budget only mean something with a GPU; without one they say why not.
  const BackendInfo* gpu = m_model->gpuBackend();
  QString whyNoGpu;
  for (const BackendInfo& b : m_model->backends()) {
    if (b.id != QLatin1String("cpu") && !b.available)
      whyNoGpu += (whyNoGpu.isEmpty() ? QString() : QStringLiteral("; ")) + b.reason;
  }
  const bool hasModel = m_model->rowCount() > 0;
  m_layers->setRange(0, std::max(0, p.layerCount()));
  m_layers->setValue(p.gpuLayers);
  m_layers->setEnabled(gpu && hasModel && cur && cur->usesLayerCount);
  m_layers->setToolTip(gpu ? tr("For “First N layers on GPU”")
                           : tr("Needs a GPU (%1)").arg(whyNoGpu));
  const int maxMiB = gpu ? static_cast<int>(std::min<qint64>(gpu->memoryBytes >> 20, 1 << 30)) : 0;
  m_budget->setRange(0, maxMiB);
  m_budget->setSingleStep(16);
  m_budget->setPageStep(std::max(16, maxMiB / 16));
  m_budget->setValue(std::min(p.vramBudgetMiB, maxMiB));
  m_budget->setEnabled(gpu && hasModel && cur && cur->usesBudget);
  m_budget->setToolTip(
      gpu ? tr("GPU memory the “attention on GPU” and “auto” strategies may fill (0 to %1)")
                .arg(bytesText(gpu->memoryBytes))
          : tr("Needs a GPU (%1)").arg(whyNoGpu));
  m_budgetLabel->setText(gpu ? bytesText(qint64{m_budget->value()} << 20) : tr("no GPU"));
  m_budgetLabel->setToolTip(m_budget->toolTip());
  // Spans belong to rows, not to a model: the previous model's output row
  // (row 6 after the 5-layer demo) would otherwise stay merged as one cell of
  // the next model's layer 5.
  m_grid->clearSpans();
  for (int r = 0; r < m_model->rowCount(); ++r) {
    if (m_model->pending().isEdgeRow(r)) m_grid->setSpan(r, 0, 1, kColCount);
  }
  m_grid->horizontalHeader()->setSectionResizeMode(kColTiming, QHeaderView::Fixed);
  m_grid->horizontalHeader()->resizeSection(kColTiming, 88);
  m_grid->horizontalHeader()->setSectionResizeMode(kColKvTiers, QHeaderView::ResizeToContents);
  for (int c : {kColError, kColOutliers}) {  // "3.2e-04", "0.16%", or "—" until checked
    m_grid->horizontalHeader()->setSectionResizeMode(c, QHeaderView::Fixed);
    m_grid->horizontalHeader()->resizeSection(c, 58);
  }
  m_hint->setText(
      gpu ? tr("One row per layer, one column per op group, coloured by the unit that runs it, "
               "with its "
               "precision. Click a cell to move it between CPU and GPU; right-click for "
               "precisions. "
               "Apply re-places the model live, between two tokens of a reply.")
          : tr("One row per layer, one column per op group, with its precision. No GPU is in use, "
               "so "
               "every cell runs on the CPU: click a cell to change its precision, then Apply."));
  m_apply->setEnabled(m_model->isDirty() && !m_busy);
  m_revert->setEnabled(m_model->isDirty());
  m_savePreset->setEnabled(hasModel && m_presets);
  m_presetBox->setEnabled(hasModel && m_presets && m_presets->rowCount() > 0);
  m_grid->updateGeometry();
  m_grid->viewport()->update();
  m_syncing = false;
  updateSummary();
}

void PlacementPanel::updateSummary() {
  const PlanEstimate& e = m_model->estimate();
  const MeasuredTimes& m = m_model->measured();
  if (!e.valid) {
    m_bytes->setText(
        QStringLiteral("<span style='color:%1'>%2</span>")
            .arg(theme::css(theme::kMuted), tr("Open a model to see what its placement costs.")));
    m_times->clear();
    return;
  }
  const QString gpuColor =
      theme::css(m_model->gpuBackend() ? m_model->gpuBackend()->color : theme::kVulkan);
  QString bytes = tr("<b style='color:%1'>CPU</b> %2 weights + %3 KV")
                      .arg(theme::css(theme::kCpu), bytesText(e.cpuWeights), bytesText(e.cpuKv));
  if (const BackendInfo* gpu = m_model->gpuBackend()) {
    const qint64 used = e.gpuWeights + e.gpuKv + e.gpuOverhead;
    const qint64 budget = qint64{m_model->pending().vramBudgetMiB} << 20;
    bytes += tr(" &nbsp;·&nbsp; <b style='color:%1'>GPU</b> %2 weights + %3 KV")
                 .arg(gpuColor, bytesText(e.gpuWeights), bytesText(e.gpuKv));
    if (e.gpuOverhead > 0) bytes += tr(" + %1 working").arg(bytesText(e.gpuOverhead));
    if (used > 0 && budget > 0 && used > budget) {
      bytes += tr(" <span style='color:%1'>— over the %2 budget</span>")
                   .arg(theme::css(theme::kDanger), bytesText(budget));
    } else if (used > gpu->memoryBytes && gpu->memoryBytes > 0) {
      bytes += tr(" <span style='color:%1'>— more than the device's %2</span>")
                   .arg(theme::css(theme::kDanger), bytesText(gpu->memoryBytes));
    }
  }
  bytes += tr(" <span style='color:%1'>(KV at %2 tokens)</span>")
               .arg(theme::css(theme::kMuted))
               .arg(m_model->pending().nCtx);
  m_bytes->setText(bytes);
  // The decode step: one token's pass through every layer, as the profiler
  // times it. Not the inter-token interval of the Performance tab (which adds
  // sampling and detokenizing).
  QString times = tr("Decode step predicted <b>%1 ms</b>").arg(msShort(e.stepMs));
  if (e.transfers > 0)
    times += e.transfers == 1 ? tr(" (1 transfer)") : tr(" (%1 transfers)").arg(e.transfers);
  times += m.steps > 0 ? tr(" &nbsp;·&nbsp; measured <b style='color:%1'>P50 %2</b> / <b "
                            "style='color:%3'>P99 %4 ms</b> over %5 steps")
                             .arg(theme::css(theme::kP50), msShort(m.stepP50Ms),
                                  theme::css(theme::kP99), msShort(m.stepP99Ms))
                             .arg(m.steps)
                       : tr(" &nbsp;·&nbsp; measured: no decode step since the last Apply");
  times += tr("<br><span style='color:%1'>A decode step is one token's pass through the model; "
              "the Performance tab's token interval adds sampling and detokenizing.</span>")
               .arg(theme::css(theme::kMuted));
  times += tr("<br><span style='color:%1'>Cost model %2 at %3 tokens of context; per-layer figures "
              "in the grid's last "
              "column (≈ predicted, then P50 / P99 measured).</span>")
               .arg(theme::css(theme::kMuted),
                    e.costMeasured ? tr("measured on this machine") : tr("with default speeds"))
               .arg(e.nPast);
  m_times->setText(times);
  m_times->setToolTip(e.costText);
}

void PlacementPanel::emitStrategy() {
  if (m_syncing) return;
  emit strategyChosen(m_strategy->currentData(Qt::UserRole).toString(), m_layers->value(),
                      m_budget->value());
}

void PlacementPanel::setNote(const QString& text, bool isError) {
  m_note->setText(text);
  m_note->setStyleSheet(isError ? QStringLiteral("color:%1;").arg(theme::css(theme::kDanger))
                                : QString());
}

void PlacementPanel::setUnitsText(const QString& text, const QString& details) {
  m_units->setText(text);
  m_units->setToolTip(details);
}

void PlacementPanel::refreshChoices() {
  rebuildControls();
  syncFromModel();
}

void PlacementPanel::setBusy(bool busy) {
  m_busy = busy;
  m_apply->setEnabled(m_model->isDirty() && !m_busy);
  m_apply->setToolTip(busy ? tr("Waits for the placement being applied")
                           : tr("Re-place the model now; the chat is kept"));
}

void PlacementPanel::setChecking(bool checking) {
  m_check->setEnabled(!checking);
  m_check->setText(checking ? tr("Checking…") : tr("Check precision"));
  // The columns appear with the first check: a narrow panel has no room for
  // them beside the op groups and the timing (the grid then scrolls sideways).
  if (!checking) {
    m_grid->setColumnHidden(kColError, false);
    m_grid->setColumnHidden(kColOutliers, false);
  }
}

void PlacementPanel::refreshMeasured() {
  if (!m_stats) return;
  const LiveSnapshot s = m_stats->snapshot();
  m_statsVersion = s.version;
  m_model->setKvLayers(s.kvLayers);
  m_grid->setColumnHidden(kColKvTiers, s.kvLayers.empty());
  const int rows = m_model->rowCount();
  if (rows < 2 || static_cast<int>(s.layers.size()) != rows - 2) return;
  MeasuredTimes m;
  m.p50Ms.resize(rows);
  m.p99Ms.resize(rows);
  m.counts.resize(rows);
  auto put = [&m](int row, const loom::ProfileStat& st) {
    m.p50Ms[row] = st.p50_ms;
    m.p99Ms[row] = st.p99_ms;
    m.counts[row] = st.count;
  };
  put(0, s.embed);
  for (int l = 0; l + 2 < rows; ++l) put(l + 1, s.layers[static_cast<size_t>(l)]);
  put(rows - 1, s.output);
  m.stepP50Ms = s.step.p50_ms;
  m.stepP99Ms = s.step.p99_ms;
  m.steps = s.step.count;
  m_model->setMeasured(m);
}

void PlacementPanel::clickCell(int row, int column) {
  if (column >= kColCount) return;
  if (m_model->gpuBackend()) {
    m_model->cycleCellBackend(row, column);
  } else {
    openCellMenu(row, column);
  }
}

void PlacementPanel::openCellMenu(int row, int column) {
  const QModelIndex idx = m_model->index(row, column);
  if (!idx.isValid() || column >= kColCount || !(m_model->flags(idx) & Qt::ItemIsSelectable))
    return;
  const PlacementCell& cell = m_model->pending().rows[row][column];
  QMenu menu(this);
  menu.setToolTipsVisible(true);
  menu.addSection(tr("%1 · %2").arg(
      m_model->rowTitle(row),
      m_model->pending().isEdgeRow(row) ? tr("weights") : PlacementModel::columnTitle(column)));
  for (const BackendInfo& b : m_model->backends()) {
    QAction* a = menu.addAction(b.available && b.id != QLatin1String("cpu")
                                    ? tr("Run on %1 (%2)").arg(b.label, b.device)
                                    : tr("Run on %1").arg(b.label));
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
    connect(a, &QAction::triggered, this,
            [this, row, column, id] { m_model->setCellBackend(row, column, id); });
  }
  menu.addSection(column == kColAttnKv && !m_model->pending().isEdgeRow(row)
                      ? tr("KV cache precision")
                      : tr("Precision"));
  for (const QString& p : cell.precisions) {
    QAction* a = menu.addAction(PlacementModel::precisionLabel(cell, p));
    a->setCheckable(true);
    a->setChecked(p == kKeepPrecision
                      ? cell.dtype.isEmpty()
                      : p == cell.precision && (!cell.dtype.isEmpty() || cell.fileDtype.isEmpty()));
    connect(a, &QAction::triggered, this,
            [this, row, column, p] { m_model->setCellPrecision(row, column, p); });
  }
  if (!cell.precisionNote.isEmpty()) {
    QAction* note = menu.addAction(cell.precisionNote);
    note->setEnabled(false);
  }
  const QRect r = m_grid->visualRect(m_grid->model()->index(row, column));
  menu.exec(m_grid->viewport()->mapToGlobal(r.bottomLeft()));
}

void PlacementPanel::askPresetName() {
  bool ok = false;
  const QString name =
      QInputDialog::getText(this, tr("Save placement preset"),
                            tr("Name for the grid's placement (units, precisions and KV cache):"),
                            QLineEdit::Normal, QString(), &ok);
  if (ok && !name.trimmed().isEmpty()) emit savePresetRequested(name.trimmed());
}

void PlacementPanel::showPresetMenu() {
  QMenu menu(this);
  if (!m_presets || m_presets->rowCount() == 0) {
    menu.addAction(tr("No presets saved yet"))->setEnabled(false);
  }
  for (int r = 0; m_presets && r < m_presets->rowCount(); ++r) {
    const QModelIndex i = m_presets->index(r);
    const qint64 id = i.data(PresetListModel::PresetIdRole).toLongLong();
    QAction* a = menu.addAction(tr("Delete “%1”").arg(i.data(Qt::DisplayRole).toString()));
    connect(a, &QAction::triggered, this, [this, id] { emit deletePresetRequested(id); });
  }
  menu.exec(m_presetMenu->mapToGlobal(QPoint(0, m_presetMenu->height())));
}

void PlacementPanel::setKvTiersSummary(const QString& text) {
  m_kvTiers->setFullText(text);
}
