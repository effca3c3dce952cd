// Decode products (T <= 8 tokens): one warp per output row, reading the row
// once for every token.
//  - Quantized weights: x is first quantized to Q8 (per 32 values a float
//    scale and int8 quants, quantize_q8), then each lane takes whole 32-value
//    groups of the row (lane, lane + 32, ...: a warp reads a contiguous span
//    of blocks), decodes them to int8 (decode_group) and multiplies with dp4a;
//    the Q8 activations are read 128 bits at a time (layout: q8_act.cuh).
//    Two ways to read the row (matvec_kernel()):
//      direct: each lane loads its group's bytes from global memory (two or
//        four bytes at a time, the format's alignment: a warp's load
//        instruction touches 18-34 bytes per lane over ~600 bytes);
//      staged (default): the warp copies chunks of 32 groups (576 to 1088
//        contiguous bytes) into shared memory with 16-byte cp.async (8 for
//        Q6_K, whose 840-byte chunks are not 16-byte multiples), two chunks
//        a stage and two stages in flight, then each lane decodes its group
//        from there; groups past the last whole chunk are read directly.
//  - F32/F16/BF16: products in float; 128-bit loads of 8 values per lane
//    where the row length is a multiple of 8 and the rows and x are 16-byte
//    aligned, else one value per lane per step. F16 and BF16 (not direct):
//    four such loads a lane in flight, in a chained launch
//    (matvec_half_kernel; 15% faster F16 decode of an 8B model on an H100).
// Partial sums are reduced across the warp with shuffles; the epilogue adds
// the bias or the old y, or applies silu(gate) * up for the fused FFN input.
#include <cuda_fp16.h>

#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"
#include "engine/backends/cuda/matmul/q8_act.cuh"
#include "engine/backends/cuda/mma.cuh"
#include "engine/backends/cuda/pdl.cuh"
#include "engine/backends/cuda/quant_device.cuh"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;  // output rows per block
constexpr int kMaxT = static_cast<int>(kMaxMatvecTokens);

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + expf(-g));
}

// Writes row r's results: lane t writes token t. kT: the tokens the
// accumulators have room for (T <= kT).
template <bool kGlu, int kT = kMaxT>
__device__ __forceinline__ void epilogue(float (&acc)[kT], float (&acc2)[kT], int T, int64_t r,
                                         int64_t n_out, float* y, const float* bias,
                                         int accumulate) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t < T) {
      acc[t] = warp_sum(acc[t]);
      if constexpr (kGlu) acc2[t] = warp_sum(acc2[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t < T && lane == t) {
      float v = acc[t];
      float* dst = y + t * n_out + r;
      if constexpr (kGlu) {
        v = silu(v) * acc2[t];
      } else {
        if (bias) v += bias[r];
        if (accumulate) v += *dst;
      }
      *dst = v;
    }
  }
}

// Row `row` (and `row2` for the fused gate/up product) against the Q8
// activations: this lane's share of the products, per token. kT: 1 for one
// token (decode: the fewest registers, so the most warps in flight per SM),
// else 8 with T checked at run time. Groups from g0 on, read directly.
template <DType D, bool kGlu, bool kVec16, int kT>
__device__ __forceinline__ void row_products(const uint8_t* row, const uint8_t* row2, int64_t g0,
                                             int64_t n_groups, const int8_t* xq, uint64_t xq_stride,
                                             const float2* xd, int T, float (&acc)[kT],
                                             float (&acc2)[kT]) {
  const int lane = threadIdx.x & 31;
  // Unrolled so that the loads of several groups are in flight at once.
#pragma unroll 4
  for (int64_t g = g0 + lane; g < n_groups; g += 32) {
    const QGroup a = decode_group<D, kVec16>(row, g);
    QGroup b{};
    if constexpr (kGlu) b = decode_group<D, kVec16>(row2, g);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (t < T) {
        int xw[8];
        q8_load(xq + t * xq_stride, g, xw);
        const float2 s = xd[t * n_groups + g];
        acc[t] += group_dot<group_has_min(D)>(a, xw, s);
        if constexpr (kGlu) acc2[t] += group_dot<group_has_min(D)>(b, xw, s);
      }
    }
  }
}

// The staged reads: a chunk is 32 groups of a row (contiguous bytes).
template <DType D>
struct Chunk {
  static constexpr bool kSuper = D == DType::kQ4_K || D == DType::kQ5_K || D == DType::kQ6_K;
  static constexpr int kBytes =
      (kSuper ? 4 : 32) * static_cast<int>(sizeof(typename ref::BlockOf<D>::type));
  static constexpr int kLoad = kBytes % 16 == 0 ? 16 : 8;  // cp.async size
  static_assert(kBytes % kLoad == 0, "a chunk of whole cp.async pieces");
};
constexpr int kStageChunks = 2;  // chunks per row per stage
#ifndef LOOM_CUDA_MATVEC_STAGES
#define LOOM_CUDA_MATVEC_STAGES 4
#endif
// Stages in flight per warp: LOOM_CUDA_MATVEC_STAGES (a build setting, for
// measuring), fewer where a block's static shared memory (48 KiB) would not
// hold them; at least 2. Measured on the H200 (llama3-8b decode, tokens/s,
// two rounds, 2026-12-05): Q4_K_M 311.8, 311.7 at 2 stages, 300.2, 302.5 at
// 3 and 322.9, 319.8 at 4; Q4_0 359.8, 363.3 / 359.1, 359.9 / 359.1, 366.9.
template <DType D, bool kGlu>
constexpr int stages_for() {
  constexpr int per_stage = kWarps * kStageChunks * (kGlu ? 2 : 1) * Chunk<D>::kBytes;
  constexpr int fit = (48 * 1024 - 1024) / per_stage;
  return LOOM_CUDA_MATVEC_STAGES < fit ? (LOOM_CUDA_MATVEC_STAGES > 2 ? LOOM_CUDA_MATVEC_STAGES : 2)
                                       : (fit > 2 ? fit : 2);
}

// Shared bytes of one warp: its stages of kStageChunks chunks per row.
template <DType D, bool kGlu>
constexpr int staged_warp_bytes() {
  return stages_for<D, kGlu>() * kStageChunks * (kGlu ? 2 : 1) * Chunk<D>::kBytes;
}

template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(smem)), "l"(gmem)
                 : "memory");
}

// Whether D has words_group (the staged reads' word-aligned decode).
constexpr bool has_words_group(DType d) {
  return d == DType::kQ4_0 || d == DType::kQ8_0 || d == DType::kQ6_K;
}

// Group `lane` of a staged chunk of Q4_0 or Q8_0 blocks (18 or 34 bytes; the
// chunk 16-byte aligned), read as the 32-bit words that hold it: 5 or 9
// shared loads where decode_group makes 9 or 17 of 16 bits. A block starts
// 0 or 2 bytes into a word (even or odd lane); its scale is the low or high
// half of the first word, and each word of quants is two words shifted.
template <DType D>
__device__ __forceinline__ QGroup q40_q80_words_group(const uint8_t* chunk, int lane) {
  constexpr int kBlock = D == DType::kQ4_0 ? 18 : 34;
  constexpr int kQWords = D == DType::kQ4_0 ? 4 : 8;
  const int o = kBlock * lane;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(chunk) + o / 4;
  uint32_t v[kQWords + 1];
#pragma unroll
  for (int j = 0; j <= kQWords; ++j) v[j] = w[j];
  const int sh = 8 * (o & 3);  // 0 or 16
  QGroup r;
  r.m = 0.0f;
  r.d_lo = r.d_hi = h2f(static_cast<uint16_t>(v[0] >> sh));
#pragma unroll
  for (int j = 0; j < kQWords; ++j) {
    const uint32_t q = __funnelshift_rc(v[j], v[j + 1], 16 + sh);  // bytes 2 + 4j ... of the block
    if constexpr (D == DType::kQ4_0) {
      r.q[j] = static_cast<int>(__vsub4(q & 0x0F0F0F0Fu, 0x08080808u));
      r.q[j + 4] = static_cast<int>(__vsub4((q >> 4) & 0x0F0F0F0Fu, 0x08080808u));
    } else {
      r.q[j] = static_cast<int>(q);
    }
  }
  return r;
}

// Group `lane` of a staged chunk of four Q6_K blocks (210 bytes each; the
// chunk 8-byte aligned), from aligned 32-bit words as above: a block starts
// 0 or 2 bytes into a word, and so do its 32-byte runs of low and high bits.
// 18 shared loads of 32 bits where decode_group makes 32 of 16 bits.
__device__ __forceinline__ QGroup q6k_words_group(const uint8_t* chunk, int lane) {
  const int gi = lane & 7, h = gi >> 2, k = gi & 3;  // group gi of block lane / 8
  const int o = 210 * (lane >> 3);
  const int sh = 8 * (o & 3);  // 0 or 16
  const uint32_t* wl =
      reinterpret_cast<const uint32_t*>(chunk + ((o + 64 * h + 32 * (k & 1)) & ~3));
  const uint32_t* wh = reinterpret_cast<const uint32_t*>(chunk + ((o + 128 + 32 * h) & ~3));
  uint32_t l[9], hb[9];
#pragma unroll
  for (int j = 0; j < 9; ++j) l[j] = wl[j], hb[j] = wh[j];
  QGroup r;
  r.m = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t low = (__funnelshift_r(l[j], l[j + 1], sh) >> (4 * (k >> 1))) & 0x0F0F0F0Fu;
    const uint32_t high = (__funnelshift_r(hb[j], hb[j + 1], sh) >> (2 * k)) & 0x03030303u;
    r.q[j] = static_cast<int>(__vsub4(low | (high << 4), 0x20202020u));
  }
  const uint32_t sc = *reinterpret_cast<const uint16_t*>(chunk + o + 192 + 2 * gi);
  const float d = h2f(*reinterpret_cast<const uint16_t*>(chunk + o + 208));
  r.d_lo = d * static_cast<float>(static_cast<int8_t>(sc & 0xFFu));
  r.d_hi = d * static_cast<float>(static_cast<int8_t>(sc >> 8));
  return r;
}

// The word-aligned decode of a staged chunk's group `lane` (has_words_group).
template <DType D>
__device__ __forceinline__ QGroup words_group(const uint8_t* chunk, int lane) {
  if constexpr (D == DType::kQ6_K)
    return q6k_words_group(chunk, lane);
  else
    return q40_q80_words_group<D>(chunk, lane);
}

// row_products over the row's whole chunks through the warp's shared bytes
// `sm` (staged_warp_bytes, 16-byte aligned), then its tail groups directly.
// The rows start kLoad-aligned and row_bytes is a multiple of kLoad
// (checked on the host).
template <DType D, bool kGlu, int kT, bool kWords>
__device__ __forceinline__ void row_products_staged(const uint8_t* row, const uint8_t* row2,
                                                    int64_t n_groups, const int8_t* xq,
                                                    uint64_t xq_stride, const float2* xd, int T,
                                                    float (&acc)[kT], float (&acc2)[kT],
                                                    uint8_t* sm) {
  constexpr int kBytes = Chunk<D>::kBytes, kLoad = Chunk<D>::kLoad;
  constexpr int kRows = kGlu ? 2 : 1;
  constexpr int kStageBytes = kStageChunks * kRows * kBytes;
  constexpr int kStages = stages_for<D, kGlu>();
  constexpr bool kVec16 = D == DType::kQ4_K || D == DType::kQ5_K;  // shared chunks are aligned
  const int lane = threadIdx.x & 31;
  const int64_t n_chunks = n_groups / 32;
  const int64_t n_stages = (n_chunks + kStageChunks - 1) / kStageChunks;
  auto issue = [&](int64_t b) {
    uint8_t* dst = sm + (b % kStages) * kStageBytes;
#pragma unroll
    for (int u = 0; u < kStageChunks; ++u) {
      const int64_t c = b * kStageChunks + u;
      if (c < n_chunks) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const uint8_t* src = (r == 0 ? row : row2) + c * kBytes;
          uint8_t* d = dst + (u * kRows + r) * kBytes;
#pragma unroll
          for (int p = lane * kLoad; p < kBytes; p += 32 * kLoad) cp_async<kLoad>(d + p, src + p);
        }
      }
    }
    cp_async_commit();
  };
  // The first stages' weights are requested before pdl_wait(): they depend
  // on no earlier launch (pdl.cuh), so they load while it finishes.
#pragma unroll
  for (int b = 0; b < kStages; ++b) {
    if (b < n_stages)
      issue(b);
    else
      cp_async_commit();  // an empty group: the wait below then still means stage b
  }
  pdl_wait();
  for (int64_t b = 0; b < n_stages; ++b) {
    cp_async_wait<kStages - 1>();
    __syncwarp();  // every lane's copies of stage b are visible to the warp
    const uint8_t* st = sm + (b % kStages) * kStageBytes;
#pragma unroll
    for (int u = 0; u < kStageChunks; ++u) {
      const int64_t c = b * kStageChunks + u;
      if (c < n_chunks) {
        const int64_t g = c * 32 + lane;
        QGroup a, bq{};
        if constexpr (kWords && has_words_group(D)) {
          a = words_group<D>(st + u * kRows * kBytes, lane);
          if constexpr (kGlu) bq = words_group<D>(st + (u * kRows + 1) * kBytes, lane);
        } else {
          a = decode_group<D, kVec16>(st + u * kRows * kBytes, lane);
          if constexpr (kGlu) bq = decode_group<D, kVec16>(st + (u * kRows + 1) * kBytes, lane);
        }
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          if (t < T) {
            int xw[8];
            q8_load(xq + t * xq_stride, g, xw);
            const float2 s = xd[t * n_groups + g];
            acc[t] += group_dot<group_has_min(D)>(a, xw, s);
            if constexpr (kGlu) acc2[t] += group_dot<group_has_min(D)>(bq, xw, s);
          }
        }
      }
    }
    __syncwarp();  // stage b read by every lane before issue(b + kStages) refills it
    if (b + kStages < n_stages)
      issue(b + kStages);
    else
      cp_async_commit();  // empty, as above
  }
  row_products<D, kGlu, false, kT>(row, row2, n_chunks * 32, n_groups, xq, xq_stride, xd, T, acc,
                                   acc2);
}

// kStaged: row_products_staged, kVec16 meaning its word-aligned decode
// (words_group, Q4_0, Q8_0 and Q6_K); else row_products, kVec16 its 128-bit
// loads (Q4_K, Q5_K).
template <DType D, bool kGlu, bool kVec16, int kT, bool kStaged>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_q8_kernel(const uint8_t* w, const uint8_t* w2, uint64_t row_bytes, int64_t n_out,
                     int64_t n_groups, const int8_t* xq, uint64_t xq_stride, const float2* xd,
                     int T, float* y, const float* bias, int accumulate) {
  constexpr int kSm = kStaged ? staged_warp_bytes<D, kGlu>() : 16;
  __shared__ __align__(16) uint8_t sm[kWarps][kSm];
  pdl_launch_dependents();
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (r >= n_out) return;              // the whole warp leaves together
  if constexpr (!kStaged) pdl_wait();  // (the staged reads wait after their first loads)
  float acc[kT] = {}, acc2[kT] = {};
  const uint8_t* row = w + r * row_bytes;
  const uint8_t* row2 = kGlu ? w2 + r * row_bytes : nullptr;
  if constexpr (kStaged)
    row_products_staged<D, kGlu, kT, kVec16>(row, row2, n_groups, xq, xq_stride, xd, T, acc, acc2,
                                             sm[threadIdx.x / 32]);
  else
    row_products<D, kGlu, kVec16, kT>(row, row2, 0, n_groups, xq, xq_stride, xd, T, acc, acc2);
  epilogue<kGlu, kT>(acc, acc2, T, r, n_out, y, bias, accumulate);
}

// Up to three matrices of one dtype and row size over the same activations
// (q, k and v) in one launch: the grid runs over their rows end to end.
struct MultiRows {
  const uint8_t* w[3];
  float* y[3];
  const float* bias[3];
  int64_t rows[3];
};

template <DType D, bool kVec16, int kT, bool kStaged>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_q8_multi_kernel(MultiRows m, uint64_t row_bytes, int64_t n_groups, const int8_t* xq,
                           uint64_t xq_stride, const float2* xd, int T) {
  constexpr int kSm = kStaged ? staged_warp_bytes<D, false>() : 16;
  __shared__ __align__(16) uint8_t sm[kWarps][kSm];
  pdl_launch_dependents();
  // Which matrix: selected with constant indices, so the parameters are not
  // copied to local memory to be indexed.
  int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const uint8_t* w = m.w[0];
  float* y = m.y[0];
  const float* bias = m.bias[0];
  int64_t rows = m.rows[0];
  if (r >= rows) {
    r -= rows;
    w = m.w[1], y = m.y[1], bias = m.bias[1], rows = m.rows[1];
    if (r >= rows) {
      r -= rows;
      w = m.w[2], y = m.y[2], bias = m.bias[2], rows = m.rows[2];
      if (r >= rows) return;  // the whole warp leaves together
    }
  }
  if constexpr (!kStaged) pdl_wait();
  float acc[kT] = {}, acc2[kT] = {};
  const uint8_t* row = w + r * row_bytes;
  if constexpr (kStaged)
    row_products_staged<D, false, kT, kVec16>(row, nullptr, n_groups, xq, xq_stride, xd, T, acc,
                                              acc2, sm[threadIdx.x / 32]);
  else
    row_products<D, false, kVec16, kT>(row, nullptr, 0, n_groups, xq, xq_stride, xd, T, acc, acc2);
  epilogue<false, kT>(acc, acc2, T, r, rows, y, bias, 0);
}

// Eight consecutive values of a row at element i (i a multiple of 8; the row
// 16-byte aligned).
template <DType D>
__device__ __forceinline__ void load8(const uint8_t* row, int64_t i, float (&v)[8]) {
  if constexpr (D == DType::kF32) {
    const float4* p = reinterpret_cast<const float4*>(row) + i / 4;
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 u = *(reinterpret_cast<const uint4*>(row) + i / 8);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const auto lo = static_cast<uint16_t>(words[k] & 0xFFFFu);
      const auto hi = static_cast<uint16_t>(words[k] >> 16);
      if constexpr (D == DType::kF16) {
        v[2 * k] = h2f(lo), v[2 * k + 1] = h2f(hi);
      } else {
        v[2 * k] = bf2f(lo), v[2 * k + 1] = bf2f(hi);
      }
    }
  }
}

template <DType D, bool kVec, bool kGlu>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_float_kernel(const uint8_t* w, const uint8_t* w2, uint64_t row_bytes, int64_t n_out,
                        int64_t n_in, const float* x, int T, float* y, const float* bias,
                        int accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (r >= n_out) return;
  float acc[kMaxT] = {}, acc2[kMaxT] = {};
  const uint8_t* row = w + r * row_bytes;
  const uint8_t* row2 = kGlu ? w2 + r * row_bytes : nullptr;
  if constexpr (kVec) {
    for (int64_t i = 8 * lane; i < n_in; i += 256) {
      float a[8], b[8] = {};
      load8<D>(row, i, a);
      if constexpr (kGlu) load8<D>(row2, i, b);
#pragma unroll
      for (int t = 0; t < kMaxT; ++t) {
        if (t < T) {
          const float4* xp = reinterpret_cast<const float4*>(x + t * n_in + i);
          const float4 p = xp[0], q = xp[1];
          const float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            acc[t] += a[k] * xv[k];
            if constexpr (kGlu) acc2[t] += b[k] * xv[k];
          }
        }
      }
    }
  } else {
    for (int64_t i = lane; i < n_in; i += 32) {
      const float a = dequant_one<D>(row, i);
      const float b = kGlu ? dequant_one<D>(row2, i) : 0.0f;
#pragma unroll
      for (int t = 0; t < kMaxT; ++t) {
        if (t < T) {
          const float xv = x[t * n_in + i];
          acc[t] += a * xv;
          if constexpr (kGlu) acc2[t] += b * xv;
        }
      }
    }
  }
  epilogue<kGlu>(acc, acc2, T, r, n_out, y, bias, accumulate);
}

// Eight F16 or BF16 values of a 16-byte chunk, times x (8 floats, 32-byte
// aligned), added to acc.
template <DType D>
__device__ __forceinline__ float dot8(const uint4& u, const float* x) {
  const float4 p = reinterpret_cast<const float4*>(x)[0], q = reinterpret_cast<const float4*>(x)[1];
  const float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const auto lo = static_cast<uint16_t>(words[k] & 0xFFFFu);
    const auto hi = static_cast<uint16_t>(words[k] >> 16);
    if constexpr (D == DType::kF16)
      s += h2f(lo) * xv[2 * k] + h2f(hi) * xv[2 * k + 1];
    else
      s += bf2f(lo) * xv[2 * k] + bf2f(hi) * xv[2 * k + 1];
  }
  return s;
}

// F16 / BF16 rows (16-byte aligned, n_in a multiple of 8): each lane loads
// kHalfUnroll 16-byte chunks of its row (256 values apart) before it
// multiplies, so that a warp keeps 2 KiB of the row in flight, not 512
// bytes; the first chunks are requested before pdl_wait() (weights depend
// on no earlier launch). kT: 1 for one token, else kMaxT with T checked.
constexpr int kHalfUnroll = 4;
template <DType D, bool kGlu, int kT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_half_kernel(const uint8_t* w, const uint8_t* w2, uint64_t row_bytes, int64_t n_out,
                       int64_t n_in, const float* x, int T, float* y, const float* bias,
                       int accumulate) {
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (r >= n_out) {
    pdl_wait();
    return;
  }
  const auto* row = reinterpret_cast<const uint4*>(w + r * row_bytes);
  const auto* row2 = kGlu ? reinterpret_cast<const uint4*>(w2 + r * row_bytes) : nullptr;
  const int64_t n_chunks = n_in / 8;
  float acc[kT] = {}, acc2[kT] = {};
  uint4 a[kHalfUnroll], b[kHalfUnroll];
  auto load = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kHalfUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c < n_chunks) {
        a[u] = __ldg(row + c);
        if constexpr (kGlu) b[u] = __ldg(row2 + c);
      }
    }
  };
  load(lane);
  pdl_wait();
  for (int64_t c0 = lane; c0 < n_chunks; c0 += 32 * kHalfUnroll) {
#pragma unroll
    for (int u = 0; u < kHalfUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= n_chunks) break;
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        if (t < T) {
          const float* xt = x + t * n_in + 8 * c;
          acc[t] += dot8<D>(a[u], xt);
          if constexpr (kGlu) acc2[t] += dot8<D>(b[u], xt);
        }
      }
    }
    load(c0 + 32 * kHalfUnroll);
  }
  epilogue<kGlu, kT>(acc, acc2, T, r, n_out, y, bias, accumulate);
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t T, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < T * n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[k] += bias[k % n];
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[k] = silu(g[k]) * u[k];
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Calls f.template operator()<kVec16, kT, kStaged>() for the Q8 matvec
// kernels of D: staged where matvec_kernel() asks for it and the rows are
// aligned for its copies (`staged`), else direct, with 128-bit quant loads
// only for Q4_K/Q5_K rows that allow them; one token or up to eight.
template <DType D, typename F>
void q8_variant(bool staged, bool vec16, int T, F&& f) {
  auto by_t = [&]<bool kVec16, bool kStaged>() {
    if (T == 1)
      f.template operator()<kVec16, 1, kStaged>();
    else
      f.template operator()<kVec16, kMaxT, kStaged>();
  };
  if (staged) {
    if constexpr (has_words_group(D)) {
      if (matvec_kernel() == kMatvecStagedWords) {
        by_t.template operator()<true, true>();
        return;
      }
    }
    by_t.template operator()<false, true>();
    return;
  }
  if constexpr (D == DType::kQ4_K || D == DType::kQ5_K) {
    if (vec16) {
      by_t.template operator()<true, false>();
      return;
    }
  }
  by_t.template operator()<false, false>();
}

// Whether the staged kernel can copy rows of D starting at each of ps (n of
// them, null ones skipped), row_bytes apart.
template <DType D>
bool staged_fits(const void* const* ps, int n, uint64_t row_bytes) {
  if (matvec_kernel() == kMatvecDirect) return false;
  constexpr uint64_t a = Chunk<D>::kLoad;
  if (row_bytes % a != 0) return false;
  for (int i = 0; i < n; ++i)
    if (ps[i] && reinterpret_cast<uintptr_t>(ps[i]) % a != 0) return false;
  return true;
}

int initial_matvec_kernel() {
  const char* e = std::getenv("LOOM_CUDA_MATVEC");
  // Measured on the H200 (llama3-8b Q4_0 decode, 2026-12-05): words 368.7
  // and 367.8 tokens/s, staged 345.7 and 344.2.
  if (e && std::strcmp(e, "direct") == 0) return kMatvecDirect;
  if (e && std::strcmp(e, "staged") == 0) return kMatvecStaged;
  return kMatvecStagedWords;
}
int g_matvec_kernel = -1;

}  // namespace

int matvec_kernel() {
  if (g_matvec_kernel < 0) g_matvec_kernel = initial_matvec_kernel();
  return g_matvec_kernel;
}

void set_matvec_kernel(int k) {
  g_matvec_kernel = k;
}

bool matvec_uses_q8(DType d) {
  return has_group_decode(d);
}

Status matvec(const DevMatrix& w, const DevMatrix* up, const float* x, const int8_t* xq,
              const float2* xd, int64_t T, float* y, const float* bias, bool accumulate,
              cudaStream_t s) {
  if (T <= 0) return {};
  if (T > kMaxMatvecTokens)
    return make_error(ErrorCode::kInternal, "CUDA matvec: %" PRId64 " tokens (at most 8)", T);
  if (up && (up->dtype != w.dtype || up->n_in != w.n_in || up->n_out != w.n_out ||
             up->row_bytes != w.row_bytes))
    return make_error(ErrorCode::kInternal, "CUDA matvec: gate and up differ in shape or type");
  const auto* p = static_cast<const uint8_t*>(w.data);
  const auto* p2 = up ? static_cast<const uint8_t*>(up->data) : nullptr;
  const unsigned blocks = static_cast<unsigned>((w.n_out + kWarps - 1) / kWarps);
  const int t = static_cast<int>(T);
  const int acc = accumulate ? 1 : 0;
  if (has_group_decode(w.dtype)) {
    const int64_t n_groups = w.n_in / 32;
    const uint64_t xs = q8_token_bytes(w.n_in);
    // 128-bit loads of Q4_K/Q5_K quants where every row starts 16-byte aligned.
    const bool vec16 = w.row_bytes % 16 == 0 && aligned16(p) && (!p2 || aligned16(p2));
    dispatch_dtype(w.dtype, [&]<DType D>() {
      if constexpr (has_group_decode(D)) {
        const void* ps[2] = {p, p2};
        q8_variant<D>(staged_fits<D>(ps, 2, w.row_bytes), vec16, t,
                      [&]<bool kVec16, int kT, bool kStaged>() {
                        if (up)
                          (void)launch_chained(matvec_q8_kernel<D, true, kVec16, kT, kStaged>,
                                               blocks, kWarps * 32, 0, s, p, p2, w.row_bytes,
                                               w.n_out, n_groups, xq, xs, xd, t, y, nullptr, 0);
                        else
                          (void)launch_chained(matvec_q8_kernel<D, false, kVec16, kT, kStaged>,
                                               blocks, kWarps * 32, 0, s, p, nullptr, w.row_bytes,
                                               w.n_out, n_groups, xq, xs, xd, t, y, bias, acc);
                      });
      }
    });
    return launch_status("matvec_q8");
  }
  const bool vec = w.n_in % 8 == 0 && w.row_bytes % 16 == 0 && aligned16(p) &&
                   (!p2 || aligned16(p2)) && aligned16(x);
  const bool launched = dispatch_dtype(w.dtype, [&]<DType D>() {
    if constexpr (D == DType::kF16 || D == DType::kBF16) {
      if (vec && matvec_kernel() != kMatvecDirect) {
        auto go = [&]<int kT>() {
          if (up)
            (void)launch_chained(matvec_half_kernel<D, true, kT>, blocks, kWarps * 32, 0, s, p, p2,
                                 w.row_bytes, w.n_out, w.n_in, x, t, y, nullptr, 0);
          else
            (void)launch_chained(matvec_half_kernel<D, false, kT>, blocks, kWarps * 32, 0, s, p,
                                 nullptr, w.row_bytes, w.n_out, w.n_in, x, t, y, bias, acc);
        };
        if (t == 1)
          go.template operator()<1>();
        else
          go.template operator()<kMaxT>();
        return;
      }
    }
    if constexpr (D == DType::kF32 || D == DType::kF16 || D == DType::kBF16) {
      if (vec) {
        if (up)
          matvec_float_kernel<D, true, true><<<blocks, kWarps * 32, 0, s>>>(
              p, p2, w.row_bytes, w.n_out, w.n_in, x, t, y, nullptr, 0);
        else
          matvec_float_kernel<D, true, false><<<blocks, kWarps * 32, 0, s>>>(
              p, nullptr, w.row_bytes, w.n_out, w.n_in, x, t, y, bias, acc);
      } else {
        if (up)
          matvec_float_kernel<D, false, true><<<blocks, kWarps * 32, 0, s>>>(
              p, p2, w.row_bytes, w.n_out, w.n_in, x, t, y, nullptr, 0);
        else
          matvec_float_kernel<D, false, false><<<blocks, kWarps * 32, 0, s>>>(
              p, nullptr, w.row_bytes, w.n_out, w.n_in, x, t, y, bias, acc);
      }
    }
  });
  if (!launched)
    return make_error(ErrorCode::kUnsupported, "CUDA matvec: no kernel for %s weights",
                      std::string(dtype_name(w.dtype)).c_str());
  return launch_status("matvec_float");
}

bool matvec_multi_fits(const DevMatrix* ws, int n) {
  if (n < 2 || n > 3 || !has_group_decode(ws[0].dtype)) return false;
  for (int i = 1; i < n; ++i)
    if (ws[i].dtype != ws[0].dtype || ws[i].row_bytes != ws[0].row_bytes ||
        ws[i].n_in != ws[0].n_in)
      return false;
  return true;
}

Status matvec_multi(const DevMatrix* ws, int n, const int8_t* xq, const float2* xd, int64_t T,
                    float* const* ys, const float* const* biases, cudaStream_t s) {
  if (!matvec_multi_fits(ws, n))
    return make_error(ErrorCode::kInternal, "CUDA matvec_multi: matrices of different kinds");
  if (T <= 0) return {};
  if (T > kMaxMatvecTokens)
    return make_error(ErrorCode::kInternal, "CUDA matvec: %" PRId64 " tokens (at most 8)", T);
  MultiRows m{};
  int64_t total = 0;
  bool vec16 = ws[0].row_bytes % 16 == 0;
  const void* ps[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < n; ++i) {
    m.w[i] = static_cast<const uint8_t*>(ws[i].data);
    m.y[i] = ys[i];
    m.bias[i] = biases[i];
    m.rows[i] = ws[i].n_out;
    total += ws[i].n_out;
    vec16 = vec16 && aligned16(m.w[i]);
    ps[i] = m.w[i];
  }
  const unsigned blocks = static_cast<unsigned>((total + kWarps - 1) / kWarps);
  const int64_t n_groups = ws[0].n_in / 32;
  const uint64_t xs = q8_token_bytes(ws[0].n_in);
  const int t = static_cast<int>(T);
  dispatch_dtype(ws[0].dtype, [&]<DType D>() {
    if constexpr (has_group_decode(D)) {
      q8_variant<D>(staged_fits<D>(ps, 3, ws[0].row_bytes), vec16, t,
                    [&]<bool kVec16, int kT, bool kStaged>() {
                      (void)launch_chained(matvec_q8_multi_kernel<D, kVec16, kT, kStaged>, blocks,
                                           kWarps * 32, 0, s, m, ws[0].row_bytes, n_groups, xq, xs,
                                           xd, t);
                    });
    }
  });
  return launch_status("matvec_q8_multi");
}

Status add_bias(float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T * n <= 0) return {};
  add_bias_kernel<<<grid_for(T * n, 256), 256, 0, s>>>(y, bias, T, n);
  return launch_status("add_bias");
}

Status silu_mul_f32(const float* g, const float* u, float* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return {};
  silu_mul_kernel<<<grid_for(n, 256), 256, 0, s>>>(g, u, out, n);
  return launch_status("silu_mul");
}

}  // namespace loom::cuda
