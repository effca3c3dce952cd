// A plain double-precision forward pass of llama-style decoders, written for
// the tests from the model definition alone (no Loom kernels but the
// reference dequantizers): the yardstick for the optimized engine.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/model.h"

namespace loom::test {

/// Logits [T, n_vocab] for every position of `tokens`, evaluated from scratch.
std::vector<std::vector<double>> reference_logits(const Model& m,
                                                  const std::vector<int32_t>& tokens);

/// sqrt(sum (a-b)^2 / sum b^2): error of `a` relative to the reference `b`.
double normalized_error(const std::vector<float>& a, const std::vector<double>& b);

}  // namespace loom::test
