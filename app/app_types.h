// Plain value types that cross the GUI <-> engine-worker boundary in queued
// signals. Qt types only: the engine's own types stay inside engine_worker.cpp
// and engine_bridge.cpp.
#pragma once

#include <QMetaType>
#include <QString>
#include <QStringList>
#include <QVector>

/// One tensor group of a layer as the model file has it.
struct TensorGroupInfo {
  QString dtype;  ///< e.g. "Q8_0", or "Q4_K + Q6_K" for a mixture
  qint64 bytes = 0;
  QStringList tensors;  ///< tensor names, for tooltips
};

/// What the GUI shows about a loaded model (built on the worker from loom::Model).
struct ModelSummary {
  QString path;
  QString name;          ///< general.name, or the file name
  QString arch;          ///< llama, qwen2, phi3...
  QString description;   ///< the engine's own one-line description
  QString quant;         ///< the dominant weight format
  QString chatTemplate;  ///< template family (chatml, llama3...)
  qint64 fileBytes = 0;
  qint64 weightBytes = 0;
  int nLayer = 0, nEmbd = 0, nFf = 0, nHead = 0, nHeadKv = 0, headDim = 0, nVocab = 0;
  int nCtxTrain = 0;
  int nCtx = 0;         ///< context of the session now
  QString kvDtype;      ///< KV cache precision now (F16, Q8_0)
  bool isDemo = false;  ///< the built-in synthetic model (random weights)
  QStringList warnings;
  // Per-layer tensor groups, for the placement grid.
  QVector<TensorGroupInfo> attnWeights, ffnWeights, norms;
  TensorGroupInfo embedding, output;
};

/// One turn of the conversation sent to the engine.
struct ChatTurn {
  QString role;
  QString content;
};

/// Sampling and length settings of one request (a chat's settings).
struct SamplingSettings {
  double temperature = 0.8;
  int topK = 40;
  double topP = 0.95;
  double minP = 0.05;
  double repeatPenalty = 1.1;
  qint64 seed = -1;     ///< < 0: a new random seed each turn
  int maxTokens = 512;  ///< < 0: until the context is full
  int nCtx = 0;         ///< 0: the model's own (capped by the engine)
};

/// Where the KV cache may live beyond the GPU: host RAM up to a budget, the
/// rest in a spill file on the SSD (engine: loom::KvTierConfig).
struct KvTierSettings {
  /// 0: automatic, a GPU layer keeps all its KV on the device while it fits
  /// beside the weights, else what is left (loom::default_kv_device_budget);
  /// > 0: device slots up to this many MiB in all, older blocks in RAM
  /// (engine: device_budget).
  qint64 gpuBudgetMiB = 0;
  qint64 ramBudgetMiB = -1;  ///< < 0: automatic (from free memory); 0: no limit (nothing spills)
  QString spillDir;          ///< empty: the user cache folder (default_kv_spill_dir)
  QString policy = QStringLiteral("importance");  ///< importance | lru
  QString spillType;  ///< empty: the cache's own precision; "q8_0" or "fp8": requantized on the SSD
  bool operator==(const KvTierSettings&) const = default;
};

/// A model already on the machine (engine: loom::FoundModel), for the start screen.
struct FoundModelInfo {
  QString path;  ///< a GGUF file or a Hugging Face folder
  QString name;
  QString arch;
  QString quant;
  qint64 sizeBytes = 0;
  QString source;  ///< "Hugging Face cache", "LM Studio", "Ollama", "llama.cpp cache", "folder"
  QString error;   ///< non-empty: its header could not be read
};

/// A request to generate one assistant message.
struct GenerationRequest {
  quint64 requestId = 0;
  qint64 chatId = 0;
  qint64 messageId = 0;  ///< the assistant message, already saved (empty, streaming)
  QVector<ChatTurn> turns;
  SamplingSettings sampling;
};

/// How a generation ended.
struct GenerationResult {
  quint64 requestId = 0;
  qint64 messageId = 0;
  QString text;        ///< the whole message
  QString stopReason;  ///< the engine's words ("end of generation token", "cancelled"...)
  bool cancelled = false;
  QString error;  ///< non-empty: generation failed with this engine message
  int nPrompt = 0, nReused = 0, nGenerated = 0;
  double ttftMs = 0, tokensPerSecond = 0;
  QString meta;  ///< the line saved with the message ("42 tokens · 35 tok/s")
};

Q_DECLARE_METATYPE(ModelSummary)
Q_DECLARE_METATYPE(GenerationRequest)
Q_DECLARE_METATYPE(GenerationResult)
Q_DECLARE_METATYPE(KvTierSettings)
Q_DECLARE_METATYPE(QVector<FoundModelInfo>)
