// Flash attention for prompts on the tensor cores (flash_prefill.h): causal
// GQA attention with the semantics of cuda::attention, sm_90.
//
// Grid (row tile, KV head), 128 threads = 4 warps. The rows of a KV head are
// the queries of every head of its GQA group, token-major: row R = t * group
// + (h - kvh * group), T * group rows in all, so one K/V tile loaded into
// shared memory serves all heads of the group (4 with llama3-8b). A block
// takes kBr = 64 rows, each warp 16 (the m16 of mma.sync.m16n8k16, F16
// inputs and FP32 accumulators); blocks are numbered from the last rows, so
// the longest (latest positions) start first.
//  - Q [64][D] is read once, scaled by scale * log2(e) (the softmax runs in
//    base 2 with exp2f), rounded to F16 in shared memory and kept in
//    registers as A fragments (D <= 128), or read from shared memory at each
//    key tile (D = 256, whose registers go to the output).
//  - Key tiles of kBc keys (64; 32 for D = 256) from 0 to the largest pos of
//    the block's rows: K and V rows into shared memory as F16, each row
//    padded by 16 bytes so that the 8 row addresses of an ldmatrix fall in
//    different banks. F16 caches: cp.async into two stages, the next tile
//    copied while this one is multiplied. Q8_0: one stage, the blocks
//    dequantized through registers. No row past the block's largest pos is
//    read (it may lie past the cache's capacity); the tile's rest is zeros,
//    masked.
//  - S = Q K^T in registers (ldmatrix of K rows as the col-major B), keys
//    past a row's own pos masked to -inf (pos is read per row: it need not
//    be contiguous), then the online softmax per row: running max m and sum
//    l in FP32, the 4 lanes holding a row combined by shuffles. P is rounded
//    to F16 and reused in registers as the A fragments of O += P V
//    (ldmatrix.trans of V). l sums the F16-rounded P, so the output is a
//    convex combination of V rows whatever P's rounding.
//  - A warp whose 16 rows all come before a key tile skips its products; rows
//    past T * group (the last tile's padding) have pos -1 and see no key.
// Shared memory: per stage a K and a V tile of kBc x (D + 8) halfs (Q is
// staged in stage 0's K tile, but apart for D 256): F16 36 KiB (D 64) to 68
// KiB (D 128) and 99 KiB (D 256); Q8_0 (one stage) 18 to 34 KiB, and 66 KiB
// for D 256. Past 48 KiB the opt-in is set once per device before the first
// launch.
#include <cuda_fp16.h>

#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/backends/cuda/attention/flash_prefill.h"
#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/mma.cuh"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBr = kWarps * 16;  // query rows per block (16 per warp)
constexpr float kLog2e = 1.4426950408889634f;

struct FlashArgs {
  const uint8_t* kc;  // K rows [n_kv_heads][capacity][row_bytes]
  const uint8_t* vc;
  const float* q;      // [T][n_heads][D]
  const int32_t* pos;  // [T]
  float* out;          // [T][n_heads][D]
  int64_t capacity;
  uint64_t row_bytes;
  int n_rows;  // T * group
  int n_heads;
  int group;
  float qscale;  // scale * log2(e)
  bool q8;       // Q8_0 rows, else F16 (the one-stage kernel reads both)
};

// kAsync: F16 rows copied by cp.async into two stages (the next tile lands
// while this one is multiplied); else one stage, loaded through registers
// (Q8_0 dequantized; F16 too under LOOM_CUDA_ATTN=sync or kernel 4).
template <int kD, bool kAsync>
struct FlashCfg {
  static constexpr int kBc = kD > 128 ? 32 : 64;  // keys per tile
  static constexpr bool kQRegs = kD <= 128;       // Q's A fragments held in registers
  static constexpr int kStride = kD + 8;          // halfs per shared row: 16 bytes of padding
  static constexpr int kTileHalfs = kBc * kStride;
  static constexpr int kStages = kAsync ? 2 : 1;
  // Q is staged in stage 0's K tile when its fragments go to registers.
  static constexpr int kQHalfs = kQRegs ? 0 : kBr * kStride;
  static constexpr int kSmemBytes = (kStages * 2 * kTileHalfs + kQHalfs) * 2;
  static constexpr int kChunks = kD / 8;  // 16-byte chunks (8 halfs) per row
  // Blocks per SM the registers are bounded for: 3 (at most 168 per thread)
  // where ptxas -v shows no spills under it (D 64; D 96 with cp.async), else 2
  // (D 128 with cp.async spills 68 bytes at 168; D 128 takes 200-240, D 256 252).
  static constexpr int kMinBlocks = kD <= 80 || (kAsync && kD <= 96) ? 3 : 2;
  static_assert(kD % 16 == 0, "mma k-steps of 16");
  static_assert(!kQRegs || kBc >= kBr, "Q is staged in the K tile");
  static_assert(kBc % 16 == 0 && (kBc * kChunks) % kThreads == 0 && (kBr * kChunks) % kThreads == 0,
                "whole chunks per thread");
};

// Values d0 .. d0 + 7 of a K or V row as 8 halfs: F16 rows as they are (16
// bytes, aligned: checked on the host), Q8_0 blocks (34 bytes: an F16 scale
// and 32 int8, 2-byte aligned) as scale * q rounded to F16.
__device__ __forceinline__ uint4 load_chunk(const uint8_t* row, int d0, bool q8) {
  if (!q8) return *reinterpret_cast<const uint4*>(row + d0 * 2);
  const uint8_t* blk = row + (d0 >> 5) * 34;
  const float scale = __half2float(*reinterpret_cast<const __half*>(blk));
  const uint16_t* qs = reinterpret_cast<const uint16_t*>(blk + 2 + (d0 & 31));
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t u = qs[i];  // little endian: value 2i in the low byte
    w[i] = pack_half2(scale * static_cast<float>(static_cast<int8_t>(u & 0xFF)),
                      scale * static_cast<float>(static_cast<int8_t>(u >> 8)));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int kD, bool kAsync>
__global__ void __launch_bounds__(kThreads, FlashCfg<kD, kAsync>::kMinBlocks)
    flash_prefill_kernel(FlashArgs a) {
  using C = FlashCfg<kD, kAsync>;
  constexpr int kBc = C::kBc, kS = C::kStride, kChunks = C::kChunks;
  extern __shared__ uint4 smem_raw[];  // 16-byte aligned, as ldmatrix and cp.async need
  // Stage st: K tile at smem + 2 st kTileHalfs, its V tile after it.
  __half* const smem = reinterpret_cast<__half*>(smem_raw);
  __half* const qs = C::kQRegs ? smem : smem + C::kStages * 2 * C::kTileHalfs;
  __shared__ int block_max;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;  // fragment row (and row + 8), column pair
  const int kvh = blockIdx.y;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kBr;
  const int group = a.group;

  if (tid == 0) block_max = -1;
  // Q rows r0 .. r0 + 63, scaled, as F16 (zeros past the last row).
  constexpr int kQIters = kBr * kChunks / kThreads;
#pragma unroll
  for (int it = 0; it < kQIters; ++it) {
    const int i = tid + it * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    const int row = r0 + r;
    uint4 w = make_uint4(0, 0, 0, 0);
    if (row < a.n_rows) {
      const int t = row / group, h = kvh * group + row % group;
      const float* src = a.q + (static_cast<int64_t>(t) * a.n_heads + h) * kD + c * 8;
      w.x = pack_half2(src[0] * a.qscale, src[1] * a.qscale);
      w.y = pack_half2(src[2] * a.qscale, src[3] * a.qscale);
      w.z = pack_half2(src[4] * a.qscale, src[5] * a.qscale);
      w.w = pack_half2(src[6] * a.qscale, src[7] * a.qscale);
    }
    *reinterpret_cast<uint4*>(qs + r * kS + c * 8) = w;
  }
  // Positions of this thread's two fragment rows (-1: padding, sees no key).
  const int row_lo = r0 + warp * 16 + g, row_hi = row_lo + 8;
  const int p_lo = row_lo < a.n_rows ? a.pos[row_lo / group] : -1;
  const int p_hi = row_hi < a.n_rows ? a.pos[row_hi / group] : -1;
  const int warp_max = __reduce_max_sync(0xFFFFFFFFu, max(p_lo, p_hi));
  const int warp_min = __reduce_min_sync(0xFFFFFFFFu, min(p_lo, p_hi));
  __syncthreads();  // Q staged; block_max initialized
  if (lane == 0) atomicMax(&block_max, warp_max);

  uint32_t qf[C::kQRegs ? kD / 16 : 1][4];
  if constexpr (C::kQRegs) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      ldsm_x4(smem_u32(qs + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8), qf[kk][0],
              qf[kk][1], qf[kk][2], qf[kk][3]);
  }
  __syncthreads();  // block_max final; Q read before the K tile takes its room
  const int bmax = block_max;

  float o[kD / 8][4];  // O, d tile n: (g, 8n + 2tq), (g, +1), (g + 8, 8n + 2tq), (g + 8, +1)
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  const uint8_t* kbase = a.kc + static_cast<int64_t>(kvh) * a.capacity * a.row_bytes;
  const uint8_t* vbase = a.vc + static_cast<int64_t>(kvh) * a.capacity * a.row_bytes;

  // K and V rows k0 .. k0 + kBc - 1 into stage st; none past bmax is read (zeros
  // instead). kAsync: cp.async, waited for by the caller; else through registers.
  auto load_tile = [&](int k0, int st) {
    __half* ks = smem + st * 2 * C::kTileHalfs;
    __half* vs = ks + C::kTileHalfs;
#pragma unroll
    for (int it = 0; it < kBc * kChunks / kThreads; ++it) {
      const int i = tid + it * kThreads;
      const int r = i / kChunks, c = i % kChunks;
      const int j = k0 + r;
      uint4* kd = reinterpret_cast<uint4*>(ks + r * kS + c * 8);
      uint4* vd = reinterpret_cast<uint4*>(vs + r * kS + c * 8);
      if (j > bmax) {
        *kd = make_uint4(0, 0, 0, 0);
        *vd = make_uint4(0, 0, 0, 0);
        continue;
      }
      const uint64_t off = static_cast<uint64_t>(j) * a.row_bytes;
      if constexpr (kAsync) {
        cp_async16(kd, kbase + off + c * 16);
        cp_async16(vd, vbase + off + c * 16);
      } else {
        *kd = load_chunk(kbase + off, c * 8, a.q8);
        *vd = load_chunk(vbase + off, c * 8, a.q8);
      }
    }
  };

  if constexpr (kAsync) {
    load_tile(0, 0);  // after the barrier above: stage 0 held Q until then
    cp_async_commit();
  }
  for (int k0 = 0, st = 0; k0 <= bmax; k0 += kBc, st ^= C::kStages - 1) {
    if constexpr (kAsync) {
      // The next tile into the other stage (last read in the previous
      // iteration, before its closing barrier), then wait for this one: a
      // group is committed even when empty, so at most one stays in flight.
      if (k0 + kBc <= bmax) load_tile(k0 + kBc, st ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      load_tile(k0, 0);
    }
    __syncthreads();  // the tile (every thread's copies and stores) visible
    const __half* ks = smem + st * 2 * C::kTileHalfs;
    const __half* vs = ks + C::kTileHalfs;

    if (k0 <= warp_max) {  // warp-uniform: some row of the warp sees a key of the tile
      // S = Q K^T, key tile n: columns 8n .. 8n + 7 (fragment layout as o).
      float s[kBc / 8][4];
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t af[4];
        if constexpr (C::kQRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) af[e] = qf[kk][e];
        } else {
          ldsm_x4(smem_u32(qs + (warp * 16 + (lane & 15)) * kS + kk * 16 + (lane >> 4) * 8), af[0],
                  af[1], af[2], af[3]);
        }
#pragma unroll
        for (int np = 0; np < kBc / 16; ++np) {
          // Matrices: keys +0..7 x d +0..7, keys +0..7 x d +8..15, keys +8..15 x d +0..7,
          // keys +8..15 x d +8..15: the b0, b1 of key tiles 2np and 2np + 1.
          uint32_t b0, b1, b2, b3;
          ldsm_x4(smem_u32(ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kS + kk * 16 +
                           ((lane >> 3) & 1) * 8),
                  b0, b1, b2, b3);
          mma_16816(s[2 * np], af, b0, b1);
          mma_16816(s[2 * np + 1], af, b2, b3);
        }
      }
      // Causal mask by each row's own position.
      if (k0 + kBc - 1 > warp_min) {
#pragma unroll
        for (int n = 0; n < kBc / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = k0 + n * 8 + 2 * tq + e;
            if (j > p_lo) s[n][e] = -INFINITY;
            if (j > p_hi) s[n][2 + e] = -INFINITY;
          }
        }
      }
      // Online softmax (base 2: Q carries log2(e)).
      float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) {
        mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
      }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {  // the 4 lanes of a row
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xFFFFFFFFu, mx_lo, x));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xFFFFFFFFu, mx_hi, x));
      }
      // A row that has seen no key yet keeps max -inf: subtract 0 instead (every
      // p is then exp2(-inf) = 0), never -inf - -inf.
      const float base_lo = mx_lo == -INFINITY ? 0.0f : mx_lo;
      const float base_hi = mx_hi == -INFINITY ? 0.0f : mx_hi;
      const float corr_lo = exp2f(m_lo - base_lo), corr_hi = exp2f(m_hi - base_hi);
      m_lo = mx_lo;
      m_hi = mx_hi;
      l_lo *= corr_lo;
      l_hi *= corr_hi;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        o[n][0] *= corr_lo;
        o[n][1] *= corr_lo;
        o[n][2] *= corr_hi;
        o[n][3] *= corr_hi;
      }
      // P as F16 A fragments: key step kk = key tiles 2kk (a0, a1) and 2kk + 1 (a2, a3).
      uint32_t pf[kBc / 16][4];
#pragma unroll
      for (int n = 0; n < kBc / 8; ++n) {
        const uint32_t plo = pack_half2(exp2f(s[n][0] - base_lo), exp2f(s[n][1] - base_lo));
        const uint32_t phi = pack_half2(exp2f(s[n][2] - base_hi), exp2f(s[n][3] - base_hi));
        const float2 flo = unpack_half2(plo), fhi = unpack_half2(phi);
        l_lo += flo.x + flo.y;
        l_hi += fhi.x + fhi.y;
        pf[n / 2][(n & 1) * 2] = plo;
        pf[n / 2][(n & 1) * 2 + 1] = phi;
      }
      // O += P V.
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < kD / 16; ++dp) {
          // Transposed matrices: keys +0..7 x d +0..7, keys +8..15 x d +0..7, keys +0..7 x
          // d +8..15, keys +8..15 x d +8..15: the b0, b1 of d tiles 2dp and 2dp + 1.
          uint32_t b0, b1, b2, b3;
          ldsm_x4_t(smem_u32(vs + (kk * 16 + (lane & 15)) * kS + dp * 16 + (lane >> 4) * 8), b0, b1,
                    b2, b3);
          mma_16816(o[2 * dp], pf[kk], b0, b1);
          mma_16816(o[2 * dp + 1], pf[kk], b2, b3);
        }
      }
    }
    __syncthreads();  // every warp done with the tile before the next overwrites it
  }

  // Each lane summed its own columns of P: add the row's 4 lanes.
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l_lo += __shfl_xor_sync(0xFFFFFFFFu, l_lo, x);
    l_hi += __shfl_xor_sync(0xFFFFFFFFu, l_hi, x);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half ? row_hi : row_lo;
    if (row >= a.n_rows) continue;
    const float l = half ? l_hi : l_lo;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int t = row / group, h = kvh * group + row % group;
    float* dst = a.out + (static_cast<int64_t>(t) * a.n_heads + h) * kD + 2 * tq;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      dst[8 * n] = o[n][2 * half] * inv;
      dst[8 * n + 1] = o[n][2 * half + 1] * inv;
    }
  }
}

// Lets the kernel take its dynamic shared memory past 48 KiB on the current
// device (once per device).
template <int kD, bool kAsync>
Status allow_smem() {
  using C = FlashCfg<kD, kAsync>;
  if constexpr (C::kSmemBytes <= 48 * 1024) {
    return {};
  } else {
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    LOOM_CUDA_TRY(cudaGetDevice(&dev), "current device (flash prefill)");
    const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return {};
    LOOM_CUDA_TRY(cudaFuncSetAttribute(flash_prefill_kernel<kD, kAsync>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                  "shared memory opt-in of the flash prefill kernel");
    done.fetch_or(bit, std::memory_order_acq_rel);
    return {};
  }
}

template <int kD, bool kAsync>
Status launch(const FlashArgs& args, int n_kv_heads, cudaStream_t s) {
  LOOM_TRY((allow_smem<kD, kAsync>()));
  const dim3 grid(static_cast<unsigned>((args.n_rows + kBr - 1) / kBr),
                  static_cast<unsigned>(n_kv_heads));
  flash_prefill_kernel<kD, kAsync><<<grid, kThreads, FlashCfg<kD, kAsync>::kSmemBytes, s>>>(args);
  return launch_status("attention (flash prefill)");
}

}  // namespace

bool flash_prefill_supports(int64_t head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

namespace {
bool env_attn_is(const char* value) {
  const char* e = std::getenv("LOOM_CUDA_ATTN");
  return e && std::strcmp(e, value) == 0;
}
}  // namespace

bool flash_prefill_enabled() {
  static const bool on = !env_attn_is("tile");
  return on;
}

Status flash_prefill(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                     int64_t n_heads, float scale, float* out, cudaStream_t s, bool one_stage) {
  static const bool env_one_stage = env_attn_is("sync");
  if (T <= 0) return {};
  if (!flash_prefill_supports(layer.head_dim))
    return make_error(ErrorCode::kUnsupported,
                      "CUDA flash prefill: head_dim %" PRId64 " (64, 80, 96, 128 or 256)",
                      layer.head_dim);
  const bool q8 = layer.dtype == DType::kQ8_0;
  if (!q8 && layer.dtype != DType::kF16)
    return make_error(ErrorCode::kUnsupported, "CUDA flash prefill: a %s cache",
                      std::string(dtype_name(layer.dtype)).c_str());
  if (q8 && layer.head_dim % 32 != 0)
    return make_error(ErrorCode::kUnsupported,
                      "CUDA flash prefill: a Q8_0 cache of head_dim %" PRId64, layer.head_dim);
  if (layer.n_kv_heads <= 0 || n_heads % layer.n_kv_heads != 0 || T > 65535 ||
      T * (n_heads / layer.n_kv_heads) > (int64_t{1} << 30))
    return make_error(ErrorCode::kInvalidArgument,
                      "CUDA flash prefill: %" PRId64 " tokens, %" PRId64 " heads over %" PRId64
                      " KV heads",
                      T, n_heads, layer.n_kv_heads);
  const int64_t group = n_heads / layer.n_kv_heads;
  // F16 rows are copied 16 bytes at a time (cp.async).
  if (!q8 && (reinterpret_cast<uintptr_t>(layer.k) % 16 +
              reinterpret_cast<uintptr_t>(layer.v) % 16 + layer.row_bytes % 16))
    return make_error(ErrorCode::kInternal, "CUDA flash prefill: K/V not 16-byte aligned");
  FlashArgs args{};
  args.kc = static_cast<const uint8_t*>(layer.k);
  args.vc = static_cast<const uint8_t*>(layer.v);
  args.q = q;
  args.pos = pos;
  args.out = out;
  args.capacity = layer.capacity;
  args.row_bytes = layer.row_bytes;
  args.n_rows = static_cast<int>(T * group);
  args.n_heads = static_cast<int>(n_heads);
  args.group = static_cast<int>(group);
  args.qscale = scale * kLog2e;
  args.q8 = q8;
  const int nkv = static_cast<int>(layer.n_kv_heads);
  const bool pipelined = !q8 && !one_stage && !env_one_stage;
  switch (layer.head_dim) {
    case 64: return pipelined ? launch<64, true>(args, nkv, s) : launch<64, false>(args, nkv, s);
    case 80: return pipelined ? launch<80, true>(args, nkv, s) : launch<80, false>(args, nkv, s);
    case 96: return pipelined ? launch<96, true>(args, nkv, s) : launch<96, false>(args, nkv, s);
    case 128: return pipelined ? launch<128, true>(args, nkv, s) : launch<128, false>(args, nkv, s);
    default: return pipelined ? launch<256, true>(args, nkv, s) : launch<256, false>(args, nkv, s);
  }
}

}  // namespace loom::cuda
