#include "app/composer.h"

#include <QHBoxLayout>
#include <QKeyEvent>
#include <QLabel>
#include <QPushButton>
#include <QStyle>
#include <QTextBlock>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>

#include "app/elided_label.h"
#include "app/theme.h"

ChatInput::ChatInput(QWidget* parent) : QPlainTextEdit(parent) {
  setObjectName(QStringLiteral("ComposerEdit"));
  setFrameShape(QFrame::NoFrame);
  setTabChangesFocus(true);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setVerticalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
  document()->setDocumentMargin(2);
  connect(this, &QPlainTextEdit::textChanged, this, &ChatInput::fitHeight);
  fitHeight();
}

QSize ChatInput::sizeHint() const {
  return {400, height()};
}

void ChatInput::keyPressEvent(QKeyEvent* event) {
  const bool enter = event->key() == Qt::Key_Return || event->key() == Qt::Key_Enter;
  if (enter && !(event->modifiers() & Qt::ShiftModifier)) {
    emit submitted();
    return;
  }
  if (event->key() == Qt::Key_Escape) {
    emit escapePressed();
    return;
  }
  QPlainTextEdit::keyPressEvent(event);
}

void ChatInput::fitHeight() {
  // Grow with the text from one line to about eight, then scroll.
  const QFontMetrics fm(font());
  int lines = 0;
  for (QTextBlock b = document()->begin(); b.isValid(); b = b.next())
    lines += std::max(1, b.lineCount());
  lines = std::clamp(lines, 1, 8);
  const int h = lines * fm.lineSpacing() + 2 * static_cast<int>(document()->documentMargin()) + 8;
  if (h != height()) setFixedHeight(h);
}

Composer::Composer(QWidget* parent) : QFrame(parent) {
  setObjectName(QStringLiteral("Composer"));
  auto* v = new QVBoxLayout(this);
  v->setContentsMargins(14, 10, 10, 10);
  v->setSpacing(6);

  auto* banner = new QHBoxLayout;
  m_editBanner = new QLabel(
      tr("Editing your last message: sending replaces it and the reply after it."), this);
  m_editBanner->setObjectName(QStringLiteral("EditBanner"));
  m_cancelEdit = new QPushButton(tr("Cancel edit"), this);
  connect(m_cancelEdit, &QPushButton::clicked, this, [this] {
    setEditing(false);
    clear();
    emit editCancelled();
  });
  banner->addWidget(m_editBanner, 1);
  banner->addWidget(m_cancelEdit);
  v->addLayout(banner);

  m_input = new ChatInput(this);
  v->addWidget(m_input);
  auto* row = new QHBoxLayout;
  // Elided in a narrow chat column, whole in its tooltip.
  m_hint = new ElidedLabel(this);
  m_hint->setFullText(tr("Enter to send · Shift+Enter for a new line · Esc stops"));
  m_hint->setObjectName(QStringLiteral("Muted"));
  m_send = new QPushButton(tr("Send"), this);
  m_send->setObjectName(QStringLiteral("Primary"));
  m_send->setMinimumWidth(84);
  m_send->setCursor(Qt::PointingHandCursor);
  row->addWidget(m_hint, 1);
  row->addWidget(m_send);
  v->addLayout(row);

  connect(m_input, &ChatInput::submitted, this, &Composer::trySend);
  connect(m_input, &ChatInput::escapePressed, this, [this] {
    if (m_busy) emit stopRequested();
  });
  connect(m_send, &QPushButton::clicked, this, [this] {
    if (m_busy)
      emit stopRequested();
    else
      trySend();
  });
  connect(m_input, &QPlainTextEdit::textChanged, this, &Composer::updateButton);
  setEditing(false);
  setReady(false);
}

QString Composer::text() const {
  return m_input->toPlainText();
}
void Composer::setText(const QString& text) {
  m_input->setPlainText(text);
  m_input->moveCursor(QTextCursor::End);
}
void Composer::clear() {
  m_input->clear();
}

void Composer::trySend() {
  if (m_busy || !m_ready) return;
  const QString t = text().trimmed();
  if (t.isEmpty()) return;
  emit sendRequested(t);
}

void Composer::setBusy(bool busy) {
  m_busy = busy;
  updateButton();
}

void Composer::setReady(bool ready, const QString& whyNot) {
  m_ready = ready;
  m_input->setPlaceholderText(ready ? tr("Message the model…") : whyNot);
  updateButton();
}

void Composer::setEditing(bool editing) {
  m_editing = editing;
  m_editBanner->setVisible(editing);
  m_cancelEdit->setVisible(editing);
}

void Composer::updateButton() {
  if (m_busy) {
    m_send->setText(tr("Stop"));
    m_send->setObjectName(QStringLiteral("Danger"));
    m_send->setEnabled(true);
    m_send->setToolTip(tr("Stop the reply (Esc)"));
  } else {
    m_send->setText(tr("Send"));
    m_send->setObjectName(QStringLiteral("Primary"));
    m_send->setEnabled(m_ready && !text().trimmed().isEmpty());
    m_send->setToolTip(tr("Send (Enter)"));
  }
  // The object name picks the style: re-polish after changing it.
  m_send->style()->unpolish(m_send);
  m_send->style()->polish(m_send);
}
