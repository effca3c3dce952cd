// A plain double-precision forward of one layer (`loom verify`'s yardstick):
// the weights dequantized from the file by the reference dequantizers, every
// sum in double, attention causal over positions [0, T). It computes what
// the architecture defines, with none of the engine's kernels, so an op
// group's error against it is what that group's precision and unit cost.
// (YaRN's RoPE correction is not modelled: such models compare with plain
// RoPE at the scaled frequencies.)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model.h"

namespace loom {

/// The embedding rows of `tokens`, [T, n_embd], as the model scales them.
Result<std::vector<double>> reference_embed(const Model& m, std::span<const int32_t> tokens);

/// Layer `l` on the hidden states `x` [T, n_embd] at positions [0, T): its output [T, n_embd].
Result<std::vector<double>> reference_layer(const Model& m, int64_t l, const std::vector<double>& x,
                                            int64_t T);

}  // namespace loom
