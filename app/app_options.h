// loom-chat's command line, and where it keeps its files.
//
//   loom-chat [MODEL.gguf] [--demo] [--screenshot FILE.png [--tab NAME]]
//             [--data-dir DIR] [--cache-dir DIR] [--threads N] [--size WxH]
#pragma once

#include <QSize>
#include <QString>
#include <QStringList>

struct AppOptions {
  QString modelPath;       ///< a model to open at start
  bool demo = false;       ///< open the built-in demo model at start
  QString screenshotPath;  ///< render the window to this PNG and quit
  QString screenshotTab =
      QStringLiteral("performance");  ///< the right panel's tab in the screenshot
  QString dataDir;                    ///< the store (loom.db); empty: the user's data directory
  QString cacheDir;                   ///< the demo model; empty: the user's cache directory
  int threads = 0;                    ///< CPU threads for the engine (0: all)
  QSize windowSize;                   ///< --size; invalid: the saved size, or 1440x900

  QString dbPath() const;
  QString demoModelPath() const;
};

/// Parses `args` (argv, the program name first). False with a message for the
/// user on a bad command line; `exitNow` with no error for --help/--version
/// (the text to print is in `error`).
bool parseAppOptions(const QStringList& args, AppOptions* out, QString* error, bool* exitNow);

/// ~/.local/share/loom (XDG_DATA_HOME respected).
QString defaultDataDir();
/// ~/.cache/loom (XDG_CACHE_HOME respected): the same place `packaging/dev.sh run` writes the demo
/// model.
QString defaultCacheDir();
