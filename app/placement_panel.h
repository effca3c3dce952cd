// The placement grid and its controls: strategy, layer count, VRAM budget,
// presets, Apply / Revert, a legend of units, and what the placement costs
// (bytes on each unit, the cost model's predicted step next to the
// profiler's measured one). Clicking a cell moves it to the next unit (CPU
// <-> GPU); its context menu offers the units (unavailable ones disabled,
// saying why) and the precisions. Everything shown comes from a
// PlacementModel; nothing here knows which backends exist.
#pragma once

#include <QWidget>
#include <cstdint>
#include <memory>

class LiveStats;
class PlacementModel;
class PresetListModel;
class ElidedLabel;
class QComboBox;
class QLabel;
class QPushButton;
class QSlider;
class QSpinBox;
class QTableView;
class QTimer;
class QToolButton;
class QHBoxLayout;

class PlacementPanel : public QWidget {
  Q_OBJECT
 public:
  /// The grid shows at least this many rows (when the model has them), and scrolls.
  static constexpr int kGridMinRows = 8;

  PlacementPanel(PlacementModel* model, PresetListModel* presets, std::shared_ptr<LiveStats> stats,
                 QWidget* parent = nullptr);

  QTableView* grid() const { return m_grid; }
  QPushButton* applyButton() const { return m_apply; }
  QComboBox* strategyBox() const { return m_strategy; }
  QSpinBox* layersBox() const { return m_layers; }
  QSlider* budgetSlider() const { return m_budget; }
  QComboBox* presetBox() const { return m_presetBox; }
  QString noteText() const;
  /// The cost lines: bytes per unit, predicted and measured step.
  QString summaryText() const;
  /// What a click on the cell does: the next unit when there is a GPU, the menu otherwise.
  void clickCell(int row, int column);
  /// Opens the cell menu programmatically (tests, keyboard).
  void openCellMenu(int row, int column);
  /// A line under the grid: the engine's answer to the last Apply.
  void setNote(const QString& text, bool isError = false);
  /// The line under the cost that says where the KV cache may go beyond the GPU.
  void setKvTiersSummary(const QString& text);
  /// While a placement is being applied, Apply waits.
  void setBusy(bool busy);
  /// While a precision check runs, its button waits; after the first one the
  /// error and outliers columns are shown (hidden before).
  void setChecking(bool checking);
  QPushButton* checkButton() const { return m_check; }
  /// What the engine runs on: "… and the GPU: …" or "CPU only: why" (`details` in the tooltip).
  void setUnitsText(const QString& text, const QString& details = {});
  QString unitsText() const;
  /// Rebuilds the strategy list and legend after the model's backends or strategies changed.
  void refreshChoices();
  /// Reads the profiler's figures into the grid now (a timer does it twice a second).
  void refreshMeasured();

 signals:
  void applyRequested();
  /// "KV memory…": the owner opens the KV tier settings.
  void kvTiersRequested();
  /// "Check precision": the owner has the worker fill the error and outlier columns.
  void precisionCheckRequested();
  /// The user picked a strategy; the owner plans it (or not) into the model.
  void strategyChosen(const QString& strategyId, int gpuLayers, int vramBudgetMiB);
  void presetChosen(qint64 presetId);
  void savePresetRequested(const QString& name);
  void deletePresetRequested(qint64 presetId);

 private:
  void rebuildControls();
  void syncFromModel();
  void updateSummary();
  void emitStrategy();
  void askPresetName();
  void showPresetMenu();

  PlacementModel* m_model;
  PresetListModel* m_presets;
  std::shared_ptr<LiveStats> m_stats;
  QComboBox* m_strategy = nullptr;
  QSpinBox* m_layers = nullptr;
  QSlider* m_budget = nullptr;
  QLabel* m_budgetLabel = nullptr;
  QLabel* m_units = nullptr;
  QComboBox* m_presetBox = nullptr;
  QPushButton* m_savePreset = nullptr;
  QToolButton* m_presetMenu = nullptr;
  QPushButton* m_apply = nullptr;
  ElidedLabel* m_kvTiers = nullptr;
  QPushButton* m_kvTiersButton = nullptr;
  QPushButton* m_revert = nullptr;
  QPushButton* m_check = nullptr;
  QTableView* m_grid = nullptr;
  QLabel* m_hint = nullptr;
  QLabel* m_note = nullptr;
  QLabel* m_bytes = nullptr;
  QLabel* m_times = nullptr;
  QHBoxLayout* m_legend = nullptr;
  QWidget* m_legendBox = nullptr;
  QTimer* m_timer = nullptr;
  QTimer* m_moveTimer = nullptr;  ///< repaints the grid while moved cells fade
  uint64_t m_statsVersion = 0;
  bool m_busy = false;
  bool m_syncing = false;
};
