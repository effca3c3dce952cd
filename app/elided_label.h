// A one-line label that elides its text to the width it is given, instead of
// asking its layout for the whole text's width: a long chat title or model
// name then never pushes the panels beside it (the splitter's sizes change
// only when the user drags them). The whole text is in the tooltip.
#pragma once

#include <QLabel>

class ElidedLabel : public QLabel {
  Q_OBJECT
 public:
  explicit ElidedLabel(QWidget* parent = nullptr);

  /// The whole text (what is shown may be elided with "…").
  void setFullText(const QString& text);
  const QString& fullText() const { return m_full; }
  /// Whether the text shown now is cut short.
  bool isElided() const { return text() != m_full; }

  QSize minimumSizeHint() const override;
  QSize sizeHint() const override;

 protected:
  void resizeEvent(QResizeEvent* event) override;

 private:
  void updateShown();
  QString m_full;
};
