// Conversions between the engine's types and the app's (Qt) value types. The
// only app file besides engine_worker.cpp that includes engine model headers.
#pragma once

#include <QString>
#include <QStringList>

#include "app/app_types.h"

namespace loom {
struct Model;
struct SamplerParams;
}  // namespace loom

/// What the GUI shows about `model`, loaded from `path`.
ModelSummary summarizeModel(const loom::Model& model, const QString& path, bool isDemo);

/// KV cache precisions the engine can use for this model, and a note saying
/// why others are not offered (shown in the grid's menu).
QStringList kvPrecisionChoices(const ModelSummary& model, QString* note);

/// The engine's sampler parameters for a chat's settings; a negative seed
/// becomes a fresh random one.
loom::SamplerParams toSamplerParams(const SamplingSettings& s);

/// "1.2 GB", "512 MB": sizes as the UI prints them.
QString formatBytes(qint64 bytes);

/// The demo model's shape: the "stories-like" preset in Q8_0, seed 1 (the
/// same file `loom synth --preset stories-like --dtype q8_0 --seed 1` writes).
struct DemoModelSpec {
  QString preset = QStringLiteral("stories-like");
  QString weightType = QStringLiteral("q8_0");
  quint64 seed = 1;
};
