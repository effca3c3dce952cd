// Products of quantized weights and a few dozen tokens on the tensor cores
// (gemm_q, matmul_kernels.h): continuous batching's decode steps (one token
// of each of 9..128 sequences) and short prompt chunks. cuBLAS needs the
// weights as F16 first, a copy of the whole matrix at every call whatever T;
// here each block decodes its weight rows into shared memory and multiplies
// them there, so the weights are read once per tile of up to 128 tokens.
//
// Grid (row tiles, K splits, token tiles), 128 threads = 4 warps. A block
// takes kBm = 64 weight rows (16 per warp: the m16 of mma.sync.m16n8k16,
// F16 inputs, F32 accumulators) and kBn = 16, 32, 64 or 128 tokens, the
// least that holds T. It walks k in stages of 256 values (a K-quant super-block,
// eight 32-value blocks):
//  - the stage's raw rows (64 x 144 bytes for Q4_K) are loaded by all
//    threads into registers one stage ahead, so those loads are in flight
//    through the four steps of the stage before, and stored to shared
//    memory at its start;
//  - each step of 64 values, every thread decodes one group of 32 of one
//    row from there (decode_group, as the int8 matvecs read them), scaled
//    to floats and rounded to F16 into a shared tile, beside the tokens'
//    F16 activations (to_f16 of x; loaded one step ahead); tokens past T
//    and groups past the row are zeros, rows past n_out repeat the last;
//  - each warp multiplies its 16 rows by every token: ldmatrix of the
//    weight rows (A, row-major) and of the token rows (B, col-major), rows
//    padded by 16 bytes so that an ldmatrix's 8 row addresses fall in
//    different banks.
// Shared memory: at most 17 KiB of raw rows (Q8_0) and 27 KiB of tiles, so
// several blocks share an SM.
// Matrices with few row tiles (fewer blocks than four per SM) split k over
// gridDim.y blocks, whose partial sums a second kernel adds in a fixed
// order (so results do not depend on timing), with the bias and the
// accumulated y.
#include <cuda_fp16.h>

#include <cinttypes>
#include <cstdlib>
#include <type_traits>

#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"
#include "engine/backends/cuda/mma.cuh"
#include "engine/backends/cuda/quant_device.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;     // 4 warps
constexpr int kBm = 64;           // weight rows per block, 16 per warp
constexpr int kKs = 64;           // k values per step: two groups of 32
constexpr int kStride = kKs + 8;  // halfs per shared row (16 bytes of padding)
constexpr int kStage = 256;       // k values per stage of raw rows: 4 steps
constexpr int kMaxSplits = 8;     // k splits at most
// Splits until the grid has this many blocks per SM (8 and 16 measured the
// same on an H100: 16- and 64-token chunks of the 8B within 2.5%).
constexpr int kBlocksPerSm = 4;
constexpr int kMinStagesPerSplit = 2;  // a split takes at least this many stages

// Bytes of kStage values of a row of D (whole blocks: 256 values are one
// K-quant super-block or eight 32-value blocks).
template <DType D>
__host__ __device__ constexpr int stage_bytes() {
  using B = typename ref::BlockOf<D>::type;
  constexpr bool k = D == DType::kQ4_K || D == DType::kQ5_K || D == DType::kQ6_K;
  return static_cast<int>(sizeof(B)) * (kStage / (k ? ref::kQK_K : ref::kQK));
}

struct GemmQArgs {
  const uint8_t* w;
  uint64_t row_bytes;
  int n_out;
  int n_groups;    // groups of 32 per row (n_in / 32)
  const uint4* x;  // F16 activations [T][n_in], 8 halfs per uint4
  int x_ld;        // uint4s per token (n_in / 8)
  int T;
  int stages_per_split;
  float* y;           // [T][n_out]
  const float* bias;  // [n_out] or null
  bool accumulate;
  float* part;       // k splits' partial sums [splits][T][n_out], or null (one split)
  bool half_decode;  // halfs_fast (F16 arithmetic) rather than halfs_of
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

// The same in F16 arithmetic, without conversion instructions (an eighth of
// the FP32 rate): a byte b + 128 placed under the exponent bits 0x64 is the
// F16 1024 + b + 128, exactly; less 1152, times d, plus m (d and m rounded
// to F16: about 2e-4 more error per value than rounding d q + m once).
__device__ __forceinline__ uint4 halfs_fast(int q0, int q1, __half2 d, __half2 m) {
  const __half2 bias = __float2half2_rn(1152.0f);
  uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t u = static_cast<uint32_t>(k == 0 ? q0 : q1) ^ 0x80808080u;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t bits = __byte_perm(u, 0x64646464u, j == 0 ? 0x4140u : 0x4342u);
      __half2 v;
      memcpy(&v, &bits, sizeof(v));
      v = __hfma2(__hsub2(v, bias), d, m);
      memcpy(&h[2 * k + j], &v, sizeof(v));
    }
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// The block's raw rows for one stage, in 4-byte (kWords: rows and stage
// 4-byte aligned) or 2-byte units: thread t loads half h = t % 2 of row
// t / 2's stage bytes, the units at fixed offsets from one address. Bytes
// past a row's end are zeros (they decode no group that is used).
template <DType D, bool kWords>
struct RawTile {
  static constexpr int kRb = stage_bytes<D>();
  static constexpr int kUnit = kWords ? 4 : 2;
  static constexpr int kUnitsPerRow = kRb / kUnit;
  static constexpr int kPerThread = (kUnitsPerRow + 1) / 2;  // the first half's (the larger)
  static_assert(kRb % kUnit == 0 && kThreads == 2 * kBm, "two threads a row, whole units");
  using U = std::conditional_t<kWords, uint32_t, uint16_t>;
  U v[kPerThread];

  __device__ __forceinline__ void load(const GemmQArgs& a, int m0, int stage) {
    const int h = threadIdx.x % 2;
    const uint64_t row =
        static_cast<uint64_t>(min(m0 + static_cast<int>(threadIdx.x) / 2, a.n_out - 1));
    const uint64_t off = static_cast<uint64_t>(stage) * kRb + h * kPerThread * kUnit;
    const int64_t valid = static_cast<int64_t>(a.row_bytes) - static_cast<int64_t>(off);
    const U* p = reinterpret_cast<const U*>(a.w + row * a.row_bytes + off);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const bool in_row = h * kPerThread + i < kUnitsPerRow && (i + 1) * kUnit <= valid;
      v[i] = in_row ? p[i] : U(0);
    }
  }
  __device__ __forceinline__ void store(uint8_t* sraw) const {
    const int h = threadIdx.x % 2;
    U* d = reinterpret_cast<U*>(sraw) + (threadIdx.x / 2) * kUnitsPerRow + h * kPerThread;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if (h * kPerThread + i < kUnitsPerRow) d[i] = v[i];
  }
};

template <DType D, int kBn, bool kWords>
__global__ void __launch_bounds__(kThreads) gemm_q_kernel(GemmQArgs a) {
  using Raw = RawTile<D, kWords>;
  constexpr int kNt = kBn / 8;               // n8 tiles per warp
  constexpr int kXPer = kBn * 8 / kThreads;  // uint4s of activations per thread and step
  static_assert(kBn % 16 == 0 && kXPer * kThreads == kBn * 8, "whole ldmatrix pairs and chunks");
  __shared__ __align__(16) uint8_t sraw[kBm * Raw::kRb];
  __shared__ __align__(16) __half sw[kBm * kStride];
  __shared__ __align__(16) __half sx[kBn * kStride];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = blockIdx.x * kBm, t0 = blockIdx.z * kBn;
  const int total_stages = (a.n_groups + 7) / 8;
  const int s_begin = blockIdx.y * a.stages_per_split;
  const int s_end = min(total_stages, s_begin + a.stages_per_split);
  const int steps = (a.n_groups + 1) / 2;  // steps of kKs values in the row
  const int st_end = min(steps, 4 * s_end);

  float c[kNt][4];
#pragma unroll
  for (int j = 0; j < kNt; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;

  // Activations of step st: piece i = tid + kThreads e is token i / 8, k 8 (i % 8) .. + 7.
  uint4 xr[kXPer];
  auto load_x = [&](int st) {
#pragma unroll
    for (int e = 0; e < kXPer; ++e) {
      const int i = tid + kThreads * e, t = i / 8, part = i % 8;
      xr[e] = t0 + t < a.T && 2 * st + part / 4 < a.n_groups
                  ? a.x[static_cast<int64_t>(t0 + t) * a.x_ld + 8 * st + part]
                  : make_uint4(0, 0, 0, 0);
    }
  };

  // This thread decodes group wg of each step of weight row wr.
  const int wr = tid / 2, wg = tid % 2;
  // ldmatrix addresses: A (rows) matrix l / 8 = (rows + 8 (l / 8 % 2), k + 8 (l / 16));
  // B (tokens) = (tokens + 8 (l / 16), k + 8 (l / 8 % 2)).
  const int a_row = warp * 16 + lane % 8 + 8 * (lane / 8 % 2), a_col = 8 * (lane / 16);
  const int b_row = lane % 8 + 8 * (lane / 16), b_col = 8 * (lane / 8 % 2);

  Raw raw;
  if (s_begin < s_end) {
    raw.load(a, m0, s_begin);
    load_x(4 * s_begin);
  }
  for (int stage = s_begin; stage < s_end; ++stage) {
    // The stage's raw rows into shared memory; the next stage's loads then
    // stay in flight through this stage's four steps.
    __syncthreads();
    raw.store(sraw);
    if (stage + 1 < s_end) raw.load(a, m0, stage + 1);
    __syncthreads();
    for (int st = 4 * stage; st < min(4 * stage + 4, st_end); ++st) {
      const int gl = 2 * (st - 4 * stage) + wg;  // group in the stage
      uint4* dst = reinterpret_cast<uint4*>(&sw[wr * kStride + 32 * wg]);
      if (8 * stage + gl < a.n_groups) {
        const QGroup q = decode_group<D>(sraw + wr * Raw::kRb, gl);
        if (a.half_decode) {
          const __half2 dlo = __float2half2_rn(q.d_lo), dhi = __float2half2_rn(q.d_hi),
                        m = __float2half2_rn(q.m);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            dst[i] = halfs_fast(q.q[2 * i], q.q[2 * i + 1], i < 2 ? dlo : dhi, m);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            dst[i] = halfs_of(q.q[2 * i], q.q[2 * i + 1], i < 2 ? q.d_lo : q.d_hi, q.m);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) dst[i] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int e = 0; e < kXPer; ++e) {
        const int i = tid + kThreads * e;
        *reinterpret_cast<uint4*>(&sx[(i / 8) * kStride + 8 * (i % 8)]) = xr[e];
      }
      if (st + 1 < st_end) load_x(st + 1);
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kKs; kk += 16) {
        uint32_t af[4];
        ldsm_x4(smem_u32(&sw[a_row * kStride + kk + a_col]), af[0], af[1], af[2], af[3]);
#pragma unroll
        for (int j = 0; j < kNt; j += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4(smem_u32(&sx[(8 * j + b_row) * kStride + kk + b_col]), b0, b1, b2, b3);
          mma_16816(c[j], af, b0, b1);
          mma_16816(c[j + 1], af, b2, b3);
        }
      }
      __syncthreads();
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

// Tokens per block: the least tile of 16, 32, 64 or 128 that holds T
// (past 128, tiles of 128: each tile decodes the weights again).
int token_tile(int64_t T) {
  return T <= 16 ? 16 : (T <= 32 ? 32 : (T <= 64 ? 64 : 128));
}

int stages_of(const DevMatrix& w) {
  return static_cast<int>((w.n_in / 32 + 7) / 8);
}

// Whether gemm_q reads w's rows in 4-byte units (rows and stages 4-byte aligned).
bool words_of(const DevMatrix& w) {
  int rb = 0;
  dispatch_dtype(w.dtype, [&]<DType D>() {
    if constexpr (has_group_decode(D)) rb = stage_bytes<D>();
  });
  return rb % 4 == 0 && w.row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(w.data) % 4 == 0;
}

// LOOM_CUDA_GEMMQ_HALF=0: decode through FP32 (halfs_of), to compare.
bool half_decode() {
  static const bool on = [] {
    const char* e = std::getenv("LOOM_CUDA_GEMMQ_HALF");
    return !(e && e[0] == '0');
  }();
  return on;
}

}  // namespace

int gemm_q_splits(const DevMatrix& w, int64_t T, int sms) {
  const int bn = token_tile(T);
  const int64_t blocks = (w.n_out + kBm - 1) / kBm * ((T + bn - 1) / bn);
  const int stages = stages_of(w);
  int s = 1;
  while (s < kMaxSplits && blocks * s < kBlocksPerSm * static_cast<int64_t>(sms) &&
         stages / (2 * s) >= kMinStagesPerSplit)
    s *= 2;
  const int per = (stages + s - 1) / s;
  return (stages + per - 1) / per;  // none empty
}

Status gemm_q(const DevMatrix& w, const uint16_t* xf16, int64_t T, float* y, const float* bias,
              bool accumulate, int splits, float* part, cudaStream_t s) {
  if (!matvec_uses_q8(w.dtype) || w.n_in % 32 != 0 || T <= 0 || splits < 1 || (splits > 1 && !part))
    return make_error(ErrorCode::kInternal,
                      "CUDA gemm_q: %s weights of width %" PRId64 ", %" PRId64
                      " tokens in %d splits",
                      std::string(dtype_name(w.dtype)).c_str(), w.n_in, T, splits);
  const int stages = stages_of(w);
  const int per = (stages + splits - 1) / splits;
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
              splits > 1 ? part : nullptr,
              half_decode()};
  const int bn = token_tile(T);
  const dim3 grid(static_cast<unsigned>((w.n_out + kBm - 1) / kBm), static_cast<unsigned>(splits),
                  static_cast<unsigned>((T + bn - 1) / bn));
  const bool words = words_of(w);
  dispatch_dtype(w.dtype, [&]<DType D>() {
    if constexpr (has_group_decode(D)) {
      auto go = [&]<bool kWords>() {
        if (bn == 16)
          gemm_q_kernel<D, 16, kWords><<<grid, kThreads, 0, s>>>(a);
        else if (bn == 32)
          gemm_q_kernel<D, 32, kWords><<<grid, kThreads, 0, s>>>(a);
        else if (bn == 64)
          gemm_q_kernel<D, 64, kWords><<<grid, kThreads, 0, s>>>(a);
        else
          gemm_q_kernel<D, 128, kWords><<<grid, kThreads, 0, s>>>(a);
      };
      if constexpr (stage_bytes<D>() % 4 == 0) {
        if (words) {
          go.template operator()<true>();
          return;
        }
      }
      go.template operator()<false>();
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
