#include "app/elided_label.h"

#include <QFontMetrics>
#include <QResizeEvent>

ElidedLabel::ElidedLabel(QWidget* parent) : QLabel(parent) {
  setTextFormat(Qt::PlainText);
  setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
}

void ElidedLabel::setFullText(const QString& text) {
  m_full = text;
  setToolTip(text);
  updateShown();
  updateGeometry();
}

QSize ElidedLabel::minimumSizeHint() const {
  // A few characters and the ellipsis: never the whole text's width.
  const QFontMetrics fm(font());
  return {fm.horizontalAdvance(QStringLiteral("Wwww…")), QLabel::minimumSizeHint().height()};
}

QSize ElidedLabel::sizeHint() const {
  const QFontMetrics fm(font());
  const QMargins m = contentsMargins();
  return {fm.horizontalAdvance(m_full) + m.left() + m.right() + 2 * margin() + 2,
          QLabel::sizeHint().height()};
}

void ElidedLabel::resizeEvent(QResizeEvent* event) {
  QLabel::resizeEvent(event);
  updateShown();
}

void ElidedLabel::updateShown() {
  const int w = contentsRect().width() - 2 * margin();
  const QString shown = fontMetrics().elidedText(m_full, Qt::ElideRight, std::max(0, w));
  if (shown != text()) QLabel::setText(shown);
}
