// Element-wise kernels of the CUDA backend (cuda_ops.h). Grid-stride loops,
// one value per thread; rms_norm is one block per row.
#include <cinttypes>

#include "engine/backends/cuda/cuda_ops.h"
#include "engine/backends/cuda/cuda_util.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

// One block of kNormThreads per row: a few values per thread, their loads
// unrolled so that they are in flight together (one row is the whole launch
// at decode), squares summed in double as cpu::rms_norm does.
constexpr int kNormThreads = 1024;

__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* x, const float* w, float eps, float* out, int64_t n) {
  __shared__ double partial[kNormThreads / 32];
  const float* xr = x + blockIdx.x * n;
  float* yr = out + blockIdx.x * n;
  double sum = 0.0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    const float v = xr[i];
    sum += static_cast<double>(v * v);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  double total = 0.0;
#pragma unroll
  for (int wi = 0; wi < kNormThreads / 32; ++wi) total += partial[wi];
  const float mean = static_cast<float>(total / static_cast<double>(n));
  const float scale = 1.0f / sqrtf(mean + eps);
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) yr[i] = (xr[i] * scale) * w[i];
}

// Heads [0, n_heads) of token t are x's, heads [n_heads, n_heads + n_heads2)
// x2's (q and k in one launch).
__global__ void rope_kernel(float* x, float* x2, int64_t T, int64_t n_heads, int64_t n_heads2,
                            int64_t head_dim, int64_t n_pairs, int neox, const float* cs) {
  const int64_t heads = n_heads + n_heads2;
  const int64_t total = T * heads * n_pairs;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % n_pairs;
    const int64_t th = k / n_pairs;  // t * heads + h
    const int64_t t = th / heads, h = th % heads;
    float* v = h < n_heads ? x + (t * n_heads + h) * head_dim
                           : x2 + (t * n_heads2 + h - n_heads) * head_dim;
    const int64_t i0 = neox ? i : 2 * i;
    const int64_t i1 = neox ? i + n_pairs : 2 * i + 1;
    const float c = cs[(t * n_pairs + i) * 2], sn = cs[(t * n_pairs + i) * 2 + 1];
    const float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * c - x1 * sn;
    v[i1] = x0 * sn + x1 * c;
  }
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double gd = g[k];
    const double silu = gd / (1.0 + exp(-gd));
    out[k] = static_cast<float>(silu * static_cast<double>(u[k]));
  }
}

// gelu(g) = 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3),
// in double (as ref::gelu_mul); the second form is finite for any g.
__global__ void gelu_mul_kernel(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double gd = g[k];
    const double gelu = gd / (1.0 + exp(-1.5957691216057308 * (gd + 0.044715 * gd * gd * gd)));
    out[k] = static_cast<float>(gelu * static_cast<double>(u[k]));
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[k] = a[k] + b[k];
}

}  // namespace

Status rms_norm(const float* x, const float* w, float eps, float* out, int64_t T, int64_t n,
                cudaStream_t s) {
  if (T <= 0 || n <= 0) return {};
  if (T > INT32_MAX)
    return make_error(ErrorCode::kUnsupported, "CUDA rms_norm: %" PRId64 " rows", T);
  rms_norm_kernel<<<static_cast<unsigned>(T), kNormThreads, 0, s>>>(x, w, eps, out, n);
  return launch_status("rms_norm");
}

Status rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t n_pairs, bool neox,
            const float* cs, cudaStream_t s) {
  return rope_qk(x, n_heads, nullptr, 0, T, head_dim, n_pairs, neox, cs, s);
}

Status rope_qk(float* q, int64_t n_heads, float* k, int64_t n_kv_heads, int64_t T, int64_t head_dim,
               int64_t n_pairs, bool neox, const float* cs, cudaStream_t s) {
  const int64_t total = T * (n_heads + n_kv_heads) * n_pairs;
  if (total <= 0) return {};
  rope_kernel<<<grid_for(total), kThreads, 0, s>>>(q, k, T, n_heads, n_kv_heads, head_dim, n_pairs,
                                                   neox ? 1 : 0, cs);
  return launch_status("rope");
}

Status silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return {};
  silu_mul_kernel<<<grid_for(n), kThreads, 0, s>>>(gate, up, out, n);
  return launch_status("silu_mul");
}

Status gelu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return {};
  gelu_mul_kernel<<<grid_for(n), kThreads, 0, s>>>(gate, up, out, n);
  return launch_status("gelu_mul");
}

Status add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return {};
  add_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, out, n);
  return launch_status("add");
}

}  // namespace loom::cuda
