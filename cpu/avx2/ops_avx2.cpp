// AVX2 + FMA + F16C kernels behind cpu/ops.h: rms_norm, silu_mul, add,
// softmax, the F16 row store of kv_store, and the per-block steps of paged
// attention (cpu/ops.cpp drives them; the scratch layouts are described there).
//
// Same algorithms as cpu/avx512/ops_avx512.cpp with 8-float vectors:
//   exp: Cephes' scheme; 2^n is applied as 2^(n/2) * 2^(n - n/2), both
//     normal floats for every clamped n, so overflow gives inf and tiny
//     results underflow gradually, as vscalefps does on AVX-512.
//   scores: 8 cached rows at a time, 8 accumulators summed lane-wise into one
//     vector by 3 levels of (blend, permute, add), inputs in bit-reversed order.
//   P . V: register tiles of 4 query rows x 2 chunks of 8 dims (2 x 4, 1 x 8)
//     over the fp32 V scratch, each V chunk loaded once for all rows of the tile.
//   K is stored chunk-major with 8-float chunks (the attention driver asks
//   for kAttnLanes = 8); V row-major.
// Tails (n not a multiple of 8) go through a small zero-padded buffer.
//
// Rule of this folder (cpu/CMakeLists.txt): intrinsics, raw pointers and
// functions of namespace loom::cpu::avx2 only; no std templates or header
// inline functions are instantiated here. The templates below are our own,
// in an anonymous namespace.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace loom::cpu::avx2 {
namespace {

// Loads k < 8 floats (zeros after them) / stores the first k lanes.
inline __m256 load_partial(const float* p, int64_t k) {
  float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < k; ++j) buf[j] = p[j];
  return _mm256_loadu_ps(buf);
}

inline void store_partial(float* p, __m256 v, int64_t k) {
  float buf[8];
  _mm256_storeu_ps(buf, v);
  for (int64_t j = 0; j < k; ++j) p[j] = buf[j];
}

inline __m256 exp_ps(__m256 x) {
  // max/min return their second operand when either is NaN: NaN goes through.
  x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // n in [-150, 129]: halves in [-75, 65], each a normal power of two.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}

inline float exp_ss(float x) {
  return _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(x)));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline double hsum_pd(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

// Adds the 8 floats of v to a double accumulator (two halves).
inline __m256d add_pd8(__m256d acc, __m256 v) {
  acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

// out[j] = sum of the 8 lanes of a[j], j = 0..7 (inputs bit-reversed: 0, 4, 2, 6, 1, 5, 3, 7).
inline __m256 reduce8(const __m256* a) {
  // Level 1: 128-bit halves.
  auto c1 = [](__m256 x, __m256 y) {
    return _mm256_add_ps(_mm256_blend_ps(x, y, 0xF0), _mm256_permute2f128_ps(x, y, 0x21));
  };
  // Level 2: 64-bit pairs of each 128-bit lane.
  auto c2 = [](__m256 x, __m256 y) {
    return _mm256_add_ps(_mm256_blend_ps(x, y, 0xCC), _mm256_shuffle_ps(x, y, 0x4E));
  };
  // Level 3: neighbouring floats.
  auto c3 = [](__m256 x, __m256 y) {
    return _mm256_add_ps(_mm256_blend_ps(x, y, 0xAA),
                         _mm256_permute_ps(_mm256_blend_ps(x, y, 0x55), 0xB1));
  };
  const __m256 t0 = c1(a[0], a[4]);
  const __m256 t1 = c1(a[2], a[6]);
  const __m256 t2 = c1(a[1], a[5]);
  const __m256 t3 = c1(a[3], a[7]);
  return c3(c2(t0, t1), c2(t2, t3));
}

// acc[i][0..8G) = acc[i] * alpha[i] + sum_r p[i][r] * vf[r][0..8G) for R
// query rows: R x G accumulators, each V chunk loaded once for R rows, each
// probability broadcast once for G chunks.
template <int R, int G>
void pv_tile(const float* p, int64_t lds, const float* alpha, const float* v, int64_t hdp,
             int64_t n, float* acc) {
  __m256 x[R][G];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const __m256 a = _mm256_set1_ps(alpha[i]);
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c) x[i][c] = _mm256_mul_ps(_mm256_loadu_ps(acc + i * hdp + 8 * c), a);
  }
  for (int64_t r = 0; r < n; ++r) {
    const float* vr = v + r * hdp;
    __m256 vv[G];
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c) vv[c] = _mm256_loadu_ps(vr + 8 * c);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m256 b = _mm256_broadcast_ss(p + i * lds + r);
#pragma GCC unroll 8
      for (int c = 0; c < G; ++c) x[i][c] = _mm256_fmadd_ps(b, vv[c], x[i][c]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c) _mm256_storeu_ps(acc + i * hdp + 8 * c, x[i][c]);
  }
}

// Tiles of the 16 ymm registers: 4 rows x 2 chunks, 2 x 4, 1 x 8 (8 FMA chains each).
template <int R>
void pv_tile_g(int64_t g, const float* p, int64_t lds, const float* alpha, const float* v,
               int64_t hdp, int64_t n, float* acc) {
  switch (g) {
    case 1: return pv_tile<R, 1>(p, lds, alpha, v, hdp, n, acc);
    case 2: return pv_tile<R, 2>(p, lds, alpha, v, hdp, n, acc);
    default: break;
  }
  if constexpr (R <= 2) {
    switch (g) {
      case 3: return pv_tile<R, 3>(p, lds, alpha, v, hdp, n, acc);
      case 4: return pv_tile<R, 4>(p, lds, alpha, v, hdp, n, acc);
      default: break;
    }
  }
  if constexpr (R == 1) {
    switch (g) {
      case 5: return pv_tile<R, 5>(p, lds, alpha, v, hdp, n, acc);
      case 6: return pv_tile<R, 6>(p, lds, alpha, v, hdp, n, acc);
      case 7: return pv_tile<R, 7>(p, lds, alpha, v, hdp, n, acc);
      default: return pv_tile<R, 8>(p, lds, alpha, v, hdp, n, acc);
    }
  }
}

}  // namespace

// ---- element-wise ------------------------------------------------------------

void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n) {
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i);
    const __m256 b = _mm256_loadu_ps(x + i + 8);
    acc0 = add_pd8(acc0, _mm256_mul_ps(a, a));
    acc1 = add_pd8(acc1, _mm256_mul_ps(b, b));
  }
  for (; i < n; i += 8) {
    const __m256 a = n - i >= 8 ? _mm256_loadu_ps(x + i) : load_partial(x + i, n - i);
    acc0 = add_pd8(acc0, _mm256_mul_ps(a, a));
  }
  const double sum = hsum_pd(_mm256_add_pd(acc0, acc1));
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(mean + eps)));
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(
        y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
  }
  if (i < n) {
    const __m256 v =
        _mm256_mul_ps(_mm256_mul_ps(load_partial(x + i, n - i), vs), load_partial(w + i, n - i));
    store_partial(y + i, v, n - i);
  }
}

namespace {
inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n)
    store_partial(out + i, silu_mul8(load_partial(gate + i, n - i), load_partial(up + i, n - i)),
                  n - i);
}

void add(const float* a, const float* b, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 mx = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  float max = hmax(mx);
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  const __m256 vmax = _mm256_set1_ps(max);
  // exp values summed in double: a vocabulary-sized row would lose digits in float.
  __m256d sum = _mm256_setzero_pd();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    sum = add_pd8(sum, e);
    _mm256_storeu_ps(x + i, e);
  }
  double total = hsum_pd(sum);
  if (i < n) {
    const int64_t k = n - i;
    float e[8];
    _mm256_storeu_ps(e, exp_ps(_mm256_sub_ps(load_partial(x + i, k), vmax)));
    for (int64_t j = 0; j < k; ++j) {
      x[i + j] = e[j];
      total += static_cast<double>(e[j]);
    }
  }
  const float inv = static_cast<float>(1.0 / total);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
  for (; i < n; ++i) x[i] *= inv;
}

void f32_to_f16_row(const float* x, void* y, int64_t n) {
  auto* out = static_cast<unsigned char*>(y);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  if (i < n) {
    unsigned char buf[16];
    const __m128i h =
        _mm256_cvtps_ph(load_partial(x + i, n - i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(buf), h);
    for (int64_t j = 0; j < 2 * (n - i); ++j) out[2 * i + j] = buf[j];
  }
}

// ---- attention -------------------------------------------------------------------

void attn_load_f16(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs,
                   int64_t n_pad) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  const int64_t hdp = (hd + 15) / 16 * 16;  // the driver pads dims to 16
  const int64_t full = hd / 8;              // whole 8-dim chunks
  for (int64_t r = 0; r < n; ++r) {
    const unsigned char* row = bytes + 2 * r * hd;
    float* d = dst + r * rs;
    for (int64_t c = 0; c < full; ++c) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * c));
      _mm256_storeu_ps(d + c * cs, _mm256_cvtph_ps(h));
    }
    int64_t c = full;
    if (hd % 8 != 0) {
      unsigned char buf[16] = {};
      for (int64_t j = 0; j < 2 * (hd % 8); ++j) buf[j] = row[16 * c + j];
      _mm256_storeu_ps(d + c * cs,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(buf))));
      ++c;
    }
    for (; c < hdp / 8; ++c) _mm256_storeu_ps(d + c * cs, _mm256_setzero_ps());
  }
  for (int64_t r = n; r < n_pad; ++r) {
    for (int64_t c = 0; c < hdp / 8; ++c)
      _mm256_storeu_ps(dst + r * rs + c * cs, _mm256_setzero_ps());
  }
}

void attn_load_q8_0(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs,
                    int64_t n_pad) {
  // Row: hd / 32 blocks of {fp16 d, int8 qs[32]} (34 bytes); y = qs * d.
  const auto* bytes = static_cast<const unsigned char*>(src);
  const int64_t n_blocks = hd / 32;
  const int64_t row_bytes = 34 * n_blocks;
  for (int64_t r = 0; r < n; ++r) {
    const unsigned char* row = bytes + r * row_bytes;
    float* d = dst + r * rs;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const unsigned char* blk = row + 34 * b;
      const auto bits = static_cast<unsigned short>(blk[0] | (blk[1] << 8));
      const __m256 scale = _mm256_set1_ps(_cvtsh_ss(bits));
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
      const __m256i w0 = _mm256_cvtepi8_epi32(q0);
      const __m256i w1 = _mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8));
      const __m256i w2 = _mm256_cvtepi8_epi32(q1);
      const __m256i w3 = _mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8));
      _mm256_storeu_ps(d + (4 * b) * cs, _mm256_mul_ps(_mm256_cvtepi32_ps(w0), scale));
      _mm256_storeu_ps(d + (4 * b + 1) * cs, _mm256_mul_ps(_mm256_cvtepi32_ps(w1), scale));
      _mm256_storeu_ps(d + (4 * b + 2) * cs, _mm256_mul_ps(_mm256_cvtepi32_ps(w2), scale));
      _mm256_storeu_ps(d + (4 * b + 3) * cs, _mm256_mul_ps(_mm256_cvtepi32_ps(w3), scale));
    }
  }
  for (int64_t r = n; r < n_pad; ++r) {
    for (int64_t c = 0; c < 4 * n_blocks; ++c)
      _mm256_storeu_ps(dst + r * rs + c * cs, _mm256_setzero_ps());
  }
}

void attn_scores(const float* q, int64_t m, int64_t hdp, const float* kf, int64_t rc, int64_t n,
                 float scale, float* s, int64_t lds) {
  const int64_t n_chunks = hdp / 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t g = 0; g < n; g += 8) {
    // Rows g..g+7 (zero past n): chunk c of row g+j at kf + c*rc*8 + (g+j)*8.
    const float* kg = kf + g * 8;
    for (int64_t i = 0; i < m; ++i) {
      const float* qi = q + i * hdp;
      __m256 a[8];
      for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
      const float* kc = kg;
      for (int64_t c = 0; c < n_chunks; ++c, kc += rc * 8) {
        const __m256 qv = _mm256_loadu_ps(qi + 8 * c);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kc + 8 * j), a[j]);
      }
      const __m256 v = _mm256_mul_ps(reduce8(a), vscale);
      if (n - g >= 8) {
        _mm256_storeu_ps(s + i * lds + g, v);
      } else {
        store_partial(s + i * lds + g, v, n - g);
      }
    }
  }
}

void attn_softmax(float* s, int64_t lds, int64_t m, int64_t n, const int32_t* n_valid,
                  float* row_max, float* row_sum, float* alpha) {
  for (int64_t i = 0; i < m; ++i) {
    float* si = s + i * lds;
    const int64_t nv = n_valid[i];
    if (nv == 0) {
      for (int64_t r = 0; r < n; ++r) si[r] = 0.0f;
      alpha[i] = 1.0f;
      continue;
    }
    __m256 mx = _mm256_set1_ps(-__builtin_inff());
    int64_t r = 0;
    for (; r + 8 <= nv; r += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(si + r));
    float block_max = hmax(mx);
    for (; r < nv; ++r) block_max = si[r] > block_max ? si[r] : block_max;
    const float new_max = block_max > row_max[i] ? block_max : row_max[i];
    const __m256 vmax = _mm256_set1_ps(new_max);
    __m256 sum = _mm256_setzero_ps();
    for (r = 0; r + 8 <= nv; r += 8) {
      const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(si + r), vmax));
      sum = _mm256_add_ps(sum, e);
      _mm256_storeu_ps(si + r, e);
    }
    float total = hsum(sum);
    if (r < nv) {
      float e[8];
      _mm256_storeu_ps(e, exp_ps(_mm256_sub_ps(load_partial(si + r, nv - r), vmax)));
      for (int64_t j = 0; r + j < nv; ++j) {
        si[r + j] = e[j];
        total += e[j];
      }
    }
    for (r = nv; r < n; ++r) si[r] = 0.0f;  // masked: later than this query
    alpha[i] = exp_ss(row_max[i] - new_max);
    row_sum[i] = row_sum[i] * alpha[i] + total;
    row_max[i] = new_max;
  }
}

void attn_pv(const float* p, int64_t lds, const float* alpha, int64_t m, const float* vf, int64_t n,
             int64_t hdp, float* acc) {
  const int64_t n_chunks = hdp / 8;
  for (int64_t i0 = 0; i0 < m; i0 += 4) {
    const int64_t rows = m - i0 < 4 ? m - i0 : 4;
    const int64_t g_max = rows >= 3 ? 2 : (rows == 2 ? 4 : 8);
    for (int64_t c0 = 0; c0 < n_chunks; c0 += g_max) {
      const int64_t g = n_chunks - c0 < g_max ? n_chunks - c0 : g_max;
      const float* pi = p + i0 * lds;
      const float* v = vf + 8 * c0;
      float* a = acc + i0 * hdp + 8 * c0;
      switch (rows) {
        case 1: pv_tile_g<1>(g, pi, lds, alpha + i0, v, hdp, n, a); break;
        case 2: pv_tile_g<2>(g, pi, lds, alpha + i0, v, hdp, n, a); break;
        case 3: pv_tile_g<3>(g, pi, lds, alpha + i0, v, hdp, n, a); break;
        default: pv_tile_g<4>(g, pi, lds, alpha + i0, v, hdp, n, a); break;
      }
    }
  }
}

}  // namespace loom::cpu::avx2
