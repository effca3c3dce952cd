// Live performance charts (Qt Charts): inter-token latency histogram with P50
// and P99 marked, per-layer P50/P99 bars, tokens/s over time, memory per tier.
// A timer reads LiveStats snapshots (a copy of counters: the engine never
// waits for the GUI) and redraws only when something changed.
#pragma once

#include <QWidget>
#include <memory>

#include "app/live_stats.h"

class QChart;
class QChartView;
class QGridLayout;
class QLabel;
class QLineSeries;
class QAreaSeries;
class QBarSet;
class QBarSeries;
class QBarCategoryAxis;
class QCategoryAxis;
class QValueAxis;
class QLogValueAxis;
class QTimer;

class ChartsPanel : public QWidget {
  Q_OBJECT
 public:
  explicit ChartsPanel(std::shared_ptr<LiveStats> stats, QWidget* parent = nullptr);
  ~ChartsPanel() override;

  /// Redraws from a fresh snapshot now (the timer does this every 250 ms).
  void refresh();
  /// What is drawn now, for tests.
  struct Shown {
    uint64_t version = 0;
    uint64_t itlSamples = 0;
    double p50Ms = 0, p99Ms = 0;
    double tokensPerSecond = 0;  ///< the tile's figure
    int layersWithData = 0;
    int tpsPoints = 0;
    int placementMarks = 0;  ///< placement changes drawn on the tokens/s chart
    uint64_t ramBytes = 0;
    uint64_t gpuBytes = 0;
    bool gpuPresent = false;
  };
  const Shown& shown() const { return m_shown; }

 protected:
  void showEvent(QShowEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;

 private:
  /// Makes every axis lay its labels out again (see showEvent).
  void relayoutAxes();
  void buildHistogram(const LiveSnapshot& s);
  void buildLayers(const LiveSnapshot& s);
  void buildTps(const LiveSnapshot& s);
  void buildMemory(const LiveSnapshot& s);
  void buildTiles(const LiveSnapshot& s);

  std::shared_ptr<LiveStats> m_stats;
  QTimer* m_timer = nullptr;
  Shown m_shown;
  // Tiles: four in a row from this panel width (px), else two by two.
  static constexpr int kTilesInOneRowWidth = 520;
  QGridLayout* m_tiles = nullptr;
  int m_tileColumns = 4;
  QLabel* m_ttft = nullptr;
  QLabel* m_tps = nullptr;
  QLabel* m_p50 = nullptr;
  QLabel* m_p99 = nullptr;
  // Histogram.
  QChart* m_histChart = nullptr;
  QLineSeries* m_histUpper = nullptr;
  QAreaSeries* m_histArea = nullptr;
  QLineSeries* m_p50Line = nullptr;
  QLineSeries* m_p99Line = nullptr;
  QLabel* m_histLegend = nullptr;
  QCategoryAxis* m_histX = nullptr;
  QValueAxis* m_histY = nullptr;
  // Per layer.
  QChart* m_layerChart = nullptr;
  QBarSeries* m_layerSeries = nullptr;
  QBarSet* m_layerP50 = nullptr;
  QBarSet* m_layerP99 = nullptr;
  QBarCategoryAxis* m_layerX = nullptr;
  QLogValueAxis* m_layerY = nullptr;
  QLabel* m_layerLegend = nullptr;
  int m_layerCount = -1;
  // Tokens/s.
  QChart* m_tpsChart = nullptr;
  QLineSeries* m_tpsSeries = nullptr;
  QLineSeries* m_tpsMarks = nullptr;  ///< placement changes: a vertical dashed line each
  QLabel* m_tpsLegend = nullptr;
  QValueAxis* m_tpsX = nullptr;
  QValueAxis* m_tpsY = nullptr;
  // Memory.
  QChart* m_memChart = nullptr;
  QBarSet* m_memWeights = nullptr;
  QBarSet* m_memKv = nullptr;
  QBarCategoryAxis* m_memCats = nullptr;
  QValueAxis* m_memAxis = nullptr;
};
