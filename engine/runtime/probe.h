// Activation statistics of a model on a text (`loom probe`): per layer, the
// residual stream after the layer and the inputs of its attention and FFN
// matmuls (after the norms); also the embeddings and the final norm's output.
// Layers whose activations have a wide range or many outliers are the ones
// that tolerate a low precision least. The hidden states are the double
// reference's (reference.h): the model's own numbers, independent of the
// engine's kernels and of any placement.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model.h"

namespace loom {

/// A value counts as an outlier when |x - mean| > kProbeOutlierSigmas * std.
inline constexpr double kProbeOutlierSigmas = 6.0;

/// Statistics of one activation tensor, over all its values (T x n_embd).
struct ActStats {
  double min = 0, max = 0, mean = 0;
  double std = 0;            ///< population standard deviation
  double outlier_share = 0;  ///< fraction of values with |x - mean| > 6 std
  int64_t n = 0;             ///< values counted
};

/// The statistics of `x` (0 values: all zero).
ActStats activation_stats(std::span<const double> x);

struct ProbeRow {
  int64_t layer = 0;
  ActStats attn_in;  ///< input of Wq/Wk/Wv: rms_norm(x) * attn_norm
  ActStats ffn_in;   ///< input of W_gate/W_up: rms_norm(x + attention) * ffn_norm
  ActStats out;      ///< the residual stream after the layer
};

struct ProbeReport {
  int64_t n_tokens = 0;
  ActStats embd;               ///< the embedding rows (as the model scales them)
  std::vector<ProbeRow> rows;  ///< one per layer
  ActStats final_norm;  ///< rms_norm(last hidden state) * output_norm: the output matrix's input
};

/// Runs `tokens` (1 to 256) through the model in double on the CPU.
/// `progress(layer)` after each layer; returning false cancels (kCancelled).
Result<ProbeReport> probe_model(const Model& m, std::span<const int32_t> tokens,
                                const std::function<bool(int64_t)>& progress = {});

}  // namespace loom
