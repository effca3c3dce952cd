#include "app/placement_planner.h"

#include <QObject>
#include <algorithm>

#include "app/engine_bridge.h"
#include "cpu/ref/quants.h"
#include "engine/model/model.h"
#include "engine/placement/adaptive.h"
#include "engine/placement/cost_model.h"
#include "engine/placement/placement.h"
#include "engine/placement/strategy.h"

namespace {

QString qstr(std::string_view s) {
  return QString::fromUtf8(s.data(), static_cast<qsizetype>(s.size()));
}

// Precisions the grid offers for weights, when every matrix of the group can be
// re-quantized to them (a reference quantizer, rows a multiple of the block).
constexpr loom::DType kWeightChoices[] = {loom::DType::kF16,  loom::DType::kQ8_0,
                                          loom::DType::kQ6_K, loom::DType::kQ5_0,
                                          loom::DType::kQ4_K, loom::DType::kQ4_0};

QStringList choicesFor(const std::vector<const loom::Weight*>& ws) {
  QStringList out{kKeepPrecision};
  bool anyMatrix = false;
  for (const loom::Weight* w : ws) anyMatrix |= w->n_out > 1;
  if (!anyMatrix) return {};
  for (loom::DType d : kWeightChoices) {
    bool ok = loom::ref::has_reference(d);
    for (const loom::Weight* w : ws) {
      if (!ok) break;
      if (w->n_out <= 1) continue;  // vectors stay F32
      ok = loom::ref::has_reference(w->dtype) &&
           loom::dtype_row_bytes(d, static_cast<uint64_t>(w->n_in)).has_value();
    }
    if (ok) out << qstr(loom::dtype_name(d));
  }
  return out;
}

int column(loom::OpGroup g) {
  return static_cast<int>(g);
}  // the grid's columns follow the engine's groups

loom::Unit unitOf(const QString& backendId) {
  return backendId == QLatin1String("cpu") ? loom::Unit::kCpu : loom::Unit::kGpu;
}

std::optional<loom::DType> dtypeOf(const QString& name) {
  if (name.isEmpty() || name == kKeepPrecision) return std::nullopt;
  return loom::dtype_from_name(name.toStdString());
}

QString strategyText(const PlacementPlan& plan) {
  if (plan.strategy == QLatin1String("layers"))
    return QStringLiteral("layers:%1").arg(plan.gpuLayers);
  return plan.strategy;
}

}  // namespace

struct PlacementPlanner::Choices {
  QVector<QVector<QStringList>> rows;  ///< [grid row][column]: precisions offered
  QStringList kv;
  QString kvNote;
};

PlacementPlanner::PlacementPlanner(std::shared_ptr<const loom::Model> model,
                                   const ModelSummary& summary, const loom::CostModel& cost,
                                   QString gpuBackendId, qint64 gpuMemoryBytes)
    : m_model(std::move(model)),
      m_summary(summary),
      m_cost(std::make_unique<loom::CostModel>(cost)),
      m_gpuId(std::move(gpuBackendId)),
      m_gpuMemory(gpuMemoryBytes),
      m_choices(std::make_unique<Choices>()) {
  const loom::Model& m = *m_model;
  const int n = static_cast<int>(m.hp.n_layer);
  m_choices->rows.resize(n + 2);
  for (auto& r : m_choices->rows) r.resize(kColCount);
  m_choices->rows[0][0] = choicesFor({&m.tok_embd});
  m_choices->rows[n + 1][0] = choicesFor({&m.output});
  for (int l = 0; l < n; ++l) {
    for (loom::OpGroup g : {loom::OpGroup::kAttnW, loom::OpGroup::kFfn}) {
      m_choices->rows[l + 1][column(g)] = choicesFor(loom::group_weights(m, l, g));
    }
  }
  m_choices->kv = kvPrecisionChoices(m_summary, &m_choices->kvNote);
}

PlacementPlanner::~PlacementPlanner() = default;

PlacementPlan PlacementPlanner::toPlan(const loom::Placement& p, const QString& kvDtype,
                                       int nCtx) const {
  PlacementPlan plan = PlacementPlan::allOn(QStringLiteral("cpu"), m_summary, kvDtype,
                                            m_choices->kv, m_choices->kvNote);
  plan.nCtx = nCtx;
  const QString strategy = qstr(p.strategy);
  if (strategy.startsWith(QLatin1String("layers:"))) {
    plan.strategy = QStringLiteral("layers");
    plan.gpuLayers = strategy.mid(7).toInt();
  } else {
    plan.strategy = strategy.isEmpty() ? QStringLiteral("custom") : strategy;
  }
  auto fill = [&](PlacementCell& c, const loom::GroupPlace& g, const QStringList& choices) {
    c.backend = g.unit == loom::Unit::kGpu && hasGpu() ? m_gpuId : QStringLiteral("cpu");
    if (!choices.isEmpty()) {
      c.precisions = choices;
      c.precisionNote = QObject::tr(
          "Weights are re-quantized from the file's format when the placement is applied");
    }
    if (g.dtype && qstr(loom::dtype_name(*g.dtype)) != c.fileDtype && !choices.isEmpty()) {
      c.dtype = qstr(loom::dtype_name(*g.dtype));
      c.precision = c.dtype;
    }
  };
  const int n = plan.layerCount();
  fill(plan.rows[0][0], p.embed, m_choices->rows[0][0]);
  fill(plan.rows[n + 1][0], p.output, m_choices->rows[n + 1][0]);
  for (int l = 0; l < n && l < static_cast<int>(p.layers.size()); ++l) {
    const loom::LayerPlace& lp = p.layers[static_cast<size_t>(l)];
    for (loom::OpGroup g : {loom::OpGroup::kAttnW, loom::OpGroup::kFfn, loom::OpGroup::kNorm}) {
      fill(plan.rows[l + 1][column(g)], lp[g], m_choices->rows[l + 1][column(g)]);
    }
    PlacementCell& kv = plan.rows[l + 1][kColAttnKv];
    kv.backend = lp[loom::OpGroup::kAttn].unit == loom::Unit::kGpu && hasGpu()
                     ? m_gpuId
                     : QStringLiteral("cpu");
  }
  return plan;
}

loom::Placement PlacementPlanner::toPlacement(const PlacementPlan& plan) const {
  const int n = plan.layerCount();
  loom::Placement p = loom::Placement::uniform(n, loom::Unit::kCpu);
  p.strategy = strategyText(plan).toStdString();
  if (plan.rows.size() < 2) return p;
  auto place = [](const PlacementCell& c) {
    loom::GroupPlace g;
    g.unit = unitOf(c.backend);
    g.dtype = dtypeOf(c.dtype);
    return g;
  };
  p.embed = place(plan.rows[0][0]);
  p.output = place(plan.rows[n + 1][0]);
  for (int l = 0; l < n; ++l) {
    loom::LayerPlace& lp = p.layers[static_cast<size_t>(l)];
    for (loom::OpGroup g : {loom::OpGroup::kAttnW, loom::OpGroup::kFfn, loom::OpGroup::kNorm}) {
      lp[g] = place(plan.rows[l + 1][column(g)]);
    }
    // The KV precision is the session's (SessionConfig), not a weight precision.
    lp[loom::OpGroup::kAttn].unit = unitOf(plan.rows[l + 1][kColAttnKv].backend);
  }
  return p;
}

bool PlacementPlanner::check(const PlacementPlan& plan, QString* error) const {
  if (plan.rows.size() != m_summary.nLayer + 2) {
    *error = QObject::tr("This placement has %1 layers; the model has %2.")
                 .arg(plan.layerCount())
                 .arg(m_summary.nLayer);
    return false;
  }
  const QString kv = plan.kvPrecision();
  if (kv.isEmpty()) {
    *error = QObject::tr("The KV cache has one precision for all layers.");
    return false;
  }
  if (!m_choices->kv.contains(kv)) {
    *error = QObject::tr("KV cache precision %1 is not offered for this model.").arg(kv);
    return false;
  }
  const loom::Placement p = toPlacement(plan);
  if (p.uses(loom::Unit::kGpu) && !hasGpu()) {
    *error = QObject::tr("The placement puts work on the GPU, and no GPU is in use.");
    return false;
  }
  if (loom::Status st = loom::validate_placement(*m_model, p); !st.ok()) {
    *error = qstr(st.message());
    return false;
  }
  return true;
}

int64_t PlacementPlanner::prefillChunk() const {
  return loom::default_prefill_chunk(*m_model, hasGpu() ? static_cast<uint64_t>(m_gpuMemory) : 0);
}

loom::StrategyOptions PlacementPlanner::options(const QString& strategy, int gpuLayers,
                                                int vramBudgetMiB,
                                                const PlacementPlan& current) const {
  const QString kv =
      current.kvPrecision().isEmpty() ? QStringLiteral("F16") : current.kvPrecision();
  loom::StrategyOptions so;
  // "adaptive" starts where auto does; the controller moves it from there.
  so.strategy = strategy == QLatin1String("layers")
                    ? QStringLiteral("layers:%1").arg(gpuLayers).toStdString()
                : strategy == QLatin1String("adaptive") ? std::string("auto")
                                                        : strategy.toStdString();
  // 0 means "no limit" to the engine; the slider's 0 means nothing on the GPU.
  so.vram_budget = std::max<uint64_t>(1, static_cast<uint64_t>(std::max(0, vramBudgetMiB)) << 20);
  so.max_chunk = prefillChunk();
  so.has_gpu = hasGpu();
  so.n_ctx = current.nCtx > 0 ? current.nCtx : std::min<int64_t>(m_model->hp.n_ctx_train, 4096);
  so.kv_dtype = dtypeOf(kv).value_or(loom::DType::kF16);
  return so;
}

bool PlacementPlanner::plan(const QString& strategy, int gpuLayers, int vramBudgetMiB,
                            const PlacementPlan& current, PlacementPlan* out,
                            QString* error) const {
  if (strategy == QLatin1String("custom")) {
    *out = current;
    out->strategy = strategy;
    return true;
  }
  const QString kv =
      current.kvPrecision().isEmpty() ? QStringLiteral("F16") : current.kvPrecision();
  auto p =
      loom::make_placement(*m_model, options(strategy, gpuLayers, vramBudgetMiB, current), *m_cost);
  if (!p.ok()) {
    *error = qstr(p.message());
    return false;
  }
  *out = toPlan(*p, kv, current.nCtx);
  out->strategy = strategy;
  out->gpuLayers = gpuLayers;
  out->vramBudgetMiB = vramBudgetMiB;
  return true;
}

std::shared_ptr<loom::AdaptiveController> PlacementPlanner::makeAdaptive(
    const PlacementPlan& plan) const {
  if (plan.strategy != QLatin1String("adaptive") || !hasGpu()) return nullptr;
  return std::make_shared<loom::AdaptiveController>(
      *m_model, options(plan.strategy, plan.gpuLayers, plan.vramBudgetMiB, plan), *m_cost);
}

PlanEstimate PlacementPlanner::estimate(const PlacementPlan& plan, int nPast) const {
  PlanEstimate e;
  if (plan.rows.size() != m_summary.nLayer + 2) return e;
  const loom::Model& m = *m_model;
  const loom::Placement p = toPlacement(plan);
  const loom::DType kv = dtypeOf(plan.kvPrecision()).value_or(loom::DType::kF16);
  const int64_t nCtx = plan.nCtx > 0 ? plan.nCtx : std::min<int64_t>(m.hp.n_ctx_train, 4096);
  e.nPast = static_cast<int>(
      std::clamp<int64_t>(nPast < 0 ? 256 : nPast, 1, std::max<int64_t>(1, nCtx - 1)));
  const loom::CostModel::Prediction pr = m_cost->predict(m, p, e.nPast, kv);
  e.stepMs = pr.step_ms;
  e.rowMs.reserve(plan.rows.size());
  e.rowMs << pr.embed_ms;
  for (double ms : pr.layer_ms) e.rowMs << ms;
  e.rowMs << pr.output_ms;
  e.transfers = static_cast<int>(pr.transfers);
  const loom::PlacementBytes b = loom::placement_bytes(m, p, loom::kv_bytes_per_layer(m, nCtx, kv));
  e.cpuWeights = static_cast<qint64>(b.weights[static_cast<size_t>(loom::Unit::kCpu)]);
  e.cpuKv = static_cast<qint64>(b.kv[static_cast<size_t>(loom::Unit::kCpu)]);
  e.gpuWeights = static_cast<qint64>(b.weights[static_cast<size_t>(loom::Unit::kGpu)]);
  e.gpuKv = static_cast<qint64>(b.kv[static_cast<size_t>(loom::Unit::kGpu)]);
  e.gpuOverhead = p.uses(loom::Unit::kGpu)
                      ? static_cast<qint64>(loom::gpu_overhead_bytes(m, prefillChunk()))
                      : 0;
  e.costMeasured = m_cost->measured;
  e.costText = qstr(m_cost->describe());
  e.valid = true;
  return e;
}

QString PlacementPlanner::toPresetJson(const PlacementPlan& plan) const {
  loom::Placement p = toPlacement(plan);
  const auto kv = dtypeOf(plan.kvPrecision());
  for (auto& lp : p.layers) lp[loom::OpGroup::kAttn].dtype = kv;
  return qstr(p.to_json());
}

bool PlacementPlanner::fromPresetJson(const QString& json, const PlacementPlan& current,
                                      PlacementPlan* out, QString* error) const {
  auto p = loom::Placement::from_json(json.toStdString(), m_model->hp.n_layer);
  if (!p.ok()) {
    *error = qstr(p.message());
    return false;
  }
  if (p->uses(loom::Unit::kGpu) && !hasGpu()) {
    *error = QObject::tr("This preset puts work on the GPU, and no GPU is in use.");
    return false;
  }
  // The KV precision travels in the attention groups' dtype (see the header).
  QString kv = current.kvPrecision();
  if (!p->layers.empty() && p->layers.front()[loom::OpGroup::kAttn].dtype) {
    const QString want = qstr(loom::dtype_name(*p->layers.front()[loom::OpGroup::kAttn].dtype));
    if (m_choices->kv.contains(want)) kv = want;
  }
  for (auto& lp : p->layers) lp[loom::OpGroup::kAttn].dtype.reset();
  if (loom::Status st = loom::validate_placement(*m_model, *p); !st.ok()) {
    *error = qstr(st.message());
    return false;
  }
  *out = toPlan(*p, kv.isEmpty() ? QStringLiteral("F16") : kv, current.nCtx);
  return true;
}
