#include "app/sidebar.h"

#include <QAction>
#include <QFrame>
#include <QHBoxLayout>
#include <QIcon>
#include <QKeyEvent>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QMenu>
#include <QPainter>
#include <QPushButton>
#include <QStyledItemDelegate>
#include <QToolButton>
#include <QVBoxLayout>

#include "app/chat_list_model.h"
#include "app/elided_label.h"
#include "app/engine_bridge.h"
#include "app/theme.h"

namespace {

// A chat row: the title, and when it last changed on the right, muted.
class ChatItemDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;
  QSize sizeHint(const QStyleOptionViewItem& option, const QModelIndex& index) const override {
    QSize s = QStyledItemDelegate::sizeHint(option, index);
    s.setHeight(std::max(s.height(), 36));
    return s;
  }
  void paint(QPainter* p, const QStyleOptionViewItem& option,
             const QModelIndex& index) const override {
    QStyleOptionViewItem o = option;
    initStyleOption(&o, index);
    const QString when = index.data(ChatListModel::SubtitleRole).toString();
    o.text.clear();
    // Background (hover, selection) as the style sheet says.
    o.widget->style()->drawControl(QStyle::CE_ItemViewItem, &o, p, o.widget);
    const QRect r = option.rect.adjusted(10, 0, -10, 0);
    const bool selected = option.state & QStyle::State_Selected;
    QFont small = theme::uiFont(8.5);
    const int whenWidth = QFontMetrics(small).horizontalAdvance(when) + 8;
    p->save();
    p->setFont(small);
    p->setPen(theme::kMuted);
    p->drawText(r, Qt::AlignVCenter | Qt::AlignRight, when);
    QFont f = option.font;
    if (selected) f.setWeight(QFont::DemiBold);
    p->setFont(f);
    p->setPen(selected ? theme::kAccent : theme::kText);
    const QRect tr = r.adjusted(0, 0, -whenWidth, 0);
    p->drawText(tr, Qt::AlignVCenter | Qt::AlignLeft,
                QFontMetrics(f).elidedText(index.data().toString(), Qt::ElideRight, tr.width()));
    p->restore();
  }
};

}  // namespace

Sidebar::Sidebar(ChatListModel* chats, QWidget* parent) : QWidget(parent), m_chats(chats) {
  setObjectName(QStringLiteral("Sidebar"));
  setAttribute(Qt::WA_StyledBackground, true);
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(14, 16, 14, 14);
  v->setSpacing(10);

  auto* brand = new QHBoxLayout;
  auto* logo = new QLabel(this);
  logo->setPixmap(QIcon(QStringLiteral(":/loom/loom.svg")).pixmap(28, 28));
  auto* title = new QLabel(QStringLiteral("Loom"), this);
  title->setObjectName(QStringLiteral("AppTitle"));
  brand->addWidget(logo);
  brand->addWidget(title, 1);
  auto* about = new QToolButton(this);
  about->setObjectName(QStringLiteral("AboutButton"));
  about->setText(QStringLiteral("?"));
  about->setToolTip(tr("About Loom (F1): version and build"));
  about->setAutoRaise(true);
  about->setCursor(Qt::PointingHandCursor);
  connect(about, &QToolButton::clicked, this, &Sidebar::aboutRequested);
  brand->addWidget(about);
  v->addLayout(brand);

  auto* newChat = new QPushButton(tr("+  New chat"), this);
  newChat->setObjectName(QStringLiteral("Primary"));
  newChat->setToolTip(tr("New chat (Ctrl+N)"));
  newChat->setCursor(Qt::PointingHandCursor);
  connect(newChat, &QPushButton::clicked, this, &Sidebar::newChatRequested);
  v->addWidget(newChat);

  m_search = new QLineEdit(this);
  m_search->setObjectName(QStringLiteral("Search"));
  m_search->setPlaceholderText(tr("Search chats"));
  m_search->setClearButtonEnabled(true);
  connect(m_search, &QLineEdit::textChanged, this,
          [this](const QString& t) { m_chats->setSearch(t.trimmed()); });
  v->addWidget(m_search);

  auto* section = new QLabel(tr("CHATS"), this);
  section->setObjectName(QStringLiteral("SectionLabel"));
  v->addWidget(section);

  m_list = new QListView(this);
  m_list->setObjectName(QStringLiteral("ChatList"));
  m_list->setModel(m_chats);
  m_list->setItemDelegate(new ChatItemDelegate(m_list));
  m_list->setEditTriggers(QAbstractItemView::EditKeyPressed);
  m_list->setContextMenuPolicy(Qt::CustomContextMenu);
  m_list->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  m_list->setUniformItemSizes(true);
  connect(m_list, &QListView::customContextMenuRequested, this, &Sidebar::showContextMenu);
  // A reset (a search typed or cleared, a reload) drops the selection: the open
  // chat gets its highlight back whenever it is listed.
  connect(m_chats, &QAbstractItemModel::modelReset, this, [this] { selectChat(m_current); });
  connect(m_list->selectionModel(), &QItemSelectionModel::currentChanged, this,
          [this](const QModelIndex& cur) {
            if (m_selecting || !cur.isValid()) return;
            m_current = m_chats->chatIdAt(cur.row());
            emit chatSelected(m_current);
          });
  // The selection model is replaced on reset; reconnecting is not needed for
  // QListView (it keeps its own), but the current row is restored by the owner.
  auto* del = new QAction(m_list);
  del->setShortcut(QKeySequence::Delete);
  del->setShortcutContext(Qt::WidgetShortcut);
  connect(del, &QAction::triggered, this, [this] {
    const QModelIndex cur = m_list->currentIndex();
    if (cur.isValid()) emit deleteChatRequested(m_chats->chatIdAt(cur.row()));
  });
  m_list->addAction(del);
  v->addWidget(m_list, 1);

  // The model card.
  m_modelCard = new QFrame(this);
  m_modelCard->setObjectName(QStringLiteral("ModelCard"));
  auto* mc = new QVBoxLayout(m_modelCard);
  mc->setContentsMargins(12, 10, 12, 10);
  mc->setSpacing(4);
  auto* modelSection = new QLabel(tr("MODEL"), m_modelCard);
  modelSection->setObjectName(QStringLiteral("SectionLabel"));
  mc->addWidget(modelSection);
  auto* nameRow = new QHBoxLayout;
  // One line each, elided (the whole text in the tooltip): wrapped labels here
  // were given too little height and drew over each other.
  m_modelName = new ElidedLabel(m_modelCard);
  m_modelName->setObjectName(QStringLiteral("ModelName"));
  m_demoBadge = new QLabel(tr("random weights"), m_modelCard);
  m_demoBadge->setObjectName(QStringLiteral("DemoBadge"));
  m_demoBadge->setToolTip(
      tr("The built-in demo model: a tiny synthetic model with random weights. "
         "It writes nonsense, but every panel works with it."));
  nameRow->addWidget(m_modelName, 1);
  nameRow->addWidget(m_demoBadge, 0, Qt::AlignTop);
  mc->addLayout(nameRow);
  m_modelMeta = new ElidedLabel(m_modelCard);
  m_modelMeta->setObjectName(QStringLiteral("ModelMeta"));
  mc->addWidget(m_modelMeta);
  m_modelMeta2 = new ElidedLabel(m_modelCard);
  m_modelMeta2->setObjectName(QStringLiteral("ModelMeta"));
  mc->addWidget(m_modelMeta2);
  auto* buttons = new QHBoxLayout;
  buttons->setSpacing(6);
  auto* open = new QPushButton(tr("Open model…"), m_modelCard);
  open->setObjectName(QStringLiteral("OpenModelButton"));
  // Never narrower than its label: the sidebar's minimum width follows.
  open->setMinimumWidth(open->sizeHint().width());
  open->setToolTip(tr("Open a GGUF file (Ctrl+O), or drop one on the window"));
  connect(open, &QPushButton::clicked, this, &Sidebar::openModelRequested);
  m_recent = new QToolButton(m_modelCard);
  m_recent->setText(tr("Recent"));
  m_recent->setPopupMode(QToolButton::InstantPopup);
  m_recent->setStyleSheet(
      QStringLiteral(
          "QToolButton{border:1px solid %1;border-radius:8px;padding:5px 10px;background:white;}"
          "QToolButton::menu-indicator{image:none;}")
          .arg(theme::css(theme::kBorder)));
  m_recentMenu = new QMenu(m_recent);
  m_recent->setMenu(m_recentMenu);
  buttons->addWidget(open, 1);
  buttons->addWidget(m_recent);
  mc->addLayout(buttons);
  v->addWidget(m_modelCard);
  setModel(nullptr);
  setRecentModels({});
}

void Sidebar::selectChat(qint64 chatId) {
  m_current = chatId;
  m_selecting = true;
  const int row = m_chats->rowOf(chatId);
  if (row >= 0)
    m_list->setCurrentIndex(m_chats->index(row));
  else
    m_list->clearSelection();
  m_selecting = false;
}

qint64 Sidebar::highlightedChat() const {
  const QModelIndex cur = m_list->currentIndex();
  return cur.isValid() && m_list->selectionModel()->isSelected(cur) ? m_chats->chatIdAt(cur.row())
                                                                    : 0;
}

void Sidebar::beginRename(qint64 chatId) {
  const int row = m_chats->rowOf(chatId);
  if (row >= 0) m_list->edit(m_chats->index(row));
}

void Sidebar::showContextMenu(const QPoint& pos) {
  const QModelIndex idx = m_list->indexAt(pos);
  if (!idx.isValid()) return;
  const qint64 id = m_chats->chatIdAt(idx.row());
  QMenu menu(this);
  menu.addAction(tr("Rename"), this, [this, idx] { m_list->edit(idx); });
  menu.addAction(tr("Delete…"), this, [this, id] { emit deleteChatRequested(id); });
  menu.exec(m_list->viewport()->mapToGlobal(pos));
}

void Sidebar::setModel(const ModelSummary* m) {
  if (!m) {
    m_modelName->setFullText(tr("No model loaded"));
    m_modelMeta->setFullText(tr("Open a GGUF file,"));
    m_modelMeta2->setFullText(tr("or try the demo model."));
    m_demoBadge->hide();
    return;
  }
  m_modelName->setFullText(m->isDemo ? tr("Loom demo model") : m->name);
  m_modelName->setToolTip(m_modelName->fullText() + QStringLiteral("\n") + m->path);
  m_demoBadge->setVisible(m->isDemo);
  m_modelMeta->setFullText(tr("%1 · %2 layers · %3").arg(m->arch).arg(m->nLayer).arg(m->quant));
  m_modelMeta2->setFullText(
      tr("%1 · context %2 · KV %3").arg(formatBytes(m->fileBytes)).arg(m->nCtx).arg(m->kvDtype));
  m_modelMeta2->setToolTip(m->description);
  m_modelMeta->setToolTip(m->description +
                          (m->warnings.isEmpty()
                               ? QString()
                               : QStringLiteral("\n\n") + m->warnings.join(QStringLiteral("\n"))));
}

void Sidebar::setRecentModels(const QList<QPair<QString, QString>>& recent) {
  m_recentMenu->clear();
  for (const auto& r : recent) {
    QAction* a = m_recentMenu->addAction(r.second);
    a->setToolTip(r.first);
    const QString path = r.first;
    connect(a, &QAction::triggered, this, [this, path] { emit recentModelRequested(path); });
  }
  if (!recent.isEmpty()) m_recentMenu->addSeparator();
  m_recentMenu->addAction(tr("Demo model (random weights)"), this, &Sidebar::demoModelRequested);
}
