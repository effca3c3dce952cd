// Scalar reference versions of the CPU element-wise and attention ops
// (cpu/ops.h): plain loops, one step at a time, double accumulators where a
// sum is involved. They are the ground truth the fast kernels are tested
// against; speed does not matter here, readability does.
//
// Shapes are given innermost last: [T, n] means T rows of n contiguous floats.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/ops.h"
#include "engine/core/dtype.h"

namespace loom::ref {

/// y[n] = x[n] / sqrt(mean(x^2) + eps) * w[n]. Same float expression as
/// ggml (double sum of float squares, float scale), so y may alias x.
void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n);

/// out[n] = silu(gate[n]) * up[n], silu evaluated in double.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

/// out[n] = gelu(gate[n]) * up[n] (GELU's tanh form, gemma's GeGLU), in double.
void gelu_mul(const float* gate, const float* up, float* out, int64_t n);

/// out[n] = a[n] + b[n].
void add(const float* a, const float* b, float* out, int64_t n);

/// In-place softmax over x[n]: exp and sum in double.
void softmax(float* x, int64_t n);

/// Row `row` of a [rows, n] matrix of dtype `t` (rows `row_bytes` apart), as floats.
void get_row(DType t, const void* w, size_t row_bytes, int64_t row, float* out, int64_t n);

/// Start and end pair indices of YaRN's ramp between interpolated and
/// extrapolated frequencies, as ggml_rope_yarn_corr_dims computes them.
void rope_yarn_corr_dims(int64_t n_rot, int64_t n_ctx_orig, float freq_base, float beta_fast,
                         float beta_slow, float dims[2]);

/// RoPE over x [T, n_heads, head_dim] in place, computed exactly as ggml's
/// CPU rope does (float math, theta built by repeated multiplication by
/// freq_base^(-2/n_rot)); dimensions >= n_rot are left as they are.
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
          const cpu::RopeParams& p);

/// Writes one token's K or V ([n_kv_heads, head_dim] floats) into row `row`
/// of a KV block (F16 rounded to nearest even, Q8_0 by quantize_row_q8_0).
void kv_store(DType dtype, void* block, size_t head_stride_bytes, int64_t n_kv_heads,
              int64_t head_dim, int64_t row, const float* src);

/// Causal GQA attention for query heads [h0, h1), same contract as
/// cpu::attention, computed the plain way: for each query the full score
/// row over positions 0..q_pos[t] (double), softmax, weighted sum of V.
void attention(const float* q, int64_t T, const int32_t* q_pos, int64_t n_heads,
               const cpu::KvView& kv, float scale, float* out, int64_t h0, int64_t h1);

}  // namespace loom::ref
