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
//   - GEMV-like (T small, decode): each weight block is read from memory once
//     and dotted with the T activation rows in registers; R = 4 weight rows
//     share every activation load. Bound by memory bandwidth.
//   - GEMM (T large, prefill): see the second half of the file.
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

#include "cpu/matmul_internal.h"

namespace loom::cpu::avx512 {
namespace {

#define LOOM_INLINE inline __attribute__((always_inline))

// ---- small helpers ------------------------------------------------------------

LOOM_INLINE __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
LOOM_INLINE __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
LOOM_INLINE __m512i load512(const void* p) { return _mm512_loadu_si512(p); }

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
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(stride));
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, p, 1);
}
LOOM_INLINE __m512 half_lo_to_ps(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
LOOM_INLINE __m512 half_hi_to_ps(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))); }

// Lane i of the result = lane 4 * g + i / 4 of v: the scales of blocks
// 4g..4g+3 spread over the four 128-bit lanes of a group.
LOOM_INLINE __m512 spread_group(__m512 v, int g) {
  const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                       _mm512_set1_epi32(4 * g));
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

// ---- weight formats of 32-element blocks ------------------------------------------
// Each has: kBytes (block size), kBias (offset of the unsigned quants, or 0
// with kHasMin for the formats with an explicit min), scales() for up to 16
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
  const __m512i bits = _mm512_set4_epi32(static_cast<int>(0x80402010), 0x08040201, static_cast<int>(0x80402010),
                                         0x08040201);
  const __mmask64 mlo = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh4, spread_lo), bits);
  const __mmask64 mhi = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh4, spread_hi), bits);
  const __m512i c16 = _mm512_set1_epi8(16);
  *lo = _mm512_mask_add_epi8(*lo, mlo, *lo, c16);
  *hi = _mm512_mask_add_epi8(*hi, mhi, *hi, c16);
}

// qh of 4 blocks (at p, p + stride, ...) into dword 0 of each 128-bit lane.
LOOM_INLINE __m512i load_qh4(const uint8_t* p, int stride, int count) {
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, stride, 0, 0, 0, 2 * stride, 0, 0, 0, 3 * stride, 0, 0, 0);
  const __mmask16 m = static_cast<__mmask16>(0x1111 & ((1u << (4 * count)) - 1u));
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, p, 1);
}

struct FmtQ4_0 {
  static constexpr int kBytes = 18;
  static constexpr float kBias = -8.0f;
  static constexpr bool kHasMin = false;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* /*min*/) {
    *d = half_lo_to_ps(gather_dwords(p, kBytes, m));
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 2, kBytes) : load_4x16_partial(p + 2, kBytes, count), lo, hi);
  }
};

struct FmtQ4_1 {
  static constexpr int kBytes = 20;
  static constexpr float kBias = 0.0f;
  static constexpr bool kHasMin = true;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* min) {
    const __m512i v = gather_dwords(p, kBytes, m);  // d | m << 16
    *d = half_lo_to_ps(v);
    *min = half_hi_to_ps(v);
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 4, kBytes) : load_4x16_partial(p + 4, kBytes, count), lo, hi);
  }
};

struct FmtQ5_0 {
  static constexpr int kBytes = 22;
  static constexpr float kBias = -16.0f;
  static constexpr bool kHasMin = false;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* /*min*/) {
    *d = half_lo_to_ps(gather_dwords(p, kBytes, m));
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 6, kBytes) : load_4x16_partial(p + 6, kBytes, count), lo, hi);
    add_fifth_bits(load_qh4(p + 2, kBytes, count), lo, hi);
  }
};

struct FmtQ5_1 {
  static constexpr int kBytes = 24;
  static constexpr float kBias = 0.0f;
  static constexpr bool kHasMin = true;
  static LOOM_INLINE void scales(const uint8_t* p, __mmask16 m, __m512* d, __m512* min) {
    const __m512i v = gather_dwords(p, kBytes, m);
    *d = half_lo_to_ps(v);
    *min = half_hi_to_ps(v);
  }
  static LOOM_INLINE void group(const uint8_t* p, int count, __m512i* lo, __m512i* hi) {
    split_nibbles(count == 4 ? load_4x16(p + 8, kBytes) : load_4x16_partial(p + 8, kBytes, count), lo, hi);
    add_fifth_bits(load_qh4(p + 4, kBytes, count), lo, hi);
  }
};

struct FmtQ8_0 {
  static constexpr int kBytes = 34;
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
};

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
template <class F, int R, int C>
LOOM_INLINE void gemv32_tile(const uint8_t* w, size_t wrb, const XRow* x, int64_t nb, float* const* y) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();

  for (int64_t b = 0; b < nb; b += 16) {
    const int64_t left = nb - b;
    const bool full = left >= 16;
    const __mmask16 m16 = mask16(left);
    __m512 dx[C];
    for (int c = 0; c < C; ++c) dx[c] = _mm512_maskz_loadu_ps(m16, x[c].d + b);
    __m512 dw[R];
    for (int r = 0; r < R; ++r) {
      __m512 mn = _mm512_setzero_ps();
      F::scales(w + r * wrb + b * F::kBytes, m16, &dw[r], &mn);
      for (int c = 0; c < C; ++c) {
        const __m512 s = _mm512_maskz_loadu_ps(m16, x[c].s + b);
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
    const int groups = full ? 4 : static_cast<int>((left + 3) / 4);
    for (int g = 0; g < groups; ++g) {
      const int count = full ? 4 : static_cast<int>(left - 4 * g < 4 ? left - 4 * g : 4);
      const int64_t bg = b + 4 * g;
      __m512i xlo[C], xhi[C];
      for (int c = 0; c < C; ++c) {
        if (count == 4) {
          load_x_group(x[c].q + 32 * bg, &xlo[c], &xhi[c]);
        } else {
          load_x_group_partial(x[c].q + 32 * bg, count, &xlo[c], &xhi[c]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = w + r * wrb + bg * F::kBytes;
        // The rows of the next tile follow this one in memory: fetch them
        // while this tile computes (the hardware prefetchers lose too much
        // time re-learning each short row stream).
        _mm_prefetch(reinterpret_cast<const char*>(p + R * wrb), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + R * wrb + 64), _MM_HINT_T0);
        __m512i lo, hi;
        F::group(p, count, &lo, &hi);
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
            acc[r][c] = _mm512_fmadd_ps(t, spread_group(dx[c], g), acc[r][c]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c][r] = _mm512_reduce_add_ps(acc[r][c]);
}

// Rows [r0, r1) in tiles of R, for C activation rows.
template <class F, int C>
void gemv32_rows(const uint8_t* W, size_t wrb, const XRow* x, int64_t nb, float* const* y, int64_t r0, int64_t r1) {
  constexpr int R = C <= 2 ? 4 : 2;
  float* yr[C];
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    gemv32_tile<F, R, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
  for (; r < r1; ++r) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    gemv32_tile<F, 1, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
}

template <class F>
void matmul32(LOOM_QUANT_KERNEL_ARGS) {
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
    switch (tc) {
      case 1: gemv32_rows<F, 1>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 2: gemv32_rows<F, 2>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 3: gemv32_rows<F, 3>(w, w_row_bytes, x, nb, y, r0, r1); break;
      default: gemv32_rows<F, 4>(w, w_row_bytes, x, nb, y, r0, r1); break;
    }
  }
}

}  // namespace

void matmul_q4_0(LOOM_QUANT_KERNEL_ARGS) { matmul32<FmtQ4_0>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q4_1(LOOM_QUANT_KERNEL_ARGS) { matmul32<FmtQ4_1>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q5_0(LOOM_QUANT_KERNEL_ARGS) { matmul32<FmtQ5_0>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q5_1(LOOM_QUANT_KERNEL_ARGS) { matmul32<FmtQ5_1>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q8_0(LOOM_QUANT_KERNEL_ARGS) { matmul32<FmtQ8_0>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q2_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q2_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q3_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q3_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q4_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q4_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q5_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q5_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q6_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q6_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void quantize_act_q8_0(const float* x, void* out, int64_t n) { scalar::quantize_act_q8_0(x, out, n); }
void quantize_act_q8_k(const float* x, void* out, int64_t n) { scalar::quantize_act_q8_k(x, out, n); }

}  // namespace loom::cpu::avx512
