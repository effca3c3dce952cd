#include "app/app_options.h"

#include <QCommandLineParser>
#include <QDir>
#include <QStandardPaths>

QString defaultDataDir() {
  return QStandardPaths::writableLocation(QStandardPaths::GenericDataLocation) +
         QStringLiteral("/loom");
}

QString defaultCacheDir() {
  return QStandardPaths::writableLocation(QStandardPaths::GenericCacheLocation) +
         QStringLiteral("/loom");
}

QString AppOptions::dbPath() const {
  return QDir(dataDir.isEmpty() ? defaultDataDir() : dataDir).filePath(QStringLiteral("loom.db"));
}

QString AppOptions::demoModelPath() const {
  return QDir(cacheDir.isEmpty() ? defaultCacheDir() : cacheDir)
      .filePath(QStringLiteral("demo-stories-like.gguf"));
}

bool parseAppOptions(const QStringList& args, AppOptions* out, QString* error, bool* exitNow) {
  *exitNow = false;
  QCommandLineParser p;
  p.setApplicationDescription(
      QStringLiteral("Loom: chat with a local model and watch where it runs."));
  const QCommandLineOption help = p.addHelpOption();
  const QCommandLineOption version = p.addVersionOption();
  const QCommandLineOption demo(
      QStringLiteral("demo"),
      QStringLiteral("Open the built-in demo model (random weights; written on first use)."));
  const QCommandLineOption shot(
      QStringLiteral("screenshot"),
      QStringLiteral("Render the main window to FILE.png and quit (with --demo: after a "
                     "finished demo exchange, charts populated)."),
      QStringLiteral("FILE"));
  const QCommandLineOption tab(
      QStringLiteral("tab"),
      QStringLiteral("Right-panel tab in the screenshot: placement, performance, devices, chat."),
      QStringLiteral("NAME"), QStringLiteral("performance"));
  const QCommandLineOption data(
      QStringLiteral("data-dir"),
      QStringLiteral("Where the chats are kept (default %1).").arg(defaultDataDir()),
      QStringLiteral("DIR"));
  const QCommandLineOption cache(
      QStringLiteral("cache-dir"),
      QStringLiteral("Where the demo model is written (default %1).").arg(defaultCacheDir()),
      QStringLiteral("DIR"));
  const QCommandLineOption threads(QStringLiteral("threads"),
                                   QStringLiteral("CPU threads for the engine (default: all)."),
                                   QStringLiteral("N"), QStringLiteral("0"));
  const QCommandLineOption size(
      QStringLiteral("size"),
      QStringLiteral("Window size in pixels, e.g. 1000x700 (for --screenshot; default: the last "
                     "size, or 1440x900)."),
      QStringLiteral("WxH"));
  for (const auto& o : {demo, shot, tab, data, cache, threads, size}) p.addOption(o);
  p.addPositionalArgument(QStringLiteral("model"),
                          QStringLiteral("A GGUF model file, or a Hugging Face model folder, to "
                                         "open."),
                          QStringLiteral("[MODEL.gguf | MODEL_DIR]"));

  if (!p.parse(args)) {
    *error = p.errorText();
    return false;
  }
  if (p.isSet(help)) {
    *error = p.helpText();
    *exitNow = true;
    return true;
  }
  if (p.isSet(version)) {
    *error = QStringLiteral("loom-chat %1").arg(QCoreApplication::applicationVersion());
    *exitNow = true;
    return true;
  }
  const QStringList pos = p.positionalArguments();
  if (pos.size() > 1) {
    *error = QStringLiteral("one model at a time (got %1 files)").arg(pos.size());
    return false;
  }
  if (!pos.isEmpty()) out->modelPath = pos.first();
  out->demo = p.isSet(demo);
  out->screenshotPath = p.value(shot);
  out->screenshotTab = p.value(tab).toLower();
  static const QStringList kTabs = {QStringLiteral("placement"), QStringLiteral("performance"),
                                    QStringLiteral("devices"), QStringLiteral("chat")};
  if (!kTabs.contains(out->screenshotTab)) {
    *error = QStringLiteral("--tab: one of %1").arg(kTabs.join(QStringLiteral(", ")));
    return false;
  }
  out->dataDir = p.value(data);
  out->cacheDir = p.value(cache);
  bool ok = false;
  out->threads = p.value(threads).toInt(&ok);
  if (!ok || out->threads < 0) {
    *error = QStringLiteral("--threads: a number of threads, 0 for all");
    return false;
  }
  if (p.isSet(size)) {
    const QStringList wh = p.value(size).toLower().split(QLatin1Char('x'));
    bool okW = false, okH = false;
    const int w = wh.size() == 2 ? wh[0].toInt(&okW) : 0;
    const int h = wh.size() == 2 ? wh[1].toInt(&okH) : 0;
    if (!okW || !okH || w <= 0 || h <= 0) {
      *error = QStringLiteral("--size: WIDTHxHEIGHT in pixels, e.g. 1000x700");
      return false;
    }
    out->windowSize = QSize(w, h);
  }
  if (out->demo && !out->modelPath.isEmpty()) {
    *error = QStringLiteral("--demo and a model file: choose one");
    return false;
  }
  return true;
}
