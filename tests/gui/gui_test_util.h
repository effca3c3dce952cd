// Helpers of the GUI tests: fresh directories under the build tree, and a
// small synthetic model written once per run.
#pragma once

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QString>
#include <string>

#include "app/app_options.h"
#include "engine/model/synth.h"

namespace guitest {

/// An empty directory for one test (removed and made again).
inline QString freshDir(const QString& name) {
  QDir dir(QStringLiteral(LOOM_GUI_TEST_TMP "/") + name);
  dir.removeRecursively();
  QDir().mkpath(dir.path());
  return dir.path();
}

/// A 3-layer llama with head size 32 (so its KV cache can also be Q8_0),
/// Q8_0 weights, the built-in ChatML vocabulary. Written once per process.
inline QString tinyModel() {
  static const QString path = [] {
    // Per process: ctest runs each test in its own process, several at once.
    const QString dir =
        freshDir(QStringLiteral("models-%1").arg(QCoreApplication::applicationPid()));
    const QString p = dir + QStringLiteral("/tiny-llama.gguf");
    loom::SynthSpec spec;
    spec.name = "gui test model";
    spec.n_layer = 3;
    spec.n_embd = 128;
    spec.n_ff = 256;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_ctx = 1024;
    spec.weight_type = "q8_0";
    spec.seed = 3;
    auto r = loom::write_synthetic_model(spec, p.toStdString());
    return r.ok() ? p : QString();
  }();
  return path;
}

/// App options with fresh data and cache folders named after `name`, 2 threads.
inline AppOptions appOptions(const QString& name) {
  AppOptions o;
  o.dataDir = freshDir(name + QStringLiteral("-data"));
  o.cacheDir = freshDir(name + QStringLiteral("-cache"));
  o.threads = 2;
  return o;
}

/// A small synthetic llama at `path` (2 layers, width 64, one KV head).
inline bool writeSmallModel(const QString& path, const char* name, const char* weightType) {
  loom::SynthSpec spec;
  spec.name = name;
  spec.n_layer = 2;
  spec.n_embd = 64;
  spec.n_ff = 128;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.n_ctx = 512;
  spec.weight_type = weightType;
  spec.seed = 8;
  return loom::write_synthetic_model(spec, path.toStdString()).ok();
}

/// A copy of the tiny model cut short: a load must fail with the engine's message.
inline QString truncatedModel() {
  const QString src = tinyModel();
  const QString p =
      freshDir(QStringLiteral("truncated-%1").arg(QCoreApplication::applicationPid())) +
      QStringLiteral("/cut.gguf");
  QFile in(src);
  if (!in.open(QIODevice::ReadOnly)) return {};
  const QByteArray bytes = in.readAll();
  QFile out(p);
  if (!out.open(QIODevice::WriteOnly)) return {};
  out.write(bytes.left(bytes.size() * 2 / 3));
  return p;
}

}  // namespace guitest
