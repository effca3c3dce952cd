// Layer-by-layer verification of a placement (`loom verify`): for every layer
// and op group, the relative error of that layer's output when the group
// runs as the placement says (its unit and precision; every other group on
// the CPU in the file's precision), against the double-precision reference
// (reference.h) on the same input. The input of layer l is the reference's
// output of layer l - 1, so errors do not accumulate from layer to layer:
// each figure is what that layer and group cost by themselves.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/placement/placement.h"

namespace loom {

struct VerifyRow {
  int64_t layer = 0;
  /// ||y - y_ref|| / ||y_ref|| with only that group as placed, by OpGroup.
  std::array<double, kNumOpGroups> group{};
  double all = 0;        ///< the same with the whole layer as placed
  double all_delta = 0;  ///< the whole layer's error relative to its update: / ||y_ref - x||
};

struct VerifyReport {
  std::vector<VerifyRow> rows;
  int64_t n_tokens = 0;
  Placement placement;             ///< as run (groups the GPU could not take moved to the CPU)
  std::vector<std::string> notes;  ///< why a group runs elsewhere than asked
};

/// Verifies `p` on `tokens` (at most 256). `gpu`: the GPU backend when the
/// placement uses one; `cpu`: the CPU backend. `progress(layer)` after each
/// layer; returning false cancels.
Result<VerifyReport> verify_placement(const Model& m, Backend& cpu, Backend* gpu,
                                      const Placement& p, std::span<const int32_t> tokens,
                                      const std::function<bool(int64_t)>& progress = {});

}  // namespace loom
