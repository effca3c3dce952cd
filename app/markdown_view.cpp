#include "app/markdown_view.h"

#include <QAbstractTextDocumentLayout>
#include <QRegularExpression>
#include <QResizeEvent>
#include <QScrollBar>
#include <QTextBlock>
#include <QTextCursor>
#include <QTextDocument>
#include <QTextFrame>
#include <cmath>
#include <memory>

#include "app/theme.h"

QVector<MarkdownSegment> splitMarkdownFences(const QString& markdown) {
  static const QRegularExpression fence(QStringLiteral("^ {0,3}(`{3,}|~{3,})\\s*([^`\\s]*)"));
  QVector<MarkdownSegment> out;
  MarkdownSegment cur;
  QString fenceText;  // the opening fence, while inside a code block
  const QStringList lines = markdown.split(QLatin1Char('\n'));
  auto push = [&] {
    if (cur.code || !cur.text.trimmed().isEmpty()) out << cur;
    cur = MarkdownSegment();
  };
  for (const QString& line : lines) {
    const auto m = fence.match(line);
    if (fenceText.isEmpty()) {
      if (m.hasMatch()) {
        push();
        cur.code = true;
        cur.closed = false;
        cur.language = m.captured(2);
        fenceText = m.captured(1);
        continue;
      }
    } else if (m.hasMatch() && m.captured(1).startsWith(fenceText) && m.captured(2).isEmpty()) {
      // A closing fence: same character, at least as long, no info string.
      if (cur.text.endsWith(QLatin1Char('\n'))) cur.text.chop(1);
      cur.closed = true;
      fenceText.clear();
      push();
      continue;
    }
    cur.text += line;
    cur.text += QLatin1Char('\n');
  }
  if (cur.code && cur.text.endsWith(QLatin1Char('\n'))) cur.text.chop(1);
  push();
  return out;
}

void renderMarkdown(QTextDocument* doc, const QString& markdown) {
  doc->clear();
  QTextCursor cur(doc);
  bool first = true;
  for (const MarkdownSegment& seg : splitMarkdownFences(markdown)) {
    cur.movePosition(QTextCursor::End);
    if (!seg.code) {
      if (!first) cur.insertBlock();
      cur.insertMarkdown(seg.text.trimmed(), QTextDocument::MarkdownDialectGitHub);
      first = false;
      continue;
    }
    QTextFrameFormat ff;
    ff.setBackground(theme::kCodeBg);
    ff.setBorder(1);
    ff.setBorderBrush(theme::kBorder);
    ff.setBorderStyle(QTextFrameFormat::BorderStyle_Solid);
    ff.setPadding(10);
    ff.setTopMargin(first ? 0 : 6);
    ff.setBottomMargin(6);
    cur.insertFrame(ff);  // the cursor is now inside the frame's first block
    QTextCharFormat mono;
    mono.setFont(theme::monoFont());
    mono.setForeground(theme::kText);
    if (!seg.language.isEmpty()) {
      QTextCharFormat lang;
      lang.setFont(theme::uiFont(8.0));
      lang.setForeground(theme::kMuted);
      cur.insertText(seg.language, lang);
      QTextBlockFormat bf;
      bf.setBottomMargin(4);
      cur.setBlockFormat(bf);
      cur.insertBlock(QTextBlockFormat(), mono);
    }
    // Plain text: code is never Markdown. Tabs as 4 spaces keep columns in a proportional-width
    // world.
    QString code = seg.text;
    code.replace(QLatin1Char('\t'), QStringLiteral("    "));
    cur.insertText(code, mono);
    first = false;
  }
  // Paragraphs a little apart, like the rest of the app's text.
  for (QTextBlock b = doc->begin(); b.isValid(); b = b.next()) {
    QTextCursor bc(b);
    QTextBlockFormat f = b.blockFormat();
    if (b.textList() || bc.currentFrame() != doc->rootFrame()) continue;
    if (f.bottomMargin() < 6) {
      f.setBottomMargin(6);
      bc.setBlockFormat(f);
    }
  }
}

MarkdownView::MarkdownView(QWidget* parent) : QTextBrowser(parent) {
  setObjectName(QStringLiteral("MessageBody"));
  setReadOnly(true);
  setOpenExternalLinks(true);
  setFrameShape(QFrame::NoFrame);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
  QSizePolicy sp = sizePolicy();
  sp.setHeightForWidth(true);
  setSizePolicy(sp);
  document()->setDocumentMargin(0);
  document()->setDefaultFont(theme::uiFont(10.5));
  viewport()->setAutoFillBackground(false);
  setTextInteractionFlags(Qt::TextBrowserInteraction);
}

QString displayableText(const QString& text) {
  QString out;
  out.reserve(text.size());
  bool lastReplacement = false;
  for (const QChar c : text) {
    const char16_t u = c.unicode();
    // C0/C1 control characters draw as boxes (or not at all): a model that
    // emits them (random weights do) should not fill the view with them.
    if ((u < 0x20 && u != u'\n' && u != u'\t') || (u >= 0x7f && u <= 0x9f)) continue;
    // Bytes that were not valid UTF-8 arrive as U+FFFD, often in runs: one mark per run.
    if (u == 0xFFFD && lastReplacement) continue;
    lastReplacement = u == 0xFFFD;
    out += c;
  }
  return out;
}

void MarkdownView::setMarkdownText(const QString& markdown) {
  if (markdown == m_markdown && !document()->isEmpty()) return;
  m_markdown = markdown;
  renderMarkdown(document(), displayableText(markdown));
  fitHeight();
}

int MarkdownView::idealWidth() const {
  // idealWidth() needs a layout without a width limit; measure a copy so the shown one keeps its
  // width.
  std::unique_ptr<QTextDocument> d(document()->clone());
  d->setTextWidth(-1);
  return static_cast<int>(std::ceil(d->idealWidth())) + 2;
}

int MarkdownView::heightForWidth(int width) const {
  const QMargins m = contentsMargins();
  QTextDocument* doc = document();
  const qreal old = doc->textWidth();
  doc->setTextWidth(width - m.left() - m.right());
  const int h = static_cast<int>(std::ceil(doc->size().height())) + m.top() + m.bottom();
  if (old != doc->textWidth()) doc->setTextWidth(old);
  return h;
}

QSize MarkdownView::sizeHint() const {
  const int w = QTextBrowser::sizeHint().width();
  return {w, heightForWidth(width() > 0 ? width() : w)};
}

QSize MarkdownView::minimumSizeHint() const {
  return {40, heightForWidth(width() > 0 ? width() : 200)};
}

void MarkdownView::resizeEvent(QResizeEvent* event) {
  QTextBrowser::resizeEvent(event);
  if (event->oldSize().width() != event->size().width()) fitHeight();
}

void MarkdownView::fitHeight() {
  const int h = heightForWidth(width());
  if (h != height()) {
    setMinimumHeight(h);
    setMaximumHeight(h);
  }
  updateGeometry();
  verticalScrollBar()->setValue(0);
}
