// AVX-512 kernels behind cpu/ops.h: rms_norm, silu_mul, add, softmax, the
// F16 row store of kv_store, and the steps of paged attention (cpu/ops.cpp
// drives them; the scratch layouts are described there).
//
// exp: Cephes' expf scheme. x = n ln2 + r with n = round(x / ln2), |r| <=
// ln2/2 (ln2 split in two so n * ln2_hi is exact), a degree-5 minimax
// polynomial for (e^r - 1 - r) / r^2, then vscalefps multiplies by 2^n with
// correct overflow to inf and gradual underflow to 0. Max relative error
// 1.4e-7 measured over [-87, 0] (softmax) and for silu over [-100, 100];
// NaN in, NaN out.
//
// Attention scores, K row-major in fp32 scratch ([rows, hdp]):
//   3+ query rows (GQA decode, prefill): rows in quads, interleaved by 4 dims
//     (attn_prepare_q); one FMA multiplies 4 dims of 4 query rows by the same
//     4 dims of one cached row (a 16-byte broadcast), so a score ends as a sum
//     of only 4 lanes: two levels of (blend, permute, add) for 16 scores.
//   1-2 query rows: 16 cached rows at a time, one accumulator per row over
//     16-dim chunks, then the 16 accumulators summed lane-wise into one
//     vector of 16 scores by 4 levels of (blend, two-source permute, add).
//     Each level pairs vectors and halves the lanes that hold a given row,
//     which leaves rows in bit-reversed order; feeding the accumulators in
//     bit-reversed order puts them back in order.
// The quad scheme does the same number of FMAs as the row scheme but a
// quarter of the lane-sum work per score, which made the row scheme's
// reductions the largest cost of a GQA decode step.
//
// P . V: register tiles of up to 4 query rows x 4 chunks of 16 dims (1-2
// rows x 8 chunks), each V chunk converted once (F16 vcvtph2ps, Q8_0
// sign-extend, convert, scale) straight from the cached row and used for all
// rows of the tile, each probability broadcast once for all chunks. Loading
// each V chunk once per 2 rows, as a first version did, left the loop bound
// by loads at half the FMA rate.
//
// Rule of this folder (cpu/CMakeLists.txt): intrinsics, raw pointers and
// functions of namespace loom::cpu::avx512 only; no std templates or header
// inline functions are instantiated here. The templates below are our own,
// in an anonymous namespace.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace loom::cpu::avx512 {
namespace {

// Lanes [0, k) of a 16-lane vector (k may be <= 0 or >= 16).
inline __mmask16 tail_mask(int64_t k) {
  if (k <= 0) return 0;
  if (k >= 16) return 0xFFFF;
  return static_cast<__mmask16>((1u << k) - 1u);
}

inline __m512 exp_ps(__m512 x) {
  // Clamp so that n stays small; max/min return their second operand when
  // either is NaN, so a NaN goes through unchanged.
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

inline float exp_ss(float x) {
  return _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(x)));
}

// Sum of 16 products x*x (computed in float, as ggml does), added in double.
inline __m512d add_squares(__m512d acc, __m512 v) {
  const __m512 sq = _mm512_mul_ps(v, v);
  acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
  return _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sq, 1)));
}

// One level of the score reduction: lanes where `mask` is set come from y,
// the others from x; `idx` brings the complementary halves together.
inline __m512 combine(__m512 x, __m512 y, __mmask16 mask, __m512i idx) {
  return _mm512_add_ps(_mm512_mask_blend_ps(mask, x, y), _mm512_permutex2var_ps(x, idx, y));
}

// out[j] = sum of the 16 lanes of a[j], j = 0..15.
inline __m512 reduce16(const __m512* a) {
  // Level 1 pairs 256-bit halves, 2 the 128-bit lanes of each half, 3 the
  // 64-bit pairs, 4 neighbouring floats (indices 16..31 pick from y).
  const __m512i i1 =
      _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i i2 = _mm512_setr_epi32(4, 5, 6, 7, 16, 17, 18, 19, 12, 13, 14, 15, 24, 25, 26, 27);
  const __m512i i3 = _mm512_setr_epi32(2, 3, 16, 17, 6, 7, 20, 21, 10, 11, 24, 25, 14, 15, 28, 29);
  const __m512i i4 = _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30);
  // Inputs in bit-reversed order (0, 8, 4, 12, 2, 10, ...) so that the
  // output lanes come out in natural order.
  const __m512 t0 = combine(a[0], a[8], 0xFF00, i1);
  const __m512 t1 = combine(a[4], a[12], 0xFF00, i1);
  const __m512 t2 = combine(a[2], a[10], 0xFF00, i1);
  const __m512 t3 = combine(a[6], a[14], 0xFF00, i1);
  const __m512 t4 = combine(a[1], a[9], 0xFF00, i1);
  const __m512 t5 = combine(a[5], a[13], 0xFF00, i1);
  const __m512 t6 = combine(a[3], a[11], 0xFF00, i1);
  const __m512 t7 = combine(a[7], a[15], 0xFF00, i1);
  const __m512 u0 = combine(t0, t1, 0xF0F0, i2);
  const __m512 u1 = combine(t2, t3, 0xF0F0, i2);
  const __m512 u2 = combine(t4, t5, 0xF0F0, i2);
  const __m512 u3 = combine(t6, t7, 0xF0F0, i2);
  const __m512 v0 = combine(u0, u1, 0xCCCC, i3);
  const __m512 v1 = combine(u2, u3, 0xCCCC, i3);
  return combine(v0, v1, 0xAAAA, i4);
}

// Query rows from which the scores use the quad layout (attn_prepare_q).
constexpr int64_t kQuadMinRows = 3;

// Per 128-bit lane k (query row 4hq + k of a quad): the sums of the 4
// partial lanes of a0..a3 (cached rows 0..3), in row order.
inline __m512 reduce_quad(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512i i3 = _mm512_setr_epi32(2, 3, 16, 17, 6, 7, 20, 21, 10, 11, 24, 25, 14, 15, 28, 29);
  const __m512i i4 = _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30);
  return combine(combine(a0, a2, 0xCCCC, i3), combine(a1, a3, 0xCCCC, i3), 0xAAAA, i4);
}

// Stores the scores of one quad for cached rows g..g+3: lane k to s[(4hq+k) * lds + g..g+3].
inline void store_quad(__m512 u, float* s, int64_t lds, int64_t hq, int64_t g) {
  float* base = s + 4 * hq * lds + g;
  _mm_storeu_ps(base, _mm512_castps512_ps128(u));
  _mm_storeu_ps(base + lds, _mm512_extractf32x4_ps(u, 1));
  _mm_storeu_ps(base + 2 * lds, _mm512_extractf32x4_ps(u, 2));
  _mm_storeu_ps(base + 3 * lds, _mm512_extractf32x4_ps(u, 3));
}

inline __m512 bcast4(const float* p) {
  return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
}

// Scores with query rows in quads (qx from attn_prepare_q) and K row-major:
// each FMA multiplies 4 dims of 4 query rows by the same 4 dims of one cached
// row (a 16-byte broadcast), so a score is the sum of only 4 lanes. Four
// cached rows at a time; two quads share each broadcast.
void scores_quads(const float* qx, int64_t m, int64_t hdp, const float* kf, int64_t n, float scale,
                  float* s, int64_t lds) {
  const int64_t n_steps = hdp / 4;
  const int64_t n_quads = (m + 3) / 4;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t g = 0; g < n; g += 4) {
    // Rows g..g+3; rows past n are zero (padded to 16).
    const float* k0 = kf + g * hdp;
    const float* k1 = k0 + hdp;
    const float* k2 = k1 + hdp;
    const float* k3 = k2 + hdp;
    int64_t hq = 0;
    for (; hq + 1 < n_quads; hq += 2) {
      const float* qa = qx + hq * n_steps * 16;
      const float* qb = qa + n_steps * 16;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
             b3 = a0;
      for (int64_t t = 0; t < n_steps; ++t) {
        const __m512 x0 = bcast4(k0 + 4 * t), x1 = bcast4(k1 + 4 * t), x2 = bcast4(k2 + 4 * t),
                     x3 = bcast4(k3 + 4 * t);
        const __m512 qva = _mm512_loadu_ps(qa + 16 * t);
        const __m512 qvb = _mm512_loadu_ps(qb + 16 * t);
        a0 = _mm512_fmadd_ps(qva, x0, a0);
        a1 = _mm512_fmadd_ps(qva, x1, a1);
        a2 = _mm512_fmadd_ps(qva, x2, a2);
        a3 = _mm512_fmadd_ps(qva, x3, a3);
        b0 = _mm512_fmadd_ps(qvb, x0, b0);
        b1 = _mm512_fmadd_ps(qvb, x1, b1);
        b2 = _mm512_fmadd_ps(qvb, x2, b2);
        b3 = _mm512_fmadd_ps(qvb, x3, b3);
      }
      store_quad(_mm512_mul_ps(reduce_quad(a0, a1, a2, a3), vscale), s, lds, hq, g);
      store_quad(_mm512_mul_ps(reduce_quad(b0, b1, b2, b3), vscale), s, lds, hq + 1, g);
    }
    if (hq < n_quads) {
      // One quad left: even and odd steps in separate accumulators (8 FMA chains).
      const float* qa = qx + hq * n_steps * 16;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0,
             c3 = a0;
      for (int64_t t = 0; t < n_steps; t += 2) {
        const __m512 qv = _mm512_loadu_ps(qa + 16 * t);
        const __m512 qw = _mm512_loadu_ps(qa + 16 * t + 16);
        a0 = _mm512_fmadd_ps(qv, bcast4(k0 + 4 * t), a0);
        a1 = _mm512_fmadd_ps(qv, bcast4(k1 + 4 * t), a1);
        a2 = _mm512_fmadd_ps(qv, bcast4(k2 + 4 * t), a2);
        a3 = _mm512_fmadd_ps(qv, bcast4(k3 + 4 * t), a3);
        c0 = _mm512_fmadd_ps(qw, bcast4(k0 + 4 * t + 4), c0);
        c1 = _mm512_fmadd_ps(qw, bcast4(k1 + 4 * t + 4), c1);
        c2 = _mm512_fmadd_ps(qw, bcast4(k2 + 4 * t + 4), c2);
        c3 = _mm512_fmadd_ps(qw, bcast4(k3 + 4 * t + 4), c3);
      }
      const __m512 u = reduce_quad(_mm512_add_ps(a0, c0), _mm512_add_ps(a1, c1),
                                   _mm512_add_ps(a2, c2), _mm512_add_ps(a3, c3));
      store_quad(_mm512_mul_ps(u, vscale), s, lds, hq, g);
    }
  }
}

// V rows as fp32 chunks of 16 dims. chunk(r, j) is chunk j of row r,
// counted from the first chunk of the group the functor was made for.
struct RowsF32 {  // converted scratch, rows `stride` floats apart
  const float* base;
  int64_t stride;
  __m512 chunk(int64_t r, int j) const { return _mm512_loadu_ps(base + r * stride + 16 * j); }
};
struct RowsF16 {  // F16 cache rows, head_dim a multiple of 16
  const char* base;
  int64_t row_bytes;
  __m512 chunk(int64_t r, int j) const {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + r * row_bytes + 32 * j)));
  }
};
struct RowsQ8 {  // Q8_0 cache rows (first chunk of the group even): y = qs * d
  const unsigned char* base;
  int64_t row_bytes;
  __m512 chunk(int64_t r, int j) const {
    const unsigned char* blk = base + r * row_bytes + 34 * (j / 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(static_cast<unsigned short>(blk[0] | (blk[1] << 8))));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 16 * (j % 2)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
  }
};

// acc[i][0..16G) = acc[i] * alpha[i] + sum_r p[i][r] * V[r] for R query rows:
// R x G accumulators; each V chunk is converted once and used for R rows,
// each probability broadcast once and used for G chunks. alpha null: 1.
template <int R, int G, typename Rows>
void pv_tile(const float* p, int64_t lds, const float* alpha, const Rows& v, int64_t n, float* acc,
             int64_t hdp) {
  __m512 x[R][G];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const __m512 a = _mm512_set1_ps(alpha ? alpha[i] : 1.0f);
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c) x[i][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + i * hdp + 16 * c), a);
  }
  for (int64_t r = 0; r < n; ++r) {
    __m512 vv[G];
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c) vv[c] = v.chunk(r, c);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 b = _mm512_set1_ps(p[i * lds + r]);
#pragma GCC unroll 8
      for (int c = 0; c < G; ++c) x[i][c] = _mm512_fmadd_ps(b, vv[c], x[i][c]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c) _mm512_storeu_ps(acc + i * hdp + 16 * c, x[i][c]);
  }
}

template <int R, typename Rows>
void pv_tile_g(int64_t g, const float* p, int64_t lds, const float* alpha, const Rows& v, int64_t n,
               float* acc, int64_t hdp) {
  switch (g) {
    case 1: return pv_tile<R, 1>(p, lds, alpha, v, n, acc, hdp);
    case 2: return pv_tile<R, 2>(p, lds, alpha, v, n, acc, hdp);
    case 3: return pv_tile<R, 3>(p, lds, alpha, v, n, acc, hdp);
    case 4: return pv_tile<R, 4>(p, lds, alpha, v, n, acc, hdp);
    default: break;
  }
  if constexpr (R <= 2) {
    switch (g) {
      case 5: return pv_tile<R, 5>(p, lds, alpha, v, n, acc, hdp);
      case 6: return pv_tile<R, 6>(p, lds, alpha, v, n, acc, hdp);
      case 7: return pv_tile<R, 7>(p, lds, alpha, v, n, acc, hdp);
      default: return pv_tile<R, 8>(p, lds, alpha, v, n, acc, hdp);
    }
  }
}

// PV over all m query rows and hdp / 16 chunks: rows in groups of 8 while 8
// are left (chunks in pairs), then of up to 4 (chunks in groups of 4, or 8
// for 1-2 rows, for enough FMA chains). Every group converts each V chunk
// once, so 8-row groups halve the conversions of a GQA group of 8 heads or a
// prefill tile (Q8_0 decode attention ~6% faster, Q8_0 prefill 17-20%,
// loom_ops_bench). make_rows(c0) gives the Rows functor of chunk group c0.
template <typename MakeRows>
void pv_all(const float* p, int64_t lds, const float* alpha, int64_t m, int64_t n, int64_t hdp,
            float* acc, MakeRows make_rows) {
  const int64_t n_chunks = hdp / 16;
  for (int64_t i0 = 0; i0 < m;) {
    const int64_t rows = m - i0 >= 8 ? 8 : m - i0 < 4 ? m - i0 : 4;
    const int64_t g_max = rows == 8 ? 2 : rows <= 2 ? 8 : 4;
    const float* pi = p + i0 * lds;
    const float* ai = alpha ? alpha + i0 : nullptr;
    for (int64_t c0 = 0; c0 < n_chunks; c0 += g_max) {
      const int64_t g = n_chunks - c0 < g_max ? n_chunks - c0 : g_max;
      const auto v = make_rows(c0);
      float* a = acc + i0 * hdp + 16 * c0;
      switch (rows) {
        case 1: pv_tile_g<1>(g, pi, lds, ai, v, n, a, hdp); break;
        case 2: pv_tile_g<2>(g, pi, lds, ai, v, n, a, hdp); break;
        case 3: pv_tile_g<3>(g, pi, lds, ai, v, n, a, hdp); break;
        case 4: pv_tile_g<4>(g, pi, lds, ai, v, n, a, hdp); break;
        default:
          if (g == 2)
            pv_tile<8, 2>(pi, lds, ai, v, n, a, hdp);
          else
            pv_tile<8, 1>(pi, lds, ai, v, n, a, hdp);
          break;
      }
    }
    i0 += rows;
  }
}

}  // namespace

// ---- element-wise ------------------------------------------------------------

void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n) {
  __m512d acc0 = _mm512_setzero_pd();
  __m512d acc1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = add_squares(acc0, _mm512_loadu_ps(x + i));
    acc1 = add_squares(acc1, _mm512_loadu_ps(x + i + 16));
  }
  for (; i < n; i += 16) acc0 = add_squares(acc0, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  const double sum = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(mean + eps)));
  const __m512 vs = _mm512_set1_ps(scale);
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vs);
    _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + i)));
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(k, up + i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(silu, u));
  }
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(
        out + i, k,
        _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i)));
  }
}

// tanh(y), y = x / cap: for |y| < 0.25 the odd Taylor polynomial to y^9
// (the next term is below 1e-8 relative there); else (1 - e) / (1 + e) with
// e = exp(-2|y|) <= 0.61, so no digits cancel; the sign put back.
void softcap(float* x, int64_t n, float cap) {
  const __m512 vcap = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  // Masked loads and stores for the tail only (masked stores are slow on some CPUs).
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const bool full = k == 0xFFFF;
    const __m512 xv = full ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(k, x + i);
    const __m512 y = _mm512_mul_ps(xv, inv);
    const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(y), abs_mask));
    const __m512 e = exp_ps(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
    const __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    const __m512 a2 = _mm512_mul_ps(a, a);
    __m512 p = _mm512_set1_ps(62.0f / 2835.0f);
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(-17.0f / 315.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(-1.0f / 3.0f));
    const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, a2), a, a);
    const __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_LT_OQ);
    const __m512 t = _mm512_mask_mov_ps(big, is_small, small);
    // sign(y) * t: y's sign bit onto t (>= 0).
    const __m512i sign = _mm512_andnot_si512(abs_mask, _mm512_castps_si512(y));
    const __m512 r = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
    if (full) {
      _mm512_storeu_ps(x + i, _mm512_mul_ps(r, vcap));
    } else {
      _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(r, vcap));
    }
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 mx = neg_inf;
  for (int64_t i = 0; i < n; i += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, tail_mask(n - i), x + i));
  const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  // exp values summed in double: a vocabulary-sized row would lose digits in float.
  __m512d sum = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e =
        _mm512_maskz_mov_ps(k, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vmax)));
    sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    _mm512_mask_storeu_ps(x + i, k, e);
  }
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / _mm512_reduce_add_pd(sum)));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}

void f32_to_f16_row(const float* x, void* y, int64_t n) {
  auto* out = static_cast<char*>(y);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, x + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(out + 2 * i, k, h);
  }
}

// ---- spill precisions back to F16 ---------------------------------------------------

// Per Q8_0 block: 32 int8 quants sign-extended, converted, times the block's
// scale (one rounding, as ref's q * d), rounded to F16 to nearest even.
void q8_0_to_f16(const void* src, void* dst, int64_t n_blocks) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<char*>(dst);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t b = 0; b < n_blocks; ++b, in += 34, out += 64) {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(static_cast<unsigned short>(in[0] | (in[1] << 8))));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 18));
    const __m512 f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
    const __m512 f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtps_ph(f0, kRound));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), _mm512_cvtps_ph(f1, kRound));
  }
}

// The F16 bits of E4M3 codes 0..127 (the sign is bit 7 of a code and bit 15
// of an F16): every E4M3 value is exact in F16. Exponent e > 0: (e + 8) << 10
// | mantissa << 7; e = 0: mantissa x 2^-9, normalized; 0x7F: NaN.
struct Fp8Table {
  unsigned short v[128];
};
constexpr Fp8Table make_fp8_table() {
  Fp8Table t{};
  for (int c = 0; c < 128; ++c) {
    const int e = c >> 3, m = c & 7;
    if (c == 0x7F) {
      t.v[c] = 0x7E00;
    } else if (e > 0) {
      t.v[c] = static_cast<unsigned short>(((e + 8) << 10) | (m << 7));
    } else if (m > 0) {  // m x 2^-9 = 1.f x 2^(p - 9), p the top bit of m
      const int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;
      t.v[c] = static_cast<unsigned short>(((p - 9 + 15) << 10) | (((m << (10 - p)) & 0x3FF)));
    }
  }
  return t;
}
constexpr Fp8Table kFp8 = make_fp8_table();

// 32 codes at a time: their F16 bits by two two-register word permutes
// (codes 0..63 and 64..127), the sign put back, then times the scale in float
// (ref multiplies the decoded value by the scale in float) and back to F16.
void fp8_e4m3_to_f16(const unsigned char* src, float scale, void* dst, int64_t n) {
  auto* out = static_cast<char*>(dst);
  const __m512i t0 = _mm512_loadu_si512(kFp8.v), t1 = _mm512_loadu_si512(kFp8.v + 32);
  const __m512i t2 = _mm512_loadu_si512(kFp8.v + 64), t3 = _mm512_loadu_si512(kFp8.v + 96);
  const __m512 vscale = _mm512_set1_ps(scale);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  // Full pieces with plain loads and stores (masked stores are slow on some
  // CPUs), the tail masked.
  auto piece = [&](const __m512i c, __m256i* h0, __m256i* h1) {
    const __m512i lo = _mm512_permutex2var_epi16(t0, c, t1);  // index bits 0..5
    const __m512i hi = _mm512_permutex2var_epi16(t2, c, t3);
    const __mmask32 upper = _mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40));
    const __m512i mag = _mm512_mask_mov_epi16(lo, upper, hi);
    const __m512i h = _mm512_or_si512(mag, _mm512_slli_epi16(_mm512_srli_epi16(c, 7), 15));
    const __m512 f0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), vscale);
    const __m512 f1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), vscale);
    *h0 = _mm512_cvtps_ph(f0, kRound);
    *h1 = _mm512_cvtps_ph(f1, kRound);
  };
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i h0, h1;
    piece(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))), &h0,
          &h1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), h0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + 32), h1);
  }
  if (i < n) {
    const __mmask32 k = (1u << (n - i)) - 1u;
    __m256i h0, h1;
    piece(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(k, src + i)), &h0, &h1);
    _mm256_mask_storeu_epi16(out + 2 * i, static_cast<__mmask16>(k), h0);
    _mm256_mask_storeu_epi16(out + 2 * i + 32, static_cast<__mmask16>(k >> 16), h1);
  }
}

// ---- attention -------------------------------------------------------------------

void attn_load_f16(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs,
                   int64_t n_pad) {
  const auto* bytes = static_cast<const char*>(src);
  const int64_t n_chunks = (hd + 15) / 16;
  const __mmask16 last = tail_mask(hd - 16 * (n_chunks - 1));
  for (int64_t r = 0; r < n; ++r) {
    const char* row = bytes + 2 * r * hd;
    float* d = dst + r * rs;
    for (int64_t c = 0; c + 1 < n_chunks; ++c) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * c));
      _mm512_storeu_ps(d + c * cs, _mm512_cvtph_ps(h));
    }
    const __m256i h = _mm256_maskz_loadu_epi16(last, row + 32 * (n_chunks - 1));
    _mm512_storeu_ps(d + (n_chunks - 1) * cs, _mm512_cvtph_ps(h));
  }
  for (int64_t r = n; r < n_pad; ++r) {
    for (int64_t c = 0; c < n_chunks; ++c)
      _mm512_storeu_ps(dst + r * rs + c * cs, _mm512_setzero_ps());
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
      const __m512 scale = _mm512_set1_ps(_cvtsh_ss(bits));
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
      _mm512_storeu_ps(d + (2 * b) * cs,
                       _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), scale));
      _mm512_storeu_ps(d + (2 * b + 1) * cs,
                       _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), scale));
    }
  }
  for (int64_t r = n; r < n_pad; ++r) {
    for (int64_t c = 0; c < 2 * n_blocks; ++c)
      _mm512_storeu_ps(dst + r * rs + c * cs, _mm512_setzero_ps());
  }
}

void attn_prepare_q(const float* q, int64_t m, int64_t hdp, float* qx) {
  if (m < kQuadMinRows) {
    for (int64_t i = 0; i < m * hdp; i += 16) _mm512_storeu_ps(qx + i, _mm512_loadu_ps(q + i));
    return;
  }
  // Quad layout: quad hq, step s (dims 4s..4s+3) -> 16 floats, 4 per row of
  // the quad: qx[(hq * hdp/4 + s) * 16 + 4k + e] = q[4hq + k][4s + e]
  // (rows past m are zero).
  const int64_t n_steps = hdp / 4;
  const __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  for (int64_t hq = 0; hq * 4 < m; ++hq) {
    const float* rows[4];
    for (int k = 0; k < 4; ++k) rows[k] = 4 * hq + k < m ? q + (4 * hq + k) * hdp : nullptr;
    float* out = qx + hq * n_steps * 16;
    for (int64_t d = 0; d < hdp; d += 16) {
      // 16 dims of the 4 rows -> 4 steps of 16 floats.
      __m512 r[4];
      for (int k = 0; k < 4; ++k)
        r[k] = rows[k] ? _mm512_loadu_ps(rows[k] + d) : _mm512_setzero_ps();
      const __m512 r01lo =
          _mm512_permutex2var_ps(r[0], idx, r[1]);  // steps 0,1 of rows 0,1 (interleaved by 4)
      const __m512 r23lo = _mm512_permutex2var_ps(r[2], idx, r[3]);
      const __m512i hi = _mm512_add_epi32(idx, _mm512_set1_epi32(8));
      const __m512 r01hi = _mm512_permutex2var_ps(r[0], hi, r[1]);  // steps 2,3 of rows 0,1
      const __m512 r23hi = _mm512_permutex2var_ps(r[2], hi, r[3]);
      // r01lo = [r0 s0, r1 s0, r0 s1, r1 s1]; combine with rows 2,3 per step.
      float* o = out + (d / 4) * 16;
      _mm512_storeu_ps(o + 0, _mm512_shuffle_f32x4(r01lo, r23lo, 0x44));   // step 0: r0 r1 r2 r3
      _mm512_storeu_ps(o + 16, _mm512_shuffle_f32x4(r01lo, r23lo, 0xEE));  // step 1
      _mm512_storeu_ps(o + 32, _mm512_shuffle_f32x4(r01hi, r23hi, 0x44));  // step 2
      _mm512_storeu_ps(o + 48, _mm512_shuffle_f32x4(r01hi, r23hi, 0xEE));  // step 3
    }
  }
}

void attn_scores(const float* q, int64_t m, int64_t hdp, const float* kf, int64_t rc, int64_t n,
                 float scale, float* s, int64_t lds) {
  (void)rc;  // K is row-major here: row r at kf + r * hdp
  if (m >= kQuadMinRows) {
    scores_quads(q, m, hdp, kf, n, scale, s, lds);
    return;
  }
  const int64_t n_chunks = hdp / 16;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t g = 0; g < n; g += 16) {
    // Rows g..g+15 (zero past n).
    const float* kg = kf + g * hdp;
    const __mmask16 store = tail_mask(n - g);
    for (int64_t i = 0; i < m; ++i) {
      const float* qi = q + i * hdp;
      __m512 a[16];
      for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
      for (int64_t c = 0; c < n_chunks; ++c) {
        const __m512 qv = _mm512_loadu_ps(qi + 16 * c);
        const float* kc = kg + 16 * c;
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j)
          a[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kc + j * hdp), a[j]);
      }
      _mm512_mask_storeu_ps(s + i * lds + g, store, _mm512_mul_ps(reduce16(a), vscale));
    }
  }
}

void attn_softmax(float* s, int64_t lds, int64_t m, int64_t n, const int32_t* n_valid,
                  float* row_max, float* row_sum, float* alpha) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < m; ++i) {
    float* si = s + i * lds;
    const int64_t nv = n_valid[i];
    if (nv == 0) {
      for (int64_t r = 0; r < n; r += 16)
        _mm512_mask_storeu_ps(si + r, tail_mask(n - r), _mm512_setzero_ps());
      alpha[i] = 1.0f;
      continue;
    }
    __m512 mx = neg_inf;
    for (int64_t r = 0; r < nv; r += 16)
      mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, tail_mask(nv - r), si + r));
    const float block_max = _mm512_reduce_max_ps(mx);
    const float new_max = block_max > row_max[i] ? block_max : row_max[i];
    const __m512 vmax = _mm512_set1_ps(new_max);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t r = 0; r < n; r += 16) {
      const __mmask16 valid = tail_mask(nv - r);
      const __m512 e = _mm512_maskz_mov_ps(
          valid, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, si + r), vmax)));
      sum = _mm512_add_ps(sum, e);
      _mm512_mask_storeu_ps(si + r, tail_mask(n - r), e);
    }
    alpha[i] = exp_ss(row_max[i] - new_max);
    row_sum[i] = row_sum[i] * alpha[i] + _mm512_reduce_add_ps(sum);
    row_max[i] = new_max;
  }
}

void attn_pv(const float* p, int64_t lds, const float* alpha, int64_t m, const float* vf, int64_t n,
             int64_t hdp, float* acc) {
  pv_all(p, lds, alpha, m, n, hdp, acc, [vf, hdp](int64_t c0) {
    return RowsF32{vf + 16 * c0, hdp};
  });
}

void attn_pv_f16(const float* p, int64_t lds, const float* alpha, int64_t m, const void* v,
                 int64_t n, int64_t hd, float* acc) {
  const auto* base = static_cast<const char*>(v);
  const int64_t row_bytes = 2 * hd;
  pv_all(p, lds, alpha, m, n, hd, acc, [base, row_bytes](int64_t c0) {
    return RowsF16{base + 32 * c0, row_bytes};
  });
}

void attn_pv_q8_0(const float* p, int64_t lds, const float* alpha, int64_t m, const void* v,
                  int64_t n, int64_t hd, float* acc) {
  // Chunk groups start at even chunks (4 or 8 per group), so at block boundaries.
  const auto* base = static_cast<const unsigned char*>(v);
  const int64_t row_bytes = 34 * (hd / 32);
  pv_all(p, lds, alpha, m, n, hd, acc, [base, row_bytes](int64_t c0) {
    return RowsQ8{base + 34 * (c0 / 2), row_bytes};
  });
}

}  // namespace loom::cpu::avx512
