// AVX-512 (F, BW, VL, DQ, VNNI) quantized matrix products.
//
// Built with ISA flags: only intrinsics, raw pointers and functions of this
// namespace live here (helpers in an anonymous namespace), no std templates.
// Activation formats: see cpu/matmul_internal.h.
//
// Integer core: VPDPBUSD multiplies unsigned bytes by signed bytes and adds
// groups of four into int32 lanes. Weights are fed as the unsigned operand:
// 4/5-bit quants as they are (0..15 / 0..31), Q8_0 quants as q + 128 (xor
// 0x80), Q6_K as 0..63; the offset that this adds (8, 16, 128, 32 times the
// sum of the activation quants) is removed in float, once per block, through
// the activation block sums s = dx * sum(x) that the activation format
// carries. Every integer sum is exact; each block costs one int->float
// conversion and one FMA (plus one per 16 blocks for the offsets).
//
// Two shapes of work:
//   - GEMV tiles (T < 8, decode, also of several sequences batched): each
//     weight block is read from memory once and dotted with up to 4
//     activation rows in registers; R = 4 (or 2) weight rows share every
//     activation load. Bound by memory bandwidth: the weights of the next row
//     tiles are prefetched. More than 4 rows go in chunks of 4 over blocks of
//     rows small enough that the later chunks read them from cache.
//   - GEMM (T >= 8, prefill): weights and activations repacked so that one
//     accumulator holds 16 blocks (see "GEMM" below). Bound by VPDPBUSD.
//
// GCC 12 warns inside its own AVX-512 headers, whose intrinsics start from
// _mm512_undefined_*() (a self-initialised variable), once they are inlined
// at -O3: -Wmaybe-uninitialized false positives, silenced for this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "cpu/matmul_internal.h"

namespace loom::cpu::avx512 {
namespace {

#define LOOM_INLINE inline __attribute__((always_inline))

// ---- small helpers ------------------------------------------------------------

LOOM_INLINE __m128i load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
LOOM_INLINE __m256i load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
LOOM_INLINE __m512i load512(const void* p) {
  return _mm512_loadu_si512(p);
}

// Four 16-byte pieces at p, p + stride, ... into the four 128-bit lanes;
// pieces k >= count are zero (and not read).
LOOM_INLINE __m512i load_4x16(const uint8_t* p, size_t stride) {
  __m512i v = _mm512_castsi128_si512(load128(p));
  v = _mm512_inserti32x4(v, load128(p + stride), 1);
  v = _mm512_inserti32x4(v, load128(p + 2 * stride), 2);
  v = _mm512_inserti32x4(v, load128(p + 3 * stride), 3);
  return v;
}
LOOM_INLINE __m512i load_4x16_partial(const uint8_t* p, size_t stride, int count) {
  __m512i v = _mm512_setzero_si512();
  if (count > 0) v = _mm512_castsi128_si512(load128(p));
  if (count > 1) v = _mm512_inserti32x4(v, load128(p + stride), 1);
  if (count > 2) v = _mm512_inserti32x4(v, load128(p + 2 * stride), 2);
  if (count > 3) v = _mm512_inserti32x4(v, load128(p + 3 * stride), 3);
  return v;
}

// How far ahead the GEMV kernels prefetch weights: the same position one
// row tile later (two tiles or >= 16 KB measured no better). Prefetches go
// to L2 (T1): ~10% faster than T0 on 2 threads, the L1 fill buffers being
// the scarcer resource; NTA was 40% slower.
LOOM_INLINE size_t prefetch_distance(size_t tile_bytes) {
  return tile_bytes;
}

LOOM_INLINE __mmask16 mask16(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}
LOOM_INLINE __mmask64 mask64(int64_t count) {
  return count >= 64 ? ~__mmask64{0} : count <= 0 ? __mmask64{0} : ((__mmask64{1} << count) - 1);
}

// fp16 fields of up to 16 blocks, `stride` bytes apart, at p: a 32-bit
// gather (lane j reads the dword at p + j * stride), then the low or high
// half of each dword converted to fp32. Lanes >= count are 0 and not read.
LOOM_INLINE __m512i gather_dwords(const uint8_t* p, int stride, __mmask16 m) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(stride));
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, p, 1);
}
LOOM_INLINE __m512 half_lo_to_ps(__m512i v) {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}
LOOM_INLINE __m512 half_hi_to_ps(__m512i v) {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
}

// Lane i of the result = lane 4 * g + i / 4 of v: the scales of blocks
// 4g..4g+3 spread over the four 128-bit lanes of a group.
LOOM_INLINE __m512 spread_group(__m512 v, int g) {
  const __m512i idx = _mm512_add_epi32(
      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_set1_epi32(4 * g));
  return _mm512_permutexvar_ps(idx, v);
}

// ---- activations: split Q8_0 rows -----------------------------------------------

struct XRow {
  const int8_t* q;  // [n] quants
  const float* d;   // [nb] scales
  const float* s;   // [nb] d * sum of the block's quants
};

LOOM_INLINE XRow x_row(const void* X, size_t x_row_bytes, int64_t t, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(X) + t * static_cast<int64_t>(x_row_bytes);
  const auto* d = reinterpret_cast<const float*>(p + n);  // only read through loadu intrinsics
  return {reinterpret_cast<const int8_t*>(p), d, d + n / 32};
}

// Activation quants of blocks b..b+3 in the group layout of the weights:
// lo = elements 0..15 of each block, one block per 128-bit lane; hi = 16..31.
LOOM_INLINE void load_x_group(const int8_t* q, __m512i* lo, __m512i* hi) {
  const __m512i a = load512(q);       // blocks 0, 1
  const __m512i b = load512(q + 64);  // blocks 2, 3
  *lo = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  *hi = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1));
}
LOOM_INLINE void load_x_group_partial(const int8_t* q, int count, __m512i* lo, __m512i* hi) {
  const __m512i a = _mm512_maskz_loadu_epi8(mask64(32 * count), q);
  const __m512i b = _mm512_maskz_loadu_epi8(mask64(32 * count - 64), q + 64);
  *lo = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  *hi = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1));
}

// ---- VBMI: a group's pieces gathered with one byte permute ---------------------------
// With AVX512_VBMI (Ice Lake and later, Zen 4 and later), the quants of four
// consecutive blocks come from two plain loads and one VPERMT2B instead of
// four 16-byte loads and three lane inserts. Operand a holds the group's
// bytes 0..63, operand b the rest of the group from byte kBOff on, loaded
// with its exact length so that nothing past the group is read.

// Runtime switch (CPU support, and a test hook to take the other path).
int g_vbmi_state = -1;  // -1: not probed yet, 0: off, 1: on (accessed with __atomic builtins)

bool vbmi_enabled() {
  int v = __atomic_load_n(&g_vbmi_state, __ATOMIC_RELAXED);
  if (v < 0) {
    v = detail::cpu_has_avx512_vbmi() ? 1 : 0;
    __atomic_store_n(&g_vbmi_state, v, __ATOMIC_RELAXED);
  }
  return v == 1;
}

struct alignas(64) ByteIdx {
  uint8_t v[64];
};

// Output byte 16k + j = group byte block_bytes * k + off + j (j < len; the
// other bytes of each lane repeat byte 0 of the piece: don't care).
constexpr ByteIdx make_piece_idx(int block_bytes, int off, int len, int b_off) {
  ByteIdx t{};
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < 16; ++j) {
      const int src = block_bytes * k + off + (j < len ? j : 0);
      t.v[16 * k + j] = static_cast<uint8_t>(src < 64 ? src : 64 + (src - b_off));
    }
  }
  return t;
}

LOOM_INLINE __m512i permute_group(__m512i a, __m512i b, const ByteIdx& idx) {
  return _mm512_permutex2var_epi8(a, _mm512_load_si512(idx.v), b);
}

// ---- weight formats of 32-element blocks ------------------------------------------
// Each has: kBytes (block size), kHasMin (an explicit min) or else kBias
// (the offset of the unsigned quants, as a multiple of the scale), scales() for up to 16
// blocks and group() giving 4 blocks' unsigned quants as (lo, hi) in the
// layout of load_x_group.

LOOM_INLINE void split_nibbles(__m512i v, __m512i* lo, __m512i* hi) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  *lo = _mm512_and_si512(v, m4);
  *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
}

// Adds 16 to the quants whose bit is set in the 32-bit qh of their block:
// bit j of qh_k goes to byte j of lane k in lo (j < 16) or of hi (j >= 16).
LOOM_INLINE void add_fifth_bits(__m512i qh4, __m512i* lo, __m512i* hi) {
  // qh4: dword 0 of 128-bit lane k holds qh of block k. Spread bytes so that
  // byte j of the lane holds qh byte j / 8, then test bit j % 8.
  const __m512i spread_lo = _mm512_set4_epi32(0x01010101, 0x01010101, 0x00000000, 0x00000000);
  const __m512i spread_hi = _mm512_set4_epi32(0x03030303, 0x03030303, 0x02020202, 0x02020202);
  const __m512i bits = _mm512_set4_epi32(static_cast<int>(0x80402010), 0x08040201,
                                         static_cast<int>(0x80402010), 0x08040201);
  const __mmask64 mlo = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh4, spread_lo), bits);
  const __mmask64 mhi = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh4, spread_hi), bits);
  const __m512i c16 = _mm512_set1_epi8(16);
  *lo = _mm512_mask_add_epi8(*lo, mlo, *lo, c16);
  *hi = _mm512_mask_add_epi8(*hi, mhi, *hi, c16);
}

// qh of 4 blocks (at p, p + stride, ...) into dword 0 of each 128-bit lane.
LOOM_INLINE __m512i load_qh4(const uint8_t* p, int stride, int count) {
  const __m512i idx =
      _mm512_setr_epi32(0, 0, 0, 0, stride, 0, 0, 0, 2 * stride, 0, 0, 0, 3 * stride, 0, 0, 0);
  const __mmask16 m = static_cast<__mmask16>(0x1111 & ((1u << (4 * count)) - 1u));
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, p, 1);
}

struct FmtQ4_0 {
  static constexpr int kBytes = 18;
  static constexpr bool kVbmi = true;  // GEMV: group_vbmi measured faster than plain loads
  static constexpr float kBias = -8.0f;
  static constexpr bool kHasMin = false;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* /*min*/) {
    *d = half_lo_to_ps(gather_dwords(p, kBytes, m));
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 2, kBytes) : load_4x16_partial(p + 2, kBytes, count),
                  lo, hi);
  }
  // VBMI, full groups: bytes 0..63 and 64..71.
  static constexpr ByteIdx kQsIdx = make_piece_idx(kBytes, 2, 16, 64);
  static LOOM_INLINE void group_vbmi(const uint8_t* p, __m512i* lo, __m512i* hi) {
    const __m512i b =
        _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 64)));
    split_nibbles(permute_group(load512(p), b, kQsIdx), lo, hi);
  }
};

struct FmtQ4_1 {
  static constexpr int kBytes = 20;
  static constexpr bool kVbmi = true;  // GEMV: group_vbmi measured faster than plain loads
  static constexpr bool kHasMin = true;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* min) {
    const __m512i v = gather_dwords(p, kBytes, m);  // d | m << 16
    *d = half_lo_to_ps(v);
    *min = half_hi_to_ps(v);
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 4, kBytes) : load_4x16_partial(p + 4, kBytes, count),
                  lo, hi);
  }
  // VBMI, full groups: bytes 0..63 and 64..79.
  static constexpr ByteIdx kQsIdx = make_piece_idx(kBytes, 4, 16, 64);
  static LOOM_INLINE void group_vbmi(const uint8_t* p, __m512i* lo, __m512i* hi) {
    split_nibbles(permute_group(load512(p), _mm512_castsi128_si512(load128(p + 64)), kQsIdx), lo,
                  hi);
  }
};

struct FmtQ5_0 {
  static constexpr int kBytes = 22;
  static constexpr bool kVbmi = true;  // GEMV: group_vbmi measured faster than plain loads
  static constexpr float kBias = -16.0f;
  static constexpr bool kHasMin = false;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* /*min*/) {
    *d = half_lo_to_ps(gather_dwords(p, kBytes, m));
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 6, kBytes) : load_4x16_partial(p + 6, kBytes, count),
                  lo, hi);
    add_fifth_bits(load_qh4(p + 2, kBytes, count), lo, hi);
  }
  // VBMI, full groups: bytes 0..63 and 56..87.
  static constexpr ByteIdx kQsIdx = make_piece_idx(kBytes, 6, 16, 56);
  static constexpr ByteIdx kQhIdx = make_piece_idx(kBytes, 2, 4, 56);
  static LOOM_INLINE void group_vbmi(const uint8_t* p, __m512i* lo, __m512i* hi) {
    const __m512i a = load512(p);
    const __m512i b = _mm512_castsi256_si512(load256(p + 56));
    split_nibbles(permute_group(a, b, kQsIdx), lo, hi);
    add_fifth_bits(permute_group(a, b, kQhIdx), lo, hi);
  }
};

struct FmtQ5_1 {
  static constexpr int kBytes = 24;
  static constexpr bool kVbmi = true;  // GEMV: group_vbmi measured faster than plain loads
  static constexpr bool kHasMin = true;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* min) {
    const __m512i v = gather_dwords(p, kBytes, m);
    *d = half_lo_to_ps(v);
    *min = half_hi_to_ps(v);
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 8, kBytes) : load_4x16_partial(p + 8, kBytes, count),
                  lo, hi);
    add_fifth_bits(load_qh4(p + 4, kBytes, count), lo, hi);
  }
  // VBMI, full groups: bytes 0..63 and 64..95.
  static constexpr ByteIdx kQsIdx = make_piece_idx(kBytes, 8, 16, 64);
  static constexpr ByteIdx kQhIdx = make_piece_idx(kBytes, 4, 4, 64);
  static LOOM_INLINE void group_vbmi(const uint8_t* p, __m512i* lo, __m512i* hi) {
    const __m512i a = load512(p);
    const __m512i b = _mm512_castsi256_si512(load256(p + 64));
    split_nibbles(permute_group(a, b, kQsIdx), lo, hi);
    add_fifth_bits(permute_group(a, b, kQhIdx), lo, hi);
  }
};

struct FmtQ8_0 {
  static constexpr int kBytes = 34;
  static constexpr bool kVbmi = false;   // GEMV: plain loads measured faster than group_vbmi here
  static constexpr bool kOneRow = true;  // GEMV of one token: see gemv32_rows
  static constexpr float kBias = -128.0f;
  static constexpr bool kHasMin = false;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* /*min*/) {
    *d = half_lo_to_ps(gather_dwords(p, kBytes, m));
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    // Blocks past `count` load as 0 (then 128): harmless, their activations are 0.
    if (count == 4) {
      *lo = _mm512_xor_si512(load_4x16(p + 2, kBytes), sign);
      *hi = _mm512_xor_si512(load_4x16(p + 18, kBytes), sign);
    } else {
      *lo = _mm512_xor_si512(load_4x16_partial(p + 2, kBytes, count), sign);
      *hi = _mm512_xor_si512(load_4x16_partial(p + 18, kBytes, count), sign);
    }
  }
  // VBMI, full groups: the first halves of the blocks from bytes 0..127,
  // the second halves from bytes 8..71 and 72..135.
  static constexpr ByteIdx kLoIdx = make_piece_idx(kBytes, 2, 16, 64);
  static constexpr ByteIdx kHiIdx = []() {
    ByteIdx t{};
    for (int k = 0; k < 4; ++k) {
      for (int j = 0; j < 16; ++j) {
        const int src = kBytes * k + 18 + j;
        t.v[16 * k + j] = static_cast<uint8_t>(src < 72 ? src - 8 : 64 + (src - 72));
      }
    }
    return t;
  }();
  static LOOM_INLINE void group_vbmi(const uint8_t* p, __m512i* lo, __m512i* hi) {
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    *lo = _mm512_xor_si512(permute_group(load512(p), load512(p + 64), kLoIdx), sign);
    *hi = _mm512_xor_si512(permute_group(load512(p + 8), load512(p + 72), kHiIdx), sign);
  }
};

// Rows per block when the GEMV runs more than 4 tokens (in chunks of 4): a
// block of about 16 KiB of weights is read from memory by the first chunk
// and from L1/L2 by the others. A multiple of 4 (the row tiles).
// fn(a, b) over rows [r0, r1): whole for up to 4 tokens, else in row blocks.
template <class Fn>
LOOM_INLINE void gemv_row_blocks(int64_t T, size_t w_row_bytes, int64_t r0, int64_t r1, Fn&& fn) {
  if (T <= 4) {
    fn(r0, r1);
    return;
  }
  const int64_t rows = static_cast<int64_t>((size_t{16} << 10) / w_row_bytes);
  const int64_t rb = rows < 4 ? 4 : rows / 4 * 4;
  for (int64_t a = r0; a < r1; a += rb) fn(a, a + rb < r1 ? a + rb : r1);
}

// ---- GEMV-like kernel for the 32-element formats ----------------------------------
//
// R weight rows x C activation rows, all blocks. Per 16 blocks: one gather
// of the weight scales per row; per group of 4 blocks and row: the quants
// (72..136 bytes), two VPDPBUSD per activation row, one conversion and one FMA.
//
// acc[r][c] += sum over blocks b of dw_b * (dx_b * I_b + kBias * s_b)
//            (+ m_b * s_b for the formats with a min),
// with I_b the integer dot of the unsigned weight quants and the activation
// quants of block b.
template <class F, int R, int C, bool kFull, bool kVbmi>
LOOM_INLINE void gemv32_step(const uint8_t* w, size_t wrb, const XRow* x, int64_t b, int64_t left,
                             __m512 (&acc)[R][C]) {
  // kFull: 16 blocks, no masks and no branches on counts.
  const __mmask16 m16 = kFull ? static_cast<__mmask16>(0xFFFF) : mask16(left);
  __m512 dx[C];
  for (int c = 0; c < C; ++c) {
    dx[c] = kFull ? _mm512_loadu_ps(x[c].d + b) : _mm512_maskz_loadu_ps(m16, x[c].d + b);
  }
  __m512 dw[R];
  for (int r = 0; r < R; ++r) {
    __m512 mn = _mm512_setzero_ps();
    F::scales(w + r * wrb + b * F::kBytes, m16, &dw[r], &mn);
    for (int c = 0; c < C; ++c) {
      const __m512 s = kFull ? _mm512_loadu_ps(x[c].s + b) : _mm512_maskz_loadu_ps(m16, x[c].s + b);
      if constexpr (F::kHasMin) {
        acc[r][c] = _mm512_fmadd_ps(mn, s, acc[r][c]);
      } else {
        acc[r][c] = _mm512_fmadd_ps(dw[r], _mm512_mul_ps(s, _mm512_set1_ps(F::kBias)), acc[r][c]);
      }
    }
  }
  // GEMV: the per-block scale products dw * dx, spread per group below.
  __m512 sc[R];
  if constexpr (C == 1) {
    for (int r = 0; r < R; ++r) sc[r] = _mm512_mul_ps(dw[r], dx[0]);
  }
  const int groups = kFull ? 4 : static_cast<int>((left + 3) / 4);
#pragma GCC unroll 4
  for (int g = 0; g < groups; ++g) {
    const int count = kFull ? 4 : static_cast<int>(left - 4 * g < 4 ? left - 4 * g : 4);
    const int64_t bg = b + 4 * g;
    __m512i xlo[C], xhi[C];
    // C >= 4: the activations' scales of this group spread once, for every
    // row (Q4_0 at 4 tokens 10% faster; at 3 tokens Q8_0 was 15% slower).
    [[maybe_unused]] __m512 dxg[C];
    for (int c = 0; c < C; ++c) {
      if (kFull) {
        load_x_group(x[c].q + 32 * bg, &xlo[c], &xhi[c]);
      } else {
        load_x_group_partial(x[c].q + 32 * bg, count, &xlo[c], &xhi[c]);
      }
      if constexpr (C >= 4) dxg[c] = spread_group(dx[c], g);
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * wrb + bg * F::kBytes;
      // The rows of the next tiles follow this one in memory: fetch them
      // while this tile computes (the hardware prefetchers lose too much
      // time re-learning each short row stream).
      const size_t ahead = prefetch_distance(R * wrb);
      _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p + ahead + 64), _MM_HINT_T1);
      __m512i lo, hi;
      if constexpr (kFull && kVbmi) {
        F::group_vbmi(p, &lo, &hi);
      } else {
        F::group(p, count, &lo, &hi);
      }
      if constexpr (C == 1) {
        __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo[0]);
        i = _mm512_dpbusd_epi32(i, hi, xhi[0]);
        acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), spread_group(sc[r], g), acc[r][0]);
      } else {
        const __m512 dwg = spread_group(dw[r], g);
        for (int c = 0; c < C; ++c) {
          __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo[c]);
          i = _mm512_dpbusd_epi32(i, hi, xhi[c]);
          const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(i), dwg);
          if constexpr (C >= 4) {
            acc[r][c] = _mm512_fmadd_ps(t, dxg[c], acc[r][c]);
          } else {
            acc[r][c] = _mm512_fmadd_ps(t, spread_group(dx[c], g), acc[r][c]);
          }
        }
      }
    }
  }
}

template <class F, int R, int C, bool kVbmi>
LOOM_INLINE void gemv32_tile(const uint8_t* w, size_t wrb, const XRow* x, int64_t nb,
                             float* const* y) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 16 <= nb; b += 16) {
    gemv32_step<F, R, C, true, kVbmi && F::kVbmi>(w, wrb, x, b, 16, acc);
  }
  if (b < nb) gemv32_step<F, R, C, false, kVbmi>(w, wrb, x, b, nb - b, acc);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c][r] = _mm512_reduce_add_ps(acc[r][c]);
}

// One activation row: formats that set kOneRow take their rows one at a
// time on AMD (one sequential stream, the rows being contiguous) rather than
// in tiles of 4. Q8_0 on one Zen core (the 2-core development machine,
// tools/bench/matmul_bench --model, TinyLlama's decode step, three
// interleaved passes): 22.2-22.8 against 16.0-16.7 tokens/s of matmuls on 1
// thread, 38.0-43.1 against 30.1-31.8 on 2; Q4_0 and the K-quants were
// slower that way (Q4_0 29-30 against 38-41 on 1 thread). Intel keeps the
// tiles: this has not run on an Intel core.
template <class F>
constexpr bool one_row_of() {
  if constexpr (requires { F::kOneRow; })
    return F::kOneRow;
  else
    return false;
}

// Rows [r0, r1) in tiles of R, for C activation rows.
template <class F, int C, bool kVbmi>
void gemv32_rows(const uint8_t* W, size_t wrb, const XRow* x, int64_t nb, float* const* y,
                 int64_t r0, int64_t r1) {
  constexpr int R = C <= 2 ? 4 : 2;
  float* yr[C];
  int64_t r = r0;
  int64_t tiles_end = r1;  // rows in tiles of R before it, one at a time after
  if constexpr (C == 1 && one_row_of<F>()) {
    if (detail::gemv_one_stream()) tiles_end = r0;
  }
  for (; r + R <= tiles_end; r += R) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    gemv32_tile<F, R, C, kVbmi>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
  for (; r < r1; ++r) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    gemv32_tile<F, 1, C, kVbmi>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
}

template <class F>
void gemv32_chunks(LOOM_QUANT_KERNEL_ARGS) {
  const auto* w = static_cast<const uint8_t*>(W);
  const int64_t nb = n / 32;
  for (int64_t t0 = 0; t0 < T; t0 += 4) {
    const int64_t tc = T - t0 < 4 ? T - t0 : 4;
    XRow x[4];
    float* y[4];
    for (int c = 0; c < tc; ++c) {
      x[c] = x_row(X, x_row_bytes, t0 + c, n);
      y[c] = Y + (t0 + c) * ldy;
    }
    if (vbmi_enabled()) {
      switch (tc) {
        case 1: gemv32_rows<F, 1, true>(w, w_row_bytes, x, nb, y, r0, r1); break;
        case 2: gemv32_rows<F, 2, true>(w, w_row_bytes, x, nb, y, r0, r1); break;
        case 3: gemv32_rows<F, 3, true>(w, w_row_bytes, x, nb, y, r0, r1); break;
        default: gemv32_rows<F, 4, true>(w, w_row_bytes, x, nb, y, r0, r1); break;
      }
    } else {
      switch (tc) {
        case 1: gemv32_rows<F, 1, false>(w, w_row_bytes, x, nb, y, r0, r1); break;
        case 2: gemv32_rows<F, 2, false>(w, w_row_bytes, x, nb, y, r0, r1); break;
        case 3: gemv32_rows<F, 3, false>(w, w_row_bytes, x, nb, y, r0, r1); break;
        default: gemv32_rows<F, 4, false>(w, w_row_bytes, x, nb, y, r0, r1); break;
      }
    }
  }
}

template <class F>
void gemv32_all(LOOM_QUANT_KERNEL_ARGS) {
  gemv_row_blocks(T, w_row_bytes, r0, r1, [&](int64_t a, int64_t b) {
    gemv32_chunks<F>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, a, b);
  });
}

// ---- K-quants (256-element super-blocks, Q8_K activations) -----------------------
//
// Each weight super-block is unpacked into four vectors w[k] of unsigned
// quants, w[k] = elements 64k..64k+63 in natural order (so they pair with
// plain loads of the activation quants), plus two vectors over the 16
// sub-blocks of 16 elements:
//   scale16[j] = multiplier of sum(q x) over sub-block j (d * sc, as fp32),
//   bias16[j]  = multiplier of sum(x) over sub-block j (the mins, or the
//                quant offset times the scale).
// After VPDPBUSD, lane i of the product with w[k] belongs to sub-block
// 4k + i / 4, so each w[k] needs the four scales of its sub-blocks spread
// over its lanes. Then for one activation block (scale dx, sums bsums):
//   dot = dx * (sum_j scale16[j] * I_j  +  sum_j bias16[j] * bsums[j]).
// Formats with 32-element sub-blocks (Q4_K, Q5_K) repeat each scale twice.

// Lane i -> lane 4k + i / 4 of v.
LOOM_INLINE __m512 spread_quarter(__m512 v, int k) {
  return spread_group(v, k);
}

// The activation block (Q8_K) as the dot products use it.
struct XK {
  __m512i q[4];  // quants, 64 per vector
  __m512 dx;     // d, all lanes
  __m512 bs;     // d * bsums[j] per lane j
};

LOOM_INLINE void load_xk(const uint8_t* blk, XK* x) {
  float d;
  __builtin_memcpy(&d, blk, 4);
  x->dx = _mm512_set1_ps(d);
  for (int k = 0; k < 4; ++k) x->q[k] = load512(blk + 4 + 64 * k);
  const __m512i bsums = _mm512_cvtepi16_epi32(load256(blk + 4 + 256));
  x->bs = _mm512_mul_ps(_mm512_cvtepi32_ps(bsums), x->dx);
}

// load_xk with the quants in unpack_pairs' order: q[k] = elements
// pair_base(k) + 0..31 and + 64..95 (pair_base 0, 32, 128, 160).
LOOM_INLINE void load_xk_pairs(const uint8_t* blk, XK* x) {
  float d;
  __builtin_memcpy(&d, blk, 4);
  x->dx = _mm512_set1_ps(d);
  for (int k = 0; k < 4; ++k) {
    const uint8_t* q = blk + 4 + 128 * (k / 2) + 32 * (k % 2);
    x->q[k] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(q)), load256(q + 64), 1);
  }
  const __m512i bsums = _mm512_cvtepi16_epi32(load256(blk + 4 + 256));
  x->bs = _mm512_mul_ps(_mm512_cvtepi32_ps(bsums), x->dx);
}

// The 16-element sub-block of each lane of the product with the pairs' w[k]:
// lane i -> lane (sub-block of pair_base(k) + 4i, and of + 64 for i >= 8) of v.
LOOM_INLINE __m512 spread_pairs(__m512 v, int k) {
  const int base = 8 * (k / 2) + 2 * (k % 2);
  const __m512i idx = _mm512_add_epi32(
      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 4, 4, 4, 4, 5, 5, 5, 5), _mm512_set1_epi32(base));
  return _mm512_permutexvar_ps(idx, v);
}

// Two fp16 values at p (p[0..1], p[2..3]) as fp32.
LOOM_INLINE void load_two_halves(const uint8_t* p, float* a, float* b) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(v)));
  *a = _mm_cvtss_f32(f);
  *b = _mm_cvtss_f32(_mm_shuffle_ps(f, f, 1));
}
LOOM_INLINE float load_half(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v)));
}

// 32 bytes at p in both 256-bit halves.
LOOM_INLINE __m512i load_dup32(const uint8_t* p) {
  return _mm512_broadcast_i64x4(load256(p));
}

// Per-half 16-bit shift counts: a in the low 256 bits, b in the high.
LOOM_INLINE __m512i halves_epi16(int a, int b) {
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(a)),
                            _mm256_set1_epi16(static_cast<short>(b)), 1);
}

// 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K (12 packed bytes, see
// ref::scale_min_k4) as bytes: returns sc in the low 8 bytes, mn in the high.
// With u = the three words: sc 0-3 = u0 & 0x3F, mn 0-3 = u1 & 0x3F, sc 4-7 =
// (u2 & 0x0F) | (u0 >> 6) << 4, mn 4-7 = (u2 >> 4 & 0x0F) | (u1 >> 6) << 4,
// per byte, all four at once in dwords (reads 16 bytes: p + 12 .. 15 too).
LOOM_INLINE __m128i unpack_scales_k4(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));  // u0 u2 u1 u2
  const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));  // u0 u0 u1 u1
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  // ((x >> 6) & 3) << 4 per byte is (x >> 2) & 0x30.
  const __m128i high =
      _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, high);
}

// Q4_K/Q5_K's d, dmin and packed scales (bytes 0-15 of a super-block) as
// scale16 = d sc and bias16 = -dmin mn per 16-element sub-block (each
// 32-element scale twice).
LOOM_INLINE void scales_k4(const uint8_t* b, __m512* scale16, __m512* bias16) {
  float d, dmin;
  load_two_halves(b, &d, &dmin);
  const __m128i sm = unpack_scales_k4(b + 4);
  *scale16 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sm, sm))),
                           _mm512_set1_ps(d));
  *bias16 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(sm, sm))),
                          _mm512_set1_ps(-dmin));
}

struct FmtQ4_K {
  static constexpr int kBytes = 144;
  static constexpr bool kHasMin = true;
  static constexpr bool kScales32 = true;  // scales and mins per 32 elements (GemmK32)
  static LOOM_INLINE void unpack(const uint8_t* b, __m512i w[4], __m512* scale16, __m512* bias16) {
    scales_k4(b, scale16, bias16);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i shift = halves_epi16(0, 4);
    for (int k = 0; k < 4; ++k)
      w[k] = _mm512_and_si512(_mm512_srlv_epi16(load_dup32(b + 16 + 32 * k), shift), m4);
  }
  // The GEMV's order (kPairs): w[k] = the low (k even) or high (k odd)
  // nibbles of quant bytes 64 (k / 2) .. + 63, i.e. elements (pair_base)
  // 0-31 and 64-95 (k 0), 32-63 and 96-127 (1), 128-159 and 192-223 (2),
  // 160-191 and 224-255 (3); two loads instead of four.
  static constexpr bool kPairs = true;
  static LOOM_INLINE void unpack_pairs(const uint8_t* b, __m512i w[4], __m512* scale16,
                                       __m512* bias16) {
    scales_k4(b, scale16, bias16);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 2; ++h) {
      const __m512i v = load512(b + 16 + 64 * h);
      w[2 * h] = _mm512_and_si512(v, m4);
      w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
  }
};

struct FmtQ5_K {
  static constexpr int kBytes = 176;
  static constexpr bool kHasMin = true;
  static constexpr bool kScales32 = true;  // scales and mins per 32 elements (GemmK32)
  static LOOM_INLINE void unpack(const uint8_t* b, __m512i w[4], __m512* scale16, __m512* bias16) {
    scales_k4(b, scale16, bias16);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i shift = halves_epi16(0, 4);
    const __m512i qh = load_dup32(b + 16);
    const __m512i c16 = _mm512_set1_epi8(16);
    for (int k = 0; k < 4; ++k) {
      __m512i v = _mm512_and_si512(_mm512_srlv_epi16(load_dup32(b + 48 + 32 * k), shift), m4);
      // Fifth bit: bit 2k of qh[l] for the low half, bit 2k + 1 for the high half.
      const __m512i bit =
          _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * k))),
                             _mm256_set1_epi8(static_cast<char>(1 << (2 * k + 1))), 1);
      w[k] = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(qh, bit), v, c16);
    }
  }
};

struct FmtQ6_K {
  static constexpr int kBytes = 210;
  static constexpr bool kHasMin = false;
  static constexpr float kBeta = -32.0f;    // offset = kBeta * scale (formats without mins)
  static constexpr bool kScales32 = false;  // scales and mins per 32 elements (GemmK32)
  static LOOM_INLINE void unpack(const uint8_t* b, __m512i w[4], __m512* scale16, __m512* bias16) {
    const float d = load_half(b + 208);
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load128(b + 192)));
    *scale16 = _mm512_mul_ps(sc, _mm512_set1_ps(d));
    *bias16 = _mm512_mul_ps(*scale16, _mm512_set1_ps(-32.0f));  // quants stored as q + 32
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m2 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = load512(b + 64 * h);
      const __m512i qh = load_dup32(b + 128 + 32 * h);
      // Elements 128h + 0..63: low nibbles of ql, qh bits 0-1 (low half), 2-3 (high half).
      const __m512i h0 = _mm512_and_si512(_mm512_sllv_epi16(qh, halves_epi16(4, 2)), m2);
      // Elements 128h + 64..127: high nibbles, qh bits 4-5 and 6-7.
      const __m512i h1 = _mm512_and_si512(_mm512_srlv_epi16(qh, halves_epi16(0, 2)), m2);
      w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), h0);
      w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h1);
    }
  }
};

struct FmtQ2_K {
  static constexpr int kBytes = 84;
  static constexpr bool kHasMin = true;
  static constexpr bool kScales32 = false;  // scales and mins per 32 elements (GemmK32)
  static LOOM_INLINE void unpack(const uint8_t* b, __m512i w[4], __m512* scale16, __m512* bias16) {
    float d, dmin;
    load_two_halves(b + 80, &d, &dmin);
    const __m128i sm = load128(b);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    *scale16 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(sm, m4))),
                             _mm512_set1_ps(d));
    *bias16 = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(sm, 4), m4))),
        _mm512_set1_ps(-dmin));
    const __m512i m2 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = load_dup32(b + 16 + 32 * h);
      // Elements 128h + 64j + 32i + l: bits 2(2j + i) of q[l].
      w[2 * h] = _mm512_and_si512(_mm512_srlv_epi16(q, halves_epi16(0, 2)), m2);
      w[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi16(q, halves_epi16(4, 6)), m2);
    }
  }
};

// 16 six-bit scales of Q3_K (see blocks.h) as bytes.
LOOM_INLINE __m128i unpack_scales_q3(const uint8_t* p) {
  uint32_t u[3];
  __builtin_memcpy(u, p, 12);
  const uint32_t m4 = 0x0F0F0F0Fu;
  const uint32_t m2 = 0x03030303u;
  const uint32_t s0 = (u[0] & m4) | ((u[2] & m2) << 4);
  const uint32_t s1 = (u[1] & m4) | (((u[2] >> 2) & m2) << 4);
  const uint32_t s2 = ((u[0] >> 4) & m4) | (((u[2] >> 4) & m2) << 4);
  const uint32_t s3 = ((u[1] >> 4) & m4) | (((u[2] >> 6) & m2) << 4);
  return _mm_set_epi32(static_cast<int>(s3), static_cast<int>(s2), static_cast<int>(s1),
                       static_cast<int>(s0));
}

struct FmtQ3_K {
  static constexpr int kBytes = 110;
  static constexpr bool kHasMin = false;
  static constexpr float kBeta = -4.0f;     // offset = kBeta * scale (formats without mins)
  static constexpr bool kScales32 = false;  // scales and mins per 32 elements (GemmK32)
  static LOOM_INLINE void unpack(const uint8_t* b, __m512i w[4], __m512* scale16, __m512* bias16) {
    const float d = load_half(b + 108);
    const __m128i sc = _mm_sub_epi8(unpack_scales_q3(b + 96), _mm_set1_epi8(32));
    *scale16 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), _mm512_set1_ps(d));
    *bias16 = _mm512_mul_ps(*scale16, _mm512_set1_ps(-4.0f));  // quants stored as q + 4
    const __m512i m2 = _mm512_set1_epi8(3);
    const __m512i hm = load_dup32(b);
    const __m512i c4 = _mm512_set1_epi8(4);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = load_dup32(b + 32 + 32 * h);
      for (int j = 0; j < 2; ++j) {
        const int k = 2 * h + j;
        // Low bits: elements 128h + 64j + 32i + l take bits 2(2j + i) of qs[32h + l];
        // bit 2 of element e is bit e / 32 (= 2k + i) of hmask[l].
        const __m512i v =
            _mm512_and_si512(_mm512_srlv_epi16(q, halves_epi16(4 * j, 4 * j + 2)), m2);
        const __m512i bit =
            _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * k))),
                               _mm256_set1_epi8(static_cast<char>(1 << (2 * k + 1))), 1);
        w[k] = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(hm, bit), v, c4);
      }
    }
  }
};

// Whether F has the GEMV's nibble-pair order (unpack_pairs).
template <class F>
constexpr bool kPairs = requires {
  F::kPairs;
};

// R weight rows x C activation rows over all super-blocks.
template <class F, int R, int C>
LOOM_INLINE void gemv_k_tile(const uint8_t* w, size_t wrb, const uint8_t* const* x, int64_t nb,
                             float* const* y) {
  constexpr int kXBytes = 292;  // BlockQ8_K
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    XK xk[C];
    for (int c = 0; c < C; ++c) {
      if constexpr (kPairs<F>) {
        load_xk_pairs(x[c] + b * kXBytes, &xk[c]);
      } else {
        load_xk(x[c] + b * kXBytes, &xk[c]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * wrb + b * F::kBytes;
      const size_t ahead = prefetch_distance(R * wrb);
      for (int l = 0; l < F::kBytes; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + ahead + l), _MM_HINT_T1);
      __m512i q[4];
      __m512 scale16, bias16;
      if constexpr (kPairs<F>) {
        F::unpack_pairs(p, q, &scale16, &bias16);
      } else {
        F::unpack(p, q, &scale16, &bias16);
      }
      for (int c = 0; c < C; ++c) {
        const __m512 s = _mm512_mul_ps(scale16, xk[c].dx);
        __m512 a = _mm512_fmadd_ps(bias16, xk[c].bs, acc[r][c]);
        for (int k = 0; k < 4; ++k) {
          const __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[k], xk[c].q[k]);
          const __m512 sk = kPairs<F> ? spread_pairs(s, k) : spread_quarter(s, k);
          a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sk, a);
        }
        acc[r][c] = a;
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c][r] = _mm512_reduce_add_ps(acc[r][c]);
}

template <class F, int C>
void gemv_k_rows(const uint8_t* W, size_t wrb, const uint8_t* const* x, int64_t nb, float* const* y,
                 int64_t r0, int64_t r1) {
  constexpr int R = C <= 2 ? 4 : 2;
  float* yr[C];
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    gemv_k_tile<F, R, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
  for (; r < r1; ++r) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    gemv_k_tile<F, 1, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
}

template <class F>
void gemv_k_chunks(LOOM_QUANT_KERNEL_ARGS) {
  const auto* w = static_cast<const uint8_t*>(W);
  const int64_t nb = n / 256;
  for (int64_t t0 = 0; t0 < T; t0 += 4) {
    const int64_t tc = T - t0 < 4 ? T - t0 : 4;
    const uint8_t* x[4];
    float* y[4];
    for (int c = 0; c < tc; ++c) {
      x[c] = static_cast<const uint8_t*>(X) + (t0 + c) * static_cast<int64_t>(x_row_bytes);
      y[c] = Y + (t0 + c) * ldy;
    }
    switch (tc) {
      case 1: gemv_k_rows<F, 1>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 2: gemv_k_rows<F, 2>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 3: gemv_k_rows<F, 3>(w, w_row_bytes, x, nb, y, r0, r1); break;
      default: gemv_k_rows<F, 4>(w, w_row_bytes, x, nb, y, r0, r1); break;
    }
  }
}

template <class F>
void gemv_k_all(LOOM_QUANT_KERNEL_ARGS) {
  gemv_row_blocks(T, w_row_bytes, r0, r1, [&](int64_t a, int64_t b) {
    gemv_k_chunks<F>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, a, b);
  });
}

// ---- GEMM helpers: the transposed ("one sub-block per lane") layout --------------
//
// For the GEMM, a step of 16 sub-blocks is stored as M = L / 4 vectors
// (L = 32 elements per sub-block for the legacy formats, 16 for the
// K-quants): vector m holds, in lane j, the four quants 4m..4m+3 of sub-block
// j. Weights and activations in this layout give, after M VPDPBUSD into one
// accumulator, the 16 sub-block dot products in the 16 lanes: one float
// update per 16 sub-blocks instead of one per 4.

// 4x4 transpose of dwords inside each 128-bit lane across v[0..3]: afterwards
// lane 4i + k of v[m] is dword m of lane i of the old v[k]. For K-quant
// super-blocks (old v[k] = elements 64k.., 128-bit lane i = sub-block 4k + i)
// this is the transposed layout with sub-block 4k + i in lane 4i + k.
LOOM_INLINE void transpose_lanes_4x4(__m512i v[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]);
  const __m512i t1 = _mm512_unpackhi_epi32(v[0], v[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]);
  const __m512i t3 = _mm512_unpackhi_epi32(v[2], v[3]);
  v[0] = _mm512_unpacklo_epi64(t0, t2);
  v[1] = _mm512_unpackhi_epi64(t0, t2);
  v[2] = _mm512_unpacklo_epi64(t1, t3);
  v[3] = _mm512_unpackhi_epi64(t1, t3);
}
// Sub-block order of transpose_lanes_4x4: lane p = 4i + k holds sub-block 4k + i.
LOOM_INLINE __m512i k_lane_order() {
  return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

// ---- GEMM (many activation rows: prefill) --------------------------------------------
//
// Weights and activations are first repacked into the transposed layout
// (see gemm helpers above): the activations of a block of tokens once per
// call, the weights of R = 4 rows once per token block. The inner tile is
// R = 4 rows x C = 4 tokens: per step and pair, M VPDPBUSD (four weight
// vectors in registers, one activation vector shared by the 4 rows) and
// 3-4 float operations:
//   acc += a16 * (cvt(I) * dx16) + b16 * sx16
// where a16/b16 are the weights' scale and min (or offset) per sub-block and
// dx16/sx16 the activations' scale and scaled sum per sub-block. For the
// formats whose offset is a fixed multiple beta of the scale (Q4_0: -8,
// Q8_0: -128, Q6_K: -32...), sx16 is stored times beta and the update is
//   acc += a16 * (cvt(I) * dx16 + sx16).
// Integer sums stay in registers for a step (16), float sums in L1.

constexpr int kGemmR = 4;
constexpr int kGemmC = 4;

// Bytes of one packed step: activations (M quant vectors, dx16, sx16) and
// weights of the R rows (M x R quant vectors, R a16, R b16).
template <int M>
constexpr size_t kXStepBytes = (M + 2) * 64;
template <int M>
constexpr size_t kWStepBytes = (M * kGemmR + 2 * kGemmR) * 64;

LOOM_INLINE void store512(uint8_t* p, __m512i v) {
  _mm512_store_si512(p, v);
}
LOOM_INLINE void store512(uint8_t* p, __m512 v) {
  _mm512_store_ps(p, v);
}

// Sums of four vectors: lanes 0..3 of the result.
LOOM_INLINE __m128 reduce_4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab =
      _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // a0 b0 a1 b1 per lane
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd =
      _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));  // a b c d per lane
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// acc[c * R + r] += the products over `steps` packed steps. xp: C activation
// rows of packed steps, x_tok_bytes apart; wp: the packed steps of the R
// weight rows. The float accumulators live in memory (L1): one load and one
// store per pair and step, which frees the registers that keep the R weight
// vectors of a step loaded once (16 int sums + 4 weights + 1 activation).
template <int M, bool kMin>
LOOM_INLINE void gemm_tile(const uint8_t* wp, const uint8_t* xp, size_t x_tok_bytes, int64_t steps,
                           __m512* acc) {
  constexpr int R = kGemmR;
  constexpr int C = kGemmC;
  for (int64_t s = 0; s < steps; ++s) {
    const uint8_t* ws = wp + s * kWStepBytes<M>;
    const uint8_t* xs = xp + s * kXStepBytes<M>;
    __m512i isum[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) isum[r][c] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      // The empty asm statements pin w and x in registers: left alone, GCC
      // reloads the weight vector for every VPDPBUSD, and the loads then
      // limit the tile to ~3/4 of its speed.
      __m512i w[R];
      for (int r = 0; r < R; ++r) {
        w[r] = _mm512_load_si512(ws + (m * R + r) * 64);
        asm("" : "+v"(w[r]));
      }
      for (int c = 0; c < C; ++c) {
        __m512i x = _mm512_load_si512(xs + c * x_tok_bytes + m * 64);
        asm("" : "+v"(x));
        for (int r = 0; r < R; ++r) isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], w[r], x);
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 dx = _mm512_load_ps(xs + c * x_tok_bytes + M * 64);
      const __m512 sx = _mm512_load_ps(xs + c * x_tok_bytes + (M + 1) * 64);
      for (int r = 0; r < R; ++r) {
        const __m512 a = _mm512_load_ps(ws + (M * R + r) * 64);
        __m512 v = acc[c * R + r];
        if constexpr (kMin) {
          const __m512 b = _mm512_load_ps(ws + (M * R + R + r) * 64);
          const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r][c]), dx);
          v = _mm512_fmadd_ps(b, sx, _mm512_fmadd_ps(t, a, v));
        } else {
          const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), dx, sx);
          v = _mm512_fmadd_ps(t, a, v);
        }
        acc[c * R + r] = v;
      }
    }
    // Compiler barrier: keep acc in memory between steps (otherwise GCC
    // holds the 12 sums in registers and reloads the weights for every
    // VPDPBUSD instead, which costs more load bandwidth than it saves).
    asm volatile("" ::: "memory");
  }
}

// One token block [t0, t0 + tb) x rows [r0, r1) with packed activations.
// G knows the format: kM, kMin, unpack_w(row, step, ...) (see Gemm32/GemmK).
// The steps are walked in chunks of kGemmChunk so that the chunk's packed
// weights (R rows) and the activations of one token tile stay in L1
// together; partial sums wait in acc_buf between chunks.
constexpr int64_t kGemmChunk = 4;

template <class G>
void gemm_rows(const G& g, const uint8_t* xp, size_t x_tok_bytes, int64_t tb, uint8_t* wp,
               __m512* acc_buf, float* Y, int64_t ldy, int64_t t0, int64_t r0, int64_t r1) {
  constexpr int M = G::kM;
  constexpr int R = kGemmR;
  constexpr int C = kGemmC;
  const int64_t steps = g.steps;
  for (int64_t r = r0; r < r1; r += R) {
    const int rows = static_cast<int>(r1 - r < R ? r1 - r : R);
    for (int64_t s = 0; s < steps; ++s) {
      uint8_t* ws = wp + s * kWStepBytes<M>;
      for (int i = 0; i < R; ++i) {
        __m512i q[M];
        __m512 a = _mm512_setzero_ps();
        __m512 b = _mm512_setzero_ps();
        if (i < rows) {
          g.unpack_w(r + i, s, q, &a, &b);
        } else {
          for (int m = 0; m < M; ++m) q[m] = _mm512_setzero_si512();  // padding row
        }
        for (int m = 0; m < M; ++m) store512(ws + (m * R + i) * 64, q[m]);
        store512(ws + (M * R + i) * 64, a);
        store512(ws + (M * R + R + i) * 64, b);
      }
    }
    for (int64_t k0 = 0; k0 < steps; k0 += kGemmChunk) {
      const int64_t ks = steps - k0 < kGemmChunk ? steps - k0 : kGemmChunk;
      const bool first = k0 == 0;
      const bool last = k0 + ks == steps;
      for (int64_t c0 = 0; c0 < tb; c0 += C) {
        __m512* acc = acc_buf + c0 * R;  // C * R vectors per token tile
        if (first) {
          for (int i = 0; i < C * R; ++i) acc[i] = _mm512_setzero_ps();
        }
        gemm_tile<M, G::kMin>(wp + k0 * kWStepBytes<M>, xp + c0 * x_tok_bytes + k0 * kXStepBytes<M>,
                              x_tok_bytes, ks, acc);
        if (!last) continue;
        const int cols = static_cast<int>(tb - c0 < C ? tb - c0 : C);
        for (int c = 0; c < cols; ++c) {
          float out[4];
          _mm_storeu_ps(out, reduce_4(acc[c * R], acc[c * R + 1], acc[c * R + 2], acc[c * R + 3]));
          float* y = Y + (t0 + c0 + c) * ldy + r;
          for (int i = 0; i < rows; ++i) y[i] = out[i];
        }
      }
    }
  }
}

// Drives a GEMM: token blocks sized so that their packed activations stay
// around 1 MB (L2), activations packed once per block, weights per row tile.
template <class G>
void gemm_driver(const G& g, int64_t T, float* Y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int M = G::kM;
  const size_t x_tok_bytes = static_cast<size_t>(g.steps) * kXStepBytes<M>;
  int64_t tb_max = static_cast<int64_t>((size_t{1} << 20) / x_tok_bytes);
  tb_max = tb_max < kGemmC * 4 ? kGemmC * 4 : tb_max;
  tb_max = tb_max / kGemmC * kGemmC;
  const int64_t tb_alloc = (T < tb_max ? (T + kGemmC - 1) / kGemmC * kGemmC : tb_max);
  const size_t w_bytes = static_cast<size_t>(g.steps) * kWStepBytes<M>;
  const size_t acc_bytes = static_cast<size_t>(tb_alloc) * kGemmR * 64;
  auto* scratch = static_cast<uint8_t*>(
      detail::thread_scratch(w_bytes + acc_bytes + static_cast<size_t>(tb_alloc) * x_tok_bytes));
  uint8_t* wp = scratch;
  auto* acc_buf = reinterpret_cast<__m512*>(scratch + w_bytes);
  uint8_t* xp = scratch + w_bytes + acc_bytes;
  for (int64_t t0 = 0; t0 < T; t0 += tb_max) {
    const int64_t tb = T - t0 < tb_max ? T - t0 : tb_max;
    const int64_t tb_pad = (tb + kGemmC - 1) / kGemmC * kGemmC;
    for (int64_t c = 0; c < tb_pad; ++c) {
      for (int64_t s = 0; s < g.steps; ++s) {
        uint8_t* out = xp + c * x_tok_bytes + s * kXStepBytes<M>;
        if (c < tb) {
          g.pack_x(t0 + c, s, out);
        } else {
          for (size_t i = 0; i < kXStepBytes<M>; i += 64)
            store512(out + i, _mm512_setzero_si512());  // padding token
        }
      }
    }
    gemm_rows(g, xp, x_tok_bytes, tb, wp, acc_buf, Y, ldy, t0, r0, r1);
  }
}

// Legacy formats: steps of 16 blocks of 32, activations in the split Q8_0 rows.
template <class F>
struct Gemm32 {
  static constexpr int kM = 8;
  static constexpr bool kMin = F::kHasMin;
  const uint8_t* W;
  size_t wrb;
  const void* X;
  size_t xrb;
  int64_t n;
  int64_t nb;
  int64_t steps;

  bool vbmi;

  Gemm32(const void* w, size_t w_row_bytes, const void* x, size_t x_row_bytes, int64_t n_)
      : W(static_cast<const uint8_t*>(w)),
        wrb(w_row_bytes),
        X(x),
        xrb(x_row_bytes),
        n(n_),
        nb(n_ / 32),
        steps((n_ / 32 + 15) / 16),
        vbmi(vbmi_enabled()) {}

  // Blocks in the lane order of transpose_lanes_4x4 (lane 4i + g holds
  // block 4g + i), to match unpack_w.
  void pack_x(int64_t t, int64_t s, uint8_t* out) const {
    const XRow x = x_row(X, xrb, t, n);
    const int64_t b0 = 16 * s;
    const __mmask16 m16 = mask16(nb - b0);
    const __m512i order = k_lane_order();
    const __mmask16 m = static_cast<__mmask16>(_mm512_cmplt_epi32_mask(
        order, _mm512_set1_epi32(static_cast<int>(nb - b0 < 16 ? nb - b0 : 16))));
    const __m512i idx = _mm512_slli_epi32(order, 5);  // 32 bytes per block
    const auto* q = reinterpret_cast<const uint8_t*>(x.q + 32 * b0);
    for (int k = 0; k < 8; ++k) {
      store512(out + 64 * k,
               _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m,
                                           _mm512_add_epi32(idx, _mm512_set1_epi32(4 * k)), q, 1));
    }
    store512(out + 512, _mm512_permutexvar_ps(order, _mm512_maskz_loadu_ps(m16, x.d + b0)));
    __m512 sx = _mm512_permutexvar_ps(order, _mm512_maskz_loadu_ps(m16, x.s + b0));
    if constexpr (!F::kHasMin) sx = _mm512_mul_ps(sx, _mm512_set1_ps(F::kBias));
    store512(out + 576, sx);
  }
  // Four groups of four blocks (lane k of a group = block 4g + k, the
  // layout of the GEMV) transposed by transpose_lanes_4x4.
  void unpack_w(int64_t row, int64_t s, __m512i q[8], __m512* a, __m512* b) const {
    const int64_t b0 = 16 * s;
    const int64_t left = nb - b0;
    const uint8_t* p = W + row * static_cast<int64_t>(wrb) + b0 * F::kBytes;
    __m512i lo[4], hi[4];
    for (int g = 0; g < 4; ++g) {
      const int64_t count = left - 4 * g;
      if (count >= 4 && vbmi) {
        F::group_vbmi(p + 4 * g * F::kBytes, &lo[g], &hi[g]);
      } else {
        F::group(p + 4 * g * F::kBytes,
                 static_cast<int>(count < 0   ? 0
                                  : count > 4 ? 4
                                              : count),
                 &lo[g], &hi[g]);
      }
    }
    transpose_lanes_4x4(lo);
    transpose_lanes_4x4(hi);
    for (int k = 0; k < 4; ++k) {
      q[k] = lo[k];
      q[k + 4] = hi[k];
    }
    __m512 d, mn = _mm512_setzero_ps();
    F::scales(p, mask16(left), &d, &mn);
    *a = _mm512_permutexvar_ps(k_lane_order(), d);
    *b = _mm512_permutexvar_ps(k_lane_order(), mn);
  }
};

// K-quants: steps of one super-block (16 sub-blocks of 16), Q8_K activations.
template <class F>
struct GemmK {
  static constexpr int kM = 4;
  static constexpr bool kMin = F::kHasMin;
  const uint8_t* W;
  size_t wrb;
  const uint8_t* X;
  size_t xrb;
  int64_t steps;

  GemmK(const void* w, size_t w_row_bytes, const void* x, size_t x_row_bytes, int64_t n)
      : W(static_cast<const uint8_t*>(w)),
        wrb(w_row_bytes),
        X(static_cast<const uint8_t*>(x)),
        xrb(x_row_bytes),
        steps(n / 256) {}

  void pack_x(int64_t t, int64_t s, uint8_t* out) const {
    const uint8_t* blk = X + t * static_cast<int64_t>(xrb) + s * 292;
    __m512i v[4];
    for (int k = 0; k < 4; ++k) v[k] = load512(blk + 4 + 64 * k);
    transpose_lanes_4x4(v);
    for (int k = 0; k < 4; ++k) store512(out + 64 * k, v[k]);
    float d;
    __builtin_memcpy(&d, blk, 4);
    const __m512 bsums = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(load256(blk + 260)));
    float sd = d;
    if constexpr (!F::kHasMin) sd = d * F::kBeta;
    store512(out + 256, _mm512_set1_ps(d));
    store512(out + 320,
             _mm512_mul_ps(_mm512_permutexvar_ps(k_lane_order(), bsums), _mm512_set1_ps(sd)));
  }
  void unpack_w(int64_t row, int64_t s, __m512i q[4], __m512* a, __m512* b) const {
    __m512 scale16, bias16;
    F::unpack(W + row * static_cast<int64_t>(wrb) + s * F::kBytes, q, &scale16, &bias16);
    transpose_lanes_4x4(q);
    *a = _mm512_permutexvar_ps(k_lane_order(), scale16);
    *b = _mm512_permutexvar_ps(k_lane_order(), bias16);
  }
};

// Q4_K/Q5_K, whose scales and mins are per 32 elements: steps of two
// super-blocks (16 sub-blocks of 32, like the legacy formats), so that each
// float update covers 8 VPDPBUSD instead of 4. A lone last super-block is
// paired with zeros.
template <class F>
struct GemmK32 {
  static constexpr int kM = 8;
  static constexpr bool kMin = F::kHasMin;
  static_assert(F::kHasMin, "GemmK32 packs mins (Q4_K, Q5_K)");
  const uint8_t* W;
  size_t wrb;
  const uint8_t* X;
  size_t xrb;
  int64_t nsb;  // super-blocks per row
  int64_t steps;

  GemmK32(const void* w, size_t w_row_bytes, const void* x, size_t x_row_bytes, int64_t n)
      : W(static_cast<const uint8_t*>(w)),
        wrb(w_row_bytes),
        X(static_cast<const uint8_t*>(x)),
        xrb(x_row_bytes),
        nsb(n / 256),
        steps((n / 256 + 1) / 2) {}

  // Lane p of the transposed layout holds sub-block pi(p) = 4 (p % 4) + p / 4
  // (k_lane_order); these pick, for lane p, entry 2 pi(p) (+1) of the
  // per-16 vectors of super-block 0 (pi(p) < 8) or 1 (two-source permutes).
  static LOOM_INLINE __m512i pair_idx(int odd) {
    const __m512i order = k_lane_order();
    const __m512i sb1 = _mm512_srli_epi32(order, 3);  // 0 or 1
    const __m512i in_sb = _mm512_and_si512(order, _mm512_set1_epi32(7));
    return _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(in_sb, 1), _mm512_set1_epi32(odd)),
                            _mm512_slli_epi32(sb1, 4));
  }
  // Natural 64-element vectors v[0..7] (two super-blocks) -> transposed.
  static LOOM_INLINE void transpose_32(const __m512i v[8], __m512i q[8]) {
    __m512i a[4], b[4];
    for (int k = 0; k < 4; ++k) {
      a[k] = _mm512_shuffle_i64x2(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0));  // first halves
      b[k] =
          _mm512_shuffle_i64x2(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1));  // second halves
    }
    transpose_lanes_4x4(a);
    transpose_lanes_4x4(b);
    for (int k = 0; k < 4; ++k) {
      q[k] = a[k];
      q[k + 4] = b[k];
    }
  }

  void pack_x(int64_t t, int64_t s, uint8_t* out) const {
    const uint8_t* blk = X + t * static_cast<int64_t>(xrb) + 2 * s * 292;
    const bool two = 2 * s + 1 < nsb;
    __m512i v[8];
    __m512 bs[2], d[2];
    for (int h = 0; h < 2; ++h) {
      const uint8_t* b = blk + h * 292;
      const bool here = h == 0 || two;
      for (int k = 0; k < 4; ++k)
        v[4 * h + k] = here ? load512(b + 4 + 64 * k) : _mm512_setzero_si512();
      float dh = 0.0f;
      if (here) __builtin_memcpy(&dh, b, 4);
      d[h] = _mm512_set1_ps(dh);
      bs[h] =
          here ? _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(load256(b + 260))) : _mm512_setzero_ps();
    }
    __m512i q[8];
    transpose_32(v, q);
    for (int k = 0; k < 8; ++k) store512(out + 64 * k, q[k]);
    const __m512 dx = _mm512_mask_blend_ps(
        _mm512_cmpge_epi32_mask(k_lane_order(), _mm512_set1_epi32(8)), d[0], d[1]);
    const __m512 sums = _mm512_add_ps(_mm512_permutex2var_ps(bs[0], pair_idx(0), bs[1]),
                                      _mm512_permutex2var_ps(bs[0], pair_idx(1), bs[1]));
    store512(out + 512, dx);
    store512(out + 576, _mm512_mul_ps(sums, dx));
  }
  void unpack_w(int64_t row, int64_t s, __m512i q[8], __m512* a, __m512* b) const {
    const uint8_t* p = W + row * static_cast<int64_t>(wrb) + 2 * s * F::kBytes;
    __m512i v[8];
    __m512 sc[2], mn[2];
    F::unpack(p, v, &sc[0], &mn[0]);
    if (2 * s + 1 < nsb) {
      F::unpack(p + F::kBytes, v + 4, &sc[1], &mn[1]);
    } else {
      for (int k = 4; k < 8; ++k) v[k] = _mm512_setzero_si512();
      sc[1] = mn[1] = _mm512_setzero_ps();
    }
    transpose_32(v, q);
    // Per-16 vectors repeat each per-32 value: take the even entries.
    *a = _mm512_permutex2var_ps(sc[0], pair_idx(0), sc[1]);
    *b = _mm512_permutex2var_ps(mn[0], pair_idx(0), mn[1]);
  }
};

// From this many activation rows on, the repacking GEMM beats the GEMV tiles
// (LOOM_CPU_GEMM_MIN_TOKENS overrides it, for measuring). Measured with
// `loom_matmul_bench --model --batch` (TinyLlama shapes, 2 threads, EPYC):
// at 4 and 6 rows the GEMV takes 27-39 and 37-45 ms a step where the GEMM
// takes 41-54 and 49-58 ms (Q4_0, Q4_K, Q8_0); at 8 rows they are even.
int64_t gemm_min_tokens() {
  static const int64_t v = [] {
    const char* e = std::getenv("LOOM_CPU_GEMM_MIN_TOKENS");
    const long x = e ? std::strtol(e, nullptr, 10) : 0;
    return x > 0 ? static_cast<int64_t>(x) : int64_t{8};
  }();
  return v;
}

template <class F>
void matmul32(LOOM_QUANT_KERNEL_ARGS) {
  if (T >= gemm_min_tokens()) {
    gemm_driver(Gemm32<F>(W, w_row_bytes, X, x_row_bytes, n), T, Y, ldy, r0, r1);
  } else {
    gemv32_all<F>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
  }
}

template <class F>
void matmul_k(LOOM_QUANT_KERNEL_ARGS) {
  if (T >= gemm_min_tokens()) {
    if constexpr (F::kScales32) {
      gemm_driver(GemmK32<F>(W, w_row_bytes, X, x_row_bytes, n), T, Y, ldy, r0, r1);
    } else {
      gemm_driver(GemmK<F>(W, w_row_bytes, X, x_row_bytes, n), T, Y, ldy, r0, r1);
    }
  } else {
    gemv_k_all<F>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
  }
}

// ---- activation conversion ---------------------------------------------------------
// Bit for bit what ref::quantize_row_q8_0 / _q8_k write (for finite inputs):
// the same fp32 operations in the same order, with roundf (halves away from
// zero) done exactly as truncate, then +-1 where the dropped fraction is at
// least one half.

LOOM_INLINE float hmax(__m512 v) {
  return _mm512_reduce_max_ps(v);
}

// roundf of each lane, as int32.
LOOM_INLINE __m512i round_half_away(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_sub_ps(v, t);  // exact
  const __m512 abs_frac = _mm512_abs_ps(frac);
  const __mmask16 up = _mm512_cmp_ps_mask(abs_frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f),
                                  _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));  // copysign(1, v)
  return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
}

LOOM_INLINE float round_trip_fp16(float d) {
  return _mm_cvtss_f32(
      _mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}

}  // namespace

void quantize_act_q8_0(const float* x, void* out, int64_t n) {
  const int64_t nb = n / 32;
  auto* q = static_cast<int8_t*>(out);
  auto* dout = reinterpret_cast<uint8_t*>(out) + n;
  auto* sout = dout + 4 * nb;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b);
    const __m512 v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax =
        hmax(_mm512_max_ps(_mm512_and_ps(v0, abs_mask), _mm512_and_ps(v1, abs_mask)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512i q0 = round_half_away(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
    const __m512i q1 = round_half_away(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    const float dh = round_trip_fp16(d);
    const float sd = dh * static_cast<float>(sum);
    __builtin_memcpy(dout + 4 * b, &dh, 4);
    __builtin_memcpy(sout + 4 * b, &sd, 4);
  }
}

void quantize_act_q8_k(const float* x, void* out, int64_t n) {
  auto* o = static_cast<uint8_t*>(out);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < n / 256; ++b, x += 256, o += 292) {
    __m512 m = _mm512_setzero_ps();
    for (int k = 0; k < 16; ++k)
      m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(x + 16 * k), abs_mask));
    const float amax = hmax(m);
    if (amax == 0.0f) {
      __builtin_memset(o, 0, 292);
      continue;
    }
    // The first element of largest magnitude, with its sign.
    float extreme = 0.0f;
    for (int k = 0; k < 16; ++k) {
      const __m512 v = _mm512_loadu_ps(x + 16 * k);
      const __mmask16 hit =
          _mm512_cmp_ps_mask(_mm512_and_ps(v, abs_mask), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit != 0) {
        extreme = x[16 * k + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / extreme;
    const __m512 is = _mm512_set1_ps(iscale);
    int16_t bsums[16];
    for (int k = 0; k < 16; ++k) {
      // Round to nearest even, as ggml's magic-number nearest_int does here.
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(is, _mm512_loadu_ps(x + 16 * k)));
      q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 4 + 16 * k), _mm512_cvtepi32_epi8(q));
      bsums[k] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
    __builtin_memcpy(o + 260, bsums, 32);
    const float d = 1.0f / iscale;
    __builtin_memcpy(o, &d, 4);
  }
}

bool set_vbmi(bool enable) {
  if (enable && !detail::cpu_has_avx512_vbmi()) return false;
  __atomic_store_n(&g_vbmi_state, enable ? 1 : 0, __ATOMIC_RELAXED);
  return true;
}

LOOM_DEFINE_QUANT_KERNELS(matmul32, matmul_k, Fmt)

}  // namespace loom::cpu::avx512
