// Element-wise ops, RoPE and paged attention on the CPU: portable code,
// scalar fallbacks and the dispatch to the AVX2 / AVX-512 kernels
// (cpu/avx2/ops_avx2.cpp, cpu/avx512/ops_avx512.cpp).
//
// Attention plan (per call, for query heads [h0, h1)):
//   for each KV head g touched by [h0, h1), the m query heads of [h0, h1)
//   that share g, times the T tokens, are M = T * m query rows. Tiles of up
//   to kTileRows rows: a group's rows whole where they fit, several groups in
//   one tile (decode: 8 groups of 4 for Llama-3-8B), each group at a row
//   offset that is a multiple of 4; else kTileRows rows of one group a tile.
//     for each tile, for each step of rc cached rows (rc = 16..64, see
//     step_rows; a step may span several KV blocks or part of one):
//       for each group of the tile, in KV head order:
//         K rows -> fp32 scratch (once for all of the group's rows)
//         S[i][r] = q_i . k_r * scale                          [rows, rc]
//         causal mask, online softmax: running max/sum, P = exp(S - max)
//         acc[i] = acc[i] * exp(old_max - new_max) + P[i] . V  [rows, head_dim]
//           (AVX-512: V converted in registers straight from the cache; else
//           V rows -> fp32 scratch first)
//     out = acc / sum
//   Each K/V row is read from the cache once per tile: once per decode step
//   for all query heads of a GQA group, once per kTileRows query rows in
//   prefill. A step visits a block's heads back to back, which lie next to
//   each other ([kv_head][row] in a block): one long run per block, which
//   the memory system streams much better than a short run per head (8 KiB
//   for Llama-3-8B's F16 heads: 1.4x slower, loom_ops_bench). The next
//   step's rows are prefetched: blocks are pages scattered in memory, and
//   the hardware prefetcher loses the stream at each boundary.
//
// Scratch layout (floats, every region 64-byte aligned):
//   kf   [hdp / W][rc][W]  K rows, chunk-major: for a chunk of W dims, the rows
//                          are W floats apart (the scalar and AVX2 score
//                          kernels load 8 or 16 rows of one chunk at fixed
//                          offsets); row-major [rc][hdp] for AVX-512
//   vf   [rc][hdp]         V rows, row-major (the PV kernels walk rows)
//   qt   [kTileRows][hdp]  the tile's query rows, zero-padded to hdp
//   qx   [kTileRows][hdp]  the same in the layout the score kernel wants
//   acc  [kTileRows][hdp]  unnormalized outputs
//   s    [kTileRows][rc]   scores, then probabilities
//   row_max, row_sum, alpha [kTileRows]
// with hdp = head_dim rounded up to 16 and W the kernel's vector width in
// floats (16 for AVX-512 and scalar, 8 for AVX2). Padded dims are zero in kf,
// vf and qt, so whole-vector dot products are exact, and K rows past the last
// valid one are zero up to a multiple of 16.
#include "cpu/ops.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "cpu/ref/fp8.h"
#include "cpu/ref/ops_ref.h"
#include "cpu/ref/quants.h"

// The ISA kernels. Plain declarations; definitions in cpu/avx512/ops_avx512.cpp
// and cpu/avx2/ops_avx2.cpp (same contracts as the scalar_* functions below).
#define LOOM_DECLARE_OPS_KERNELS                                                                   \
  void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n);                   \
  void silu_mul(const float* gate, const float* up, float* out, int64_t n);                        \
  void add(const float* a, const float* b, float* out, int64_t n);                                 \
  void softmax(float* x, int64_t n);                                                               \
  void f32_to_f16_row(const float* x, void* y, int64_t n);                                         \
  void attn_load_f16(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs,   \
                     int64_t n_pad);                                                               \
  void attn_load_q8_0(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs,  \
                      int64_t n_pad);                                                              \
  void attn_scores(const float* q, int64_t m, int64_t hdp, const float* kf, int64_t rc, int64_t n, \
                   float scale, float* s, int64_t lds);                                            \
  void attn_softmax(float* s, int64_t lds, int64_t m, int64_t n, const int32_t* n_valid,           \
                    float* row_max, float* row_sum, float* alpha);                                 \
  void attn_pv(const float* p, int64_t lds, const float* alpha, int64_t m, const float* vf,        \
               int64_t n, int64_t hdp, float* acc);

namespace loom::cpu {
namespace avx512 {
LOOM_DECLARE_OPS_KERNELS
void attn_prepare_q(const float* q, int64_t m, int64_t hdp, float* qx);
void attn_pv_f16(const float* p, int64_t lds, const float* alpha, int64_t m, const void* v,
                 int64_t n, int64_t hd, float* acc);
void attn_pv_q8_0(const float* p, int64_t lds, const float* alpha, int64_t m, const void* v,
                  int64_t n, int64_t hd, float* acc);
void q8_0_to_f16(const void* src, void* dst, int64_t n_blocks);
void softcap(float* x, int64_t n, float cap);
void fp8_e4m3_to_f16(const uint8_t* src, float scale, void* dst, int64_t n);
inline constexpr int64_t kAttnLanes = 16;
inline constexpr bool kAttnKRowMajor = true;
}  // namespace avx512
namespace avx2 {
LOOM_DECLARE_OPS_KERNELS
inline constexpr int64_t kAttnLanes = 8;
inline constexpr bool kAttnKRowMajor = false;
}  // namespace avx2

namespace {

constexpr int64_t kTileRows = 32;  // query rows (token x head) sharing one pass over the KV blocks
constexpr int64_t kLanes = 16;     // hdp and rc are multiples of this for every ISA

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// Cached rows converted per step: K and V of a step take 2 * rows * hdp * 4
// bytes, kept to 32 KiB so that they stay in L1 while every query row of the
// tile reads them; 16 to 64 rows (a multiple of 16).
int64_t step_rows(int64_t hdp) {
  return std::clamp<int64_t>(4096 / hdp / 16 * 16, 16, 64);
}

size_t kv_row_bytes(DType dtype, int64_t head_dim) {
  assert(dtype == DType::kF16 || (dtype == DType::kQ8_0 && head_dim % ref::kQK == 0));
  return dtype == DType::kF16 ? static_cast<size_t>(head_dim) * 2
                              : static_cast<size_t>(head_dim / ref::kQK) * sizeof(ref::BlockQ8_0);
}

// ---- scalar kernels (any x86-64; the compiler vectorizes what it can) ------

void scalar_rms_norm(const float* x, const float* w, float eps, float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void scalar_silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void scalar_add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void scalar_softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void scalar_f32_to_f16_row(const float* x, void* y, int64_t n) {
  auto* out = static_cast<uint8_t*>(y);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = ref::fp32_to_fp16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// Element (r, d) of a converted block goes to dst[(d / 16) * cs + r * rs + d % 16];
// dims hd..hdp-1 and rows n..n_pad-1 are zero. value(r, d) reads the cache.
template <typename Value>
void scalar_attn_load(Value value, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs,
                      int64_t n_pad) {
  const int64_t hdp = round_up(hd, kLanes);
  for (int64_t r = 0; r < n_pad; ++r) {
    for (int64_t d = 0; d < hdp; ++d) {
      dst[(d / kLanes) * cs + r * rs + d % kLanes] = r < n && d < hd ? value(r, d) : 0.0f;
    }
  }
}

void scalar_attn_load_f16(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs,
                          int64_t cs, int64_t n_pad) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  auto value = [bytes, hd](int64_t r, int64_t d) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * (r * hd + d), 2);
    return ref::fp16_to_fp32(h);
  };
  scalar_attn_load(value, n, hd, dst, rs, cs, n_pad);
}

void scalar_attn_load_q8_0(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs,
                           int64_t cs, int64_t n_pad) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  const size_t row_bytes = kv_row_bytes(DType::kQ8_0, hd);
  auto value = [bytes, row_bytes](int64_t r, int64_t d) {
    // y = d * qs, as ref::dequantize_row_q8_0 computes it.
    const uint8_t* block =
        bytes + static_cast<size_t>(r) * row_bytes + (d / ref::kQK) * sizeof(ref::BlockQ8_0);
    uint16_t scale;
    std::memcpy(&scale, block, 2);
    const auto quant = static_cast<int8_t>(block[2 + d % ref::kQK]);
    return static_cast<float>(quant) * ref::fp16_to_fp32(scale);
  };
  scalar_attn_load(value, n, hd, dst, rs, cs, n_pad);
}

// s[i][r] = scale * q_i . k_r for i < m, r < n (kf chunk-major, 16 lanes).
void scalar_attn_scores(const float* q, int64_t m, int64_t hdp, const float* kf, int64_t rc,
                        int64_t n, float scale, float* s, int64_t lds) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < n; ++r) {
      float lane[kLanes] = {};
      for (int64_t c = 0; c < hdp / kLanes; ++c) {
        const float* k = kf + c * rc * kLanes + r * kLanes;
        const float* qc = q + i * hdp + c * kLanes;
        for (int64_t l = 0; l < kLanes; ++l) lane[l] += qc[l] * k[l];
      }
      float dot = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) dot += lane[l];
      s[i * lds + r] = dot * scale;
    }
  }
}

// Online softmax step for m rows of scores s[i][0..n): columns >= n_valid[i]
// are masked out (become 0). Updates row_max/row_sum, sets alpha[i], the
// factor the row's accumulator must be rescaled by, and leaves P in s.
void scalar_attn_softmax(float* s, int64_t lds, int64_t m, int64_t n, const int32_t* n_valid,
                         float* row_max, float* row_sum, float* alpha) {
  for (int64_t i = 0; i < m; ++i) {
    float* si = s + i * lds;
    const int64_t nv = n_valid[i];
    if (nv == 0) {
      for (int64_t r = 0; r < n; ++r) si[r] = 0.0f;
      alpha[i] = 1.0f;
      continue;
    }
    float mx = si[0];
    for (int64_t r = 1; r < nv; ++r) mx = si[r] > mx ? si[r] : mx;
    const float new_max = mx > row_max[i] ? mx : row_max[i];
    float sum = 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      si[r] = r < nv ? std::exp(si[r] - new_max) : 0.0f;
      sum += si[r];
    }
    alpha[i] = std::exp(row_max[i] - new_max);
    row_sum[i] = row_sum[i] * alpha[i] + sum;
    row_max[i] = new_max;
  }
}

// acc[i][:] = acc[i][:] * alpha[i] + sum_r p[i][r] * vf[r][:]
void scalar_attn_pv(const float* p, int64_t lds, const float* alpha, int64_t m, const float* vf,
                    int64_t n, int64_t hdp, float* acc) {
  for (int64_t i = 0; i < m; ++i) {
    float* a = acc + i * hdp;
    for (int64_t d = 0; d < hdp; ++d) a[d] *= alpha[i];
    for (int64_t r = 0; r < n; ++r) {
      const float pr = p[i * lds + r];
      const float* v = vf + r * hdp;
      for (int64_t d = 0; d < hdp; ++d) a[d] += pr * v[d];
    }
  }
}

// ---- attention kernel table --------------------------------------------------

struct AttnKernels {
  int64_t lanes;     // W: floats per vector chunk
  bool k_row_major;  // K scratch [rows, hdp] like V; else chunk-major [hdp / W][rows][W]
  void (*prepare_q)(const float*, int64_t, int64_t,
                    float*);  // q tile -> the scores' layout; null: as is
  void (*load_f16)(const void*, int64_t, int64_t, float*, int64_t, int64_t, int64_t);
  void (*load_q8_0)(const void*, int64_t, int64_t, float*, int64_t, int64_t, int64_t);
  void (*scores)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float, float*,
                 int64_t);
  void (*softmax)(float*, int64_t, int64_t, int64_t, const int32_t*, float*, float*, float*);
  void (*pv)(const float*, int64_t, const float*, int64_t, const float*, int64_t, int64_t, float*);
  // PV straight from cached V rows (no fp32 copy), or null. The F16 one
  // needs head_dim % 16 == 0. alpha may be null (no rescaling).
  using PvRaw = void (*)(const float*, int64_t, const float*, int64_t, const void*, int64_t,
                         int64_t, float*);
  PvRaw pv_f16;
  PvRaw pv_q8_0;
};

const AttnKernels& attn_kernels(Isa isa) {
  static const AttnKernels kScalar{kLanes,
                                   false,
                                   nullptr,
                                   scalar_attn_load_f16,
                                   scalar_attn_load_q8_0,
                                   scalar_attn_scores,
                                   scalar_attn_softmax,
                                   scalar_attn_pv,
                                   nullptr,
                                   nullptr};
  static const AttnKernels kAvx2{avx2::kAttnLanes,
                                 avx2::kAttnKRowMajor,
                                 nullptr,
                                 avx2::attn_load_f16,
                                 avx2::attn_load_q8_0,
                                 avx2::attn_scores,
                                 avx2::attn_softmax,
                                 avx2::attn_pv,
                                 nullptr,
                                 nullptr};
  static const AttnKernels kAvx512{
      avx512::kAttnLanes,     avx512::kAttnKRowMajor, avx512::attn_prepare_q, avx512::attn_load_f16,
      avx512::attn_load_q8_0, avx512::attn_scores,    avx512::attn_softmax,   avx512::attn_pv,
      avx512::attn_pv_f16,    avx512::attn_pv_q8_0};
  switch (isa) {
    case Isa::kAvx512: return kAvx512;
    case Isa::kAvx2: return kAvx2;
    default: return kScalar;
  }
}

// Scratch regions of one attention call (see the layout at the top).
struct AttnScratch {
  float* kf;
  float* vf;
  float* qt;
  float* qx;
  float* acc;
  float* s;
  float* row_max;
  float* row_sum;
  float* alpha;
};

AttnScratch carve_scratch(float* scratch, int64_t hdp, int64_t rc) {
  // Round the start up to 64 bytes; every region size is a multiple of 16 floats.
  const auto addr = reinterpret_cast<uintptr_t>(scratch);
  float* p = scratch + ((64 - addr % 64) % 64) / sizeof(float);
  auto take = [&p](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  AttnScratch sc;
  sc.kf = take(hdp * rc);
  sc.vf = take(hdp * rc);
  sc.qt = take(kTileRows * hdp);
  sc.qx = take(kTileRows * hdp);
  sc.acc = take(kTileRows * hdp);
  sc.s = take(kTileRows * rc);
  sc.row_max = take(kTileRows);
  sc.row_sum = take(kTileRows);
  sc.alpha = take(kTileRows);
  return sc;
}

// Hints `bytes` of cached rows into the cache.
void prefetch_rows(const void* p, size_t bytes) {
  const auto* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

}  // namespace

// ---- element-wise ops ----------------------------------------------------------

void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512::rms_norm(x, w, eps, y, n);
    case Isa::kAvx2: return avx2::rms_norm(x, w, eps, y, n);
    default: return scalar_rms_norm(x, w, eps, y, n);
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512::silu_mul(gate, up, out, n);
    case Isa::kAvx2: return avx2::silu_mul(gate, up, out, n);
    default: return scalar_silu_mul(gate, up, out, n);
  }
}

void softcap(float* x, int64_t n, float cap) {
  if (active_isa() == Isa::kAvx512) return avx512::softcap(x, n, cap);
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void add(const float* a, const float* b, float* out, int64_t n) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512::add(a, b, out, n);
    case Isa::kAvx2: return avx2::add(a, b, out, n);
    default: return scalar_add(a, b, out, n);
  }
}

void softmax(float* x, int64_t n) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512::softmax(x, n);
    case Isa::kAvx2: return avx2::softmax(x, n);
    default: return scalar_softmax(x, n);
  }
}

void get_row(DType t, const void* w, size_t row_bytes, int64_t row, float* out, int64_t n) {
  // One row per token: the reference dequantizers are fast enough here.
  ref::get_row(t, w, row_bytes, row, out, n);
}

// ---- RoPE ------------------------------------------------------------------------

void rope_cos_sin(int32_t pos, const RopeParams& p, float* cs) {
  // Same float expressions as ggml's rope (ref::rope spells them out one by
  // one): theta_0 = pos, theta_{i+1} = theta_i * base^(-2/n_rot); YaRN mixes
  // interpolated (theta * freq_scale) and extrapolated theta by a ramp over
  // the pair index and scales cos/sin by mscale.
  const int64_t n_rot = p.n_rot, n_pairs = n_rot / 2;
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_rot));
  float corr[2];
  ref::rope_yarn_corr_dims(n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
  const float ramp_denom = 0.001f > corr[1] - corr[0] ? 0.001f : corr[1] - corr[0];
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < n_pairs; ++i) {
    const float theta_extrap = p.freq_factors ? theta / p.freq_factors[i] : theta;
    const float theta_interp = p.freq_scale * theta_extrap;
    float angle = theta_interp;
    if (p.ext_factor != 0.0f) {
      const float y = (static_cast<float>(i) - corr[0]) / ramp_denom;
      const float mix = (1.0f - (y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y))) * p.ext_factor;
      angle = theta_interp * (1 - mix) + theta_extrap * mix;
    }
    cs[2 * i] = std::cos(angle) * mscale;
    cs[2 * i + 1] = std::sin(angle) * mscale;
    theta *= theta_scale;
  }
}

void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
          const RopeParams& p) {
  const int64_t n_rot = p.n_rot;
  const int64_t n_pairs = n_rot / 2;
  assert(n_rot % 2 == 0 && n_rot <= head_dim);
  // cos/sin depend only on the position: once per token for all heads.

  constexpr int64_t kMaxPairsOnStack = 256;
  float cs_stack[2 * kMaxPairsOnStack];
  std::vector<float> cs_heap;
  float* cs = cs_stack;  // [n_pairs][2]: cos, sin
  if (n_pairs > kMaxPairsOnStack) {
    cs_heap.resize(static_cast<size_t>(2 * n_pairs));
    cs = cs_heap.data();
  }

  for (int64_t t = 0; t < T; ++t) {
    rope_cos_sin(pos[t], p, cs);
    const int64_t stride = p.neox ? 1 : 2;  // distance between consecutive pairs' first elements
    const int64_t offset = p.neox ? n_pairs : 1;  // distance between a pair's two elements
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < n_pairs; ++i) {
        float* a = v + i * stride;
        const float x0 = a[0];
        const float x1 = a[offset];
        a[0] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
        a[offset] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
      }
    }
  }
}

// ---- KV cache and attention --------------------------------------------------------

size_t kv_head_bytes(DType dtype, int64_t block_size, int64_t head_dim) {
  return static_cast<size_t>(block_size) * kv_row_bytes(dtype, head_dim);
}

// F16C rounds to nearest even like ref::fp32_to_fp16 (NaN payloads aside).
void f32_to_f16_row(const float* x, void* y, int64_t n) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512::f32_to_f16_row(x, y, n);
    case Isa::kAvx2: return avx2::f32_to_f16_row(x, y, n);
    default: return scalar_f32_to_f16_row(x, y, n);
  }
}

namespace {

// Floats in pieces of this many, through a buffer on the stack.
constexpr int64_t kConvertPiece = 256;

}  // namespace

void kv_store(DType dtype, void* block, size_t head_stride_bytes, int64_t n_kv_heads,
              int64_t head_dim, int64_t row, const float* src) {
  if (dtype != DType::kF16) {
    ref::kv_store(dtype, block, head_stride_bytes, n_kv_heads, head_dim, row, src);
    return;
  }
  const size_t row_bytes = kv_row_bytes(dtype, head_dim);
  for (int64_t h = 0; h < n_kv_heads; ++h) {
    void* dst = static_cast<uint8_t*>(block) + static_cast<size_t>(h) * head_stride_bytes +
                static_cast<size_t>(row) * row_bytes;
    f32_to_f16_row(src + h * head_dim, dst, head_dim);
  }
}

void q8_0_to_f16(const void* src, void* dst, int64_t n) {
  assert(n % ref::kQK == 0);
  static_assert(kConvertPiece % ref::kQK == 0);
  if (active_isa() == Isa::kAvx512) return avx512::q8_0_to_f16(src, dst, n / ref::kQK);
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  alignas(64) float buf[kConvertPiece];
  for (int64_t i0 = 0; i0 < n; i0 += kConvertPiece) {
    const int64_t m = std::min(kConvertPiece, n - i0);
    for (int64_t j = 0; j < m; j += ref::kQK) {
      const uint8_t* blk = in + (i0 + j) / ref::kQK * sizeof(ref::BlockQ8_0);
      uint16_t h = 0;
      std::memcpy(&h, blk, sizeof h);
      const float d = ref::fp16_to_fp32(h);
      const auto* qs = reinterpret_cast<const int8_t*>(blk + sizeof h);
      for (int64_t k = 0; k < ref::kQK; ++k) buf[j + k] = static_cast<float>(qs[k]) * d;
    }
    f32_to_f16_row(buf, out + 2 * i0, m);
  }
}

void fp8_e4m3_to_f16(const uint8_t* src, float scale, void* dst, int64_t n) {
  if (active_isa() == Isa::kAvx512) return avx512::fp8_e4m3_to_f16(src, scale, dst, n);
  static const std::vector<float> kValue = [] {
    std::vector<float> t(256);
    for (int c = 0; c < 256; ++c)
      t[static_cast<size_t>(c)] = ref::fp8_e4m3_to_fp32(static_cast<uint8_t>(c));
    return t;
  }();
  auto* out = static_cast<uint8_t*>(dst);
  alignas(64) float buf[kConvertPiece];
  for (int64_t i0 = 0; i0 < n; i0 += kConvertPiece) {
    const int64_t m = std::min(kConvertPiece, n - i0);
    for (int64_t k = 0; k < m; ++k) buf[k] = kValue[src[i0 + k]] * scale;
    f32_to_f16_row(buf, out + 2 * i0, m);
  }
}

size_t attention_scratch_floats(const KvView& kv) {
  const int64_t hdp = round_up(kv.head_dim, kLanes);
  const int64_t rc = step_rows(hdp);
  return static_cast<size_t>(2 * hdp * rc + 3 * kTileRows * hdp + kTileRows * rc + 3 * kTileRows +
                             16);
}

namespace {
// One run of cached rows within one block, for one query row: the sum of its
// probabilities, relative to the row's running max at the time.
struct MassPart {
  int32_t block;
  int32_t row;
  float sum;
  float max;
};

// Soft-caps a step's scores s[i][0, n_valid[i]) and masks those of keys
// before a row's window (-inf: the softmax gives them 0).
void apply_mods(const AttnMods& mods, float* s, int64_t lds, int64_t m, int64_t j0,
                const int32_t* n_valid, const int64_t* row_first) {
  for (int64_t i = 0; i < m; ++i) {
    float* si = s + i * lds;
    const int64_t nv = n_valid[i];
    if (mods.softcap > 0.0f) softcap(si, nv, mods.softcap);
    const int64_t first = std::min<int64_t>(row_first[i] - j0, nv);
    for (int64_t r = 0; r < first; ++r) si[r] = -std::numeric_limits<float>::infinity();
  }
}

// One GQA group's query rows within a tile: tile rows [off, off + n) are the
// group's rows [r0, r0 + n) (token-major: row r is token r / m, head ha + r % m).
struct TileSeg {
  int64_t g;   // KV head
  int64_t ha;  // first query head of the group in range
  int64_t m;   // query heads of the group in range
  int64_t off;
  int64_t n;
  int64_t r0;
};

// The attention of one tile: its segments' rows walk the cached rows in steps
// together, each step visiting the KV heads in order, so that one step reads
// a block's heads back to back (one long run per block instead of a short run
// per head, which the memory system streams far better).
void attention_tile(const float* q, const int32_t* q_pos, int64_t n_heads, const KvView& kv,
                    float scale, float* out, float* part, const TileSeg* segs, int64_t n_segs,
                    const AttnScratch& sc, float* block_mass, const float* other_ml,
                    const AttnMods& mods, std::vector<MassPart>& mass_parts) {
  const AttnKernels& K = attn_kernels(active_isa());
  const int64_t hd = kv.head_dim;
  const int64_t bs = kv.block_size;
  const int64_t hdp = round_up(hd, kLanes);
  const int64_t rc = step_rows(hdp);
  const size_t row_bytes = kv_row_bytes(kv.dtype, hd);
  const auto load = kv.dtype == DType::kF16 ? K.load_f16 : K.load_q8_0;
  AttnKernels::PvRaw pv_raw =
      kv.dtype == DType::kF16 ? (hd % 16 == 0 ? K.pv_f16 : nullptr) : K.pv_q8_0;
  // K row-major or chunk-major (W-float chunks, rows W apart); V row-major.
  const int64_t k_rs = K.k_row_major ? hdp : K.lanes;
  const int64_t k_cs = K.k_row_major ? K.lanes : rc * K.lanes;

  int32_t row_pos[kTileRows];
  int32_t n_valid[kTileRows];
  int64_t row_first[kTileRows];  // a sliding window's first key position
  float* row_out[kTileRows];
  int64_t row_th[kTileRows];  // t * n_heads + h

  // Calls f(src_k, src_v, len, off) for the runs of cached rows [j0, j1) of
  // KV head g that lie in one block each; off = row index relative to j0.
  auto for_each_run = [&](int64_t g, int64_t j0, int64_t j1, auto&& f) {
    const size_t head_off = static_cast<size_t>(g) * kv.head_stride_bytes;
    for (int64_t j = j0; j < j1;) {
      const int64_t b = j / bs;
      const int64_t r = j % bs;
      const int64_t len = std::min(bs - r, j1 - j);
      const size_t off = head_off + static_cast<size_t>(r) * row_bytes;
      f(static_cast<const uint8_t*>(kv.k_blocks[b]) + off,
        static_cast<const uint8_t*>(kv.v_blocks[b]) + off, len, j - j0);
      j += len;
    }
  };

  // Gather the tile's rows; rows between segments (alignment gaps) stay unused.
  int64_t max_pos = 0, min_first = std::numeric_limits<int64_t>::max();
  const int64_t mt = segs[n_segs - 1].off + segs[n_segs - 1].n;
  for (int64_t k = 0; k < n_segs; ++k) {
    const TileSeg& sg = segs[k];
    for (int64_t i = 0; i < sg.n; ++i) {
      const int64_t ti = sg.off + i;
      const int64_t t = (sg.r0 + i) / sg.m;
      const int64_t h = sg.ha + (sg.r0 + i) % sg.m;
      row_pos[ti] = q_pos[t];
      max_pos = std::max<int64_t>(max_pos, q_pos[t]);
      row_first[ti] = mods.window > 0 ? std::max<int64_t>(0, q_pos[t] - mods.window + 1) : 0;
      min_first = std::min(min_first, row_first[ti]);
      row_th[ti] = t * n_heads + h;
      row_out[ti] = part ? part + row_th[ti] * (hd + 2) : out + row_th[ti] * hd;
      float* qi = sc.qt + ti * hdp;
      std::memcpy(qi, q + (t * n_heads + h) * hd, static_cast<size_t>(hd) * sizeof(float));
      std::fill(qi + hd, qi + hdp, 0.0f);
      sc.row_max[ti] = -std::numeric_limits<float>::infinity();
      sc.row_sum[ti] = 0.0f;
    }
  }
  std::fill(sc.acc, sc.acc + mt * hdp, 0.0f);
  mass_parts.clear();
  const float* q_tile = sc.qt;
  if (K.prepare_q) {
    for (int64_t k = 0; k < n_segs; ++k)
      K.prepare_q(sc.qt + segs[k].off * hdp, segs[k].n, hdp, sc.qx + segs[k].off * hdp);
    q_tile = sc.qx;
  }

  // Steps of rc cached rows, which may span several blocks or part of one;
  // under a sliding window from the step of the tile's first key.
  const int64_t n_ctx = max_pos + 1;
  for (int64_t j0 = min_first / rc * rc; j0 < n_ctx; j0 += rc) {
    const int64_t n = std::min(rc, n_ctx - j0);
    const int64_t n_pad = round_up(n, kLanes);
    for (int64_t k = 0; k < n_segs; ++k) {
      const TileSeg& sg = segs[k];
      for (int64_t ti = sg.off; ti < sg.off + sg.n; ++ti) {
        n_valid[ti] = static_cast<int32_t>(std::clamp<int64_t>(row_pos[ti] + 1 - j0, 0, n));
        if (row_first[ti] - j0 >= n_valid[ti]) n_valid[ti] = 0;  // the window starts later
      }
    }
    for (int64_t k = 0; k < n_segs; ++k) {
      const TileSeg& sg = segs[k];
      const int64_t o = sg.off;
      float* s = sc.s + o * rc;
      // This head's rows of the next step, into the cache while this one computes.
      for_each_run(sg.g, j0 + rc, std::min(j0 + 2 * rc, n_ctx),
                   [&](const uint8_t* kp, const uint8_t* vp, int64_t len, int64_t) {
                     prefetch_rows(kp, static_cast<size_t>(len) * row_bytes);
                     prefetch_rows(vp, static_cast<size_t>(len) * row_bytes);
                   });
      // K rows, then zeros up to a multiple of 16 rows (the score kernels
      // work on groups of 8 or 16 rows).
      for_each_run(sg.g, j0, j0 + n,
                   [&](const uint8_t* kp, const uint8_t*, int64_t len, int64_t r) {
                     const int64_t pad = r + len == n ? n_pad - r : len;
                     load(kp, len, hd, sc.kf + r * k_rs, k_rs, k_cs, pad);
                   });
      K.scores(q_tile + o * hdp, sg.n, hdp, sc.kf, rc, n, scale, s, rc);
      if (mods.softcap > 0.0f || mods.window > 0)
        apply_mods(mods, s, rc, sg.n, j0, n_valid + o, row_first + o);
      K.softmax(s, rc, sg.n, n, n_valid + o, sc.row_max + o, sc.row_sum + o, sc.alpha + o);
      if (block_mass) {
        for_each_run(sg.g, j0, j0 + n, [&](const uint8_t*, const uint8_t*, int64_t len, int64_t r) {
          const auto b = static_cast<int32_t>((j0 + r) / bs);
          for (int64_t i = o; i < o + sg.n; ++i) {
            const float* p = sc.s + i * rc + r;
            float sum = 0.0f;
            for (int64_t x = 0; x < len; ++x) sum += p[x];
            if (sum > 0.0f) mass_parts.push_back({b, static_cast<int32_t>(i), sum, sc.row_max[i]});
          }
        });
      }
      float* acc = sc.acc + o * hdp;
      if (pv_raw) {
        // Run by run from the cache; the first run applies the rescaling.
        for_each_run(sg.g, j0, j0 + n,
                     [&](const uint8_t*, const uint8_t* vp, int64_t len, int64_t r) {
                       pv_raw(s + r, rc, r == 0 ? sc.alpha + o : nullptr, sg.n, vp, len, hd, acc);
                     });
      } else {
        for_each_run(sg.g, j0, j0 + n,
                     [&](const uint8_t*, const uint8_t* vp, int64_t len, int64_t r) {
                       load(vp, len, hd, sc.vf + r * hdp, hdp, K.lanes, len);
                     });
        K.pv(s, rc, sc.alpha + o, sg.n, sc.vf, n, hdp, acc);
      }
    }
  }

  for (int64_t k = 0; k < n_segs; ++k) {
    for (int64_t i = segs[k].off; i < segs[k].off + segs[k].n; ++i) {
      const float* a = sc.acc + i * hdp;
      if (part) {
        const bool empty = !(sc.row_sum[i] > 0.0f);
        row_out[i][0] = empty ? kAttnEmptyMax : sc.row_max[i];
        row_out[i][1] = empty ? 0.0f : sc.row_sum[i];
        for (int64_t d = 0; d < hd; ++d) row_out[i][2 + d] = empty ? 0.0f : a[d];
        continue;
      }
      const float inv = 1.0f / sc.row_sum[i];
      for (int64_t d = 0; d < hd; ++d) row_out[i][d] = a[d] * inv;
    }
  }
  // Each part's sum, rescaled to the row's final max and normalized (over
  // both parts of a split layer when the other's m and l are given).
  for (const MassPart& mp : mass_parts) {
    float mx = sc.row_max[mp.row], l = sc.row_sum[mp.row];
    if (other_ml) {
      const float* o = other_ml + 2 * row_th[mp.row];
      const float m2 = std::max(mx, o[0]);
      l = l * std::exp(mx - m2) + o[1] * std::exp(o[0] - m2);
      mx = m2;
    }
    block_mass[mp.block] += mp.sum * std::exp(mp.max - mx) / l;
  }
}

// attention() and attention_partial(): `part` null writes normalized rows to
// `out`, else partials (m, l, o) to `part`. Tiles: a GQA group's T * m query
// rows whole where they fit (several groups in one tile, each at a row offset
// that is a multiple of 4, as the quad layout of the scores wants), else in
// tiles of kTileRows rows of that group alone.
void attention_impl(const float* q, int64_t T, const int32_t* q_pos, int64_t n_heads,
                    const KvView& kv, float scale, float* out, float* part, int64_t h0, int64_t h1,
                    float* scratch, float* block_mass, const float* other_ml,
                    const AttnMods& mods) {
  thread_local std::vector<MassPart> mass_parts;
  assert(kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0);
  assert(0 <= h0 && h0 <= h1 && h1 <= n_heads);
  if (T <= 0 || h0 >= h1) return;
  const int64_t hdp = round_up(kv.head_dim, kLanes);
  const AttnScratch sc = carve_scratch(scratch, hdp, step_rows(hdp));
  const int64_t n_rep = n_heads / kv.n_kv_heads;
  TileSeg segs[kTileRows];
  int64_t n_segs = 0, used = 0;
  auto flush = [&] {
    if (n_segs > 0)
      attention_tile(q, q_pos, n_heads, kv, scale, out, part, segs, n_segs, sc, block_mass,
                     other_ml, mods, mass_parts);
    n_segs = 0;
    used = 0;
  };
  for (int64_t g = h0 / n_rep; g <= (h1 - 1) / n_rep; ++g) {
    const int64_t ha = std::max(h0, g * n_rep);
    const int64_t m = std::min(h1, (g + 1) * n_rep) - ha;  // query heads of this group in range
    const int64_t n_rows = T * m;
    if (n_rows <= kTileRows) {
      if (used + n_rows > kTileRows) flush();
      segs[n_segs++] = {g, ha, m, used, n_rows, 0};
      used = round_up(used + n_rows, 4);
      continue;
    }
    flush();
    for (int64_t r0 = 0; r0 < n_rows; r0 += kTileRows) {
      segs[n_segs++] = {g, ha, m, 0, std::min(kTileRows, n_rows - r0), r0};
      flush();
    }
  }
  flush();
}

}  // namespace

void attention(const float* q, int64_t T, const int32_t* q_pos, int64_t n_heads, const KvView& kv,
               float scale, float* out, int64_t h0, int64_t h1, float* scratch, float* block_mass,
               const AttnMods& mods) {
  attention_impl(q, T, q_pos, n_heads, kv, scale, out, nullptr, h0, h1, scratch, block_mass,
                 nullptr, mods);
}

void attention_partial(const float* q, int64_t T, const int32_t* q_pos, int64_t n_heads,
                       const KvView& kv, float scale, float* part, int64_t h0, int64_t h1,
                       float* scratch, float* block_mass, const float* other_ml) {
  attention_impl(q, T, q_pos, n_heads, kv, scale, nullptr, part, h0, h1, scratch, block_mass,
                 other_ml, AttnMods{});
}

void attention_fold_partial(float* acc, const float* p, int64_t head_dim) {
  if (!(p[1] > 0.0f)) return;
  if (p[0] > acc[0]) {
    const float s = std::exp(acc[0] - p[0]);
    for (int64_t i = 1; i < head_dim + 2; ++i) acc[i] *= s;
    acc[0] = p[0];
  }
  const float w = std::exp(p[0] - acc[0]);
  for (int64_t i = 1; i < head_dim + 2; ++i) acc[i] += p[i] * w;
}

void attention_merge_partials(const float* a, const float* b, int64_t rows, int64_t head_dim,
                              float* out) {
  const int64_t stride = head_dim + 2;
  std::vector<float> acc(static_cast<size_t>(stride));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(a + r * stride, a + (r + 1) * stride, acc.begin());
    attention_fold_partial(acc.data(), b + r * stride, head_dim);
    for (int64_t d = 0; d < head_dim; ++d) out[r * head_dim + d] = acc[2 + d] / acc[1];
  }
}

}  // namespace loom::cpu
