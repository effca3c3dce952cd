// Dense (F32, F16, BF16) matrix products with AVX2 + FMA + F16C.
//
// Same structure as cpu/avx512/dense_avx512.cpp (read that header comment):
// a micro-kernel tile of 4 weight rows x TN activation rows, reduced into
// Y[t, r..r+3]; a single pass for T <= TN_max (GEMV), token x k blocking
// above. With 16 ymm registers the tile is 4 x 2 (8 accumulators, 4 weight
// vectors, 1 activation vector).
//
// Per dtype (all exact conversions, then fp32 FMA):
//   F32   vfmadd on the rows.
//   F16   vcvtph2ps. For T > 2 the blocks are widened once into fp32 scratch.
//   BF16  zero-extend to 32 bits and shift left by 16 (bf16 is the top half of
//         an fp32). For T > 2 also widened once into fp32 scratch.
// Tails (k not a multiple of 8) are copied into a zero-padded stack buffer:
// AVX2 has no 16-bit masked loads.
//
// Not tuned for prefill: one Emerald Rapids core limited to AVX2 measured
// 34-40 GFLOP/s (F32, T = 128) against oneDNN's 50-56; GEMV is at memory
// bandwidth (13.7-14.8 GB/s F32, 10.2-11.0 F16). The packed GEMM of the
// AVX-512 file (k-major weight panels, broadcast activations, no
// reductions), with 8x8 transposes and a 4 x 24 tile, is the way up.
//
// Rule of this folder (cpu/CMakeLists.txt): intrinsics, raw pointers and
// functions of namespace loom::cpu::avx2 only; no std templates or header
// inline functions instantiated here.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace loom::cpu::avx2 {
namespace {

constexpr int kTileRows = 4;
constexpr int kTileTokensMax = 2;    // 8 accumulators + 5 inputs of 16 ymm
constexpr int64_t kKBlock = 512;     // elements: weight tile 4 x 2 KiB (fp32) in L1
constexpr int64_t kTokenBlock = 64;  // tokens: activation block 64 x 2 KiB (fp32) in L2

// [sum a, sum b, sum c, sum d] over 8 lanes each.
inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  // Per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3], then [a, b, c, d] partial sums.
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

inline __m256 widen_f16(__m128i h) {
  return _mm256_cvtph_ps(h);
}
inline __m256 widen_bf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Loads m < 8 halves into a zero-padded vector.
inline __m128i load_tail_u16(const uint16_t* p, int64_t m) {
  alignas(16) uint16_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < m; ++i) buf[i] = p[i];
  return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
}

struct SrcF32 {
  using Elem = float;
  static constexpr int64_t kStep = 8;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256 load_tail(const float* p, int64_t m) {
    // Lanes i < m: all-ones mask.
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(m)), lane);
    return _mm256_maskload_ps(p, mask);
  }
};

struct SrcF16 {
  using Elem = uint16_t;
  static constexpr int64_t kStep = 8;
  static __m256 load(const uint16_t* p) {
    return widen_f16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 load_tail(const uint16_t* p, int64_t m) { return widen_f16(load_tail_u16(p, m)); }
};

struct SrcBf16 {
  using Elem = uint16_t;
  static constexpr int64_t kStep = 8;
  static __m256 load(const uint16_t* p) {
    return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 load_tail(const uint16_t* p, int64_t m) { return widen_bf16(load_tail_u16(p, m)); }
};

// Rows w[0..m_rows) (m_rows <= 4) times activation rows x[0..TN), k elements:
// Y[t * ldy + j] = (accumulate ? Y[...] : 0) + dot.
template <class S, int TN>
void tile(const typename S::Elem* w, int64_t ws, int m_rows, const typename S::Elem* x, int64_t xs,
          int64_t k, float* y, int64_t ldy, bool accumulate) {
  // Missing rows read row 0 again; their sums are not stored.
  const typename S::Elem* w0 = w;
  const typename S::Elem* w1 = m_rows > 1 ? w + ws : w;
  const typename S::Elem* w2 = m_rows > 2 ? w + 2 * ws : w;
  const typename S::Elem* w3 = m_rows > 3 ? w + 3 * ws : w;
  __m256 acc[TN][kTileRows];
#pragma GCC unroll 4
  for (int t = 0; t < TN; ++t) {
#pragma GCC unroll 4
    for (int j = 0; j < kTileRows; ++j) acc[t][j] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + S::kStep <= k; i += S::kStep) {
    const __m256 a0 = S::load(w0 + i), a1 = S::load(w1 + i), a2 = S::load(w2 + i),
                 a3 = S::load(w3 + i);
#pragma GCC unroll 4
    for (int t = 0; t < TN; ++t) {
      const __m256 b = S::load(x + t * xs + i);
      acc[t][0] = _mm256_fmadd_ps(a0, b, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(a1, b, acc[t][1]);
      acc[t][2] = _mm256_fmadd_ps(a2, b, acc[t][2]);
      acc[t][3] = _mm256_fmadd_ps(a3, b, acc[t][3]);
    }
  }
  if (i < k) {
    const int64_t m = k - i;
    const __m256 a0 = S::load_tail(w0 + i, m), a1 = S::load_tail(w1 + i, m),
                 a2 = S::load_tail(w2 + i, m), a3 = S::load_tail(w3 + i, m);
#pragma GCC unroll 4
    for (int t = 0; t < TN; ++t) {
      const __m256 b = S::load_tail(x + t * xs + i, m);
      acc[t][0] = _mm256_fmadd_ps(a0, b, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(a1, b, acc[t][1]);
      acc[t][2] = _mm256_fmadd_ps(a2, b, acc[t][2]);
      acc[t][3] = _mm256_fmadd_ps(a3, b, acc[t][3]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < TN; ++t) {
    const __m128 s = reduce4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    float* yt = y + t * ldy;
    if (m_rows == kTileRows) {
      _mm_storeu_ps(yt, accumulate ? _mm_add_ps(s, _mm_loadu_ps(yt)) : s);
    } else {
      alignas(16) float out[4];
      _mm_store_ps(out, s);
      for (int j = 0; j < m_rows; ++j) yt[j] = accumulate ? yt[j] + out[j] : out[j];
    }
  }
}

template <class S>
void tile_n(int tn, const typename S::Elem* w, int64_t ws, int m_rows, const typename S::Elem* x,
            int64_t xs, int64_t k, float* y, int64_t ldy, bool accumulate) {
  if (tn == 1) {
    tile<S, 1>(w, ws, m_rows, x, xs, k, y, ldy, accumulate);
  } else {
    tile<S, 2>(w, ws, m_rows, x, xs, k, y, ldy, accumulate);
  }
}

inline int min_int(int64_t a, int64_t b) {
  return static_cast<int>(a < b ? a : b);
}

// T <= kTileTokensMax: one pass over the weights.
template <class S>
void run_direct(const typename S::Elem* W, int64_t ws, const typename S::Elem* X, int64_t xs,
                int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r += kTileRows) {
    tile_n<S>(static_cast<int>(T), W + r * ws, ws, min_int(kTileRows, r1 - r), X, xs, n, Y + r, ldy,
              false);
  }
}

template <class S>
void run_blocked(const typename S::Elem* W, int64_t ws, const typename S::Elem* X, int64_t xs,
                 int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  for (int64_t t0 = 0; t0 < T; t0 += kTokenBlock) {
    const int64_t t1 = t0 + kTokenBlock < T ? t0 + kTokenBlock : T;
    for (int64_t k0 = 0; k0 < n; k0 += kKBlock) {
      const int64_t kb = n - k0 < kKBlock ? n - k0 : kKBlock;
      for (int64_t r = r0; r < r1; r += kTileRows) {
        const int m_rows = min_int(kTileRows, r1 - r);
        for (int64_t t = t0; t < t1; t += kTileTokensMax) {
          tile_n<S>(min_int(kTileTokensMax, t1 - t), W + r * ws + k0, ws, m_rows, X + t * xs + k0,
                    xs, kb, Y + t * ldy + r, ldy, k0 > 0);
        }
      }
    }
  }
}

// Widens `rows` rows of k 16-bit values (`src_stride` apart) into fp32 rows
// `dst_stride` apart.
template <class S>
void widen_block(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t k, float* dst,
                 int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * src_stride;
    float* d = dst + r * dst_stride;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(d + i, S::load(s + i));
    if (i < k) {
      alignas(32) float buf[8];
      _mm256_store_ps(buf, S::load_tail(s + i, k - i));
      for (int64_t j = 0; j < k - i; ++j) d[i + j] = buf[j];
    }
  }
}

// F16/BF16, T > kTileTokensMax: widen each activation block once and each
// weight tile once per token block into fp32 scratch (128 KiB + 8 KiB of
// stack), then run the F32 micro-kernel.
template <class S>
void run_blocked_widened(const uint16_t* W, int64_t ws, const uint16_t* X, int64_t xs, int64_t T,
                         float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  alignas(32) float xbuf[kTokenBlock * kKBlock];
  alignas(32) float wbuf[kTileRows * kKBlock];
  for (int64_t t0 = 0; t0 < T; t0 += kTokenBlock) {
    const int64_t t1 = t0 + kTokenBlock < T ? t0 + kTokenBlock : T;
    for (int64_t k0 = 0; k0 < n; k0 += kKBlock) {
      const int64_t kb = n - k0 < kKBlock ? n - k0 : kKBlock;
      widen_block<S>(X + t0 * xs + k0, xs, t1 - t0, kb, xbuf, kKBlock);
      for (int64_t r = r0; r < r1; r += kTileRows) {
        const int m_rows = min_int(kTileRows, r1 - r);
        widen_block<S>(W + r * ws + k0, ws, m_rows, kb, wbuf, kKBlock);
        for (int64_t t = t0; t < t1; t += kTileTokensMax) {
          tile_n<SrcF32>(min_int(kTileTokensMax, t1 - t), wbuf, kKBlock, m_rows,
                         xbuf + (t - t0) * kKBlock, kKBlock, kb, Y + t * ldy + r, ldy, k0 > 0);
        }
      }
    }
  }
}

template <class S>
void run_16bit(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
               float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  const auto* w = static_cast<const uint16_t*>(W);
  const auto* x = static_cast<const uint16_t*>(X);
  const auto ws = static_cast<int64_t>(w_row_bytes / sizeof(uint16_t));
  const auto xs = static_cast<int64_t>(x_row_bytes / sizeof(uint16_t));
  if (T <= kTileTokensMax) {
    run_direct<S>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  } else {
    run_blocked_widened<S>(w, ws, x, xs, T, Y, ldy, n, r0, r1);
  }
}

}  // namespace

// Row strides are in bytes, as in matmul_rows.

void dense_f32(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
               float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
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

void dense_f16(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
               float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  run_16bit<SrcF16>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
}

void dense_bf16(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
                float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  run_16bit<SrcBf16>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  widen_block<SrcF16>(src, 0, 1, n, dst, 0);
}

}  // namespace loom::cpu::avx2
