// StepCost (tools/serve/step_cost.h): the step-time fit and the prompt
// budget that keeps decoding sequences' steps even.
#include "tools/serve/step_cost.h"

#include <gtest/gtest.h>

namespace loom::serve {
namespace {

TEST(StepCost, FitsTheFixedAndPerRowParts) {
  StepCost c;
  // A GPU-like step: 10 ms whatever the rows, 0.05 ms a row.
  for (int i = 0; i < 40; ++i) {
    const int64_t rows = 1 + (i * 37) % 200;
    c.add(rows, 10.0 + 0.05 * static_cast<double>(rows));
  }
  EXPECT_NEAR(c.predict(0), 10.0, 1e-6);
  EXPECT_NEAR(c.predict(100), 15.0, 1e-6);
  // 8 decode rows: 10.4 ms; at 1.5x, 5.2 ms more: 104 prompt tokens.
  EXPECT_EQ(c.prompt_budget(8, 1.5, 4, 256), 104);
  EXPECT_EQ(c.prompt_budget(8, 1.5, 4, 64), 64);  // the step's room first
}

TEST(StepCost, RowsThatCostInProportion) {
  StepCost c;
  // A CPU-like step: 4 ms a row.
  for (int i = 0; i < 30; ++i) {
    const int64_t rows = 4 + i % 9;
    c.add(rows, 4.0 * static_cast<double>(rows));
  }
  EXPECT_NEAR(c.predict(10), 40.0, 1e-6);
  EXPECT_EQ(c.prompt_budget(16, 1.5, 4, 256), 8);  // half the decode rows
  EXPECT_EQ(c.prompt_budget(2, 1.5, 4, 256), 4);   // never below the minimum
}

TEST(StepCost, SameRowsEveryStepTakesTheMeanCostPerRow) {
  StepCost c;
  for (int i = 0; i < 10; ++i) c.add(8, 40.0);  // no spread: no slope to fit
  EXPECT_NEAR(c.predict(4), 20.0, 1e-9);
  EXPECT_EQ(c.prompt_budget(8, 2.0, 1, 256), 8);
}

TEST(StepCost, NothingSeenLeavesTheWholeBudget) {
  StepCost c;
  EXPECT_EQ(c.steps(), 0);
  EXPECT_EQ(c.prompt_budget(8, 1.5, 4, 200), 200);
  c.add(0, 5.0);   // ignored: no rows
  c.add(4, -1.0);  // ignored: no time
  EXPECT_EQ(c.steps(), 0);
}

TEST(StepCost, RecentStepsOutweighOldOnes) {
  StepCost c(0.9);
  for (int i = 0; i < 50; ++i) c.add(4 + i % 8, 2.0 * (4 + i % 8));  // 2 ms a row
  for (int i = 0; i < 50; ++i) c.add(4 + i % 8, 6.0 * (4 + i % 8));  // then 6 ms a row
  EXPECT_NEAR(c.predict(10), 60.0, 1.0);
}

}  // namespace
}  // namespace loom::serve
