#include "app/start_screen.h"

#include <QFileInfo>
#include <QFrame>
#include <QHBoxLayout>
#include <QIcon>
#include <QLabel>
#include <QLocale>
#include <QPushButton>
#include <QVBoxLayout>

#include "app/theme.h"

StartScreen::StartScreen(QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("StartScreen"));
  setAttribute(Qt::WA_StyledBackground, true);
  auto* outer = new QVBoxLayout(this);
  outer->addStretch(2);
  auto* column = new QWidget(this);
  column->setMaximumWidth(560);
  auto* v = new QVBoxLayout(column);
  v->setSpacing(10);

  auto* logo = new QLabel(column);
  logo->setPixmap(QIcon(QStringLiteral(":/loom/loom.svg")).pixmap(72, 72));
  logo->setAlignment(Qt::AlignCenter);
  v->addWidget(logo);
  auto* title = new QLabel(tr("Welcome to Loom"), column);
  title->setObjectName(QStringLiteral("StartTitle"));
  title->setAlignment(Qt::AlignCenter);
  v->addWidget(title);
  auto* sub = new QLabel(
      tr("Chat with a local model, and see where every layer runs and what it costs."), column);
  sub->setObjectName(QStringLiteral("StartSubtitle"));
  sub->setAlignment(Qt::AlignCenter);
  sub->setWordWrap(true);
  v->addWidget(sub);
  v->addSpacing(18);

  m_open = new QPushButton(tr("Open model…"), column);
  m_open->setObjectName(QStringLiteral("Primary"));
  m_open->setMinimumHeight(40);
  m_open->setCursor(Qt::PointingHandCursor);
  m_open->setToolTip(
      tr("A GGUF file (Ctrl+O), or a Hugging Face folder (File menu). You can also drop one "
         "on the window."));
  connect(m_open, &QPushButton::clicked, this, &StartScreen::openModelRequested);
  v->addWidget(m_open);

  m_demo = new QPushButton(tr("Try the demo model"), column);
  m_demo->setMinimumHeight(40);
  m_demo->setCursor(Qt::PointingHandCursor);
  connect(m_demo, &QPushButton::clicked, this, &StartScreen::demoModelRequested);
  v->addWidget(m_demo);
  auto* demoNote =
      new QLabel(tr("The demo is a tiny synthetic model with <b>random weights</b>: it writes "
                    "nonsense, but every panel (placement, latency, memory) works with it. "
                    "Loom writes it once (about 1 MB) on first use."),
                 column);
  demoNote->setObjectName(QStringLiteral("Muted"));
  demoNote->setWordWrap(true);
  demoNote->setAlignment(Qt::AlignCenter);
  v->addWidget(demoNote);
  v->addSpacing(14);

  m_recentTitle = new QLabel(tr("RECENT MODELS"), column);
  m_recentTitle->setObjectName(QStringLiteral("SectionLabel"));
  v->addWidget(m_recentTitle);
  m_recent = new QVBoxLayout;
  m_recent->setSpacing(4);
  v->addLayout(m_recent);
  m_foundTitle = new QLabel(tr("ON THIS MACHINE"), column);
  m_foundTitle->setObjectName(QStringLiteral("SectionLabel"));
  m_foundTitle->setToolTip(
      tr("GGUF files and Hugging Face folders in the Hugging Face cache, LM Studio, Ollama and "
         "llama.cpp's cache (`loom models` lists them all)"));
  v->addWidget(m_foundTitle);
  m_found = new QVBoxLayout;
  m_found->setSpacing(4);
  v->addLayout(m_found);
  m_foundMore = new QLabel(column);
  m_foundMore->setObjectName(QStringLiteral("Muted"));
  v->addWidget(m_foundMore);
  auto* drop = new QLabel(
      tr("Drop a .gguf file or a Hugging Face model folder anywhere on this window to open it."),
      column);
  drop->setObjectName(QStringLiteral("Muted"));
  drop->setAlignment(Qt::AlignCenter);
  v->addSpacing(8);
  v->addWidget(drop);

  auto* h = new QHBoxLayout;
  h->addStretch(1);
  h->addWidget(column, 4);
  h->addStretch(1);
  outer->addLayout(h);
  outer->addStretch(3);
  setRecentModels({});
  setFoundModels({});
}

void StartScreen::setFoundModels(const QVector<FoundModelInfo>& found) {
  m_foundAll = found;
  while (QLayoutItem* li = m_found->takeAt(0)) {
    delete li->widget();
    delete li;
  }
  int shown = 0, rest = 0;
  for (const FoundModelInfo& f : found) {
    if (m_recentPaths.contains(f.path)) continue;
    if (shown >= kFoundShown) {
      ++rest;
      continue;
    }
    ++shown;
    auto* b = new QPushButton(this);
    b->setObjectName(QStringLiteral("FoundModel"));
    QStringList what;
    for (const QString& s : {f.arch, f.quant}) {
      if (!s.isEmpty()) what << s;
    }
    what << QLocale::system().formattedDataSize(f.sizeBytes, 1, QLocale::DataSizeTraditionalFormat);
    b->setText(QStringLiteral("%1   ·   %2   —   %3")
                   .arg(f.name, what.join(QStringLiteral(" · ")), f.source));
    b->setStyleSheet(QStringLiteral("text-align:left;padding:8px 12px;"));
    b->setEnabled(f.error.isEmpty());
    b->setToolTip(f.error.isEmpty() ? f.path : tr("%1 cannot be read: %2").arg(f.path, f.error));
    const QString path = f.path;
    connect(b, &QPushButton::clicked, this, [this, path] { emit recentModelRequested(path); });
    m_found->addWidget(b);
  }
  m_foundTitle->setVisible(shown > 0);
  m_foundMore->setVisible(rest > 0);
  m_foundMore->setText(tr("and %n more (loom models lists them all)", nullptr, rest));
}

void StartScreen::setRecentModels(const QList<QPair<QString, QString>>& recent) {
  while (QLayoutItem* li = m_recent->takeAt(0)) {
    delete li->widget();
    delete li;
  }
  m_recentTitle->setVisible(!recent.isEmpty());
  m_recentPaths.clear();
  for (const auto& r : recent) m_recentPaths << r.first;
  for (const auto& r : recent) {
    auto* b = new QPushButton(this);
    const bool exists = QFileInfo::exists(r.first);
    b->setText(QStringLiteral("%1   —   %2").arg(r.second, r.first));
    b->setStyleSheet(QStringLiteral("text-align:left;padding:8px 12px;"));
    b->setEnabled(exists);
    b->setToolTip(exists ? r.first : tr("%1 is no longer there").arg(r.first));
    const QString path = r.first;
    connect(b, &QPushButton::clicked, this, [this, path] { emit recentModelRequested(path); });
    m_recent->addWidget(b);
  }
  setFoundModels(m_foundAll);  // a model just opened leaves the found list
}
