// The engine's placement logic for the GUI: strategies into grid plans
// (make_placement), grid plans into the engine's Placement and back, the
// cost model's prediction and the bytes per unit of a plan, presets as the
// engine's JSON (Placement::to_json). The engine worker makes one per model
// load, after it has calibrated the cost model, and hands it to the GUI
// thread. It only reads the model, which nothing changes once loaded, so
// both threads use it at once; it keeps the model alive while it exists.
//
// Presets carry the KV cache precision in each layer's "attn" dtype (the
// attention group has no weights, so the engine ignores that field).
#pragma once

#include <QMetaType>
#include <QString>
#include <QStringList>
#include <memory>

#include "app/app_types.h"
#include "app/placement_model.h"

namespace loom {
struct Model;
struct Placement;
struct CostModel;
struct StrategyOptions;
class AdaptiveController;
}  // namespace loom

class PlacementPlanner {
 public:
  /// `gpuBackendId`: the grid's id of the GPU unit ("vulkan:0"), empty when
  /// there is none; `gpuMemoryBytes`: its memory (the budget slider's end).
  PlacementPlanner(std::shared_ptr<const loom::Model> model, const ModelSummary& summary,
                   const loom::CostModel& cost, QString gpuBackendId, qint64 gpuMemoryBytes);
  ~PlacementPlanner();
  PlacementPlanner(const PlacementPlanner&) = delete;
  PlacementPlanner& operator=(const PlacementPlanner&) = delete;

  bool hasGpu() const { return !m_gpuId.isEmpty(); }
  const QString& gpuBackendId() const { return m_gpuId; }
  qint64 gpuMemoryBytes() const { return m_gpuMemory; }
  /// The prefill chunk of a session whose placement uses this GPU
  /// (loom::default_prefill_chunk of its memory); the CPU's without one.
  int64_t prefillChunk() const;
  int layerCount() const { return m_summary.nLayer; }
  const ModelSummary& summary() const { return m_summary; }

  /// The grid plan of an engine placement, with the KV cache in `kvDtype`
  /// sized for `nCtx` tokens.
  PlacementPlan toPlan(const loom::Placement& p, const QString& kvDtype, int nCtx) const;
  /// The engine placement of a grid plan (its KV precision is plan.kvPrecision()).
  loom::Placement toPlacement(const PlacementPlan& plan) const;

  /// Whether the engine can be asked for `plan`: the model's shape, re-quantizable
  /// precisions, a GPU for GPU cells, one KV precision. False with the reason.
  bool check(const PlacementPlan& plan, QString* error) const;

  /// The plan a strategy makes ("cpu", "gpu", "layers" with `gpuLayers`,
  /// "attn-gpu", "auto", "adaptive" (auto's placement to start from),
  /// "custom": `current` as it is), keeping `current`'s
  /// KV precision and context. False with the engine's message on error.
  bool plan(const QString& strategy, int gpuLayers, int vramBudgetMiB, const PlacementPlan& current,
            PlacementPlan* out, QString* error) const;

  /// The controller of an "adaptive" plan (Auto, adaptive): it starts from
  /// the plan's placement and moves it while generating. Null for other
  /// strategies or without a GPU.
  std::shared_ptr<loom::AdaptiveController> makeAdaptive(const PlacementPlan& plan) const;

  /// Predicted decode step and bytes per unit of `plan` (at `nPast` tokens of context; < 0: 256).
  PlanEstimate estimate(const PlacementPlan& plan, int nPast = -1) const;

  /// A preset: the engine's JSON of `plan` (Placement::to_json).
  QString toPresetJson(const PlacementPlan& plan) const;
  /// A preset back into a plan for this model (layer count, precisions and the
  /// GPU checked); `current` gives the context and the KV precision when the
  /// preset has none. False with a message for the user.
  bool fromPresetJson(const QString& json, const PlacementPlan& current, PlacementPlan* out,
                      QString* error) const;

 private:
  loom::StrategyOptions options(const QString& strategy, int gpuLayers, int vramBudgetMiB,
                                const PlacementPlan& current) const;
  struct Choices;
  std::shared_ptr<const loom::Model> m_model;
  ModelSummary m_summary;
  std::unique_ptr<loom::CostModel> m_cost;
  QString m_gpuId;
  qint64 m_gpuMemory = 0;
  std::unique_ptr<Choices> m_choices;
};

using PlannerPtr = std::shared_ptr<const PlacementPlanner>;
Q_DECLARE_METATYPE(PlannerPtr)
