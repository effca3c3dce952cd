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

/// What reference_layer() saw inside the layer (`loom probe`): the inputs of
/// its matmuls after the norms, each [T, n_embd].
struct ReferenceTaps {
  std::vector<double> attn_in;  ///< rms_norm(x) * attn_norm: the input of Wq, Wk, Wv
  std::vector<double> ffn_in;   ///< rms_norm(x + attention) * ffn_norm: the input of W_gate, W_up
};

/// Layer `l` on the hidden states `x` [T, n_embd] at positions [0, T): its
/// output [T, n_embd]. `taps`, when given, receives the matmuls' inputs.
Result<std::vector<double>> reference_layer(const Model& m, int64_t l, const std::vector<double>& x,
                                            int64_t T, ReferenceTaps* taps = nullptr);

/// Each row of `x` ([rows, n_embd]) RMS-normalized and scaled by the norm
/// vector `w`, in double (the final norm's input to the output matrix).
Result<std::vector<double>> reference_rms_norm(const Model& m, const Weight& w,
                                               const std::vector<double>& x);

}  // namespace loom
