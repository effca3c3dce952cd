#include "tools/serve/step_cost.h"

#include <algorithm>
#include <cmath>

namespace loom::serve {

void StepCost::add(int64_t rows, double ms) {
  if (rows <= 0 || !(ms >= 0) || !std::isfinite(ms)) return;
  const auto x = static_cast<double>(rows);
  w_ = w_ * decay_ + 1;
  sx_ = sx_ * decay_ + x;
  sy_ = sy_ * decay_ + ms;
  sxx_ = sxx_ * decay_ + x * x;
  sxy_ = sxy_ * decay_ + x * ms;
  ++n_;
}

void StepCost::fit(double* fixed, double* per_row) const {
  *fixed = 0;
  *per_row = 0;
  if (w_ <= 0 || sx_ <= 0) return;
  const double mx = sx_ / w_, my = sy_ / w_;
  const double var = sxx_ / w_ - mx * mx, cov = sxy_ / w_ - mx * my;
  // Rows that varied by at least one row (standard deviation), a slope that
  // is not negative and a fixed part that is not negative: the fit; else the
  // mean cost per row.
  if (var >= 1.0 && cov > 0) {
    const double b = cov / var, a = my - b * mx;
    if (a >= 0) {
      *fixed = a;
      *per_row = b;
      return;
    }
  }
  *per_row = my / mx;
}

double StepCost::predict(int64_t rows) const {
  double a = 0, b = 0;
  fit(&a, &b);
  return a + b * static_cast<double>(rows);
}

int64_t StepCost::prompt_budget(int64_t decode_rows, double factor, int64_t min_tokens,
                                int64_t max_tokens) const {
  max_tokens = std::max<int64_t>(max_tokens, 1);
  min_tokens = std::clamp<int64_t>(min_tokens, 1, max_tokens);
  if (n_ == 0) return max_tokens;
  double a = 0, b = 0;
  fit(&a, &b);
  if (b <= 0) return max_tokens;
  // a + b (D + P) <= factor (a + b D)  <=>  P <= (factor - 1) (a + b D) / b.
  const double room = (factor - 1) * (a + b * static_cast<double>(decode_rows)) / b;
  if (!(room < static_cast<double>(max_tokens))) return max_tokens;
  return std::clamp<int64_t>(static_cast<int64_t>(room), min_tokens, max_tokens);
}

}  // namespace loom::serve
