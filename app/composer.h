// The message box under the transcript: Enter sends, Shift+Enter adds a line,
// Esc stops a reply; the Send button turns into Stop while one streams.
#pragma once

#include <QFrame>
#include <QPlainTextEdit>

class ElidedLabel;
class QLabel;
class QPushButton;

class ChatInput : public QPlainTextEdit {
  Q_OBJECT
 public:
  explicit ChatInput(QWidget* parent = nullptr);
  QSize sizeHint() const override;

 signals:
  void submitted();
  void escapePressed();

 protected:
  void keyPressEvent(QKeyEvent* event) override;

 private:
  void fitHeight();
};

class Composer : public QFrame {
  Q_OBJECT
 public:
  explicit Composer(QWidget* parent = nullptr);

  QString text() const;
  void setText(const QString& text);
  void clear();
  /// While a reply streams the button stops it, and Enter does not send.
  void setBusy(bool busy);
  bool isBusy() const { return m_busy; }
  /// No model: nothing can be sent (the reason is shown as the placeholder).
  void setReady(bool ready, const QString& whyNot = {});
  /// Editing an earlier message: a banner says so, with a way out.
  void setEditing(bool editing);
  bool isEditing() const { return m_editing; }
  ChatInput* input() const { return m_input; }
  QPushButton* sendButton() const { return m_send; }

 signals:
  void sendRequested(const QString& text);
  void stopRequested();
  void editCancelled();

 private:
  void trySend();
  void updateButton();

  ChatInput* m_input = nullptr;
  QPushButton* m_send = nullptr;
  ElidedLabel* m_hint = nullptr;
  QLabel* m_editBanner = nullptr;
  QPushButton* m_cancelEdit = nullptr;
  bool m_busy = false;
  bool m_ready = false;
  bool m_editing = false;
};
