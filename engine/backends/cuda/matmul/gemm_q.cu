// Products of quantized weights and a few dozen tokens on the tensor cores
// (gemm_q, matmul_kernels.h): continuous batching's decode steps (one token
// of each of 9..64 sequences) and short prompt chunks. cuBLAS needs the
// weights as F16 first, a copy of the whole matrix at every call whatever T;
// here each block decodes its weight rows into shared memory and multiplies
// them there, so the weights are read once per tile of up to 64 tokens.
//
// Grid (row tiles, K splits, token tiles), 128 threads = 4 warps. A block
// takes kBm = 64 weight rows (16 per warp: the m16 of mma.sync.m16n8k16,
// F16 inputs, F32 accumulators) and kBn = 16, 32 or 64 tokens, the least
// that holds T. Each step takes kKs = 64 values of k:
//  - the 64 rows x 2 groups of 32 are decoded (decode_group, as the int8
//    matvecs read them) by one thread each, scaled to floats and rounded to
//    F16 into shared memory; rows past n_out repeat the last (dropped);
//  - the tokens' F16 activations (to_f16 of x) are copied beside them;
//    tokens past T and groups past the row are zeros;
//  - each warp multiplies its 16 rows by every token: ldmatrix of the
//    weight rows (A, row-major) and of the token rows (B, col-major).
// Shared memory holds two steps (one is written while the other is read),
// so one barrier a step suffices; rows are padded by 16 bytes so that the 8
// row addresses of an ldmatrix fall in different banks. Several blocks fit
// an SM (37 KiB at kBn 64), so one block's loads overlap another's products.
// Matrices with few row tiles (fewer blocks than four per SM) split k over
// gridDim.y blocks, whose partial sums a second kernel adds in a fixed
// order (so results do not depend on timing), with the bias and the
// accumulated y.
#include <cuda_fp16.h>

#include <cinttypes>
#include <cstdlib>

#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"
#include "engine/backends/cuda/mma.cuh"
#include "engine/backends/cuda/quant_device.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;         // 4 warps
constexpr int kBm = 64;               // weight rows per block, 16 per warp
constexpr int kKs = 64;               // k values per step: two groups of 32
constexpr int kStride = kKs + 8;      // halfs per shared row (16 bytes of padding)
constexpr int kMaxSplits = 8;         // k splits at most
constexpr int kMinStepsPerSplit = 4;  // a split takes at least this many steps

struct GemmQArgs {
  const uint8_t* w;
  uint64_t row_bytes;
  int n_out;
  int n_groups;    // groups of 32 per row (n_in / 32)
  const uint4* x;  // F16 activations [T][n_in], 8 halfs per uint4
  int x_ld;        // uint4s per token (n_in / 8)
  int T;
  int steps_per_split;
  float* y;           // [T][n_out]
  const float* bias;  // [n_out] or null
  bool accumulate;
  float* part;  // k splits' partial sums [splits][T][n_out], or null (one split)
};

// 8 quants (bytes of two words) times d, plus m, as 4 words of two halfs.
__device__ __forceinline__ uint4 halfs_of(int q0, int q1, float d, float m) {
  uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int v = k == 0 ? q0 : q1;
    const float e0 = d * static_cast<float>(static_cast<int8_t>(v)) + m;
    const float e1 = d * static_cast<float>(static_cast<int8_t>(v >> 8)) + m;
    const float e2 = d * static_cast<float>(static_cast<int8_t>(v >> 16)) + m;
    const float e3 = d * static_cast<float>(static_cast<int8_t>(v >> 24)) + m;
    h[2 * k] = pack_half2(e0, e1);
    h[2 * k + 1] = pack_half2(e2, e3);
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

template <DType D, int kBn>
__global__ void __launch_bounds__(kThreads) gemm_q_kernel(GemmQArgs a) {
  constexpr int kNt = kBn / 8;  // n8 tiles per warp
  static_assert(kBn % 16 == 0 && (kBn * 8) % kThreads == 0, "whole ldmatrix pairs and chunks");
  __shared__ __align__(16) __half sw[2][kBm * kStride];
  __shared__ __align__(16) __half sx[2][kBn * kStride];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = blockIdx.x * kBm, t0 = blockIdx.z * kBn;
  const int total_steps = (a.n_groups + 1) / 2;
  const int s_begin = blockIdx.y * a.steps_per_split;
  const int s_end = min(total_steps, s_begin + a.steps_per_split);

  float c[kNt][4];
#pragma unroll
  for (int j = 0; j < kNt; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;

  // This thread decodes group (2 step + wg) of weight row wr.
  const int wr = tid / 2, wg = tid % 2;
  const uint8_t* wrow = a.w + static_cast<uint64_t>(min(m0 + wr, a.n_out - 1)) * a.row_bytes;
  // ldmatrix addresses: A (rows) matrix l / 8 = (rows + 8 (l / 8 % 2), k + 8 (l / 16));
  // B (tokens) = (tokens + 8 (l / 16), k + 8 (l / 8 % 2)).
  const int a_row = warp * 16 + lane % 8 + 8 * (lane / 8 % 2), a_col = 8 * (lane / 16);
  const int b_row = lane % 8 + 8 * (lane / 16), b_col = 8 * (lane / 8 % 2);

  for (int st = s_begin; st < s_end; ++st) {
    const int b = (st - s_begin) & 1;
    {
      const int g = 2 * st + wg;
      uint4* dst = reinterpret_cast<uint4*>(&sw[b][wr * kStride + 32 * wg]);
      if (g < a.n_groups) {
        const QGroup q = decode_group<D>(wrow, g);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          dst[i] = halfs_of(q.q[2 * i], q.q[2 * i + 1], i < 2 ? q.d_lo : q.d_hi, q.m);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) dst[i] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int i = tid; i < kBn * 8; i += kThreads) {
      const int t = i / 8, part = i % 8;  // 8 halfs: k 8 part .. + 7 of the step
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t0 + t < a.T && 2 * st + part / 4 < a.n_groups)
        v = a.x[static_cast<int64_t>(t0 + t) * a.x_ld + 8 * st + part];
      *reinterpret_cast<uint4*>(&sx[b][t * kStride + 8 * part]) = v;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kKs; kk += 16) {
      uint32_t af[4];
      ldsm_x4(smem_u32(&sw[b][a_row * kStride + kk + a_col]), af[0], af[1], af[2], af[3]);
#pragma unroll
      for (int j = 0; j < kNt; j += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(smem_u32(&sx[b][(8 * j + b_row) * kStride + kk + b_col]), b0, b1, b2, b3);
        mma_16816(c[j], af, b0, b1);
        mma_16816(c[j + 1], af, b2, b3);
      }
    }
  }

  // c[j] = (row g, token 2i), (g, 2i + 1), (g + 8, 2i), (g + 8, 2i + 1) of n8 tile j.
  const int g = lane / 4, i2 = 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = m0 + warp * 16 + g + 8 * (e / 2), tok = t0 + 8 * j + i2 + e % 2;
      if (row >= a.n_out || tok >= a.T) continue;
      const int64_t at = static_cast<int64_t>(tok) * a.n_out + row;
      if (a.part) {
        a.part[static_cast<int64_t>(blockIdx.y) * a.T * a.n_out + at] = c[j][e];
      } else {
        float v = c[j][e];
        if (a.bias) v += a.bias[row];
        if (a.accumulate) v += a.y[at];
        a.y[at] = v;
      }
    }
  }
}

// y[i] = sum of the splits' part[s][i] in order (+ bias) (+ y).
__global__ void gemm_q_reduce(const float* part, int splits, int64_t n, int n_out,
                              const float* bias, bool accumulate, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += part[s * n + i];
    if (bias) v += bias[i % n_out];
    if (accumulate) v += y[i];
    y[i] = v;
  }
}

int steps_of(const DevMatrix& w) {
  return static_cast<int>((w.n_in / 32 + 1) / 2);
}

}  // namespace

int gemm_q_splits(const DevMatrix& w, int64_t T, int sms) {
  const int64_t blocks = (w.n_out + kBm - 1) / kBm * (T > 32 ? (T + 63) / 64 : 1);
  const int steps = steps_of(w);
  int s = 1;
  while (s < kMaxSplits && blocks * s < 4 * static_cast<int64_t>(sms) &&
         steps / (2 * s) >= kMinStepsPerSplit)
    s *= 2;
  const int per = (steps + s - 1) / s;
  return (steps + per - 1) / per;  // none empty
}

Status gemm_q(const DevMatrix& w, const uint16_t* xf16, int64_t T, float* y, const float* bias,
              bool accumulate, int splits, float* part, cudaStream_t s) {
  if (!matvec_uses_q8(w.dtype) || w.n_in % 32 != 0 || T <= 0 || splits < 1 || (splits > 1 && !part))
    return make_error(ErrorCode::kInternal,
                      "CUDA gemm_q: %s weights of width %" PRId64 ", %" PRId64
                      " tokens in %d splits",
                      std::string(dtype_name(w.dtype)).c_str(), w.n_in, T, splits);
  const int steps = steps_of(w);
  const int per = (steps + splits - 1) / splits;
  GemmQArgs a{static_cast<const uint8_t*>(w.data),
              w.row_bytes,
              static_cast<int>(w.n_out),
              static_cast<int>(w.n_in / 32),
              reinterpret_cast<const uint4*>(xf16),
              static_cast<int>(w.n_in / 8),
              static_cast<int>(T),
              per,
              y,
              bias,
              accumulate,
              splits > 1 ? part : nullptr};
  const int bn = T <= 16 ? 16 : (T <= 32 ? 32 : 64);
  const dim3 grid(static_cast<unsigned>((w.n_out + kBm - 1) / kBm), static_cast<unsigned>(splits),
                  static_cast<unsigned>((T + bn - 1) / bn));
  dispatch_dtype(w.dtype, [&]<DType D>() {
    if constexpr (has_group_decode(D)) {
      if (bn == 16)
        gemm_q_kernel<D, 16><<<grid, kThreads, 0, s>>>(a);
      else if (bn == 32)
        gemm_q_kernel<D, 32><<<grid, kThreads, 0, s>>>(a);
      else
        gemm_q_kernel<D, 64><<<grid, kThreads, 0, s>>>(a);
    }
  });
  LOOM_TRY(launch_status("gemm_q"));
  if (splits == 1) return {};
  const int64_t n = T * w.n_out;
  const int64_t blocks = (n + 255) / 256;
  gemm_q_reduce<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, s>>>(
      part, splits, n, static_cast<int>(w.n_out), bias, accumulate, y);
  return launch_status("gemm_q_reduce");
}

}  // namespace loom::cuda
