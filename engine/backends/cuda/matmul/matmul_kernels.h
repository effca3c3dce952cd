// Launchers of the matmul kernels (matvec.cu, gemm_q.cu, dequant.cu), called by the
// Matmul class (matmul.cpp). Host-callable; each returns the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backends/cuda/matmul/cuda_matmul.h"

namespace loom::cuda {

/// Rows [r0, r0 + n) of w dequantized to F16 (IEEE half bits), [n, w.n_in].
Status dequant_f16(const DevMatrix& w, int64_t r0, int64_t n, uint16_t* out, cudaStream_t s);
/// out[n] = F16 of x[n], saturated to +-65504 (activations beyond F16's
/// range lose accuracy in the GEMM but do not become inf).
Status to_f16(const float* x, int64_t n, uint16_t* out, cudaStream_t s);
/// Q8 activations of x [T, n] (n a multiple of 32): per 32 values a scale
/// d = amax / 127 and int8 quants xq = round(x / d), laid out as q8_act.cuh
/// says. xq [T, q8_token_bytes(n)] bytes, xd [T, n / 32] pairs (d, d * the
/// sum of the group's quants).
Status quantize_q8(const float* x, int64_t T, int64_t n, int8_t* xq, float2* xd, cudaStream_t s);
/// Decode products, T <= kMaxMatvecTokens. y [T, w.n_out] = x W^T (+ bias)
/// (+ y when accumulate). With `up` (same shape and dtype as w):
/// y = silu(x W^T) * (x up^T) instead (bias and accumulate unused).
/// Quantized types read xq/xd (quantize_q8 of x), float types read x.
Status matvec(const DevMatrix& w, const DevMatrix* up, const float* x, const int8_t* xq,
              const float2* xd, int64_t T, float* y, const float* bias, bool accumulate,
              cudaStream_t s);
/// Whether matvec_multi takes these n matrices: 2 or 3 of one quantized
/// dtype, row size and width.
bool matvec_multi_fits(const DevMatrix* ws, int n);
/// ys[i] [T, ws[i].n_out] = x ws[i]^T (+ biases[i]) for matrices that
/// matvec_multi_fits, in one launch; x as xq/xd (quantize_q8).
Status matvec_multi(const DevMatrix* ws, int n, const int8_t* xq, const float2* xd, int64_t T,
                    float* const* ys, const float* const* biases, cudaStream_t s);
/// y [T, w.n_out] = x W^T (+ bias) (+ y when accumulate) on the tensor
/// cores for a quantized w (matvec_uses_q8, n_in a multiple of 32), reading
/// the weights once per tile of up to 128 tokens (gemm_q.cu); xf16 is x as
/// to_f16 gives it. With splits > 1 (gemm_q_splits) k is split over blocks
/// whose partial sums go to part [splits, T, w.n_out] first.
Status gemm_q(const DevMatrix& w, const uint16_t* xf16, int64_t T, float* y, const float* bias,
              bool accumulate, int splits, float* part, cudaStream_t s);
/// k splits for gemm_q of T tokens on a device of `sms` multiprocessors:
/// enough blocks for four on every SM where the matrix has few rows (at most
/// 8 splits, each at least 2 stages of 256 values).
int gemm_q_splits(const DevMatrix& w, int64_t T, int sms);
/// y[t][r] += bias[r] for y [T, n].
Status add_bias(float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s);
/// out[i] = silu(g[i]) * u[i], n values (out may alias g or u).
Status silu_mul_f32(const float* g, const float* u, float* out, int64_t n, cudaStream_t s);

/// Whether w's dtype has an int8 dot-product matvec (reads Q8 activations).
bool matvec_uses_q8(DType d);

}  // namespace loom::cuda
