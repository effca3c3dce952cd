#include "app/theme.h"

#include <QApplication>
#include <QFontDatabase>
#include <QPalette>

namespace theme {

QColor backendColor(const QString& kindOrId) {
  const QString kind = kindOrId.section(QLatin1Char(':'), 0, 0).toLower();
  if (kind == QLatin1String("cpu")) return kCpu;
  if (kind == QLatin1String("vulkan")) return kVulkan;
  if (kind == QLatin1String("cuda")) return kCuda;
  return kMuted;
}

QFont uiFont(qreal pointSize) {
  QFont f;
  // Inter reads well at small sizes (grid cells, chart labels); fall back to the system's.
  if (QFontDatabase::families().contains(QStringLiteral("Inter")))
    f.setFamily(QStringLiteral("Inter"));
  f.setPointSizeF(pointSize);
  return f;
}

QFont monoFont(qreal pointSize) {
  QFont f = QFontDatabase::systemFont(QFontDatabase::FixedFont);
  if (QFontDatabase::families().contains(QStringLiteral("DejaVu Sans Mono")))
    f.setFamily(QStringLiteral("DejaVu Sans Mono"));
  f.setPointSizeF(pointSize);
  return f;
}

namespace {

// Object names give the parts of the window their look; widgets set them.
QString styleSheet() {
  return QStringLiteral(R"css(
QMainWindow, QWidget#Central { background: %1; }
QToolTip { background: #1f2937; color: #f9fafb; border: none; padding: 6px 8px; border-radius: 6px; }

QWidget#Sidebar { background: %2; border-right: 1px solid %3; }
QLabel#AppTitle { font-size: 15pt; font-weight: 700; color: %4; }
QLabel#SectionLabel { color: %5; font-size: 8.5pt; font-weight: 600; }
QLineEdit#Search { background: %1; border: 1px solid %3; border-radius: 8px; padding: 6px 10px; }
QLineEdit#Search:focus { border-color: %6; }
QListView#ChatList { background: transparent; border: none; outline: none; }
QListView#ChatList::item { padding: 8px 10px; border-radius: 8px; color: %4; margin: 1px 0; }
QListView#ChatList::item:hover { background: #eceef3; }
QListView#ChatList::item:selected { background: %7; color: %6; }

QPushButton { background: %1; border: 1px solid %3; border-radius: 8px; padding: 6px 14px; color: %4; }
QPushButton:hover { background: #f3f4f6; }
QPushButton:disabled { color: #a1a7b3; background: #f6f7f9; }
QPushButton#Primary { background: %6; color: white; border: none; font-weight: 600; }
QPushButton#Primary:hover { background: #4338ca; }
QPushButton#Primary:disabled { background: #c7c9f4; color: white; }
QPushButton#Danger { background: %1; color: %8; border: 1px solid #f3c2c2; font-weight: 600; }
QPushButton#Danger:hover { background: #fef2f2; }
QToolButton#MessageAction { border: none; color: %5; padding: 2px 6px; border-radius: 6px; font-size: 8.5pt; }
QToolButton#MessageAction:hover { background: #eef0f4; color: %4; }

QFrame#ModelCard { background: %1; border: 1px solid %3; border-radius: 10px; }
QLabel#ModelName { font-weight: 700; color: %4; }
QLabel#Muted, QLabel#ModelMeta { color: %5; }
QLabel#DemoBadge { background: #fff4dd; color: #92400e; border-radius: 6px; padding: 2px 6px; font-size: 8.5pt; font-weight: 600; }

QWidget#ChatHeader { background: %1; border-bottom: 1px solid %3; }
QLabel#ChatTitle { font-size: 12.5pt; font-weight: 600; color: %4; }
QScrollArea#Transcript { background: %1; border: none; }
QWidget#TranscriptColumn { background: %1; }
QFrame#UserBubble { background: %9; border-radius: 14px; }
QLabel#RoleLabel { font-weight: 700; color: %4; }
QLabel#MessageMeta { color: %5; font-size: 8.5pt; }
QTextBrowser#MessageBody { background: transparent; border: none; }

QFrame#Composer { background: %1; border: 1px solid #d6d9e0; border-radius: 14px; }
QPlainTextEdit#ComposerEdit { background: transparent; border: none; font-size: 10.5pt; }
QLabel#EditBanner { background: %7; color: %6; border-radius: 8px; padding: 4px 10px; }

QWidget#RightPanel { background: %10; border-left: 1px solid %3; }
QTabWidget::pane { border: none; background: %10; }
QTabBar::tab { background: transparent; padding: 8px 14px; color: %5; border: none; border-bottom: 2px solid transparent; font-weight: 600; }
QTabBar::tab:selected { color: %4; border-bottom: 2px solid %6; }
QTabBar::tab:hover { color: %4; }
QTabBar::tab:disabled { color: #b8bcc6; }
QFrame#Card { background: %1; border: 1px solid %3; border-radius: 10px; }
QLabel#CardTitle { font-weight: 700; color: %4; }
QLabel#StatValue { font-size: 15pt; font-weight: 700; color: %4; }
QLabel#StatLabel { color: %5; font-size: 8.5pt; }
QTableView#PlacementGrid { background: %1; border: 1px solid %3; border-radius: 10px; gridline-color: transparent; }
QHeaderView::section { background: %1; color: %5; border: none; padding: 4px 6px; font-size: 8.5pt; font-weight: 600; }

QComboBox, QSpinBox, QDoubleSpinBox { background: %1; border: 1px solid %3; border-radius: 7px; padding: 4px 8px; min-height: 20px; }
QComboBox:hover, QSpinBox:hover, QDoubleSpinBox:hover { border-color: #c9cdd6; }
QComboBox::drop-down { border: none; width: 24px; }
QComboBox::down-arrow { image: url(:/loom/chevron-down.svg); width: 12px; height: 12px; }
QComboBox QAbstractItemView { background: %1; border: 1px solid %3; selection-background-color: %7; selection-color: %4; outline: none; }
QSpinBox, QDoubleSpinBox { padding-right: 22px; }
QSpinBox::up-button, QDoubleSpinBox::up-button { subcontrol-origin: border; subcontrol-position: top right; width: 20px; border: none; background: transparent; }
QSpinBox::down-button, QDoubleSpinBox::down-button { subcontrol-origin: border; subcontrol-position: bottom right; width: 20px; border: none; background: transparent; }
QSpinBox::up-arrow, QDoubleSpinBox::up-arrow { image: url(:/loom/chevron-up.svg); width: 10px; height: 10px; }
QSpinBox::down-arrow, QDoubleSpinBox::down-arrow { image: url(:/loom/chevron-down.svg); width: 10px; height: 10px; }
QSlider::groove:horizontal { height: 4px; background: #e5e7eb; border-radius: 2px; }
QSlider::handle:horizontal { background: %1; border: 1px solid #c9cdd6; width: 14px; height: 14px; margin: -6px 0; border-radius: 8px; }
QSlider::sub-page:horizontal { background: %6; border-radius: 2px; }
QSlider::groove:horizontal:disabled { background: #eef0f3; }
QSlider::handle:horizontal:disabled { background: #f6f7f9; border-color: #e3e5ea; }
QSlider::sub-page:horizontal:disabled { background: #eef0f3; }
QComboBox:disabled, QSpinBox:disabled { color: #a1a7b3; background: #f6f7f9; }
QPlainTextEdit#SystemPrompt { background: %1; border: 1px solid %3; border-radius: 8px; padding: 4px; }
QProgressBar { background: #e9ebf0; border: none; border-radius: 4px; height: 8px; text-align: center; }
QProgressBar::chunk { background: %6; border-radius: 4px; }
QFrame#LoadBanner { background: %7; border-bottom: 1px solid #d9dcfb; }
QFrame#ErrorBanner { background: #fef2f2; border-bottom: 1px solid #fecaca; }
QLabel#ErrorText { color: #991b1b; }
QWidget#StartScreen { background: %1; }
QLabel#StartTitle { font-size: 22pt; font-weight: 700; color: %4; }
QLabel#StartSubtitle { font-size: 11pt; color: %5; }
QScrollBar:vertical { background: transparent; width: 10px; margin: 2px; }
QScrollBar::handle:vertical { background: #d5d8df; border-radius: 4px; min-height: 30px; }
QScrollBar::add-line:vertical, QScrollBar::sub-line:vertical { height: 0; }
QScrollBar:horizontal { background: transparent; height: 10px; margin: 2px; }
QScrollBar::handle:horizontal { background: #d5d8df; border-radius: 4px; min-width: 30px; }
QScrollBar::add-line:horizontal, QScrollBar::sub-line:horizontal { width: 0; }
QSplitter::handle { background: %3; }
)css")
      .arg(css(kWindow), css(kSidebar), css(kBorder), css(kText), css(kMuted), css(kAccent),
           css(kAccentSoft), css(kDanger), css(kUserBubble))
      .arg(css(kPanel));
}

}  // namespace

void apply(QApplication& app) {
  app.setStyle(QStringLiteral("Fusion"));  // the same look on every desktop and offscreen
  app.setFont(uiFont());
  QPalette p = app.palette();
  p.setColor(QPalette::Window, kWindow);
  p.setColor(QPalette::Base, kWindow);
  p.setColor(QPalette::AlternateBase, kPanel);
  p.setColor(QPalette::Text, kText);
  p.setColor(QPalette::WindowText, kText);
  p.setColor(QPalette::ButtonText, kText);
  p.setColor(QPalette::Button, kWindow);
  p.setColor(QPalette::Highlight, kAccent);
  p.setColor(QPalette::HighlightedText, Qt::white);
  p.setColor(QPalette::PlaceholderText, QColor(0x9c, 0xa3, 0xaf));
  p.setColor(QPalette::Link, kAccent);
  p.setColor(QPalette::ToolTipBase, QColor(0x1f, 0x29, 0x37));
  p.setColor(QPalette::ToolTipText, QColor(0xf9, 0xfa, 0xfb));
  app.setPalette(p);
  app.setStyleSheet(styleSheet());
}

}  // namespace theme
