#include "app/transcript_view.h"

#include <QHBoxLayout>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QResizeEvent>
#include <QScrollBar>
#include <QToolButton>
#include <QVBoxLayout>

#include "app/elided_label.h"
#include "app/markdown_view.h"
#include "app/theme.h"

namespace {

constexpr int kColumnMaxWidth = 860;  // a readable line length for 10.5 pt text

QToolButton* actionButton(const QString& text, const QString& tip, QWidget* parent) {
  auto* b = new QToolButton(parent);
  b->setObjectName(QStringLiteral("MessageAction"));
  b->setText(text);
  b->setToolTip(tip);
  b->setCursor(Qt::PointingHandCursor);
  b->setAutoRaise(true);
  return b;
}

// The user's bubble hugs short text and wraps long text at most of the column.
class UserBubble : public QFrame {
 public:
  UserBubble(MarkdownView* body, QWidget* parent) : QFrame(parent), m_body(body) {
    setObjectName(QStringLiteral("UserBubble"));
    auto* l = new QVBoxLayout(this);
    l->setContentsMargins(14, 9, 14, 9);
    l->addWidget(body);
    QSizePolicy sp(QSizePolicy::Preferred, QSizePolicy::Preferred);
    sp.setHeightForWidth(true);
    setSizePolicy(sp);
  }
  QSize sizeHint() const override {
    const QMargins m = layout()->contentsMargins();
    const int w = m_body->idealWidth() + m.left() + m.right();
    return {w, heightForWidth(w)};
  }
  bool hasHeightForWidth() const override { return true; }
  int heightForWidth(int w) const override {
    const QMargins m = layout()->contentsMargins();
    return m_body->heightForWidth(w - m.left() - m.right()) + m.top() + m.bottom();
  }

 private:
  MarkdownView* m_body;
};

}  // namespace

// ---- MessageWidget ----------------------------------------------------------------

MessageWidget::MessageWidget(const MessageData& data, const QString& assistantName, QWidget* parent)
    : QFrame(parent), m_data(data) {
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(0, 0, 0, 0);
  v->setSpacing(4);
  m_body = new MarkdownView(this);
  m_meta = new ElidedLabel(this);
  m_meta->setObjectName(QStringLiteral("MessageMeta"));
  m_copy = actionButton(tr("Copy"), tr("Copy this message as Markdown"), this);
  connect(m_copy, &QToolButton::clicked, this, [this] { emit copyRequested(m_data.id); });

  auto* actions = new QHBoxLayout;
  actions->setSpacing(2);
  if (data.role == QLatin1String("user")) {
    m_edit = actionButton(tr("Edit"), tr("Edit and resend (replaces the reply)"), this);
    connect(m_edit, &QToolButton::clicked, this, [this] { emit editRequested(m_data.id); });
    auto* row = new QHBoxLayout;
    row->addStretch(1);
    m_bubble = new UserBubble(m_body, this);
    m_bubble->setMaximumWidth(static_cast<int>(kColumnMaxWidth * 0.8));
    row->addWidget(m_bubble, 0, Qt::AlignRight);
    v->addLayout(row);
    actions->addStretch(1);
    actions->addWidget(m_meta);
    actions->addWidget(m_edit);
    actions->addWidget(m_copy);
  } else {
    auto* header = new QHBoxLayout;
    header->setSpacing(8);
    auto* avatar = new QLabel(QStringLiteral("L"), this);
    avatar->setFixedSize(24, 24);
    avatar->setAlignment(Qt::AlignCenter);
    avatar->setStyleSheet(
        QStringLiteral("background:%1;color:white;border-radius:12px;font-weight:700;")
            .arg(theme::css(theme::kAccent)));
    // A long model name elides: it never widens the transcript's column.
    (void)assistantName;
    m_name = new ElidedLabel(this);
    m_name->setObjectName(QStringLiteral("RoleLabel"));
    setOrigin(data.model, data.origin);
    header->addWidget(avatar);
    header->addWidget(m_name, 1);
    header->addWidget(m_meta, 2);
    v->addLayout(header);
    auto* indented = new QHBoxLayout;
    indented->setContentsMargins(32, 0, 0, 0);
    indented->addWidget(m_body);
    v->addLayout(indented);
    m_regenerate = actionButton(tr("Regenerate"), tr("Generate this reply again"), this);
    connect(m_regenerate, &QToolButton::clicked, this,
            [this] { emit regenerateRequested(m_data.id); });
    actions->setContentsMargins(26, 0, 0, 0);
    actions->addWidget(m_copy);
    actions->addWidget(m_regenerate);
    actions->addStretch(1);
  }
  v->addLayout(actions);
  m_body->setMarkdownText(data.content);
  updateMeta();
}

void MessageWidget::setText(const QString& markdown) {
  m_data.content = markdown;
  m_body->setMarkdownText(markdown);
  if (m_bubble) m_bubble->updateGeometry();
}

void MessageWidget::setOrigin(const QString& model, const QString& originJson) {
  m_data.model = model;
  m_data.origin = originJson;
  if (!m_name) return;
  m_name->setFullText(model.isEmpty() ? tr("Assistant") : model);
  m_name->setToolTip(describeOrigin(model, originJson));
}

QString describeOrigin(const QString& model, const QString& originJson) {
  if (model.isEmpty()) {
    return MessageWidget::tr(
        "The model that wrote this was not recorded (a chat from an older Loom).");
  }
  QStringList lines{MessageWidget::tr("Written by %1").arg(model)};
  const QJsonObject o = QJsonDocument::fromJson(originJson.toUtf8()).object();
  if (o.isEmpty()) return lines.join(QLatin1Char('\n'));
  if (o.contains(QLatin1String("file")))
    lines << MessageWidget::tr("File: %1 (%2)")
                 .arg(o.value(QLatin1String("file")).toString(),
                      o.value(QLatin1String("quant")).toString());
  if (o.contains(QLatin1String("placement")))
    lines << MessageWidget::tr("Placement: %1").arg(o.value(QLatin1String("placement")).toString());
  if (o.contains(QLatin1String("kv")))
    lines << MessageWidget::tr("KV cache: %1, context %2 tokens")
                 .arg(o.value(QLatin1String("kv")).toString())
                 .arg(o.value(QLatin1String("ctx")).toInteger());
  const QJsonObject sm = o.value(QLatin1String("sampling")).toObject();
  if (!sm.isEmpty()) {
    const qint64 seed = sm.value(QLatin1String("seed")).toInteger(-1);
    lines << MessageWidget::tr(
                 "Sampling: temperature %1 · top-k %2 · top-p %3 · min-p %4 · repeat %5 · seed %6")
                 .arg(sm.value(QLatin1String("temperature")).toDouble())
                 .arg(sm.value(QLatin1String("top_k")).toInteger())
                 .arg(sm.value(QLatin1String("top_p")).toDouble())
                 .arg(sm.value(QLatin1String("min_p")).toDouble())
                 .arg(sm.value(QLatin1String("repeat_penalty")).toDouble())
                 .arg(seed < 0 ? MessageWidget::tr("random") : QString::number(seed));
  }
  return lines.join(QLatin1Char('\n'));
}

void MessageWidget::setStatus(MessageStatus status, const QString& meta) {
  m_data.status = status;
  m_data.meta = meta;
  updateMeta();
}

void MessageWidget::setActions(bool canRegenerate, bool canEdit) {
  if (m_regenerate) m_regenerate->setVisible(canRegenerate);
  if (m_edit) m_edit->setVisible(canEdit);
  m_copy->setVisible(m_data.status != MessageStatus::Streaming);
}

void MessageWidget::updateMeta() {
  QString text = m_data.meta;
  QString color = theme::css(theme::kMuted);
  switch (m_data.status) {
    case MessageStatus::Streaming:
      text = tr("● generating…");
      color = theme::css(theme::kAccent);
      break;
    case MessageStatus::Error: color = theme::css(theme::kDanger); break;
    case MessageStatus::Stopped:
      if (!text.contains(tr("stopped")) && !text.contains(QStringLiteral("interrupted"))) {
        text += text.isEmpty() ? tr("stopped") : tr(" · stopped");
      }
      break;
    case MessageStatus::Complete: break;
  }
  if (m_data.role == QLatin1String("user")) text.clear();  // the user's own words need no stats
  m_meta->setFullText(text);
  m_meta->setStyleSheet(QStringLiteral("color:%1;").arg(color));
  m_meta->setVisible(!text.isEmpty());
}

// ---- TranscriptView -----------------------------------------------------------------

TranscriptView::TranscriptView(QWidget* parent) : QScrollArea(parent) {
  setObjectName(QStringLiteral("Transcript"));
  setWidgetResizable(true);
  setFrameShape(QFrame::NoFrame);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);

  auto* outer = new QWidget;
  outer->setObjectName(QStringLiteral("TranscriptColumn"));
  auto* h = new QHBoxLayout(outer);
  h->setContentsMargins(24, 20, 24, 20);
  m_column = new QWidget(outer);
  m_column->setObjectName(QStringLiteral("TranscriptColumn"));
  m_column->setMaximumWidth(kColumnMaxWidth);
  h->addStretch(0);
  h->addWidget(m_column, 1);
  h->addStretch(0);
  auto* v = new QVBoxLayout(m_column);
  v->setContentsMargins(0, 0, 0, 0);
  v->setSpacing(0);

  m_placeholder = new QWidget(m_column);
  auto* pl = new QVBoxLayout(m_placeholder);
  pl->setContentsMargins(0, 80, 0, 0);
  m_placeholderTitle = new QLabel(m_placeholder);
  m_placeholderTitle->setObjectName(QStringLiteral("StartTitle"));
  m_placeholderTitle->setAlignment(Qt::AlignCenter);
  m_placeholderText = new QLabel(m_placeholder);
  m_placeholderText->setObjectName(QStringLiteral("StartSubtitle"));
  m_placeholderText->setAlignment(Qt::AlignCenter);
  m_placeholderText->setWordWrap(true);
  pl->addWidget(m_placeholderTitle);
  pl->addWidget(m_placeholderText);
  v->addWidget(m_placeholder);

  m_messages = new QVBoxLayout;
  m_messages->setSpacing(22);
  v->addLayout(m_messages);
  v->addStretch(1);
  setWidget(outer);

  // Follow the bottom while the user is there; leave them alone when they scrolled up.
  connect(verticalScrollBar(), &QScrollBar::valueChanged, this,
          [this](int value) { m_stickToBottom = value >= verticalScrollBar()->maximum() - 24; });
  connect(verticalScrollBar(), &QScrollBar::rangeChanged, this, [this](int, int max) {
    if (m_stickToBottom) verticalScrollBar()->setValue(max);
  });
  setPlaceholder(tr("Start a conversation"),
                 tr("Type a message below. Enter sends, Shift+Enter starts a new line."));
}

void TranscriptView::setPlaceholder(const QString& title, const QString& text) {
  m_placeholderTitle->setText(title);
  m_placeholderText->setText(text);
  updatePlaceholder();
}

void TranscriptView::updatePlaceholder() {
  m_placeholder->setVisible(m_order.isEmpty());
}

void TranscriptView::clear() {
  for (MessageWidget* w : m_order) w->deleteLater();
  m_order.clear();
  m_byId.clear();
  m_stickToBottom = true;
  updatePlaceholder();
}

MessageWidget* TranscriptView::addMessage(const MessageData& data) {
  auto* w = new MessageWidget(data, m_assistantName, m_column);
  connect(w, &MessageWidget::copyRequested, this, &TranscriptView::copyRequested);
  connect(w, &MessageWidget::regenerateRequested, this, &TranscriptView::regenerateRequested);
  connect(w, &MessageWidget::editRequested, this, &TranscriptView::editRequested);
  m_messages->addWidget(w);
  m_order << w;
  m_byId.insert(data.id, w);
  updatePlaceholder();
  return w;
}

void TranscriptView::setMessageText(qint64 id, const QString& markdown) {
  if (MessageWidget* w = m_byId.value(id)) w->setText(markdown);
}

void TranscriptView::setMessageOrigin(qint64 id, const QString& model, const QString& originJson) {
  if (MessageWidget* w = m_byId.value(id)) w->setOrigin(model, originJson);
}

void TranscriptView::setMessageStatus(qint64 id, MessageStatus status, const QString& meta) {
  if (MessageWidget* w = m_byId.value(id)) w->setStatus(status, meta);
}

void TranscriptView::refreshActions(bool busy) {
  int lastUser = -1, lastAssistant = -1;
  for (int i = 0; i < m_order.size(); ++i) {
    if (m_order[i]->role() == QLatin1String("user"))
      lastUser = i;
    else
      lastAssistant = i;
  }
  for (int i = 0; i < m_order.size(); ++i) {
    // Regenerate: the last reply, when it answers the last user message.
    m_order[i]->setActions(!busy && i == lastAssistant && lastAssistant > lastUser,
                           !busy && i == lastUser);
  }
}

QString TranscriptView::plainText() const {
  QStringList parts;
  for (const MessageWidget* w : m_order) parts << w->text();
  return parts.join(QStringLiteral("\n\n"));
}

void TranscriptView::scrollToBottom() {
  m_stickToBottom = true;
  verticalScrollBar()->setValue(verticalScrollBar()->maximum());
}
