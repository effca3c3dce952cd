// AVX-512 kernels behind cpu/ops.h: rms_norm, silu_mul, add, softmax, the
// F16 row store of kv_store, and the per-block steps of paged attention
// (cpu/ops.cpp drives them; the scratch layouts are described there).
//
// exp: Cephes' expf scheme. x = n ln2 + r with n = round(x / ln2), |r| <=
// ln2/2 (ln2 split in two so n * ln2_hi is exact), a degree-5 minimax
// polynomial for (e^r - 1 - r) / r^2, then vscalefps multiplies by 2^n with
// correct overflow to inf and gradual underflow to 0. Max relative error
// about 2e-7 (1-2 ulp) over the whole float range; NaN in, NaN out.
//
// Attention scores: q . k for 16 cached rows at a time, each row's dot
// product in its own accumulator (16 accumulators, the K chunk of each row
// loaded once per query row from the L1-resident fp32 block). The 16
// accumulators are then summed lane-wise into one vector of 16 scores with 4
// levels of (blend, two-source permute, add): 15 shuffles instead of the 30
// of an unpack/shuffle tree. Each level pairs vectors and halves the lanes
// that hold a given row, which leaves the rows in bit-reversed order; feeding
// the accumulators in bit-reversed order puts them back in order.
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

inline float exp_ss(float x) { return _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(x))); }

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
  const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23);
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

// PV for two query rows over chunks [0, G) of 16 dims: x = acc * alpha + P . V.
template <int G>
void pv_two_rows(const float* p0, const float* p1, float a0, float a1, const float* v, int64_t hdp, int64_t n,
                 float* acc0, float* acc1) {
  __m512 x[G];
  __m512 y[G];
  const __m512 va0 = _mm512_set1_ps(a0);
  const __m512 va1 = _mm512_set1_ps(a1);
  for (int c = 0; c < G; ++c) {
    x[c] = _mm512_mul_ps(_mm512_loadu_ps(acc0 + 16 * c), va0);
    y[c] = _mm512_mul_ps(_mm512_loadu_ps(acc1 + 16 * c), va1);
  }
  for (int64_t r = 0; r < n; ++r) {
    const __m512 b0 = _mm512_set1_ps(p0[r]);
    const __m512 b1 = _mm512_set1_ps(p1[r]);
    const float* vr = v + r * hdp;
    for (int c = 0; c < G; ++c) {
      const __m512 vv = _mm512_loadu_ps(vr + 16 * c);
      x[c] = _mm512_fmadd_ps(b0, vv, x[c]);
      y[c] = _mm512_fmadd_ps(b1, vv, y[c]);
    }
  }
  for (int c = 0; c < G; ++c) {
    _mm512_storeu_ps(acc0 + 16 * c, x[c]);
    _mm512_storeu_ps(acc1 + 16 * c, y[c]);
  }
}

// PV for one query row: even and odd cache rows in separate accumulators so
// that short rows (G < 8) still have enough independent FMA chains.
template <int G>
void pv_one_row(const float* p0, float a0, const float* v, int64_t hdp, int64_t n, float* acc0) {
  __m512 x[G];
  __m512 y[G];
  const __m512 va0 = _mm512_set1_ps(a0);
  for (int c = 0; c < G; ++c) {
    x[c] = _mm512_mul_ps(_mm512_loadu_ps(acc0 + 16 * c), va0);
    y[c] = _mm512_setzero_ps();
  }
  int64_t r = 0;
  for (; r + 1 < n; r += 2) {
    const __m512 b0 = _mm512_set1_ps(p0[r]);
    const __m512 b1 = _mm512_set1_ps(p0[r + 1]);
    const float* vr = v + r * hdp;
    for (int c = 0; c < G; ++c) {
      x[c] = _mm512_fmadd_ps(b0, _mm512_loadu_ps(vr + 16 * c), x[c]);
      y[c] = _mm512_fmadd_ps(b1, _mm512_loadu_ps(vr + hdp + 16 * c), y[c]);
    }
  }
  if (r < n) {
    const __m512 b0 = _mm512_set1_ps(p0[r]);
    const float* vr = v + r * hdp;
    for (int c = 0; c < G; ++c) x[c] = _mm512_fmadd_ps(b0, _mm512_loadu_ps(vr + 16 * c), x[c]);
  }
  for (int c = 0; c < G; ++c) _mm512_storeu_ps(acc0 + 16 * c, _mm512_add_ps(x[c], y[c]));
}

template <int G>
void pv_group(const float* p, int64_t lds, const float* alpha, int64_t m, const float* v, int64_t n, int64_t hdp,
              float* acc) {
  int64_t i = 0;
  for (; i + 1 < m; i += 2) {
    pv_two_rows<G>(p + i * lds, p + (i + 1) * lds, alpha[i], alpha[i + 1], v, hdp, n, acc + i * hdp,
                   acc + (i + 1) * hdp);
  }
  if (i < m) pv_one_row<G>(p + i * lds, alpha[i], v, hdp, n, acc + i * hdp);
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
    _mm512_mask_storeu_ps(out + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i)));
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 mx = neg_inf;
  for (int64_t i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, tail_mask(n - i), x + i));
  const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  // exp values summed in double: a vocabulary-sized row would lose digits in float.
  __m512d sum = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vmax)));
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
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(out + 2 * i, k, h);
  }
}

// ---- attention -------------------------------------------------------------------

void attn_load_f16(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs, int64_t n_pad) {
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
    for (int64_t c = 0; c < n_chunks; ++c) _mm512_storeu_ps(dst + r * rs + c * cs, _mm512_setzero_ps());
  }
}

void attn_load_q8_0(const void* src, int64_t n, int64_t hd, float* dst, int64_t rs, int64_t cs, int64_t n_pad) {
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
      _mm512_storeu_ps(d + (2 * b) * cs, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), scale));
      _mm512_storeu_ps(d + (2 * b + 1) * cs, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), scale));
    }
  }
  for (int64_t r = n; r < n_pad; ++r) {
    for (int64_t c = 0; c < 2 * n_blocks; ++c) _mm512_storeu_ps(dst + r * rs + c * cs, _mm512_setzero_ps());
  }
}

void attn_scores(const float* q, int64_t m, int64_t hdp, const float* kf, int64_t rc, int64_t n, float scale,
                 float* s, int64_t lds) {
  const int64_t n_chunks = hdp / 16;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t g = 0; g < n; g += 16) {
    // Rows g..g+15 (zero past n): chunk c of row g+j at kf + c*rc*16 + (g+j)*16.
    const float* kg = kf + g * 16;
    const __mmask16 store = tail_mask(n - g);
    for (int64_t i = 0; i < m; ++i) {
      const float* qi = q + i * hdp;
      __m512 a[16];
      for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
      const float* kc = kg;
      for (int64_t c = 0; c < n_chunks; ++c, kc += rc * 16) {
        const __m512 qv = _mm512_loadu_ps(qi + 16 * c);
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kc + 16 * j), a[j]);
      }
      _mm512_mask_storeu_ps(s + i * lds + g, store, _mm512_mul_ps(reduce16(a), vscale));
    }
  }
}

void attn_softmax(float* s, int64_t lds, int64_t m, int64_t n, const int32_t* n_valid, float* row_max,
                  float* row_sum, float* alpha) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < m; ++i) {
    float* si = s + i * lds;
    const int64_t nv = n_valid[i];
    if (nv == 0) {
      for (int64_t r = 0; r < n; r += 16) _mm512_mask_storeu_ps(si + r, tail_mask(n - r), _mm512_setzero_ps());
      alpha[i] = 1.0f;
      continue;
    }
    __m512 mx = neg_inf;
    for (int64_t r = 0; r < nv; r += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, tail_mask(nv - r), si + r));
    const float block_max = _mm512_reduce_max_ps(mx);
    const float new_max = block_max > row_max[i] ? block_max : row_max[i];
    const __m512 vmax = _mm512_set1_ps(new_max);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t r = 0; r < n; r += 16) {
      const __mmask16 valid = tail_mask(nv - r);
      const __m512 e = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, si + r), vmax)));
      sum = _mm512_add_ps(sum, e);
      _mm512_mask_storeu_ps(si + r, tail_mask(n - r), e);
    }
    alpha[i] = exp_ss(row_max[i] - new_max);
    row_sum[i] = row_sum[i] * alpha[i] + _mm512_reduce_add_ps(sum);
    row_max[i] = new_max;
  }
}

void attn_pv(const float* p, int64_t lds, const float* alpha, int64_t m, const float* vf, int64_t n, int64_t hdp,
             float* acc) {
  // Chunks of 16 dims in groups of up to 8: 2 rows x 8 accumulators at most.
  for (int64_t c0 = 0; c0 < hdp / 16; c0 += 8) {
    const int64_t g = hdp / 16 - c0 < 8 ? hdp / 16 - c0 : 8;
    const float* v = vf + 16 * c0;
    float* a = acc + 16 * c0;
    switch (g) {
      case 1: pv_group<1>(p, lds, alpha, m, v, n, hdp, a); break;
      case 2: pv_group<2>(p, lds, alpha, m, v, n, hdp, a); break;
      case 3: pv_group<3>(p, lds, alpha, m, v, n, hdp, a); break;
      case 4: pv_group<4>(p, lds, alpha, m, v, n, hdp, a); break;
      case 5: pv_group<5>(p, lds, alpha, m, v, n, hdp, a); break;
      case 6: pv_group<6>(p, lds, alpha, m, v, n, hdp, a); break;
      case 7: pv_group<7>(p, lds, alpha, m, v, n, hdp, a); break;
      default: pv_group<8>(p, lds, alpha, m, v, n, hdp, a); break;
    }
  }
}

}  // namespace loom::cpu::avx512
