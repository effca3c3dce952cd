// The placement grid's data: which backend runs each op group of each layer,
// in what precision. Data-driven: the backends, strategies and per-cell
// choices come from outside (today the CPU engine's facts; later the engine's
// Placement), so the grid and its controls need no change when GPUs arrive.
#pragma once

#include <QAbstractTableModel>
#include <QColor>
#include <QString>
#include <QStringList>
#include <QVector>

#include "app/app_types.h"

/// A backend the grid can offer. Unavailable ones are shown, disabled, with the reason.
struct BackendInfo {
  QString id;     ///< "cpu", "vulkan:0", "cuda:0"
  QString label;  ///< short name shown in cells and legends: "CPU", "Vulkan", "CUDA"
  QColor color;
  bool available = false;
  QString reason;  ///< why not available ("Vulkan: not built")
};

/// A placement strategy of the selector.
struct StrategyInfo {
  QString id;     ///< gpu, cpu, layers, attn-gpu, auto, custom
  QString label;
  bool available = false;
  QString reason;             ///< why not available
  bool usesLayerCount = false;  ///< layers:N
  bool usesBudget = false;      ///< takes the VRAM budget
};

/// The grid's columns: op groups of a transformer layer.
enum PlacementColumn : int {
  kColAttnWeights = 0,  ///< q, k, v, o projections
  kColAttnKv,           ///< attention compute and its KV cache
  kColFfnWeights,       ///< gate, up, down
  kColNormRope,         ///< norms and RoPE
  kColCount
};

struct PlacementCell {
  QString backend;          ///< BackendInfo::id
  QString precision;        ///< e.g. "Q8_0"
  QStringList precisions;   ///< precisions that may be chosen here (the current one included)
  QString precisionNote;    ///< why the choice is what it is (shown in the menu)
  QString linkGroup;        ///< cells of one non-empty group change precision together
  QString detail;           ///< tensors and bytes, for the tooltip
  bool operator==(const PlacementCell&) const = default;
};

/// A whole placement. Row 0 is the embedding, rows 1..n the layers, row n+1
/// the output (norm + lm_head); the first and last use column 0 only.
struct PlacementPlan {
  QString strategy = QStringLiteral("cpu");
  int gpuLayers = 0;      ///< for layers:N
  int vramBudgetMiB = 0;  ///< for strategies that take a budget
  QVector<QVector<PlacementCell>> rows;

  int layerCount() const { return rows.size() >= 2 ? rows.size() - 2 : 0; }
  bool isEdgeRow(int row) const { return row == 0 || row == rows.size() - 1; }
  bool operator==(const PlacementPlan&) const = default;
  /// The KV precision of the layers (column kColAttnKv), or empty when they differ.
  QString kvPrecision() const;
  /// Backend ids used anywhere.
  QStringList backendsUsed() const;
  /// As JSON text, for presets in the store.
  QString toJson() const;

  /// Every cell on `backendId`, precisions as the model file has them; the KV
  /// precision `kvDtype`, offering `kvChoices`.
  static PlacementPlan allOn(const QString& backendId, const ModelSummary& model, const QString& kvDtype,
                             const QStringList& kvChoices, const QString& kvNote);
};
Q_DECLARE_METATYPE(PlacementPlan)

class PlacementModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Role {
    BackendIdRole = Qt::UserRole + 1,
    BackendLabelRole,
    BackendColorRole,
    DirtyRole,     ///< the pending plan differs from the applied one here
    EdgeRowRole,   ///< embedding or output row (one cell spanning the row)
  };

  explicit PlacementModel(QObject* parent = nullptr);

  void setBackends(const QVector<BackendInfo>& backends);
  const QVector<BackendInfo>& backends() const { return m_backends; }
  const BackendInfo* backend(const QString& id) const;
  void setStrategies(const QVector<StrategyInfo>& strategies);
  const QVector<StrategyInfo>& strategies() const { return m_strategies; }

  /// The placement in effect (from the engine); pending edits are dropped.
  void setApplied(const PlacementPlan& plan);
  const PlacementPlan& applied() const { return m_applied; }
  const PlacementPlan& pending() const { return m_pending; }
  bool isDirty() const { return !(m_pending == m_applied); }
  /// Back to the applied placement.
  void revertPending();

  /// Moves a cell to another backend. False (and no change) when the backend
  /// is unknown or unavailable. The strategy becomes "custom".
  bool setCellBackend(int row, int column, const QString& backendId);
  /// Changes a cell's precision (and its link group's). False when not offered.
  bool setCellPrecision(int row, int column, const QString& precision);
  /// Strategy, layer count and budget of the pending plan; `planned` (from the
  /// planner) replaces the cells when given.
  void setPendingStrategy(const QString& strategy, int gpuLayers, int vramBudgetMiB,
                          const PlacementPlan* planned = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;

  static QString columnTitle(int column);
  QString rowTitle(int row) const;

 signals:
  void pendingChanged();

 private:
  void cellsChanged();

  QVector<BackendInfo> m_backends;
  QVector<StrategyInfo> m_strategies;
  PlacementPlan m_applied;
  PlacementPlan m_pending;
};
