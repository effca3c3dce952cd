// The conversation: one MessageWidget per message in a scrolling column of
// readable width. Streaming replies update their own widget only; the view
// follows the bottom while the user has not scrolled away from it.
#pragma once

#include <QFrame>
#include <QHash>
#include <QScrollArea>

class MarkdownView;
class ElidedLabel;
class QLabel;
class QToolButton;
class QVBoxLayout;

/// How a message is shown (mirrors storage::MessageState without the dependency).
enum class MessageStatus { Complete, Streaming, Stopped, Error };

struct MessageData {
  qint64 id = 0;
  QString role;     ///< "user" or "assistant" (a "system" message is not shown)
  QString content;  ///< Markdown
  MessageStatus status = MessageStatus::Complete;
  QString meta;
  QString model;   ///< the model that wrote an assistant message (empty: not recorded)
  QString origin;  ///< JSON: file, placement, KV cache and sampling it was written with
};

/// The origin JSON of a message as tooltip lines ("Placement: …", "Sampling: …").
QString describeOrigin(const QString& model, const QString& originJson);

class MessageWidget : public QFrame {
  Q_OBJECT
 public:
  /// `assistantName` is not used for the name shown: that is data.model, the
  /// model that wrote the message ("Assistant" when it was not recorded).
  MessageWidget(const MessageData& data, const QString& assistantName, QWidget* parent = nullptr);
  /// Updates what the name's tooltip says produced the message.
  void setOrigin(const QString& model, const QString& originJson);
  qint64 messageId() const { return m_data.id; }
  const QString& role() const { return m_data.role; }
  const QString& text() const { return m_data.content; }
  MessageStatus status() const { return m_data.status; }
  void setText(const QString& markdown);
  void setStatus(MessageStatus status, const QString& meta);
  /// Which actions this message offers now.
  void setActions(bool canRegenerate, bool canEdit);
  MarkdownView* body() const { return m_body; }

 signals:
  void copyRequested(qint64 id);
  void regenerateRequested(qint64 id);
  void editRequested(qint64 id);

 private:
  void updateMeta();

  MessageData m_data;
  MarkdownView* m_body = nullptr;
  QFrame* m_bubble = nullptr;
  ElidedLabel* m_meta = nullptr;  ///< generation notes (elided: never widens the column)
  ElidedLabel* m_name = nullptr;  ///< the model that wrote it (assistant messages)
  QToolButton* m_copy = nullptr;
  QToolButton* m_regenerate = nullptr;
  QToolButton* m_edit = nullptr;
};

class TranscriptView : public QScrollArea {
  Q_OBJECT
 public:
  explicit TranscriptView(QWidget* parent = nullptr);

  void clear();
  MessageWidget* addMessage(const MessageData& data);
  MessageWidget* message(qint64 id) const { return m_byId.value(id); }
  /// Replaces a message's text (a reply streaming in).
  void setMessageText(qint64 id, const QString& markdown);
  void setMessageStatus(qint64 id, MessageStatus status, const QString& meta);
  void setMessageOrigin(qint64 id, const QString& model, const QString& originJson);
  /// Offers Regenerate on the last reply and Edit on the last user message, unless `busy`.
  void refreshActions(bool busy);
  void setAssistantName(const QString& name) { m_assistantName = name; }
  /// Shown when there are no messages.
  void setPlaceholder(const QString& title, const QString& text);
  /// All messages' text, in order (tests read it).
  QString plainText() const;
  int messageCount() const { return m_order.size(); }
  void scrollToBottom();

 signals:
  void copyRequested(qint64 id);
  void regenerateRequested(qint64 id);
  void editRequested(qint64 id);

 private:
  void updatePlaceholder();

  QWidget* m_column = nullptr;
  QVBoxLayout* m_messages = nullptr;
  QWidget* m_placeholder = nullptr;
  QLabel* m_placeholderTitle = nullptr;
  QLabel* m_placeholderText = nullptr;
  QHash<qint64, MessageWidget*> m_byId;
  QList<MessageWidget*> m_order;
  QString m_assistantName;
  bool m_stickToBottom = true;
};
