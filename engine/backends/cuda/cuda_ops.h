// Element-wise kernels of the CUDA backend (cuda_ops.cu): norms, RoPE, the
// FFN's SiLU product, additions. Host-callable launchers returning the
// launch error; all pointers are device memory. Shapes innermost last.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/core/status.h"

namespace loom::cuda {

/// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for x, out [T, n] (out may be x).
/// As ref::rms_norm: squares summed in double, the scale in float.
Status rms_norm(const float* x, const float* w, float eps, float* out, int64_t T, int64_t n,
                cudaStream_t s);

/// Rotates x [T, n_heads, head_dim] in place: pair i of token t by
/// cs[t][i] = (cos, sin) (computed on the host, as cpu::rope does, so the
/// results match it); pairs (2i, 2i+1), or (i, i + n_pairs) with `neox`.
/// Dimensions past 2 * n_pairs are left alone.
Status rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t n_pairs, bool neox,
            const float* cs, cudaStream_t s);
/// rope of q [T, n_heads, head_dim] and k [T, n_kv_heads, head_dim] in one launch.
Status rope_qk(float* q, int64_t n_heads, float* k, int64_t n_kv_heads, int64_t T, int64_t head_dim,
               int64_t n_pairs, bool neox, const float* cs, cudaStream_t s);

/// out[n] = silu(gate[n]) * up[n] (silu in double, as ref::silu_mul).
Status silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);
/// out[n] = gelu(gate[n]) * up[n], GELU's tanh form in double (as ref::gelu_mul).
Status gelu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);

/// out[n] = a[n] + b[n].
Status add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s);

}  // namespace loom::cuda
