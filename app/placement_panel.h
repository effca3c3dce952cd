// The placement grid and its controls: strategy, layer count, VRAM budget,
// Apply / Revert, a legend of backends. Clicking a cell offers its backends
// (unavailable ones disabled, saying why) and precisions. Everything shown
// comes from a PlacementModel; nothing here knows which backends exist.
#pragma once

#include <QWidget>

class PlacementModel;
class QComboBox;
class QLabel;
class QPushButton;
class QSlider;
class QSpinBox;
class QTableView;
class QHBoxLayout;

class PlacementPanel : public QWidget {
  Q_OBJECT
 public:
  explicit PlacementPanel(PlacementModel* model, QWidget* parent = nullptr);

  QTableView* grid() const { return m_grid; }
  QPushButton* applyButton() const { return m_apply; }
  QComboBox* strategyBox() const { return m_strategy; }
  /// Opens the cell menu programmatically (tests, keyboard).
  void openCellMenu(int row, int column);
  /// A line under the grid: the engine's answer to the last Apply.
  void setNote(const QString& text, bool isError = false);
  /// While a reply streams or a placement is being applied, Apply waits.
  void setBusy(bool busy);
  /// Rebuilds the strategy list and legend after the model's backends or strategies changed.
  void refreshChoices();

 signals:
  void applyRequested();
  /// The user picked a strategy; the owner plans it (or not) into the model.
  void strategyChosen(const QString& strategyId, int gpuLayers, int vramBudgetMiB);

 private:
  void rebuildControls();
  void syncFromModel();
  void emitStrategy();

  PlacementModel* m_model;
  QComboBox* m_strategy = nullptr;
  QSpinBox* m_layers = nullptr;
  QSlider* m_budget = nullptr;
  QLabel* m_budgetLabel = nullptr;
  QPushButton* m_apply = nullptr;
  QPushButton* m_revert = nullptr;
  QTableView* m_grid = nullptr;
  QLabel* m_note = nullptr;
  QHBoxLayout* m_legend = nullptr;
  QWidget* m_legendBox = nullptr;
  bool m_busy = false;
  bool m_syncing = false;
};
