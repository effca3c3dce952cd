// Dense (F32, F16, BF16) matrix products with AVX-512.
//
// Y[t, r] = dot(W row r, X row t) for t < T, r0 <= r < r1 (the contract of
// detail::matmul_rows_dense). Everything is a dot product of two contiguous
// rows, so the micro-kernel is a tile of 4 weight rows x TN activation rows
// (TN <= 6): 4 + 1 vector registers of inputs and 4 * TN accumulators, each
// weight vector loaded once per k step and used for TN tokens, each
// activation vector used for 4 rows. The 4 accumulators of one token are
// reduced together into the 4 consecutive outputs Y[t, r..r+3].
//
//   T <= 6 (decode, GEMV): one pass over the weights, straight from memory;
//     the run is bound by memory bandwidth, the tile only adds streams.
//   T > 6 (prefill): blocked. Tokens in blocks of kTokenBlock, k in blocks of
//     kKBlock elements: the weight tile [4, kKBlock] stays in L1 while all
//     token tiles of the block go past it, the activation block stays in L2
//     while all row groups of [r0, r1) go past it. Partial sums over k blocks
//     are added into Y.
//
// Per dtype:
//   F32   fp32 FMA.
//   F16   F16C (vcvtph2ps, exact) then fp32 FMA. For T > 6 the activation
//         block and each weight tile are converted once into fp32 scratch, so
//         the inner loop is the F32 one and the conversions are amortised.
//   BF16  vdpbf16ps on the raw bf16 pairs: 32 products per instruction. Each
//         product of two bf16 is exact in fp32 (8 x 8 significand bits), and
//         each lane adds its two products into the accumulator with one
//         round-to-nearest-even each, so the error is that of an fp32 dot
//         product summed in another order: |err| <= n * 2^-24 * sum|w x|.
//         Unlike vfmadd it treats subnormal inputs and results as zero
//         (DAZ/FTZ regardless of MXCSR): an extra absolute error of at most
//         2^-126 per term, nothing for real weights. tests/unit/cpu_dense_test
//         checks this bound.
//
// Rule of this folder (cpu/CMakeLists.txt): intrinsics, raw pointers and
// functions of namespace loom::cpu::avx512 only; no std templates or header
// inline functions are instantiated here. The templates below are our own,
// in an anonymous namespace. dense_bf16 needs avx512_bf16, which the Isa
// level kAvx512 does not imply: cpu/matmul_dense.cpp checks it and calls
// dense_bf16_widen on CPUs without it.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace loom::cpu::avx512 {
namespace {

constexpr int kTileRows = 4;      // weight rows per micro-kernel tile
constexpr int kTileTokensMax = 6;  // activation rows per tile: 24 accumulators + 5 inputs of 32 zmm
constexpr int64_t kKBlock = 512;   // elements: weight tile 4 x 2 KiB (fp32) in L1
constexpr int64_t kTokenBlock = 96;  // tokens: activation block 96 x 2 KiB = 192 KiB (fp32) in L2

// Sums each of a, b, c, d over its 16 lanes: returns [sum a, sum b, sum c, sum d].
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Within 128-bit lanes: [a0+a2, b0+b2, a1+a3, b1+b3] and the same for c, d.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // [a, b, c, d] partial sums in each of the 4 lanes.
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  // Add the 4 lanes.
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd),
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
  static Vec widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static Vec load(const uint16_t* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Vec load_tail(const uint16_t* p, int64_t m) {
    return widen(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << m) - 1u), p));
  }
  static __m512 madd(__m512 acc, Vec w, Vec x) { return _mm512_fmadd_ps(w, x, acc); }
};

// The micro-kernel: rows w[0..m_rows) (m_rows <= 4, `ws` elements apart) times
// activation rows x[0..TN) (`xs` elements apart), k elements each.
// Y[t * ldy + j] = (accumulate ? Y[...] : 0) + dot, for j < m_rows.
template <class S, int TN>
void tile(const typename S::Elem* w, int64_t ws, int m_rows, const typename S::Elem* x, int64_t xs, int64_t k,
          float* y, int64_t ldy, bool accumulate) {
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
void tile_n(int tn, const typename S::Elem* w, int64_t ws, int m_rows, const typename S::Elem* x, int64_t xs,
            int64_t k, float* y, int64_t ldy, bool accumulate) {
  switch (tn) {
    case 1: tile<S, 1>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 2: tile<S, 2>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 3: tile<S, 3>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 4: tile<S, 4>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    case 5: tile<S, 5>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
    default: tile<S, 6>(w, ws, m_rows, x, xs, k, y, ldy, accumulate); break;
  }
}

inline int min_int(int64_t a, int64_t b) { return static_cast<int>(a < b ? a : b); }

// T <= kTileTokensMax: every weight row is read once, for all tokens.
template <class S>
void run_direct(const typename S::Elem* W, int64_t ws, const typename S::Elem* X, int64_t xs, int64_t T, float* Y,
                int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r += kTileRows) {
    tile_n<S>(static_cast<int>(T), W + r * ws, ws, min_int(kTileRows, r1 - r), X, xs, n, Y + r, ldy, false);
  }
}

// T > kTileTokensMax: token blocks x k blocks, as in the header comment.
template <class S>
void run_blocked(const typename S::Elem* W, int64_t ws, const typename S::Elem* X, int64_t xs, int64_t T, float* Y,
                 int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  for (int64_t t0 = 0; t0 < T; t0 += kTokenBlock) {
    const int64_t t1 = t0 + kTokenBlock < T ? t0 + kTokenBlock : T;
    for (int64_t k0 = 0; k0 < n; k0 += kKBlock) {
      const int64_t kb = n - k0 < kKBlock ? n - k0 : kKBlock;
      for (int64_t r = r0; r < r1; r += kTileRows) {
        const int m_rows = min_int(kTileRows, r1 - r);
        for (int64_t t = t0; t < t1; t += kTileTokensMax) {
          tile_n<S>(min_int(kTileTokensMax, t1 - t), W + r * ws + k0, ws, m_rows, X + t * xs + k0, xs, kb,
                    Y + t * ldy + r, ldy, k0 > 0);
        }
      }
    }
  }
}

// Widens `rows` rows of k 16-bit values (`src_stride` elements apart, S is
// SrcF16 or SrcBf16Widen) into fp32 rows `dst_stride` floats apart.
template <class S>
void widen_block(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t k, float* dst, int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * src_stride;
    float* d = dst + r * dst_stride;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm512_storeu_ps(d + i, S::load(s + i));
    if (i < k) _mm512_mask_storeu_ps(d + i, static_cast<__mmask16>((1u << (k - i)) - 1u), S::load_tail(s + i, k - i));
  }
}

// F16 (and BF16 without avx512_bf16), T > kTileTokensMax: each activation
// block [tokens, kKBlock] is widened once into fp32 scratch, each weight tile
// [4, kKBlock] once per token block, then the F32 micro-kernel runs on the
// scratch. Scratch lives on the stack: 192 KiB + 8 KiB.
template <class S>
void run_blocked_widened(const uint16_t* W, int64_t ws, const uint16_t* X, int64_t xs, int64_t T, float* Y, int64_t ldy,
                     int64_t n, int64_t r0, int64_t r1) {
  alignas(64) float xbuf[kTokenBlock * kKBlock];
  alignas(64) float wbuf[kTileRows * kKBlock];
  for (int64_t t0 = 0; t0 < T; t0 += kTokenBlock) {
    const int64_t t1 = t0 + kTokenBlock < T ? t0 + kTokenBlock : T;
    for (int64_t k0 = 0; k0 < n; k0 += kKBlock) {
      const int64_t kb = n - k0 < kKBlock ? n - k0 : kKBlock;
      widen_block<S>(X + t0 * xs + k0, xs, t1 - t0, kb, xbuf, kKBlock);
      for (int64_t r = r0; r < r1; r += kTileRows) {
        const int m_rows = min_int(kTileRows, r1 - r);
        widen_block<S>(W + r * ws + k0, ws, m_rows, kb, wbuf, kKBlock);
        for (int64_t t = t0; t < t1; t += kTileTokensMax) {
          tile_n<SrcF32>(min_int(kTileTokensMax, t1 - t), wbuf, kKBlock, m_rows, xbuf + (t - t0) * kKBlock,
                         kKBlock, kb, Y + t * ldy + r, ldy, k0 > 0);
        }
      }
    }
  }
}

}  // namespace

// Row strides are in bytes, as in matmul_rows; dense rows are whole elements apart.

void dense_f32(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T, float* Y,
               int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const float*>(W);
  const auto* x = static_cast<const float*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(float));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(float));
  if (T <= kTileTokensMax) {
    run_direct<SrcF32>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_blocked<SrcF32>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

void dense_f16(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T, float* Y,
               int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const uint16_t*>(W);
  const auto* x = static_cast<const uint16_t*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(uint16_t));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(uint16_t));
  if (T <= kTileTokensMax) {
    run_direct<SrcF16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_blocked_widened<SrcF16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

void dense_bf16(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T, float* Y,
                int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const uint16_t*>(W);
  const auto* x = static_cast<const uint16_t*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(uint16_t));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(uint16_t));
  if (T <= kTileTokensMax) {
    run_direct<SrcBf16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_blocked<SrcBf16>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

// BF16 on AVX-512 CPUs without avx512_bf16: exact widening and fp32 FMA.
void dense_bf16_widen(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T, float* Y,
                      int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const uint16_t*>(W);
  const auto* x = static_cast<const uint16_t*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(uint16_t));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(uint16_t));
  if (T <= kTileTokensMax) {
    run_direct<SrcBf16Widen>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_blocked_widened<SrcBf16Widen>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) { widen_block<SrcF16>(src, 0, 1, n, dst, 0); }

}  // namespace loom::cpu::avx512
