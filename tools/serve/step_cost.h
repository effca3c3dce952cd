// What a batched step costs, learned from the steps the scheduler runs, and
// how many prompt tokens a step may carry beside the decoding sequences'
// rows so that their inter-token latency stays near a decode-only step's.
//
// The model is linear in the step's rows: ms = fixed + per_row * rows (a
// GPU's step is mostly its fixed part, the weights read once; a CPU's grows
// with the rows). It is fitted by least squares over the recent steps, each
// older step weighing `decay` times the next. Until the rows have varied
// enough to tell the two parts apart, every row is taken to cost the mean
// step's time per row (fixed 0): the cautious guess, which gives prompts the
// fewest tokens.
#pragma once

#include <cstdint>

namespace loom::serve {

class StepCost {
 public:
  explicit StepCost(double decay = 0.97) : decay_(decay) {}

  /// A step of `rows` rows (prompt tokens and decode tokens) took `ms`.
  void add(int64_t rows, double ms);
  /// Steps seen so far.
  int64_t steps() const { return n_; }
  /// Predicted milliseconds of a step of `rows` rows (0 before any step).
  double predict(int64_t rows) const;
  /// Prompt tokens a step with `decode_rows` decode rows may add so that it
  /// takes at most `factor` times the decode rows alone, clamped to
  /// [min_tokens, max_tokens]; max_tokens before any step.
  int64_t prompt_budget(int64_t decode_rows, double factor, int64_t min_tokens,
                        int64_t max_tokens) const;

 private:
  /// (fixed, per_row) of the fit.
  void fit(double* fixed, double* per_row) const;

  double decay_;
  int64_t n_ = 0;
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;  // weighted sums
};

}  // namespace loom::serve
