// The Q8 activations of the decode matvecs (layout: q8_act.cuh): from a
// float x (quantize_q8), or written by the RMS norm that makes x, in the same
// launch (rms_norm_q8), so that the matvec after a norm needs no quantize
// launch of its own.
#include <cuda_fp16.h>

#include <cinttypes>

#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"
#include "engine/backends/cuda/matmul/q8_act.cuh"
#include "engine/backends/cuda/pdl.cuh"

namespace loom::cuda {

namespace {

// One warp per 32-value group; lane j quantizes value j.
__global__ void quantize_q8_kernel(const float* x, int64_t n_groups, int64_t groups_total,
                                   uint64_t token_bytes, int8_t* xq, float2* xd) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t gi = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (gi >= groups_total) return;  // the whole warp leaves together
  const int lane = threadIdx.x & 31;
  const int64_t t = gi / n_groups, g = gi % n_groups;
  q8_store_lane(x[gi * 32 + lane], g, lane, xq + t * token_bytes, xd + t * n_groups);
}

// rms_norm_kernel of cuda_ops.cu (the same sums and products, so `out` is
// bit for bit the same), which also quantizes each 32-value group of its
// output: with 1024 threads and n a multiple of 32, the 32 values a warp
// writes in one pass are one group.
constexpr int kNormThreads = 1024;

// kPer > 0: n <= kPer * kNormThreads, and each thread loads its values of x
// and w once, all at the start (the weights' loads wait on nothing), and
// keeps them in registers; kPer == 0: any n, loads in the loops.
template <int kPer>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_q8_kernel(const float* x, const float* w, float eps, float* out, int64_t n,
                       uint64_t token_bytes, int8_t* xq, float2* xd) {
  __shared__ double partial[kNormThreads / 32];
  const float* xr = x + blockIdx.x * n;
  float* yr = out + blockIdx.x * n;
  int8_t* xq_t = xq + blockIdx.x * token_bytes;
  float2* xd_t = xd + blockIdx.x * (n / 32);
  constexpr int kRegs = kPer > 0 ? kPer : 1;
  float xv[kRegs], wv[kRegs];
  double sum = 0.0;
  pdl_launch_dependents();
  if constexpr (kPer > 0) {
    // The weights first: they depend on no earlier launch (pdl.cuh).
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      wv[k] = i < n ? w[i] : 0.0f;
    }
    pdl_wait();
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      xv[k] = i < n ? xr[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (threadIdx.x + static_cast<int64_t>(k) * kNormThreads < n)
        sum += static_cast<double>(xv[k] * xv[k]);
    }
  } else {
    pdl_wait();
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
      const float v = xr[i];
      sum += static_cast<double>(v * v);
    }
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
  const int lane = threadIdx.x & 31;
  if constexpr (kPer > 0) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      if (i < n) {  // the same for the whole warp (n is a multiple of 32)
        const float v = (xv[k] * scale) * wv[k];
        yr[i] = v;
        q8_store_lane(v, i / 32, lane, xq_t, xd_t);
      }
    }
  } else {
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
      const float v = (xr[i] * scale) * w[i];
      yr[i] = v;
      q8_store_lane(v, i / 32, lane, xq_t, xd_t);
    }
  }
}

}  // namespace

uint64_t q8_token_bytes(int64_t n) {
  return static_cast<uint64_t>((n / 32 + 31) / 32) * 1024;
}

Status quantize_q8(const float* x, int64_t T, int64_t n, int8_t* xq, float2* xd, cudaStream_t s) {
  if (n % 32 != 0)
    return make_error(ErrorCode::kInternal, "CUDA quantize_q8: %" PRId64 " is not a multiple of 32",
                      n);
  const int64_t groups = T * n / 32;
  if (groups <= 0) return {};
  constexpr int kThreads = 256;  // 8 groups per block
  const int64_t blocks = (groups + 7) / 8;
  (void)launch_chained(quantize_q8_kernel, static_cast<unsigned>(blocks), kThreads, 0, s, x, n / 32,
                       groups, q8_token_bytes(n), xq, xd);
  return launch_status("quantize_q8");
}

Status rms_norm_q8(const float* x, const float* w, float eps, float* out, int64_t T, int64_t n,
                   int8_t* xq, float2* xd, cudaStream_t s) {
  if (T <= 0 || n <= 0) return {};
  if (n % 32 != 0 || T > kMaxMatvecTokens)
    return make_error(ErrorCode::kInternal,
                      "CUDA rms_norm_q8: %" PRId64 " rows of %" PRId64 " (at most %" PRId64
                      ", a multiple of 32)",
                      T, n, kMaxMatvecTokens);
  const auto blocks = static_cast<unsigned>(T);
  if (n <= 4 * kNormThreads)
    (void)launch_chained(rms_norm_q8_kernel<4>, blocks, kNormThreads, 0, s, x, w, eps, out, n,
                         q8_token_bytes(n), xq, xd);
  else if (n <= 8 * kNormThreads)
    (void)launch_chained(rms_norm_q8_kernel<8>, blocks, kNormThreads, 0, s, x, w, eps, out, n,
                         q8_token_bytes(n), xq, xd);
  else
    (void)launch_chained(rms_norm_q8_kernel<0>, blocks, kNormThreads, 0, s, x, w, eps, out, n,
                         q8_token_bytes(n), xq, xd);
  return launch_status("rms_norm_q8");
}

}  // namespace loom::cuda
