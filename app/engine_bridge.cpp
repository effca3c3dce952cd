#include "app/engine_bridge.h"

#include <QFileInfo>
#include <QLocale>
#include <QMap>
#include <algorithm>
#include <random>

#include "engine/model/model.h"
#include "engine/runtime/sampler.h"

namespace {

QString qstr(std::string_view s) {
  return QString::fromUtf8(s.data(), static_cast<qsizetype>(s.size()));
}

// Bytes per dtype name, to name a group's format ("Q8_0", or "Q4_K + Q6_K").
struct GroupBuilder {
  QMap<QString, qint64> bytesByType;
  TensorGroupInfo info;
  void add(const loom::Weight& w) {
    if (!w.present()) return;
    const auto bytes = static_cast<qint64>(w.row_bytes) * w.n_out;
    bytesByType[qstr(loom::dtype_name(w.dtype))] += bytes;
    info.bytes += bytes;
    const QString name = qstr(w.name());
    if (!info.tensors.contains(name)) info.tensors << name;
  }
  TensorGroupInfo done() {
    // Largest share first: a Q4_K_M layer reads "Q4_K + Q6_K".
    QList<QPair<qint64, QString>> order;
    for (auto it = bytesByType.cbegin(); it != bytesByType.cend(); ++it)
      order.append({it.value(), it.key()});
    std::sort(order.begin(), order.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    QStringList names;
    for (const auto& p : order) names << p.second;
    info.dtype = names.join(QStringLiteral(" + "));
    return info;
  }
};

}  // namespace

QString formatBytes(qint64 bytes) {
  return QLocale::system().formattedDataSize(bytes, bytes >= (qint64{1} << 30) ? 2 : 1,
                                             QLocale::DataSizeTraditionalFormat);
}

ModelSummary summarizeModel(const loom::Model& m, const QString& path, bool isDemo) {
  ModelSummary s;
  s.path = path;
  s.isDemo = isDemo;
  s.arch = qstr(m.hp.arch);
  s.description = qstr(m.describe());
  s.fileBytes = static_cast<qint64>(m.file ? m.file->file_size() : 0);
  s.weightBytes = static_cast<qint64>(m.weight_bytes());
  s.nLayer = static_cast<int>(m.hp.n_layer);
  s.nEmbd = static_cast<int>(m.hp.n_embd);
  s.nFf = static_cast<int>(m.hp.n_ff);
  s.nHead = static_cast<int>(m.hp.n_head);
  s.nHeadKv = static_cast<int>(m.hp.n_head_kv);
  s.headDim = static_cast<int>(m.hp.head_dim);
  s.nVocab = static_cast<int>(m.hp.n_vocab);
  s.nCtxTrain = static_cast<int>(m.hp.n_ctx_train);
  s.chatTemplate = QString::fromLatin1(loom::chat_family_name(m.chat_template.family()));
  for (const std::string& w : m.warnings) s.warnings << qstr(w);
  if (m.file) {
    auto name = m.file->get_string("general.name");
    if (name.ok() && name->has_value() && !(*name)->empty()) s.name = qstr(**name);
  }
  if (s.name.isEmpty()) s.name = QFileInfo(path).completeBaseName();

  GroupBuilder all;  // the whole model's dominant format
  for (const loom::LayerWeights& l : m.layers) {
    GroupBuilder attn, ffn, norm;
    for (const loom::Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv}) attn.add(*w);
    for (const loom::Weight* w : {&l.w_gate, &l.w_up, &l.w_down}) ffn.add(*w);
    for (const loom::Weight* w : {&l.attn_norm, &l.ffn_norm}) norm.add(*w);
    for (const loom::Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      all.add(*w);
    s.attnWeights << attn.done();
    s.ffnWeights << ffn.done();
    s.norms << norm.done();
  }
  GroupBuilder embd, out;
  embd.add(m.tok_embd);
  out.add(m.output_norm);
  out.add(m.output);
  s.embedding = embd.done();
  s.output = out.done();
  s.quant = all.done().dtype.section(QStringLiteral(" + "), 0, 1);  // at most the two largest
  if (s.quant.isEmpty()) s.quant = s.embedding.dtype;
  return s;
}

QStringList kvPrecisionChoices(const ModelSummary& model, QString* note) {
  // The KV cache (host blocks and the GPU's storage alike) stores F16, or Q8_0
  // in blocks of 32 values along a head.
  QStringList choices{QStringLiteral("F16")};
  if (model.headDim > 0 && model.headDim % 32 == 0) {
    choices << QStringLiteral("Q8_0");
    if (note)
      *note = QObject::tr(
          "One KV precision for every layer; changing it makes a new KV cache (the chat is "
          "re-read)");
  } else if (note) {
    *note = QObject::tr("Q8_0 needs a head size that is a multiple of 32 (this model: %1)")
                .arg(model.headDim);
  }
  return choices;
}

loom::SamplerParams toSamplerParams(const SamplingSettings& s) {
  loom::SamplerParams p;
  p.temperature = static_cast<float>(s.temperature);
  p.top_k = s.topK;
  p.top_p = static_cast<float>(s.topP);
  p.min_p = static_cast<float>(s.minP);
  p.repeat_penalty = static_cast<float>(s.repeatPenalty);
  if (s.seed >= 0) {
    p.seed = static_cast<uint64_t>(s.seed);
  } else {
    std::random_device rd;
    p.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  return p;
}
