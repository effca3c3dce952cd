// loom-chat: the Loom desktop app. See app/app_options.h for the command line.
#include <QApplication>
#include <QIcon>
#include <QTemporaryDir>
#include <cstdio>
#include <string_view>

#include "app/app_options.h"
#include "app/main_window.h"
#include "app/theme.h"
#include "engine/core/version.h"

namespace {

QtMessageHandler g_defaultHandler = nullptr;

// The offscreen platform warns about window-manager hints it cannot honour,
// once per window; that says nothing to a user of --screenshot.
void messageFilter(QtMsgType type, const QMessageLogContext& context, const QString& message) {
  if (message.contains(QLatin1String("propagateSizeHints"))) return;
  g_defaultHandler(type, context, message);
}

}  // namespace

int main(int argc, char** argv) {
  g_defaultHandler = qInstallMessageHandler(messageFilter);
  // --screenshot renders without a display, and --help / --version show no
  // window: pick the offscreen platform unless the caller chose one (e.g. xcb
  // under Xvfb), so that they work in a terminal with no desktop.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    const bool windowless = arg == "--screenshot" || arg == "--help" || arg == "-h" ||
                            arg == "--version" || arg == "-v";
    if (windowless && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM") &&
        qEnvironmentVariableIsEmpty("DISPLAY") && qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY")) {
      qputenv("QT_QPA_PLATFORM", "offscreen");
    }
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("loom"));
  QApplication::setApplicationDisplayName(QStringLiteral("Loom"));
  QApplication::setApplicationVersion(QString::fromUtf8(loom::version_line()));
  QApplication::setDesktopFileName(QStringLiteral("loom-chat"));
  QApplication::setWindowIcon(QIcon(QStringLiteral(":/loom/loom.svg")));

  AppOptions options;
  QString message;
  bool exitNow = false;
  if (!parseAppOptions(QApplication::arguments(), &options, &message, &exitNow)) {
    std::fprintf(stderr, "loom-chat: %s\n", qPrintable(message));
    return 2;
  }
  if (exitNow) {
    std::printf("%s\n", qPrintable(message));
    return 0;
  }
  // A screenshot is a demonstration: it keeps its chats away from the user's own.
  QTemporaryDir shotData;
  if (!options.screenshotPath.isEmpty() && options.dataDir.isEmpty())
    options.dataDir = shotData.path();

  theme::apply(app);
  MainWindow window(options);
  window.show();
  window.start();
  return QApplication::exec();
}
