// Decode attention: split-K flash decoding over a layer's device K/V.
//
// Grid (head group, query token, split). A block takes kG query heads that
// share one KV head (kG: the largest divisor of the GQA group up to 8), so
// each K and V row of its split is read once for all of them.
//
// F16 rows of a multiple of 8 values (hd <= 256) take decode_online_kernel:
// one pass, P lanes per key each loading 16 bytes of its K row and of its V
// row together, a running max and sum per lane group (online softmax),
// merged across lane groups and warps at the end. Other rows (Q8_0, odd
// head sizes), or LOOM_CUDA_ATTN_DECODE=phased, take decode_kernel's three
// steps:
//  1. scores: F16 rows of a multiple of 8 values (kCoop, under phased): P
//     lanes per key (hd / 8 rounded up to a power of two), each with 8
//     values of the row (one 16-byte load) and of the kG queries (in
//     registers), their partial dots added across the P lanes by shuffles,
//     so a warp takes 32 / P keys at a time; else (Q8_0 rows, or
//     LOOM_CUDA_ATTN_SCORES=thread) a thread per key against the kG queries
//     in shared memory. The scores go to shared memory;
//  2. softmax of the split: block-wide max and sum per head;
//  3. values: threads over (row, 16-byte segment) accumulate p * v for the
//     kG heads (F16 rows: kVB rows' loads issued before their products),
//     then the rows' partial sums are added in shared memory.
// With one split the result is written; else the split's (max, sum, sum of
// p * v) go to scratch and the merge kernel combines the splits exactly (the
// log-sum-exp merge). The launch depends only on the planned key count, not
// on the positions (read from `pos` on the device): a split past a query's
// last key contributes nothing.
//
// Device KV tier (SlotMap): the layer's rows are slots of block_size rows,
// each holding the block at a position given by the map (-1: free); a row
// counts when its slot holds a block and its position is at most the
// query's, and a row that does not count is never read. With `keep` the
// splits stay unmerged, room is left for the host's partials, and
// merge_splits() combines them (attention_split).
#include <cuda_fp16.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/backends/cuda/attention/decode_attention.h"
#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/q8_act.cuh"
#include "engine/backends/cuda/pdl.cuh"

namespace loom::cuda::detail {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChunk = 1024;     // keys per split at most
constexpr int kSmemFloats = 12000;  // dynamic shared memory (48 KiB with the static part)

// LOOM_CUDA_ATTN_SCORES=thread: a thread per key in step 1 (the first
// version) instead of lanes sharing a key.
bool coop_scores() {
  static const bool on = [] {
    const char* e = std::getenv("LOOM_CUDA_ATTN_SCORES");
    return !(e && std::strcmp(e, "thread") == 0);
  }();
  return on;
}

// LOOM_CUDA_ATTN_DECODE=phased: decode_kernel (scores, softmax, values in
// three steps with barriers between) where decode_online_kernel would run.
bool online_decode() {
  static const bool on = [] {
    const char* e = std::getenv("LOOM_CUDA_ATTN_DECODE");
    return !(e && std::strcmp(e, "phased") == 0);
  }();
  return on;
}

// Blocks the split plan aims at, per SM: LOOM_CUDA_ATTN_WAVES, default 4.
// Measured on the H200 with the three-step kernel (llama3-8b Q4_0, decode
// after 32768 tokens, 2026-12-04): 165.1 tokens/s at 8 against 140.3 at 2,
// where a block's keys were too few loads in flight per SM. With the
// one-pass kernel (H100, 2026-12-06, loom_cuda_attn_bench, µs per layer):
// Llama-3-8B heads 18.0 / 25.1 / 61.8 / 110.3 at 4 against 20.6 / 27.9 /
// 67.3 / 116.4 at 8 for 4k / 8k / 32k / 64k keys (6, 12 and 16 slower
// still), TinyLlama's 24.2 against 35.5 at 8k and 47.5 against 60.7 at 32k;
// the 8B Q4_K_M's decode after 32768 tokens 196.2 / 192.7 tokens/s at 4
// against 190.5 / 189.5 at 8. Below about 2k keys (4k with TinyLlama's
// heads) 4 and 8 plan the same splits, of 32 keys (the least).
// An environment setting in [1, most], else `dflt`.
int64_t env_count(const char* name, long most, long dflt) {
  const char* e = std::getenv(name);
  const long v = e ? std::strtol(e, nullptr, 10) : 0;
  return static_cast<int64_t>(v >= 1 && v <= most ? v : dflt);
}

int64_t waves() {
  static const int64_t w = env_count("LOOM_CUDA_ATTN_WAVES", 64, 4);
  return w;
}

// Most splits over the host blocks (LOOM_CUDA_ATTN_HOST_SPLITS, default 16):
// each takes whole blocks, as few as make that many. Read over PCIe
// (loom_cuda_attn_bench --host-keys, H100, 2026-12-06, 32768 keys on the
// device): 1.5 / 5 / 17 MiB of host blocks added 45 / 87 / 298 µs at 16
// splits against 50 / 125 / 369 at 64 and 49 / 123 / 370 at 256.
int64_t host_splits() {
  static const int64_t n = env_count("LOOM_CUDA_ATTN_HOST_SPLITS", 4096, 16);
  return n;
}

struct Fmt {
  const uint8_t* k;
  const uint8_t* v;
  int64_t capacity;
  uint64_t row_bytes;
  int hd;
  bool q8;
  bool vec16;               // F16 rows of a multiple of 8 values: 16-byte loads
  const int32_t* slot_pos;  // device tier: first position per slot (-1: free), else null
  int bs;                   // rows per slot
  int bs_shift;             // log2(bs) where bs is a power of two (the cache's 32), else -1
  // Host blocks read in place (SlotMap::host; one-pass kernel only): rows
  // from dev_rows on are host block (j - dev_rows) / bs's. Splits:
  // dev_splits of `chunk` rows over the slots, then host_splits of
  // host_chunk rows over the host blocks, launched first (blockIdx.z <
  // host_splits): their reads are the slowest.
  const uint8_t* const* host;
  int64_t dev_rows;
  uint64_t host_head, host_v;
  int host_chunk, dev_splits, host_splits;
  const RowKv* rows;  // per query row its own K/V (attention_rows), else null
};

// f with query row t's own K/V where the rows have their own (attention_rows).
__device__ __forceinline__ Fmt fmt_of_row(const Fmt& f, int t) {
  Fmt r = f;
  if (f.rows) {
    r.k = static_cast<const uint8_t*>(f.rows[t].k);
    r.v = static_cast<const uint8_t*>(f.rows[t].v);
    r.capacity = f.rows[t].capacity;
  }
  return r;
}

// Rows of V a thread loads before their products in step 3 (F16 rows).
// Measured on the H100 (8B Q4_K_M, decode after 32768 tokens, 2026-12-05):
// 4 rows 156.3 / 157.9 tokens/s against 149.7 / 150.0 one row at a time (the
// loads left to the compiler's unrolling); 8 rows, and 8 keys a lane in
// step 1 instead of 4, were 0.5-1.4% slower than 4.
constexpr int kVB = 4;

// Row j's slot (or host block) and its row there. In 32 bits (rows stay
// below 2^31: decode_attention checks), by shifts where bs is a power of
// two: a 64-bit division and remainder per key were most of what the slot
// map cost the one-pass kernel (loom_cuda_attn_bench --host-keys 0).
__device__ __forceinline__ uint32_t slot_of(const Fmt& f, int64_t j, uint32_t* r) {
  const auto u = static_cast<uint32_t>(j);
  const uint32_t s = f.bs_shift >= 0 ? u >> f.bs_shift : u / static_cast<uint32_t>(f.bs);
  *r = u - s * static_cast<uint32_t>(f.bs);
  return s;
}

// Whether device row j counts for a query at position qp (slot maps only).
__device__ __forceinline__ bool row_counts(const Fmt& f, int64_t j, int64_t qp) {
  uint32_t r;
  const int32_t p0 = f.slot_pos[slot_of(f, j, &r)];
  return p0 >= 0 && p0 + static_cast<int64_t>(r) <= qp;
}

__device__ __forceinline__ const uint8_t* row_at(const uint8_t* base, const Fmt& f, int kvh,
                                                 int64_t j) {
  return base + (static_cast<int64_t>(kvh) * f.capacity + j) * static_cast<int64_t>(f.row_bytes);
}

// Row j's K and V rows for KV head kvh: a device row's, or past the slots a
// host block's (mapped pinned memory read over PCIe, or its device copy).
__device__ __forceinline__ void kv_rows(const Fmt& f, int kvh, int64_t j, const uint8_t** kr,
                                        const uint8_t** vr) {
  if (f.host && j >= f.dev_rows) {
    uint32_t r;
    const uint32_t hb = slot_of(f, j - f.dev_rows, &r);
    const uint8_t* b = f.host[hb] + static_cast<uint64_t>(kvh) * f.host_head +
                       static_cast<uint64_t>(r) * f.row_bytes;
    *kr = b;
    *vr = b + f.host_v;
  } else {
    *kr = row_at(f.k, f, kvh, j);
    *vr = row_at(f.v, f, kvh, j);
  }
}

// Values d and d + 1 (d even) of a K or V row.
__device__ __forceinline__ float2 pair_at(const uint8_t* row, int d, bool q8) {
  if (!q8) return __half22float2(*reinterpret_cast<const __half2*>(row + 2 * d));
  const uint8_t* blk = row + (d / 32) * 34;
  const float scale = __half2float(*reinterpret_cast<const __half*>(blk));
  return make_float2(scale * static_cast<float>(static_cast<int8_t>(blk[2 + d % 32])),
                     scale * static_cast<float>(static_cast<int8_t>(blk[3 + d % 32])));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Block-wide max (kMax) or sum of kG values per thread; every thread gets them.
template <int kG, bool kMax>
__device__ __forceinline__ void block_reduce(float (&v)[kG], float (*red)[kG]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    v[g] = kMax ? warp_max(v[g]) : warp_sum(v[g]);
    if (lane == 0) red[warp][g] = v[g];
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float r = red[0][g];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, red[w][g]) : r + red[w][g];
    v[g] = r;
  }
  __syncthreads();  // red is reused
}

template <int kG, bool kCoop>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(Fmt fa, const float* q, const int32_t* pos, int n_heads, int group, float scale,
                  int chunk, int64_t n_rows, int n_splits, float* part, float2* part_ml, float* out,
                  Q8Out q8) {
  extern __shared__ float smem[];
  __shared__ float red[kWarps][kG];
  pdl_launch_dependents();
  pdl_wait();
  const Fmt f = fmt_of_row(fa, blockIdx.y);
  const int hd = f.hd;
  const int h0 = blockIdx.x * kG, t = blockIdx.y, s = blockIdx.z;
  const int kvh = h0 / group;
  float* q_s = smem;              // [kG][hd], scaled
  float* p_s = q_s + kG * hd;     // [kG][chunk]: scores, then probabilities
  float* o_s = p_s + kG * chunk;  // [rows][kG][hd]: the value rows' partial sums
  // Rows this split reads: the keys up to the query's position, or under a
  // slot map every row of the split's slots (row_counts masks them).
  const int64_t n_keys = f.slot_pos ? n_rows : static_cast<int64_t>(pos[t]) + 1;
  const int64_t k0 = static_cast<int64_t>(s) * chunk;
  const int n = static_cast<int>(n_keys - k0 < chunk ? (n_keys > k0 ? n_keys - k0 : 0) : chunk);
  for (int i = threadIdx.x; i < kG * hd; i += kThreads)
    q_s[i] = q[(static_cast<int64_t>(t) * n_heads + h0 + i / hd) * hd + i % hd] * scale;
  __syncthreads();

  float mx[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) mx[g] = -INFINITY;
  if constexpr (kCoop) {
    // 1. Scores, P lanes per key (f.vec16: hd a multiple of 8, hd <= 256).
    int P = 1;
    while (P * 8 < hd) P *= 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int c = lane % P, slot = lane / P, per_warp = 32 / P;
    const bool seg = c * 8 < hd;  // this lane holds 8 values of the row
    float qv[kG][8];
#pragma unroll
    for (int g = 0; g < kG; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) qv[g][e] = seg ? q_s[g * hd + 8 * c + e] : 0.0f;
    // kU keys per lane at a time, their loads issued together.
    constexpr int kU = 4;
    const int step = kWarps * per_warp;
    for (int j0 = warp * per_warp; j0 < n; j0 += kU * step) {
      uint4 w[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int j = j0 + u * step + slot;
        w[u] = j < n && seg ? reinterpret_cast<const uint4*>(row_at(f.k, f, kvh, k0 + j))[c]
                            : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int j = j0 + u * step + slot;
        float acc[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) acc[g] = 0.0f;
        const __half2* h2 = reinterpret_cast<const __half2*>(&w[u]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 kv = __half22float2(h2[e]);
#pragma unroll
          for (int g = 0; g < kG; ++g) acc[g] += qv[g][2 * e] * kv.x + qv[g][2 * e + 1] * kv.y;
        }
        for (int o = P / 2; o > 0; o >>= 1) {
#pragma unroll
          for (int g = 0; g < kG; ++g) acc[g] += __shfl_xor_sync(0xFFFFFFFFu, acc[g], o);
        }
        if (c == 0 && j < n) {
          const bool ok = !f.slot_pos || row_counts(f, k0 + j, pos[t]);
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            p_s[g * chunk + j] = ok ? acc[g] : -INFINITY;
            mx[g] = ok ? fmaxf(mx[g], acc[g]) : mx[g];
          }
        }
      }
    }
  } else
    // 1. Scores, a thread per key.
    for (int j = threadIdx.x; j < n; j += kThreads) {
      if (f.slot_pos && !row_counts(f, k0 + j, pos[t])) {
#pragma unroll
        for (int g = 0; g < kG; ++g) p_s[g * chunk + j] = -INFINITY;
        continue;
      }
      const uint8_t* kr = row_at(f.k, f, kvh, k0 + j);
      float acc[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) acc[g] = 0.0f;
      if (f.vec16) {
        const uint4* k4 = reinterpret_cast<const uint4*>(kr);
#pragma unroll 4
        for (int c = 0; c < hd / 8; ++c) {
          const uint4 w = k4[c];
          const __half2* h2 = reinterpret_cast<const __half2*>(&w);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 kv = __half22float2(h2[e]);
            const int d = c * 8 + 2 * e;
#pragma unroll
            for (int g = 0; g < kG; ++g)
              acc[g] += q_s[g * hd + d] * kv.x + q_s[g * hd + d + 1] * kv.y;
          }
        }
      } else {
#pragma unroll 4
        for (int d = 0; d < hd; d += 2) {
          const float2 kv = pair_at(kr, d, f.q8);
#pragma unroll
          for (int g = 0; g < kG; ++g)
            acc[g] += q_s[g * hd + d] * kv.x + q_s[g * hd + d + 1] * kv.y;
        }
      }
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        p_s[g * chunk + j] = acc[g];
        mx[g] = fmaxf(mx[g], acc[g]);
      }
    }
  // 2. Softmax of the split.
  block_reduce<kG, true>(mx, red);
  float sum[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) sum[g] = 0.0f;
  for (int j = threadIdx.x; j < n; j += kThreads) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      // (A split whose rows all are masked has mx -inf: no probability.)
      const float p = mx[g] == -INFINITY ? 0.0f : expf(p_s[g * chunk + j] - mx[g]);
      p_s[g * chunk + j] = p;
      sum[g] += p;
    }
  }
  block_reduce<kG, false>(sum, red);  // its barrier also publishes p_s

  // 3. Values: `rows` rows at a time, a thread per 16-byte segment (F16
  // rows of a multiple of 8 values) or per value pair of a row.
  const int per_row = f.vec16 ? hd / 8 : hd / 2, rows = kThreads / per_row;
  const int r = threadIdx.x / per_row, c = threadIdx.x % per_row;
  if (r < rows && f.vec16) {
    // kVB rows' loads in flight before their products; a row that does not
    // count (past n, or outside the slot map) loads zeros with p = 0.
    float o[kG][8];
#pragma unroll
    for (int g = 0; g < kG; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) o[g][e] = 0.0f;
    for (int j0 = r; j0 < n; j0 += kVB * rows) {
      uint4 w[kVB];
      bool ok[kVB];
#pragma unroll
      for (int u = 0; u < kVB; ++u) {
        const int j = j0 + u * rows;
        ok[u] = j < n && (!f.slot_pos || row_counts(f, k0 + j, pos[t]));
        w[u] = ok[u] ? *reinterpret_cast<const uint4*>(row_at(f.v, f, kvh, k0 + j) + 16 * c)
                     : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kVB; ++u) {
        const int j = j0 + u * rows;
        const __half2* h2 = reinterpret_cast<const __half2*>(&w[u]);
        float v[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 x = __half22float2(h2[e]);
          v[2 * e] = x.x;
          v[2 * e + 1] = x.y;
        }
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const float p = ok[u] ? p_s[g * chunk + j] : 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) o[g][e] += p * v[e];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) o_s[(r * kG + g) * hd + 8 * c + e] = o[g][e];
  } else if (r < rows) {
    float2 o[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) o[g] = make_float2(0.0f, 0.0f);
#pragma unroll 4
    for (int j = r; j < n; j += rows) {
      if (f.slot_pos && !row_counts(f, k0 + j, pos[t])) continue;
      const float2 v = pair_at(row_at(f.v, f, kvh, k0 + j), 2 * c, f.q8);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float p = p_s[g * chunk + j];
        o[g].x += p * v.x;
        o[g].y += p * v.y;
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      o_s[(r * kG + g) * hd + 2 * c] = o[g].x;
      o_s[(r * kG + g) * hd + 2 * c + 1] = o[g].y;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kG * hd; i += kThreads) {
    const int g = i / hd, d = i % hd;
    float acc = 0.0f;
    for (int rr = 0; rr < rows; ++rr) acc += o_s[(rr * kG + g) * hd + d];
    const int64_t row = static_cast<int64_t>(t) * n_heads + h0 + g;
    if (n_splits == 1) {
      const float v = sum[g] > 0.0f ? acc / sum[g] : 0.0f;
      out[row * hd + d] = v;
      // A warp's 32 values are one group of the token's row (hd % 32 == 0).
      if (q8.q)
        q8_store_lane(v, ((h0 + g) * hd + d) / 32, threadIdx.x & 31, q8.q + t * q8.token_bytes,
                      q8.d + static_cast<int64_t>(t) * (n_heads * hd / 32));
    } else {
      part[(row * n_splits + s) * hd + d] = acc;
      if (d == 0) part_ml[row * n_splits + s] = make_float2(n > 0 ? mx[g] : -INFINITY, sum[g]);
      // (Under a slot map mx is -INFINITY where no row counted.)
    }
  }
}

// The single-pass kernel (the default for F16 rows of a multiple of 8
// values, hd <= 256; LOOM_CUDA_ATTN_DECODE=phased: decode_kernel). P lanes
// per key as in decode_kernel's step 1, but each lane group also loads the
// key's V segment with its K segment, kU keys at a time, and keeps its own
// running max, sum and p * v (online softmax, in base 2: q is scaled by
// log2 e). No barrier separates reading K from reading V, so a warp has both
// in flight; the lane groups, then the warps, are merged at the end.
template <int kG, int kU>
__global__ void __launch_bounds__(kThreads)
    decode_online_kernel(Fmt fa, const float* q, const int32_t* pos, int n_heads, int group,
                         float scale, int chunk, int64_t n_rows, int n_splits, float* part,
                         float2* part_ml, float* out, Q8Out q8) {
  extern __shared__ float smem[];
  pdl_launch_dependents();
  pdl_wait();
  const Fmt f = fmt_of_row(fa, blockIdx.y);
  const int hd = f.hd;
  const int h0 = blockIdx.x * kG, t = blockIdx.y;
  const int kvh = h0 / group;
  const int64_t qp = pos[t];
  const int64_t n_keys = f.slot_pos ? n_rows : qp + 1;
  int s = static_cast<int>(blockIdx.z);
  int64_t k0 = static_cast<int64_t>(s) * chunk, end = f.host ? f.dev_rows : n_keys;
  if (f.host && s < f.host_splits) {  // a host split (host blocks' rows come after the slots')
    k0 = f.dev_rows + static_cast<int64_t>(s) * f.host_chunk;
    end = n_rows;
    s += f.dev_splits;
  } else if (f.host) {
    s -= f.host_splits;
    k0 = static_cast<int64_t>(s) * chunk;
  }
  const int64_t span = f.host && s >= f.dev_splits ? f.host_chunk : chunk;
  const int n = static_cast<int>(end - k0 < span ? (end > k0 ? end - k0 : 0) : span);
  int P = 1;
  while (P * 8 < hd) P *= 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int c = lane % P, slot = lane / P, per_warp = 32 / P;
  const bool seg = c * 8 < hd;  // this lane holds 8 values of a row
  constexpr float kLog2e = 1.4426950408889634f;
  float qv[kG][8], o[kG][8], m[kG], l[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      qv[g][e] =
          seg ? q[(static_cast<int64_t>(t) * n_heads + h0 + g) * hd + 8 * c + e] * scale * kLog2e
              : 0.0f;
      o[g][e] = 0.0f;
    }
  }
  const int step = kWarps * per_warp;
  // The loop bound is the warp's, not the lane group's: the shuffles need
  // every lane.
  for (int jb = warp * per_warp; jb < n; jb += kU * step) {
    uint4 kw[kU], vw[kU];
    bool cnt[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = jb + u * step + slot;
      cnt[u] = j < n && (!f.slot_pos || row_counts(f, k0 + j, qp));
      const bool ld = cnt[u] && seg;
      const uint8_t *kr = nullptr, *vr = nullptr;
      if (ld) kv_rows(f, kvh, k0 + j, &kr, &vr);
      kw[u] = ld ? reinterpret_cast<const uint4*>(kr)[c] : make_uint4(0, 0, 0, 0);
      vw[u] = ld ? reinterpret_cast<const uint4*>(vr)[c] : make_uint4(0, 0, 0, 0);
    }
    float sc[kU][kG];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float acc[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) acc[g] = 0.0f;
      const __half2* h2 = reinterpret_cast<const __half2*>(&kw[u]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 kv = __half22float2(h2[e]);
#pragma unroll
        for (int g = 0; g < kG; ++g) acc[g] += qv[g][2 * e] * kv.x + qv[g][2 * e + 1] * kv.y;
      }
      for (int off = P / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int g = 0; g < kG; ++g) acc[g] += __shfl_xor_sync(0xFFFFFFFFu, acc[g], off);
      }
#pragma unroll
      for (int g = 0; g < kG; ++g) sc[u][g] = cnt[u] ? acc[g] : -INFINITY;
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float mn = m[g];
#pragma unroll
      for (int u = 0; u < kU; ++u) mn = fmaxf(mn, sc[u][g]);
      if (mn == -INFINITY) continue;  // no key of this lane group counted yet
      const float corr = exp2f(m[g] - mn);
      m[g] = mn;
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const float p = exp2f(sc[u][g] - mn);
        l[g] += p;
        const __half2* h2 = reinterpret_cast<const __half2*>(&vw[u]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 x = __half22float2(h2[e]);
          o[g][2 * e] += p * x.x;
          o[g][2 * e + 1] += p * x.y;
        }
      }
    }
  }
  // The warp's lane groups merged (each lane ends with the warp's sums).
  for (int off = P; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float mo = __shfl_xor_sync(0xFFFFFFFFu, m[g], off);
      const float lo = __shfl_xor_sync(0xFFFFFFFFu, l[g], off);
      const float mn = fmaxf(m[g], mo);
      const float a = mn == -INFINITY ? 0.0f : exp2f(m[g] - mn);
      const float b = mn == -INFINITY ? 0.0f : exp2f(mo - mn);
      l[g] = l[g] * a + lo * b;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        o[g][e] = o[g][e] * a + __shfl_xor_sync(0xFFFFFFFFu, o[g][e], off) * b;
      m[g] = mn;
    }
  }
  // Then the warps: o_s [kWarps][kG][hd], ml_s [kWarps][kG] (max, sum).
  float* o_s = smem;
  float2* ml_s = reinterpret_cast<float2*>(o_s + kWarps * kG * hd);
  if (slot == 0 && seg) {
#pragma unroll
    for (int g = 0; g < kG; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) o_s[(warp * kG + g) * hd + 8 * c + e] = o[g][e];
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < kG; ++g) ml_s[warp * kG + g] = make_float2(m[g], l[g]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kG * hd; i += kThreads) {
    const int g = i / hd, d = i % hd;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, ml_s[w * kG + g].x);
    float O = 0.0f, L = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float2 ml = ml_s[w * kG + g];
        const float a = exp2f(ml.x - M);  // 0 for a warp that counted nothing
        O += o_s[(w * kG + g) * hd + d] * a;
        L += ml.y * a;
      }
    }
    const int64_t row = static_cast<int64_t>(t) * n_heads + h0 + g;
    if (n_splits == 1) {
      const float v = L > 0.0f ? O / L : 0.0f;
      out[row * hd + d] = v;
      if (q8.q)  // a warp's 32 values are one group of the token's row (hd % 32 == 0)
        q8_store_lane(v, ((h0 + g) * hd + d) / 32, threadIdx.x & 31, q8.q + t * q8.token_bytes,
                      q8.d + static_cast<int64_t>(t) * (n_heads * hd / 32));
    } else {
      part[(row * n_splits + s) * hd + d] = O;
      // The merge works in base e: the max back from base 2.
      if (d == 0) part_ml[row * n_splits + s] = make_float2(M == -INFINITY ? M : M / kLog2e, L);
    }
  }
}

// out = the splits' partials combined. Grid (head, token, 32 values of the
// head); 8 warps, warp w taking the splits s = w mod 8, lane the value. Each
// thread first finds the row's max and weighted sum over all splits (strided,
// then block-wide), then adds its splits' weighted o, four loads in flight,
// and the 8 warps' sums are added. (The first version, a thread per value
// walking every split in turn on a grid of one block per head: Llama-3-8B
// heads at 4k keys, 128 splits, took 37.2 µs per layer with it against 24.2
// with this one, the same attention kernel before it; H100, 2026-12-06.)
constexpr int kMergeWarps = 8;
__global__ void __launch_bounds__(kMergeWarps * 32)
    merge_kernel(const float* part, const float2* part_ml, int n_heads, int n_splits, int hd,
                 float* out, Q8Out q8) {
  __shared__ float red[kMergeWarps];
  __shared__ float o_s[kMergeWarps][32];
  pdl_launch_dependents();
  pdl_wait();
  const int h = blockIdx.x, t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, d = blockIdx.z * 32 + lane;
  const int64_t row = static_cast<int64_t>(t) * n_heads + h;
  const float2* ml = part_ml + row * n_splits;
  float M = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += kMergeWarps * 32) M = fmaxf(M, ml[s].x);
  M = warp_max(M);
  if (lane == 0) red[warp] = M;
  __syncthreads();
  M = red[0];
#pragma unroll
  for (int w = 1; w < kMergeWarps; ++w) M = fmaxf(M, red[w]);
  __syncthreads();  // red is reused
  float L = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += kMergeWarps * 32) {
    const float2 m = ml[s];
    L += m.x == -INFINITY ? 0.0f : m.y * expf(m.x - M);
  }
  L = warp_sum(L);
  if (lane == 0) red[warp] = L;
  float O = 0.0f;
  if (d < hd) {
    const float* p = part + row * n_splits * hd + d;
#pragma unroll 4
    for (int s = warp; s < n_splits; s += kMergeWarps) {
      const float2 m = ml[s];
      O += m.x == -INFINITY ? 0.0f : p[static_cast<int64_t>(s) * hd] * expf(m.x - M);
    }
  }
  o_s[warp][lane] = O;
  __syncthreads();
  if (warp != 0) return;
  L = red[0];
  O = o_s[0][lane];
#pragma unroll
  for (int w = 1; w < kMergeWarps; ++w) {
    L += red[w];
    O += o_s[w][lane];
  }
  const float v = L > 0.0f ? O / L : 0.0f;
  if (d < hd) out[row * hd + d] = v;
  if (q8.q)  // the warp's 32 values are one group (hd % 32 == 0)
    q8_store_lane(v, (h * hd + d) / 32, lane, q8.q + t * q8.token_bytes,
                  q8.d + static_cast<int64_t>(t) * (n_heads * hd / 32));
}

template <int kG>
void launch(dim3 grid, size_t smem, cudaStream_t s, const Fmt& f, const float* q,
            const int32_t* pos, int n_heads, int group, float scale, int chunk, int64_t n_rows,
            int n_splits, float* part, float2* part_ml, float* out, const Q8Out& q8) {
  // Keys per lane group in flight: 4, or 2 past 4 heads a block, where 4
  // takes 255 registers a thread. Measured on the H100 (2026-12-06,
  // loom_cuda_attn_bench, µs per layer): 8 heads of head_dim 64 (TinyLlama)
  // 19.5 / 35.4 / 60.7 with 2 against 22.8 / 39.9 / 55.3 with 4 at 4k / 8k /
  // 32k keys; 4 heads of head_dim 128 (Llama-3-8B) 20.6 / 28.0 / 67.2 with 4
  // against 21.6 / 30.1 / 72.8 with 2.
  constexpr int kU = kG > 4 ? 2 : 4;
  if (f.vec16 && f.hd <= 256 && online_decode())
    (void)launch_chained(decode_online_kernel<kG, kU>, grid, kThreads,
                         static_cast<size_t>(kWarps * kG * (f.hd + 2)) * sizeof(float), s, f, q,
                         pos, n_heads, group, scale, chunk, n_rows, n_splits, part, part_ml, out,
                         q8);
  else if (f.vec16 && f.hd <= 256 && coop_scores())
    (void)launch_chained(decode_kernel<kG, true>, grid, kThreads, smem, s, f, q, pos, n_heads,
                         group, scale, chunk, n_rows, n_splits, part, part_ml, out, q8);
  else
    (void)launch_chained(decode_kernel<kG, false>, grid, kThreads, smem, s, f, q, pos, n_heads,
                         group, scale, chunk, n_rows, n_splits, part, part_ml, out, q8);
}

}  // namespace

Status decode_attention(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                        int64_t plan_keys, int n_heads, float scale, int64_t forced_chunk,
                        AttentionScratch& scratch, float* out, cudaStream_t s, const Q8Out* out_q8,
                        const SlotMap* slots, SplitPartials* keep, const RowKv* row_kv) {
  const int hd = static_cast<int>(layer.head_dim);
  if (hd % 2 != 0 || hd > 2 * kThreads)
    return make_error(ErrorCode::kUnsupported, "CUDA decode attention: head_dim %d", hd);
  const int group = static_cast<int>(n_heads / layer.n_kv_heads);
  int kg = 1;  // heads per block: the largest divisor of the group up to 8
  for (int g = 8; g >= 1; --g) {
    if (group % g == 0) {
      kg = g;
      break;
    }
  }
  const bool q8 = layer.dtype == DType::kQ8_0;
  const bool vec16 = !q8 && hd % 8 == 0;
  const int rows = kThreads / (vec16 ? hd / 8 : hd / 2);  // value rows at a time (kernel, step 3)
  const int fixed = kg * hd * (1 + rows);                 // q_s and o_s
  int most = (kSmemFloats - fixed) / kg;
  most = std::min(kMaxChunk, most / 32 * 32);
  if (most < 32)
    return make_error(ErrorCode::kUnsupported, "CUDA decode attention: head_dim %d, %d heads", hd,
                      kg);
  if (slots) {
    // Under a slot map the planned keys are the slots' rows, and a split
    // takes whole slots (one per split: its (m, l) is its block's share).
    plan_keys = slots->n_slots * slots->block_size;
    if (slots->block_size <= 0 || slots->block_size > most)
      return make_error(ErrorCode::kUnsupported, "CUDA decode attention: slots of %" PRId64 " rows",
                        slots->block_size);
    if (slots->host && !host_slots_fit(layer))
      return make_error(ErrorCode::kUnsupported,
                        "CUDA decode attention: host blocks read in place need F16 rows of a "
                        "head_dim that is a multiple of 8, at most 256 (got %d)",
                        hd);
  }
  const int64_t n_blocks = n_heads / kg;
  const int64_t n_host = slots && slots->host ? slots->n_host : 0;
  const int64_t bs = slots ? slots->block_size : 1;
  int64_t chunk = forced_chunk;
  if (chunk <= 0) {
    // Enough splits that the grid covers the SMs waves() times.
    const int64_t want = waves() * static_cast<int64_t>(scratch.sm_count());
    const int64_t splits = std::max<int64_t>(1, (want + n_blocks * T - 1) / (n_blocks * T));
    if (!slots) {
      chunk = std::max<int64_t>(32, (plan_keys + splits - 1) / splits);
    } else {
      // Whole slots a split, and no more splits than planned: a grid one
      // split over the SMs' waves runs a second wave for it (the slots'
      // and the host blocks' rows together; their rounding can add one).
      const int64_t rows = plan_keys + n_host * bs;
      const int64_t s_max = std::max<int64_t>(1, splits - (n_host > 0 ? 1 : 0));
      chunk = std::max<int64_t>(1, (rows + s_max * bs - 1) / (s_max * bs)) * bs;
    }
  }
  chunk = std::min<int64_t>(chunk, most);
  if (slots) chunk = std::max<int64_t>(1, chunk / bs) * bs;
  const int64_t n_dev = std::max<int64_t>(1, (plan_keys + chunk - 1) / chunk);
  // Host blocks read in place: splits of whole blocks, as long as the
  // slots' and at most host_splits() of them.
  const int64_t host_chunk =
      n_host > 0 ? std::max((n_host + host_splits() - 1) / host_splits(), chunk / bs) * bs : 0;
  const int64_t n_hs = n_host > 0 ? (n_host * bs + host_chunk - 1) / host_chunk : 0;
  // Kept for the host: one more split, which the caller fills (merge_splits).
  const int64_t n_splits = n_dev + n_hs + (keep ? 1 : 0);
  if (n_splits > 65535)
    return make_error(ErrorCode::kUnsupported, "CUDA attention: %" PRId64 " splits", n_splits);
  if (plan_keys + n_host * bs >= (int64_t{1} << 31))
    return make_error(ErrorCode::kUnsupported, "CUDA attention: %" PRId64 " rows",
                      plan_keys + n_host * bs);
  int bs_shift = -1;  // log2 of the slots' rows, where a power of two
  for (int b = 0; b < 31 && slots; ++b) {
    if (int64_t{1} << b == bs) bs_shift = b;
  }
  float* part = nullptr;
  float2* part_ml = nullptr;
  if (n_splits > 1) {
    const uint64_t rws = static_cast<uint64_t>(T * n_heads * n_splits);
    const uint64_t part_bytes = (rws * static_cast<uint64_t>(hd) * sizeof(float) + 255) / 256 * 256;
    LOOM_TRY(scratch.ensure(part_bytes + rws * sizeof(float2), s));
    part = static_cast<float*>(scratch.data());
    part_ml = reinterpret_cast<float2*>(static_cast<uint8_t*>(scratch.data()) + part_bytes);
  }
  const Fmt f{static_cast<const uint8_t*>(layer.k),
              static_cast<const uint8_t*>(layer.v),
              layer.capacity,
              layer.row_bytes,
              hd,
              q8,
              vec16,
              slots ? slots->first_pos : nullptr,
              slots ? static_cast<int>(slots->block_size) : 0,
              bs_shift,
              slots ? slots->host : nullptr,
              slots ? slots->n_slots * slots->block_size : 0,
              slots ? slots->host_head_bytes : 0,
              slots ? slots->host_v_offset : 0,
              static_cast<int>(host_chunk),
              static_cast<int>(n_dev),
              static_cast<int>(n_hs),
              row_kv};
  const dim3 grid(static_cast<unsigned>(n_blocks), static_cast<unsigned>(T),
                  static_cast<unsigned>(n_dev + n_hs));
  const Q8Out qo = out_q8 && hd % 32 == 0 && !keep ? *out_q8 : Q8Out{};
  const size_t smem = static_cast<size_t>(fixed + kg * chunk) * sizeof(float);
  // One kernel per heads-per-block count.
  using Launch = void (*)(dim3, size_t, cudaStream_t, const Fmt&, const float*, const int32_t*, int,
                          int, float, int, int64_t, int, float*, float2*, float*, const Q8Out&);
  static constexpr Launch kLaunch[8] = {launch<1>, launch<2>, launch<3>, launch<4>,
                                        launch<5>, launch<6>, launch<7>, launch<8>};
  kLaunch[kg - 1](grid, smem, s, f, q, pos, n_heads, group, scale, static_cast<int>(chunk),
                  plan_keys + n_host * (slots ? slots->block_size : 0), static_cast<int>(n_splits),
                  part, part_ml, out, qo);
  LOOM_TRY(launch_status("attention (decode)"));
  const SplitPartials sp{part, part_ml, n_splits, static_cast<int64_t>(chunk)};
  if (keep) {
    *keep = sp;
    return {};
  }
  if (n_splits > 1) return merge_splits(sp, T, n_heads, hd, out, s, &qo);
  return {};
}

}  // namespace loom::cuda::detail

namespace loom::cuda {

bool host_slots_fit(const DevKvLayer& layer) {
  return layer.dtype == DType::kF16 && layer.head_dim % 8 == 0 && layer.head_dim <= 256 &&
         detail::online_decode();
}

Status merge_splits(const SplitPartials& sp, int64_t T, int64_t n_heads, int64_t head_dim,
                    float* out, cudaStream_t s, const Q8Out* q8) {
  (void)launch_chained(detail::merge_kernel,
                       dim3(static_cast<unsigned>(n_heads), static_cast<unsigned>(T),
                            static_cast<unsigned>((head_dim + 31) / 32)),
                       detail::kMergeWarps * 32, 0, s, static_cast<const float*>(sp.o),
                       static_cast<const float2*>(sp.ml), static_cast<int>(n_heads),
                       static_cast<int>(sp.n_splits), static_cast<int>(head_dim), out,
                       q8 ? *q8 : Q8Out{});
  return launch_status("attention (merge)");
}

}  // namespace loom::cuda
