// The placement grid's data: which unit (CPU or GPU) runs each op group of
// each layer, in what precision, plus what the cost model predicts and the
// profiler measured for each row. Data-driven: the backends, strategies and
// per-cell choices come from outside (the engine worker and the planner,
// app/placement_planner.h), so the grid needs no change when backends change.
#pragma once

#include <QAbstractTableModel>
#include <QColor>
#include <QElapsedTimer>
#include <QString>
#include <QStringList>
#include <QVector>

#include "app/app_types.h"
#include "app/live_stats.h"

/// A backend the grid can offer. Unavailable ones are shown, disabled, with the reason.
struct BackendInfo {
  QString id;     ///< "cpu", "vulkan:0", "cuda:0"
  QString label;  ///< short name shown in cells and legends: "CPU", "GPU", "CUDA"
  QColor color;
  bool available = false;
  QString reason;          ///< why not available ("Vulkan: not built")
  QString device;          ///< the device's own name, for the legend ("llvmpipe", "NVIDIA H200")
  qint64 memoryBytes = 0;  ///< device memory (GPUs), for the VRAM budget
};

/// A placement strategy of the selector.
struct StrategyInfo {
  QString id;  ///< gpu, cpu, layers, attn-gpu, auto, custom
  QString label;
  bool available = false;
  QString reason;               ///< why not available
  bool usesLayerCount = false;  ///< layers:N
  bool usesBudget = false;      ///< takes the VRAM budget
};

/// The grid's columns: op groups of a transformer layer (the engine's order:
/// attn_w, attn, ffn, norm), then the row's timing.
enum PlacementColumn : int {
  kColAttnWeights = 0,     ///< q, k, v, o projections
  kColAttnKv,              ///< attention compute and its KV cache
  kColFfnWeights,          ///< gate, up, down
  kColNormRope,            ///< norms and RoPE
  kColCount,               ///< op group columns
  kColTiming = kColCount,  ///< predicted and measured time of the row (read-only)
  kColKvTiers,   ///< where the layer's KV lies now: GPU / RAM / SSD shares (tiered caches)
  kColError,     ///< relative error of the layer as placed ("Check precision")
  kColOutliers,  ///< outlier share of the layer's matmul inputs ("Check precision")
  kColAll,       ///< number of columns
};

/// The precision choice "as the file stores it".
inline const QString kKeepPrecision = QStringLiteral("keep");

struct PlacementCell {
  QString backend;         ///< BackendInfo::id
  QString precision;       ///< in effect, e.g. "Q8_0" (the file's, or the requested one)
  QString fileDtype;       ///< what the file stores ("" for the KV cache)
  QString dtype;           ///< requested precision; "" keeps the file's (weights)
  QStringList precisions;  ///< choices offered here ("keep" and dtype names)
  QString precisionNote;   ///< why the choices are what they are (shown in the menu)
  QString linkGroup;       ///< cells of one non-empty group change precision together
  QString detail;          ///< tensors and bytes, for the tooltip
  bool operator==(const PlacementCell&) const = default;
};

/// A whole placement. Row 0 is the embedding, rows 1..n the layers, row n+1
/// the output (norm + lm_head); the first and last use column 0 only.
struct PlacementPlan {
  QString strategy = QStringLiteral("cpu");
  int gpuLayers = 0;      ///< for layers:N
  int vramBudgetMiB = 0;  ///< for strategies that take a budget
  int nCtx = 0;           ///< tokens the KV cache is sized for (bytes estimates)
  QVector<QVector<PlacementCell>> rows;

  int layerCount() const { return rows.size() >= 2 ? rows.size() - 2 : 0; }
  bool isEdgeRow(int row) const { return row == 0 || row == rows.size() - 1; }
  bool operator==(const PlacementPlan&) const = default;
  /// Same cells (strategy and its parameters not compared).
  bool sameCells(const PlacementPlan& o) const { return rows == o.rows; }
  /// The KV precision of the layers (column kColAttnKv), or empty when they differ.
  QString kvPrecision() const;
  /// Backend ids used anywhere.
  QStringList backendsUsed() const;
  /// As JSON text (the grid's own form, for debugging and tests; presets use the engine's).
  QString toJson() const;

  /// Every cell on `backendId`, precisions as the model file has them; the KV
  /// precision `kvDtype`, offering `kvChoices`.
  static PlacementPlan allOn(const QString& backendId, const ModelSummary& model,
                             const QString& kvDtype, const QStringList& kvChoices,
                             const QString& kvNote);
};
Q_DECLARE_METATYPE(PlacementPlan)

/// What the cost model predicts for a plan (PlacementPlanner::estimate).
struct PlanEstimate {
  bool valid = false;
  double stepMs = 0;      ///< one decode step
  QVector<double> rowMs;  ///< per grid row (embedding, layers, output)
  int transfers = 0;      ///< activation copies between units per step
  int nPast = 0;          ///< the context length the prediction is for
  qint64 cpuWeights = 0, cpuKv = 0, gpuWeights = 0, gpuKv = 0;  ///< bytes (KV at full context)
  qint64 gpuOverhead = 0;  ///< activations and slack the GPU needs besides (0 when unused)
  bool costMeasured = false;
  QString costText;  ///< the cost model's own description
};

/// What the profiler measured (decode steps since the placement was applied).
struct MeasuredTimes {
  QVector<double> p50Ms, p99Ms;  ///< per grid row (0: no sample)
  QVector<quint64> counts;
  double stepP50Ms = 0, stepP99Ms = 0;
  quint64 steps = 0;
};

/// "Check precision" (EngineWorker::checkPrecision) for one placement: per
/// grid row (embedding, layers, output), the relative error of the layer's
/// output as placed against the double reference (loom verify), and the
/// share of outliers (|x - mean| > 6 std) in its activations (loom probe).
/// A negative value: none for that row.
struct PrecisionCheck {
  QVector<QVector<PlacementCell>> rows;  ///< the cells checked (a change of placement clears it)
  QVector<double> error;                 ///< whole layer as placed: ||y - y_ref|| / ||y_ref||
  QVector<double> outliers;              ///< the larger of the attention and FFN inputs' shares
  QVector<double> outliersOut;           ///< the residual stream's after the row
  int nTokens = 0;
};
Q_DECLARE_METATYPE(PrecisionCheck)

class PlacementModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Role {
    BackendIdRole = Qt::UserRole + 1,
    BackendLabelRole,
    BackendColorRole,
    DirtyRole,        ///< the pending plan differs from the applied one here
    EdgeRowRole,      ///< embedding or output row (one cell spanning the row)
    PrecisionRole,    ///< the precision alone ("Q8_0")
    PredictedMsRole,  ///< kColTiming: predicted ms of the row (pending plan), or invalid
    P50MsRole,        ///< kColTiming: measured P50 ms (applied plan), or invalid
    P99MsRole,        ///< kColTiming: measured P99 ms, or invalid
    MovedRole,        ///< 0..1: how fresh this cell's move by the last setApplied is (fades to 0)
  };
  /// How long a moved cell stays highlighted after setApplied (ms).
  static constexpr int kMoveFadeMs = 1600;

  explicit PlacementModel(QObject* parent = nullptr);

  void setBackends(const QVector<BackendInfo>& backends);
  const QVector<BackendInfo>& backends() const { return m_backends; }
  const BackendInfo* backend(const QString& id) const;
  /// The available GPU backend, or null.
  const BackendInfo* gpuBackend() const;
  void setStrategies(const QVector<StrategyInfo>& strategies);
  const QVector<StrategyInfo>& strategies() const { return m_strategies; }

  /// The placement in effect (from the engine); pending edits are dropped.
  /// Cells whose unit differs from the previous one are marked as moved
  /// (MovedRole fades over kMoveFadeMs; the view animates them).
  void setApplied(const PlacementPlan& plan);
  /// Whether a move is still fading (the view repaints while it is).
  bool moving() const;
  const PlacementPlan& applied() const { return m_applied; }
  const PlacementPlan& pending() const { return m_pending; }
  /// Pending cells differ from the applied ones, or the pending plan turns the
  /// adaptive auto on or off (its first cells may be the ones in force).
  bool isDirty() const {
    const auto adaptive = [](const PlacementPlan& p) {
      return p.strategy == QLatin1String("adaptive");
    };
    return !m_pending.sameCells(m_applied) || adaptive(m_pending) != adaptive(m_applied);
  }
  /// Back to the applied placement.
  void revertPending();
  /// Replaces the pending plan (a preset, a planned strategy); same shape only.
  bool setPending(const PlacementPlan& plan);

  /// Moves a cell to another backend. False (and no change) when the backend
  /// is unknown or unavailable. The strategy becomes "custom".
  bool setCellBackend(int row, int column, const QString& backendId);
  /// Moves a cell to the next available backend (CPU -> GPU -> CPU). False when there is none
  /// other.
  bool cycleCellBackend(int row, int column);
  /// Changes a cell's precision (and its link group's): "keep" or a dtype
  /// name from the cell's choices. False when not offered.
  bool setCellPrecision(int row, int column, const QString& precision);
  /// Strategy, layer count and budget of the pending plan; `planned` (from the
  /// planner) replaces the cells when given.
  void setPendingStrategy(const QString& strategy, int gpuLayers, int vramBudgetMiB,
                          const PlacementPlan* planned = nullptr);

  /// The cost model's prediction for the pending plan.
  void setEstimate(const PlanEstimate& e);
  const PlanEstimate& estimate() const { return m_estimate; }
  /// The profiler's figures for the applied plan.
  void setMeasured(const MeasuredTimes& m);
  const MeasuredTimes& measured() const { return m_measured; }
  /// "Check precision"'s figures; shown while the pending cells are the ones checked.
  void setPrecisionCheck(const PrecisionCheck& c);
  /// Whether the error and outlier columns show figures (else "—").
  bool hasPrecisionCheck() const;
  /// Where each layer's KV lies now (LiveSnapshot::kvLayers; empty: no tiers).
  void setKvLayers(const std::vector<KvLayerBytes>& layers);
  const std::vector<KvLayerBytes>& kvLayers() const { return m_kvLayers; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;

  static QString columnTitle(int column);
  QString rowTitle(int row) const;
  /// "keep" as the menu shows it ("As the file stores it (Q8_0)"), other choices as they are.
  static QString precisionLabel(const PlacementCell& cell, const QString& choice);

 signals:
  void pendingChanged();
  /// Estimate or measurements changed (the panel's summary line follows).
  void timingChanged();

 private:
  void cellsChanged();
  void timingColumnChanged();
  void checkColumnsChanged();
  bool validCell(int row, int column) const;
  QVariant kvTiersData(int row, int role) const;

  QVector<BackendInfo> m_backends;
  QVector<StrategyInfo> m_strategies;
  PlacementPlan m_applied;
  PlacementPlan m_pending;
  PlanEstimate m_estimate;
  MeasuredTimes m_measured;
  PrecisionCheck m_check;
  std::vector<KvLayerBytes> m_kvLayers;
  QVector<QVector<bool>> m_moved;  ///< [row][column] moved by the last setApplied
  QElapsedTimer m_movedAt;         ///< since that setApplied (invalid: none)
};
