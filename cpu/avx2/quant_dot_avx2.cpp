// AVX2 (+FMA, F16C) quantized matrix products: the fast path for CPUs
// without AVX-512 VNNI.
//
// Built with ISA flags: only intrinsics, raw pointers and functions of this
// namespace live here (helpers in an anonymous namespace), no std templates.
// Activation formats: see cpu/matmul_internal.h.
//
// Integer core: VPMADDUBSW multiplies unsigned weight bytes by signed
// activation bytes and adds pairs into int16 (no saturation: weight quants
// are at most 63, or |q| <= 127 against sign-adjusted activations for Q8_0),
// then VPMADDWD adds pairs into int32, against ones or against the int16
// sub-block scales of the K-quants, so that a whole K super-block sums
// exactly in integers as in ggml. One float update per block (legacy) or per
// super-block (K-quants).
//
// Work shape: R weight rows x C activation rows per tile (R = 4 for one
// activation row, 2 otherwise), so that every activation load serves R rows
// and every weight block is unpacked once for C activation rows.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu/matmul_internal.h"

namespace loom::cpu::avx2 {
namespace {

#define LOOM_INLINE inline __attribute__((always_inline))

LOOM_INLINE __m128i load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
LOOM_INLINE __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

LOOM_INLINE float half_to_float(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v)));
}
LOOM_INLINE float load_f32(const void* p) {
  float v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

LOOM_INLINE float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 16 bytes of nibbles -> 32 unsigned quants: low nibbles first (elements
// 0..15 of a legacy block), then high nibbles.
LOOM_INLINE __m256i nibbles_to_bytes(__m128i v) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(both, m4);
}

// Bit e of the 32-bit word qh as 16 added to byte e (fifth bits of Q5_0/Q5_1).
LOOM_INLINE __m256i fifth_bits(uint32_t qh) {
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                          _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                             0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

// sum of 32 products of unsigned w and signed x, as 8 int32 lanes.
LOOM_INLINE __m256i dot32(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

// ---- 32-element formats -------------------------------------------------------------
// Each gives, for block b of a row: the 32 quants (w), the scale d and the
// coefficient of the activation block sum s (the min m, or 0). Signed quants
// (kSigned) go through sign transfer: |w| times x with the sign of w.

struct XRow {
  const int8_t* q;
  const uint8_t* d;  // nb floats
  const uint8_t* s;  // nb floats
};

LOOM_INLINE XRow x_row(const void* X, size_t x_row_bytes, int64_t t, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(X) + t * static_cast<int64_t>(x_row_bytes);
  return {reinterpret_cast<const int8_t*>(p), p + n, p + n + 4 * (n / 32)};
}

// Q4_0/Q5_0 are centred on 0: taken as signed (q - 8, q - 16) rather than
// unsigned with an offset term, which would leave a float cancellation.
struct FmtQ4_0 {
  static constexpr int kBytes = 18;
  static constexpr bool kSigned = true;
  static LOOM_INLINE __m256i quants(const uint8_t* b) {
    return _mm256_sub_epi8(nibbles_to_bytes(load128(b + 2)), _mm256_set1_epi8(8));
  }
  static LOOM_INLINE void scales(const uint8_t* b, float* d, float* sc) {
    *d = half_to_float(b);
    *sc = 0.0f;
  }
};

struct FmtQ4_1 {
  static constexpr int kBytes = 20;
  static constexpr bool kSigned = false;
  static LOOM_INLINE __m256i quants(const uint8_t* b) { return nibbles_to_bytes(load128(b + 4)); }
  static LOOM_INLINE void scales(const uint8_t* b, float* d, float* sc) {
    *d = half_to_float(b);
    *sc = half_to_float(b + 2);
  }
};

struct FmtQ5_0 {
  static constexpr int kBytes = 22;
  static constexpr bool kSigned = true;
  static LOOM_INLINE __m256i quants(const uint8_t* b) {
    uint32_t qh;
    __builtin_memcpy(&qh, b + 2, 4);
    const __m256i q = _mm256_or_si256(nibbles_to_bytes(load128(b + 6)), fifth_bits(qh));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
  }
  static LOOM_INLINE void scales(const uint8_t* b, float* d, float* sc) {
    *d = half_to_float(b);
    *sc = 0.0f;
  }
};

struct FmtQ5_1 {
  static constexpr int kBytes = 24;
  static constexpr bool kSigned = false;
  static LOOM_INLINE __m256i quants(const uint8_t* b) {
    uint32_t qh;
    __builtin_memcpy(&qh, b + 4, 4);
    return _mm256_or_si256(nibbles_to_bytes(load128(b + 8)), fifth_bits(qh));
  }
  static LOOM_INLINE void scales(const uint8_t* b, float* d, float* sc) {
    *d = half_to_float(b);
    *sc = half_to_float(b + 2);
  }
};

struct FmtQ8_0 {
  static constexpr int kBytes = 34;
  static constexpr bool kSigned = true;
  static LOOM_INLINE __m256i quants(const uint8_t* b) { return load256(b + 2); }
  static LOOM_INLINE void scales(const uint8_t* b, float* d, float* sc) {
    *d = half_to_float(b);
    *sc = 0.0f;
  }
};

// R rows x C activation rows over all blocks.
//   y = sum_b d_b * dx_b * I_b + sc_b * s_b
template <class F, int R, int C>
LOOM_INLINE void tile32(const uint8_t* w, size_t wrb, const XRow* x, int64_t nb, float* const* y) {
  __m256 acc[R][C];
  float bias[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      bias[r][c] = 0.0f;
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xq[C];
    float dx[C], sx[C];
    for (int c = 0; c < C; ++c) {
      xq[c] = load256(x[c].q + 32 * b);
      dx[c] = load_f32(x[c].d + 4 * b);
      sx[c] = load_f32(x[c].s + 4 * b);
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * wrb + b * F::kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(p + R * wrb), _MM_HINT_T1);
      const __m256i q = F::quants(p);
      float d, sc;
      F::scales(p, &d, &sc);
      for (int c = 0; c < C; ++c) {
        __m256i i;
        if constexpr (F::kSigned) {
          // |w| * (x with the sign of w): VPMADDUBSW wants one unsigned operand.
          i = dot32(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xq[c], q));
        } else {
          i = dot32(q, xq[c]);
        }
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * dx[c]), acc[r][c]);
        if constexpr (!F::kSigned) bias[r][c] += sc * sx[c];
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c][r] = hsum(acc[r][c]) + bias[r][c];
}

template <class F, int C>
void rows32(const uint8_t* W, size_t wrb, const XRow* x, int64_t nb, float* const* y, int64_t r0,
            int64_t r1) {
  constexpr int R = C == 1 ? 4 : 2;
  float* yr[C];
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    tile32<F, R, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
  for (; r < r1; ++r) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    tile32<F, 1, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
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
      case 1: rows32<F, 1>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 2: rows32<F, 2>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 3: rows32<F, 3>(w, w_row_bytes, x, nb, y, r0, r1); break;
      default: rows32<F, 4>(w, w_row_bytes, x, nb, y, r0, r1); break;
    }
  }
}

// ---- K-quants ---------------------------------------------------------------------
// A super-block is unpacked into 8 vectors of 32 unsigned quants in natural
// order (q[k] = elements 32k..32k+31) and, for each, the int16 scales of its
// two 16-element halves (sc[k]: words 0..7 = scale of elements 32k..32k+15,
// words 8..15 = scale of 32k+16..32k+31: the order VPMADDUBSW leaves its
// pair sums in). Offsets and mins are a dot product of 16 int16 values with
// the activation's bsums:
//   dot = d * dx * sum_k madd(maddubs(q[k], x[k]), sc[k])  +  dm * dx * sum_j mn[j] * bsums[j]
// with (dm, mn) = (-dmin, mins) for Q2_K/Q4_K/Q5_K and (d * offset, scales)
// for Q3_K (offset -4) and Q6_K (-32).

struct KBlock {
  __m256i q[8];
  __m256i sc[8];
  __m256i mn;  // 16 int16 multipliers of bsums
  float d;
  float dm;
};

// int16 scales for q[k] from 16 per-16-element scales held as int16 in v:
// words 0..7 = scale 2k, words 8..15 = scale 2k + 1.
LOOM_INLINE void spread_scales16(__m256i v, __m256i sc[8]) {
  // Broadcast word j to 8 words: build per k with a byte shuffle of the
  // 128-bit lane holding scales 2k and 2k + 1.
  for (int k = 0; k < 8; ++k) {
    const __m128i lane = k < 4 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
    const int j = 2 * (k & 3);  // word index of scale 2k inside the lane
    const __m128i lo =
        _mm_shuffle_epi8(lane, _mm_set1_epi16(static_cast<short>((2 * j) | ((2 * j + 1) << 8))));
    const __m128i hi = _mm_shuffle_epi8(
        lane, _mm_set1_epi16(static_cast<short>((2 * j + 2) | ((2 * j + 3) << 8))));
    sc[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
}

// 8 six-bit scales and 8 mins of Q4_K/Q5_K as bytes: sc in the low 8, mn in the high 8.
LOOM_INLINE __m128i unpack_scales_k4(const uint8_t* p) {
  uint32_t u[3];
  __builtin_memcpy(u, p, 12);
  const uint32_t sc_lo = u[0] & 0x3F3F3F3Fu;
  const uint32_t mn_lo = u[1] & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  return _mm_set_epi32(static_cast<int>(mn_hi), static_cast<int>(mn_lo), static_cast<int>(sc_hi),
                       static_cast<int>(sc_lo));
}

// Q4_K/Q5_K: per-32 scales and mins, each repeated for both 16-element halves.
LOOM_INLINE void scales_mins_k4(const uint8_t* p, KBlock* k) {
  const __m128i sm = unpack_scales_k4(p);
  const __m128i sc2 = _mm_unpacklo_epi8(sm, sm);  // 16 bytes: scale j twice
  const __m128i mn2 = _mm_unpackhi_epi8(sm, sm);
  spread_scales16(_mm256_cvtepu8_epi16(sc2), k->sc);
  k->mn = _mm256_cvtepu8_epi16(mn2);
}

struct FmtQ4_K {
  static constexpr int kBytes = 144;
  static LOOM_INLINE void unpack(const uint8_t* b, KBlock* k) {
    k->d = half_to_float(b);
    k->dm = -half_to_float(b + 2);
    scales_mins_k4(b + 4, k);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load256(b + 16 + 32 * c);
      k->q[2 * c] = _mm256_and_si256(v, m4);
      k->q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
  }
};

struct FmtQ5_K {
  static constexpr int kBytes = 176;
  static LOOM_INLINE void unpack(const uint8_t* b, KBlock* k) {
    k->d = half_to_float(b);
    k->dm = -half_to_float(b + 2);
    scales_mins_k4(b + 4, k);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i qh = load256(b + 16);
    const __m256i c16 = _mm256_set1_epi8(16);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load256(b + 48 + 32 * c);
      const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
      const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
      const __m256i h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), c16);
      const __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), c16);
      k->q[2 * c] = _mm256_or_si256(_mm256_and_si256(v, m4), h0);
      k->q[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), h1);
    }
  }
};

struct FmtQ6_K {
  static constexpr int kBytes = 210;
  static LOOM_INLINE void unpack(const uint8_t* b, KBlock* k) {
    k->d = half_to_float(b + 208);
    k->dm = -32.0f * k->d;  // quants stored as q + 32
    const __m256i sc = _mm256_cvtepi8_epi16(load128(b + 192));
    spread_scales16(sc, k->sc);
    k->mn = sc;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load256(b + 64 * h);
      const __m256i ql1 = load256(b + 64 * h + 32);
      const __m256i qh = load256(b + 128 + 32 * h);
      // Elements 128h + 32i + l: nibble of ql (i = 0, 1 low; 2, 3 high) and
      // bits 2i..2i+1 of qh[l] as bits 4..5.
      k->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
      k->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
      k->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                        _mm256_and_si256(qh, m2));
      k->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
    }
  }
};

struct FmtQ2_K {
  static constexpr int kBytes = 84;
  static LOOM_INLINE void unpack(const uint8_t* b, KBlock* k) {
    k->d = half_to_float(b + 80);
    k->dm = -half_to_float(b + 82);
    const __m128i sm = load128(b);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    spread_scales16(_mm256_cvtepu8_epi16(_mm_and_si128(sm, m4)), k->sc);
    k->mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load256(b + 16 + 32 * h);
      k->q[4 * h + 0] = _mm256_and_si256(v, m2);
      k->q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m2);
      k->q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m2);
      k->q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m2);
    }
  }
};

// 16 six-bit scales of Q3_K as bytes (see blocks.h).
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
  static LOOM_INLINE void unpack(const uint8_t* b, KBlock* k) {
    k->d = half_to_float(b + 108);
    k->dm = -4.0f * k->d;  // quants stored as q + 4
    const __m256i sc =
        _mm256_cvtepi8_epi16(_mm_sub_epi8(unpack_scales_q3(b + 96), _mm_set1_epi8(32)));
    spread_scales16(sc, k->sc);
    k->mn = sc;
    const __m256i m2 = _mm256_set1_epi8(3);
    const __m256i hm = load256(b);
    const __m256i c4 = _mm256_set1_epi8(4);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load256(b + 32 + 32 * h);
      for (int i = 0; i < 4; ++i) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * i), m2);
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * h + i)));
        const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), c4);
        k->q[4 * h + i] = _mm256_or_si256(lo, hi);
      }
    }
  }
};

template <class F, int R, int C>
LOOM_INLINE void tile_k(const uint8_t* w, size_t wrb, const uint8_t* const* x, int64_t nb,
                        float* const* y) {
  constexpr int kXBytes = 292;  // BlockQ8_K
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * wrb + b * F::kBytes;
      for (int l = 0; l < F::kBytes; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + R * wrb + l), _MM_HINT_T1);
      KBlock k;
      F::unpack(p, &k);
      for (int c = 0; c < C; ++c) {
        const uint8_t* xb = x[c] + b * kXBytes;
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          const __m256i prod = _mm256_maddubs_epi16(k.q[j], load256(xb + 4 + 32 * j));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(prod, k.sc[j]));
        }
        const __m256i msum = _mm256_madd_epi16(k.mn, load256(xb + 260));
        const float dx = load_f32(xb);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(k.d * dx), acc[r][c]);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(k.dm * dx), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c][r] = hsum(acc[r][c]);
}

template <class F, int C>
void rows_k(const uint8_t* W, size_t wrb, const uint8_t* const* x, int64_t nb, float* const* y,
            int64_t r0, int64_t r1) {
  constexpr int R = C == 1 ? 4 : 2;
  float* yr[C];
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    tile_k<F, R, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
  for (; r < r1; ++r) {
    for (int c = 0; c < C; ++c) yr[c] = y[c] + r;
    tile_k<F, 1, C>(W + r * static_cast<int64_t>(wrb), wrb, x, nb, yr);
  }
}

template <class F>
void matmul_k(LOOM_QUANT_KERNEL_ARGS) {
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
      case 1: rows_k<F, 1>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 2: rows_k<F, 2>(w, w_row_bytes, x, nb, y, r0, r1); break;
      case 3: rows_k<F, 3>(w, w_row_bytes, x, nb, y, r0, r1); break;
      default: rows_k<F, 4>(w, w_row_bytes, x, nb, y, r0, r1); break;
    }
  }
}

// ---- activation conversion ---------------------------------------------------------
// Bit for bit what ref::quantize_row_q8_0 / _q8_k write (for finite inputs);
// see the AVX-512 version for the rounding argument.

LOOM_INLINE float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

LOOM_INLINE int hsum_i32(__m256i v) {
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i t = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 1)));
}

// roundf of each lane, as int32.
LOOM_INLINE __m256i round_half_away(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
  const __m256 abs_frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
  const __m256 up = _mm256_cmp_ps(abs_frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_and_ps(up, _mm256_or_ps(_mm256_set1_ps(1.0f), sign));
  return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

// Eight int32 in 0..255 range (as bytes) -> 8 bytes at p.
LOOM_INLINE void store_8x_i8(int8_t* p, __m256i v) {
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i b = _mm_packs_epi16(w, w);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), b);
}

}  // namespace

void quantize_act_q8_0(const float* x, void* out, int64_t n) {
  const int64_t nb = n / 32;
  auto* q = static_cast<int8_t*>(out);
  auto* dout = static_cast<uint8_t*>(out) + n;
  auto* sout = dout + 4 * nb;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
      m = _mm256_max_ps(m, _mm256_and_ps(v[k], abs_mask));
    }
    const float amax = hmax(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i qi = round_half_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
      store_8x_i8(q + 32 * b + 8 * k, qi);
      sum = _mm256_add_epi32(sum, qi);
    }
    const float dh =
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT)));
    const float sd = dh * static_cast<float>(hsum_i32(sum));
    __builtin_memcpy(dout + 4 * b, &dh, 4);
    __builtin_memcpy(sout + 4 * b, &sd, 4);
  }
}

void quantize_act_q8_k(const float* x, void* out, int64_t n) {
  auto* o = static_cast<uint8_t*>(out);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < n / 256; ++b, x += 256, o += 292) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k)
      m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * k), abs_mask));
    const float amax = hmax(m);
    if (amax == 0.0f) {
      __builtin_memset(o, 0, 292);
      continue;
    }
    // The first element of largest magnitude, with its sign.
    float extreme = 0.0f;
    for (int k = 0; k < 32; ++k) {
      const __m256 v = _mm256_loadu_ps(x + 8 * k);
      const int hit = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), _mm256_set1_ps(amax), _CMP_EQ_OQ));
      if (hit != 0) {
        extreme = x[8 * k + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.0f / extreme;
    const __m256 is = _mm256_set1_ps(iscale);
    int16_t bsums[16];
    for (int s = 0; s < 16; ++s) {
      // Round to nearest even, as ggml's magic-number nearest_int does here.
      const __m256i q0 =
          _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(x + 16 * s))),
                           _mm256_set1_epi32(127));
      const __m256i q1 =
          _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(x + 16 * s + 8))),
                           _mm256_set1_epi32(127));
      store_8x_i8(reinterpret_cast<int8_t*>(o + 4 + 16 * s), q0);
      store_8x_i8(reinterpret_cast<int8_t*>(o + 4 + 16 * s + 8), q1);
      bsums[s] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(q0, q1)));
    }
    __builtin_memcpy(o + 260, bsums, 32);
    const float d = 1.0f / iscale;
    __builtin_memcpy(o, &d, 4);
  }
}

LOOM_DEFINE_QUANT_KERNELS(matmul32, matmul_k, Fmt)

}  // namespace loom::cpu::avx2
