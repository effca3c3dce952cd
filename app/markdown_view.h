// Markdown for the transcript: prose through Qt's GitHub-dialect importer,
// fenced code blocks as framed monospace boxes (with their language), in a
// read-only text view that is always exactly as tall as its text (so the
// transcript, not each message, scrolls).
#pragma once

#include <QString>
#include <QTextBrowser>
#include <QVector>

class QTextDocument;

/// A run of Markdown: prose, or the body of a fenced code block.
struct MarkdownSegment {
  bool code = false;
  QString text;        ///< prose as Markdown, or the code itself (no fences)
  QString language;    ///< the fence's info string ("cpp"), code only
  bool closed = true;  ///< false: a fence still open (a reply streaming in)
};

/// Splits Markdown at ``` / ~~~ fences (up to 3 spaces of indent).
QVector<MarkdownSegment> splitMarkdownFences(const QString& markdown);

/// `text` without control characters, and with each run of U+FFFD (bytes
/// that were not UTF-8) shown once. The stored message keeps every byte.
QString displayableText(const QString& text);

/// Replaces `doc`'s content with `markdown` rendered.
void renderMarkdown(QTextDocument* doc, const QString& markdown);

class MarkdownView : public QTextBrowser {
  Q_OBJECT
 public:
  explicit MarkdownView(QWidget* parent = nullptr);

  void setMarkdownText(const QString& markdown);
  const QString& markdownText() const { return m_markdown; }
  /// Widest line without wrapping, in pixels (a short user message's bubble hugs it).
  int idealWidth() const;

  bool hasHeightForWidth() const override { return true; }
  int heightForWidth(int width) const override;
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void resizeEvent(QResizeEvent* event) override;

 private:
  void fitHeight();

  QString m_markdown;
};
