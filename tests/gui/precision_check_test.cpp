// "Check precision" beside the placement grid, offscreen with the real engine
// on its worker thread: the error and outliers columns (hidden until the first
// check) say "—" until checked, the button fills them (loom verify's error of each layer as placed,
// loom probe's outlier share) and a change of placement clears them.
#include <gtest/gtest.h>

#include <QApplication>
#include <QPushButton>
#include <QSignalSpy>
#include <QTableView>
#include <QTest>
#include <cmath>

#include "app/engine_panel.h"
#include "app/main_window.h"
#include "app/placement_panel.h"
#include "tests/gui/gui_test_util.h"

namespace {

constexpr int kWaitMs = 120000;

QString cellText(PlacementModel* pm, int row, int column) {
  return pm->data(pm->index(row, column), Qt::DisplayRole).toString();
}

TEST(PrecisionCheck, FillsTheColumnsUntilThePlacementChanges) {
  MainWindow w(guitest::appOptions(QStringLiteral("precision-check")));
  w.show();
  w.start();
  QSignalSpy ready(&w, &MainWindow::modelReady);
  w.loadModel(guitest::tinyModel());
  ASSERT_TRUE(QTest::qWaitFor([&] { return ready.count() > 0; }, kWaitMs));
  PlacementModel* pm = w.placement();
  PlacementPanel* pp = w.enginePanel()->placementPanel();
  w.enginePanel()->setCurrentIndex(EnginePanel::PlacementTab);
  const int rows = pm->rowCount();
  ASSERT_EQ(rows, 3 + 2);  // embedding, 3 layers, output
  EXPECT_EQ(PlacementModel::columnTitle(kColError), QStringLiteral("error"));
  EXPECT_EQ(PlacementModel::columnTitle(kColOutliers), QStringLiteral("outliers"));
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(cellText(pm, r, kColError), QStringLiteral("—"));
    EXPECT_EQ(cellText(pm, r, kColOutliers), QStringLiteral("—"));
  }

  // Hidden until the first check: a narrow panel has no room for them.
  EXPECT_TRUE(pp->grid()->isColumnHidden(kColError));
  EXPECT_TRUE(pp->grid()->isColumnHidden(kColOutliers));
  ASSERT_TRUE(pp->checkButton()->isEnabled());
  QTest::mouseClick(pp->checkButton(), Qt::LeftButton);
  ASSERT_TRUE(QTest::qWaitFor([&] { return pm->hasPrecisionCheck(); }, kWaitMs))
      << pp->noteText().toStdString();
  ASSERT_TRUE(QTest::qWaitFor([&] { return pp->checkButton()->isEnabled(); }, kWaitMs));
  EXPECT_FALSE(pp->grid()->isColumnHidden(kColError));
  EXPECT_FALSE(pp->grid()->isColumnHidden(kColOutliers));
  for (int r = 1; r + 1 < rows; ++r) {
    bool ok = false;
    const double e = cellText(pm, r, kColError).toDouble(&ok);
    EXPECT_TRUE(ok) << cellText(pm, r, kColError).toStdString();
    // Q8_0 weights on the CPU: a small error, but not none.
    EXPECT_GT(e, 0.0) << r;
    EXPECT_LT(e, 0.1) << r;
    EXPECT_TRUE(cellText(pm, r, kColOutliers).endsWith(QLatin1Char('%')))
        << cellText(pm, r, kColOutliers).toStdString();
  }
  EXPECT_EQ(cellText(pm, 0, kColError), QStringLiteral("—"));  // the embedding has no matmul
  EXPECT_TRUE(cellText(pm, rows - 1, kColOutliers).endsWith(QLatin1Char('%')));
  EXPECT_TRUE(pm->data(pm->index(1, kColError), Qt::ToolTipRole)
                  .toString()
                  .contains(QStringLiteral("Relative error")));

  // Another precision for layer 1's FFN: the figures were for the old placement.
  PlacementPlan p = pm->pending();
  p.rows[2][kColFfnWeights].dtype = QStringLiteral("Q4_0");
  p.rows[2][kColFfnWeights].precision = QStringLiteral("Q4_0");
  ASSERT_TRUE(pm->setPending(p));
  EXPECT_FALSE(pm->hasPrecisionCheck());
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(cellText(pm, r, kColError), QStringLiteral("—"));
    EXPECT_EQ(cellText(pm, r, kColOutliers), QStringLiteral("—"));
  }
}

}  // namespace
