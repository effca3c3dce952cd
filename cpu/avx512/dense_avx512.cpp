// Dense (F32, F16, BF16) matrix products with AVX-512.
//
// Y[t, r] = dot(W row r, X row t) for t < T, r0 <= r < r1 (the contract of
// detail::matmul_rows_dense). Two paths:
//
//   T <= 6 (decode, GEMV): dot-product tiles. A tile is 4 weight rows x T
//     activation rows: each weight vector is loaded once per k step and used
//     for T tokens, the 4 accumulators of a token are reduced together into
//     Y[t, r..r+3] (T = 1: 8 rows x 1 token, more row streams). One pass
//     over the weights, straight from memory: the run is bound by memory
//     bandwidth.
//   T > 6 (prefill): packed GEMM, see "Packed GEMM" below. Panels of 64
//     weight rows are transposed k-major into scratch and a 6 x 64 register
//     tile is computed with broadcast activations: no horizontal reductions,
//     each panel load used for 6 tokens, each broadcast for 64 rows.
//
// Per dtype:
//   F32   fp32 FMA.
//   F16   F16C (vcvtph2ps, exact) then fp32 FMA. For T > 6 weights are widened
//         while packing and activations into fp32 scratch, one conversion
//         per 64 multiply-adds.
//   BF16  vdpbf16ps on the raw bf16 pairs: 32 products per instruction. Each
//         product of two bf16 is exact in fp32 (8 x 8 significand bits), and
//         each lane adds its two products into the accumulator with one
//         round-to-nearest-even each, so the error is that of an fp32 dot
//         product summed in another order: |err| <= n * 2^-24 * sum|w x|.
//         Unlike vfmadd it treats subnormal inputs and results as zero
//         (DAZ/FTZ regardless of MXCSR): an extra absolute error of at most
//         2^-126 per term, nothing for real weights. tests/unit/cpu_dense_test
//         checks this bound. On Intel cores up to Emerald Rapids vdpbf16ps
//         issues at half the rate of vfmadd, so it only matches fp32 FMA per
//         element there; on Zen 4/5 it doubles it.
//
// Rule of this folder (cpu/CMakeLists.txt): intrinsics, raw pointers and
// functions of namespace loom::cpu::avx512 only; no std templates or header
// inline functions are instantiated here. The templates below are our own,
// in an anonymous namespace. dense_bf16 needs avx512_bf16, which the Isa
// level kAvx512 does not imply: cpu/matmul_dense.cpp checks it and calls
// dense_bf16_widen (widening, fp32 FMA) on CPUs without it.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu/matmul_internal.h"  // detail::gemv_one_stream (declarations only)

namespace loom::cpu::avx512 {
namespace {

constexpr int kTileRows = 4;       // weight rows per dot-product tile
constexpr int kTileTokensMax = 6;  // activation rows per tile: 24 accumulators + 5 inputs of 32 zmm

// Sums each of a, b, c, d over its 16 lanes: returns [sum a, sum b, sum c, sum d].
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Within 128-bit lanes: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // [a, b, c, d] partial sums in each of the 4 lanes.
  const __m512 abcd =
      _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  // Add the 4 lanes.
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(abcd),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Element sources: how a tile loads kStep elements of one row as a vector
// and multiplies-adds two such vectors into an fp32 accumulator.

// fp32 rows.
struct SrcF32 {
  using Elem = float;
  using Vec = __m512;
  static constexpr int64_t kStep = 16;
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_tail(const float* p, int64_t m) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << m) - 1u), p);
  }
  static __m512 madd(__m512 acc, Vec w, Vec x) { return _mm512_fmadd_ps(w, x, acc); }
};

// IEEE half rows, widened with vcvtph2ps (exact).
struct SrcF16 {
  using Elem = uint16_t;
  using Vec = __m512;
  static constexpr int64_t kStep = 16;
  static Vec load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Vec load_tail(const uint16_t* p, int64_t m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << m) - 1u), p));
  }
  static __m512 madd(__m512 acc, Vec w, Vec x) { return _mm512_fmadd_ps(w, x, acc); }
};

// bfloat16 rows, multiplied in pairs by vdpbf16ps (see the header comment).
struct SrcBf16 {
  using Elem = uint16_t;
  using Vec = __m512i;
  static constexpr int64_t kStep = 32;
  static Vec load(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static Vec load_tail(const uint16_t* p, int64_t m) {
    return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << m) - 1u), p);
  }
  static __m512 madd(__m512 acc, Vec w, Vec x) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
  }
};

// bfloat16 rows widened to fp32 (zero-extend, shift left 16: exact), for
// CPUs with AVX-512 but without avx512_bf16 (Ice Lake, Cascade Lake).
struct SrcBf16Widen {
  using Elem = uint16_t;
  using Vec = __m512;
  static constexpr int64_t kStep = 16;
  static Vec widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static Vec load(const uint16_t* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Vec load_tail(const uint16_t* p, int64_t m) {
    return widen(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << m) - 1u), p));
  }
  static __m512 madd(__m512 acc, Vec w, Vec x) { return _mm512_fmadd_ps(w, x, acc); }
};

// The micro-kernel: rows w[0..m_rows) (m_rows <= 4, `ws` elements apart) times
// activation rows x[0..TN) (`xs` elements apart), k elements each.
// Y[t * ldy + j] = (accumulate ? Y[...] : 0) + dot, for j < m_rows.
template <class S, int TN>
void tile(const typename S::Elem* w, int64_t ws, int m_rows, const typename S::Elem* x, int64_t xs,
          int64_t k, float* y, int64_t ldy, bool accumulate) {
  // Missing rows read row 0 again (never out of bounds); their sums are not stored.
  const typename S::Elem* w0 = w;
  const typename S::Elem* w1 = m_rows > 1 ? w + ws : w;
  const typename S::Elem* w2 = m_rows > 2 ? w + 2 * ws : w;
  const typename S::Elem* w3 = m_rows > 3 ? w + 3 * ws : w;
  __m512 acc[TN][kTileRows];
#pragma GCC unroll 8
  for (int t = 0; t < TN; ++t) {
#pragma GCC unroll 4
    for (int j = 0; j < kTileRows; ++j) acc[t][j] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + S::kStep <= k; i += S::kStep) {
    const typename S::Vec a0 = S::load(w0 + i), a1 = S::load(w1 + i), a2 = S::load(w2 + i),
                          a3 = S::load(w3 + i);
#pragma GCC unroll 8
    for (int t = 0; t < TN; ++t) {
      const typename S::Vec b = S::load(x + t * xs + i);
      acc[t][0] = S::madd(acc[t][0], a0, b);
      acc[t][1] = S::madd(acc[t][1], a1, b);
      acc[t][2] = S::madd(acc[t][2], a2, b);
      acc[t][3] = S::madd(acc[t][3], a3, b);
    }
  }
  if (i < k) {
    // Tail: masked loads read only the k - i elements that exist; the zeroed
    // lanes add 0 * 0.
    const int64_t m = k - i;
    const typename S::Vec a0 = S::load_tail(w0 + i, m), a1 = S::load_tail(w1 + i, m),
                          a2 = S::load_tail(w2 + i, m), a3 = S::load_tail(w3 + i, m);
#pragma GCC unroll 8
    for (int t = 0; t < TN; ++t) {
      const typename S::Vec b = S::load_tail(x + t * xs + i, m);
      acc[t][0] = S::madd(acc[t][0], a0, b);
      acc[t][1] = S::madd(acc[t][1], a1, b);
      acc[t][2] = S::madd(acc[t][2], a2, b);
      acc[t][3] = S::madd(acc[t][3], a3, b);
    }
  }
  const __mmask8 store_mask = static_cast<__mmask8>((1u << m_rows) - 1u);
#pragma GCC unroll 8
  for (int t = 0; t < TN; ++t) {
    __m128 s = reduce4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    float* yt = y + t * ldy;
    if (accumulate) s = _mm_add_ps(s, _mm_maskz_loadu_ps(store_mask, yt));
    _mm_mask_storeu_ps(yt, store_mask, s);
  }
}

// Tile over tn <= kTileTokensMax tokens (run-time count).
template <class S>
void tile_n(int tn, const typename S::Elem* w, int64_t ws, int m_rows, const typename S::Elem* x,
            int64_t xs, int64_t k, float* y, int64_t ldy, bool accumulate) {
  switch (tn) {
    case 1: tile<S, 1>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 2: tile<S, 2>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 3: tile<S, 3>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 4: tile<S, 4>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 5: tile<S, 5>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    default: tile<S, 6>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
  }
}

inline int min_int(int64_t a, int64_t b) {
  return static_cast<int>(a < b ? a : b);
}

// T = 1: 8 weight rows at a time (8 accumulators, 8 row streams), reduced
// into Y[r..r+8). Measured against the 4-row tile on one Emerald Rapids core
// (1 GiB of rotating weights): F32 12.4 -> 12.9 GB/s, BF16 9.1 -> 10.8,
// F16 unchanged at ~10 (a plain read loop reaches 13.5 there).
template <class S>
void gemv8(const typename S::Elem* w, int64_t ws, const typename S::Elem* x, int64_t k, float* y) {
  __m512 acc[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + S::kStep <= k; i += S::kStep) {
    const typename S::Vec b = S::load(x + i);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = S::madd(acc[j], S::load(w + j * ws + i), b);
  }
  if (i < k) {
    const typename S::Vec b = S::load_tail(x + i, k - i);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = S::madd(acc[j], S::load_tail(w + j * ws + i, k - i), b);
  }
  _mm_storeu_ps(y, reduce4(acc[0], acc[1], acc[2], acc[3]));
  _mm_storeu_ps(y + 4, reduce4(acc[4], acc[5], acc[6], acc[7]));
}

// T = 1, one row at a time in four accumulators along k: one sequential
// stream (a thread's rows are contiguous). On AMD (Zen 4/5) its single
// stream beats gemv8's eight: one Zen core (the 2-core development machine,
// tools/bench/dense_bench, TinyLlama shapes, interleaved passes) moved
// 26.3-30.1 GB/s of F16 weights against 20.0-28.5 (three passes), BF16
// 29.0-32.4 against 23.9-30.6 (two), where a plain read loop moves 32.8;
// F32 was no faster (27.0-32.2 against 29.7-35.3). Taken where
// detail::gemv_one_stream() (AMD); Intel keeps gemv8: gemv1 has not run on
// an Intel core.
template <class S>
void gemv1(const typename S::Elem* w, const typename S::Elem* x, int64_t k, float* y) {
  constexpr int kU = 4;
  __m512 acc[kU];
#pragma GCC unroll 4
  for (int u = 0; u < kU; ++u) acc[u] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kU * S::kStep <= k; i += kU * S::kStep) {
#pragma GCC unroll 4
    for (int u = 0; u < kU; ++u)
      acc[u] = S::madd(acc[u], S::load(w + i + u * S::kStep), S::load(x + i + u * S::kStep));
  }
  for (; i + S::kStep <= k; i += S::kStep) acc[0] = S::madd(acc[0], S::load(w + i), S::load(x + i));
  if (i < k) acc[1] = S::madd(acc[1], S::load_tail(w + i, k - i), S::load_tail(x + i, k - i));
  *y = _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// T <= kTileTokensMax: every weight row is read once, for all tokens.
template <class S>
void run_direct(const typename S::Elem* W, int64_t ws, const typename S::Elem* X, int64_t xs,
                int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  if (T == 1) {
    if (sizeof(typename S::Elem) == 2 && detail::gemv_one_stream()) {
      for (; r0 < r1; ++r0) gemv1<S>(W + r0 * ws, X, n, Y + r0);
      return;
    }
    for (; r0 + 8 <= r1; r0 += 8) gemv8<S>(W + r0 * ws, ws, X, n, Y + r0);
  }
  for (int64_t r = r0; r < r1; r += kTileRows) {
    tile_n<S>(static_cast<int>(T), W + r * ws, ws, min_int(kTileRows, r1 - r), X, xs, n, Y + r, ldy,
              false);
  }
}

// Widens `rows` rows of k 16-bit values (`src_stride` elements apart, S is
// SrcF16 or SrcBf16Widen) into fp32 rows `dst_stride` floats apart.
template <class S>
void widen_block(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t k, float* dst,
                 int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * src_stride;
    float* d = dst + r * dst_stride;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm512_storeu_ps(d + i, S::load(s + i));
    if (i < k)
      _mm512_mask_storeu_ps(d + i, static_cast<__mmask16>((1u << (k - i)) - 1u),
                            S::load_tail(s + i, k - i));
  }
}

// ---- Packed GEMM for T > kTileTokensMax -----------------------------------
//
// Prefill is compute-bound, and a dot-product tile pays a horizontal
// reduction per output and k block. Here a panel of 64 weight rows x one k
// block is transposed once into scratch, k-major: panel[u][64] holds unit u
// (one fp32 element, or one bf16 pair) of each of the 64 rows. The
// micro-kernel then computes 6 tokens x 64 rows with 24 accumulators that are
// pieces of Y rows: per unit, 4 panel loads, 6 broadcast activation units and
// 24 FMAs (vdpbf16ps for BF16: two elements per unit), no reduction.
//
//   for each panel of 64 rows in [r0, r1):
//     for each k block of 256 units:         panel: 256 x 64 x 4 B = 64 KiB, in L2
//       pack (transpose; widen F16)
//       for each 6 tokens of T:               Y panel [T, 64] stays in L2 over the k blocks
//         Y[t, panel] (+)= X[t, k block] . panel
//
// Software prefetch of the next block's weight lines (into L2, spread over
// the token tiles) was tried and measured 2-5% slower at T = 16: the
// hardware prefetchers already follow the 16 row streams of a pack.
// Weights are packed exactly once per call. Widened activations (F16, and
// BF16 without avx512_bf16) are converted per (panel, k block) into fp32
// scratch, 128 tokens at a time: one conversion per 64 multiply-adds.
// Block sizes were measured on a Sapphire Rapids class core (F32, T = 128):
// 128 units gave 115 GFLOP/s, 256 to 1024 gave 130-140 (oneDNN: 138).

constexpr int kPanelRows = 64;
constexpr int64_t kPanelUnits = 256;
constexpr int kGemmTokens = 6;
constexpr int64_t kWidenTokenBlock = 128;

inline __mmask16 mask16(int64_t m) {
  return m >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << m) - 1u);
}
inline __mmask32 mask32(int64_t m) {
  return m >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << m) - 1u);
}

// In-register transpose of a 16 x 16 block of 32-bit units: v[i] lane j <- v[j] lane i.
inline void transpose16(__m512 v[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);      // per 128-bit lane: [a0 b0 a1 b1]
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);  // [a2 b2 a3 b3]
  }
  for (int i = 0; i < 16; i += 4) {
    // Rows i..i+3 of column 4L + c in lane L of u[i + c].
    u[i + 0] =
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    u[i + 1] =
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    u[i + 2] = _mm512_castpd_ps(
        _mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    u[i + 3] = _mm512_castpd_ps(
        _mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  for (int c = 0; c < 4; ++c) {
    // Column 4L + c is lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
    const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);  // lanes 0, 2 of each
    const __m512 b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);  // lanes 1, 3 of each
    const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    v[c] = _mm512_shuffle_f32x4(a, e, 0x88);       // column c
    v[8 + c] = _mm512_shuffle_f32x4(a, e, 0xDD);   // column 8 + c
    v[4 + c] = _mm512_shuffle_f32x4(b, f, 0x88);   // column 4 + c
    v[12 + c] = _mm512_shuffle_f32x4(b, f, 0xDD);  // column 12 + c
  }
}

// Weight loaders for packing: the 16 units of one row starting at p, of
// which the first m elements exist (the rest read as zero), as 32-bit units.
struct PackF32 {
  using Elem = float;
  static constexpr int64_t kPerUnit = 1;
  static __m512 load(const float* p, int64_t m) { return _mm512_maskz_loadu_ps(mask16(m), p); }
};
struct PackF16 {
  using Elem = uint16_t;
  static constexpr int64_t kPerUnit = 1;
  static __m512 load(const uint16_t* p, int64_t m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(m), p));
  }
};
struct PackBf16Widen {
  using Elem = uint16_t;
  static constexpr int64_t kPerUnit = 1;
  static __m512 load(const uint16_t* p, int64_t m) {
    return SrcBf16Widen::widen(_mm256_maskz_loadu_epi16(mask16(m), p));
  }
};
struct PackBf16 {  // pairs of bf16 stay together: the layout vdpbf16ps wants
  using Elem = uint16_t;
  static constexpr int64_t kPerUnit = 2;
  static __m512 load(const uint16_t* p, int64_t m) {
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask32(m), p));
  }
};

// panel[u * 64 + r] = unit u of weight row r, for rows r < `rows` (<= 64,
// `ws` elements apart) and the k elements of each; zero elsewhere.
template <class P>
void pack_panel(const typename P::Elem* w, int64_t ws, int rows, int64_t k, float* panel) {
  constexpr int64_t kChunk = 16 * P::kPerUnit;  // elements in 16 units
  const int64_t units = (k + P::kPerUnit - 1) / P::kPerUnit;
  for (int g = 0; g < kPanelRows; g += 16) {
    for (int64_t e0 = 0; e0 < k; e0 += kChunk) {
      __m512 v[16];
      for (int i = 0; i < 16; ++i)
        v[i] = g + i < rows ? P::load(w + (g + i) * ws + e0, k - e0) : _mm512_setzero_ps();
      transpose16(v);
      const int64_t u0 = e0 / P::kPerUnit;
      const int64_t nu = units - u0 < 16 ? units - u0 : 16;
      for (int64_t i = 0; i < nu; ++i) _mm512_store_ps(panel + (u0 + i) * kPanelRows + g, v[i]);
    }
  }
}

// Activation broadcasts: unit u of an activation row in all 16 lanes.
struct BcastF32 {
  using Elem = float;
  static __m512 unit(const float* x, int64_t u) { return _mm512_set1_ps(x[u]); }
  static __m512 last_half(const float* x, int64_t u) {
    return unit(x, u);
  }  // units are whole: unused
  static __m512 madd(__m512 acc, __m512 w, __m512 x) { return _mm512_fmadd_ps(w, x, acc); }
};
struct BcastBf16 {
  using Elem = uint16_t;
  static __m512 unit(const uint16_t* x, int64_t u) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(_mm_cvtsi128_si32(_mm_loadu_si32(x + 2 * u))));
  }
  // The unpaired last element of an odd row: its partner must read as zero
  // (the bytes after the row may hold anything, a NaN included).
  static __m512 last_half(const uint16_t* x, int64_t u) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(x[2 * u]));
  }
  static __m512 madd(__m512 acc, __m512 w, __m512 x) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
  }
};

// Y[t * ldy + c] (+)= sum over units of x[t] . panel, for t < MR, c < cols
// (<= 64): `units` whole units, then (odd_tail) one whose activation is a
// lone element.
template <class B, int MR>
void gemm_micro(const float* panel, int64_t units, bool odd_tail, const typename B::Elem* x,
                int64_t xs, float* y, int64_t ldy, int cols, bool accumulate) {
  __mmask16 m[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) m[j] = mask16(cols - 16 * j < 0 ? 0 : cols - 16 * j);
  __m512 acc[MR][4];
#pragma GCC unroll 8
  for (int t = 0; t < MR; ++t) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      acc[t][j] =
          accumulate ? _mm512_maskz_loadu_ps(m[j], y + t * ldy + 16 * j) : _mm512_setzero_ps();
    }
  }
  for (int64_t u = 0; u < units; ++u) {
    const float* p = panel + u * kPanelRows;
    const __m512 b0 = _mm512_load_ps(p), b1 = _mm512_load_ps(p + 16), b2 = _mm512_load_ps(p + 32),
                 b3 = _mm512_load_ps(p + 48);
#pragma GCC unroll 8
    for (int t = 0; t < MR; ++t) {
      const __m512 a = B::unit(x + t * xs, u);
      acc[t][0] = B::madd(acc[t][0], b0, a);
      acc[t][1] = B::madd(acc[t][1], b1, a);
      acc[t][2] = B::madd(acc[t][2], b2, a);
      acc[t][3] = B::madd(acc[t][3], b3, a);
    }
  }
  if (odd_tail) {
    const float* p = panel + units * kPanelRows;
    const __m512 b0 = _mm512_load_ps(p), b1 = _mm512_load_ps(p + 16), b2 = _mm512_load_ps(p + 32),
                 b3 = _mm512_load_ps(p + 48);
#pragma GCC unroll 8
    for (int t = 0; t < MR; ++t) {
      const __m512 a = B::last_half(x + t * xs, units);
      acc[t][0] = B::madd(acc[t][0], b0, a);
      acc[t][1] = B::madd(acc[t][1], b1, a);
      acc[t][2] = B::madd(acc[t][2], b2, a);
      acc[t][3] = B::madd(acc[t][3], b3, a);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < MR; ++t) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(y + t * ldy + 16 * j, m[j], acc[t][j]);
  }
}

template <class B>
void gemm_micro_n(int mr, const float* panel, int64_t units, bool odd_tail,
                  const typename B::Elem* x, int64_t xs, float* y, int64_t ldy, int cols,
                  bool accumulate) {
  switch (mr) {
    case 1: gemm_micro<B, 1>(panel, units, odd_tail, x, xs, y, ldy, cols, accumulate); break;
    case 2: gemm_micro<B, 2>(panel, units, odd_tail, x, xs, y, ldy, cols, accumulate); break;
    case 3: gemm_micro<B, 3>(panel, units, odd_tail, x, xs, y, ldy, cols, accumulate); break;
    case 4: gemm_micro<B, 4>(panel, units, odd_tail, x, xs, y, ldy, cols, accumulate); break;
    case 5: gemm_micro<B, 5>(panel, units, odd_tail, x, xs, y, ldy, cols, accumulate); break;
    default: gemm_micro<B, 6>(panel, units, odd_tail, x, xs, y, ldy, cols, accumulate); break;
  }
}

// F32 (PackF32, BcastF32) and BF16 (PackBf16, BcastBf16): activations used in place.
template <class P, class B>
void run_packed(const typename P::Elem* W, int64_t ws, const typename B::Elem* X, int64_t xs,
                int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  alignas(64) float panel[kPanelUnits * kPanelRows];
  const int64_t kb = kPanelUnits * P::kPerUnit;  // elements per k block
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    const int rows = min_int(kPanelRows, r1 - r);
    for (int64_t k0 = 0; k0 < n; k0 += kb) {
      const int64_t k = n - k0 < kb ? n - k0 : kb;
      pack_panel<P>(W + r * ws + k0, ws, rows, k, panel);
      const int64_t units = k / P::kPerUnit;
      const bool odd_tail = units * P::kPerUnit < k;
      for (int64_t t = 0; t < T; t += kGemmTokens) {
        gemm_micro_n<B>(min_int(kGemmTokens, T - t), panel, units, odd_tail, X + t * xs + k0, xs,
                        Y + t * ldy + r, ldy, rows, k0 > 0);
      }
    }
  }
}

// 16-bit activations that must be widened (S = SrcF16 with PackF16, or
// SrcBf16Widen with PackBf16Widen): as run_packed, with the activations of
// each (panel, k block) widened into fp32 scratch, kWidenTokenBlock tokens at
// a time (64 + 128 KiB of stack in all).
template <class P, class S>
void run_packed_widened(const uint16_t* W, int64_t ws, const uint16_t* X, int64_t xs, int64_t T,
                        float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  alignas(64) float panel[kPanelUnits * kPanelRows];
  alignas(64) float xbuf[kWidenTokenBlock * kPanelUnits];
  for (int64_t t0 = 0; t0 < T; t0 += kWidenTokenBlock) {
    const int64_t tb = T - t0 < kWidenTokenBlock ? T - t0 : kWidenTokenBlock;
    for (int64_t r = r0; r < r1; r += kPanelRows) {
      const int rows = min_int(kPanelRows, r1 - r);
      for (int64_t k0 = 0; k0 < n; k0 += kPanelUnits) {
        const int64_t k = n - k0 < kPanelUnits ? n - k0 : kPanelUnits;
        pack_panel<P>(W + r * ws + k0, ws, rows, k, panel);
        widen_block<S>(X + t0 * xs + k0, xs, tb, k, xbuf, kPanelUnits);
        for (int64_t t = 0; t < tb; t += kGemmTokens) {
          gemm_micro_n<BcastF32>(min_int(kGemmTokens, tb - t), panel, k, false,
                                 xbuf + t * kPanelUnits, kPanelUnits, Y + (t0 + t) * ldy + r, ldy,
                                 rows, k0 > 0);
        }
      }
    }
  }
}

}  // namespace

// Row strides are in bytes, as in matmul_rows; dense rows are whole elements apart.

void dense_f32(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
               float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const float*>(W);
  const auto* x = static_cast<const float*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(float));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(float));
  if (T <= kTileTokensMax) {
    run_direct<SrcF32>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_packed<PackF32, BcastF32>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

void dense_f16(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
               float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const uint16_t*>(W);
  const auto* x = static_cast<const uint16_t*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(uint16_t));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(uint16_t));
  if (T <= kTileTokensMax) {
    run_direct<SrcF16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_packed_widened<PackF16, SrcF16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

void dense_bf16(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
                float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const uint16_t*>(W);
  const auto* x = static_cast<const uint16_t*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(uint16_t));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(uint16_t));
  if (T <= kTileTokensMax) {
    run_direct<SrcBf16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_packed<PackBf16, BcastBf16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

// BF16 on AVX-512 CPUs without avx512_bf16: exact widening and fp32 FMA.
void dense_bf16_widen(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes,
                      int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const uint16_t*>(W);
  const auto* x = static_cast<const uint16_t*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(uint16_t));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(uint16_t));
  if (T <= kTileTokensMax) {
    run_direct<SrcBf16Widen>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_packed_widened<PackBf16Widen, SrcBf16Widen>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  widen_block<SrcF16>(src, 0, 1, n, dst, 0);
}

}  // namespace loom::cpu::avx512
