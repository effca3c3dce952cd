// The cost model of a decode step: what a placement should take, from
// measured unit speeds (weight bytes streamed per second by a decode matmul,
// fixed cost per op) and measured transfer latency and bandwidth. The `auto`
// strategy minimizes it; `loom plan` prints it; `loom bench` prints it next
// to the profiler's measured figures.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/model/model.h"
#include "engine/placement/placement.h"

namespace loom {

struct UnitCost {
  double bytes_per_s = 0;  ///< weight bytes a single-token matmul streams per second
  double op_s = 0;         ///< fixed cost of one op (dispatch, thread wake-up)
};

struct CostModel {
  std::array<UnitCost, kNumUnits> unit{};
  double xfer_latency_s = 0;    ///< one activation copy between units, fixed part
  double xfer_bytes_per_s = 0;  ///< and per byte
  /// Extra cost of each copy from the GPU back to the host in the middle of a
  /// step: the host waits on the fence, and the GPU resumes after an idle
  /// spell (measured as a round trip after the host worked a while, less the
  /// same round trip back to back).
  double switch_s = 0;
  bool measured = false;  ///< false: rough defaults (no calibration ran)

  /// Conservative guesses for when nothing was measured.
  static CostModel defaults();
  std::string describe() const;

  struct Prediction {
    double step_ms = 0;            ///< one decode step
    std::vector<double> layer_ms;  ///< per layer (groups and transfers)
    double embed_ms = 0, output_ms = 0;
    int64_t transfers = 0;  ///< activation copies per step
    int64_t switches = 0;   ///< of them, copies back to the host mid-step (charged switch_s)
    double xfer_ms = 0;     ///< all copies, switches included
    /// Compute per unit (ops and weight streaming, no copies), embedding and output included.
    std::array<double, kNumUnits> unit_ms{};
  };
  /// A decode step at context length `n_past` under placement `p`.
  Prediction predict(const Model& m, const Placement& p, int64_t n_past, DType kv_dtype) const;
  /// One layer's time with its residual stream arriving on `x_on`.
  /// Optional outputs are added to: copies, their seconds, copies back to
  /// the host charged switch_s, and compute seconds per unit.
  double layer_s(const Model& m, int64_t l, const LayerPlace& lp, Unit x_on, int64_t n_past,
                 DType kv_dtype, int64_t* transfers = nullptr, double* xfer_s = nullptr,
                 int64_t* switches = nullptr,
                 std::array<double, kNumUnits>* unit_s = nullptr) const;
};

/// Measures a CostModel on the backends (gpu may be null): times single-token
/// matmuls on a weight of the model, a small op, and activation copies.
/// Takes a few hundred milliseconds. The GPU copy of the weight it used is released.
Result<CostModel> calibrate(const Model& m, Backend& cpu, Backend* gpu);

}  // namespace loom
