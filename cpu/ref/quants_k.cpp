// Reference (de)quantization of the K-quants (256-element super-blocks):
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the activation format Q8_K.
//
// The quantizers follow ggml's reference (non-imatrix) algorithms: each
// sub-block gets a scale (and min) from a small least-squares search, the
// sub-block scales are quantized against a super-block fp16 scale, and the
// quants are then recomputed against the scales actually stored. Matching
// ggml byte for byte needs the same float operations in the same order, so
// the sums below are written exactly in that order on purpose.
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

#include "cpu/ref/fp16.h"
#include "cpu/ref/quants.h"

// Matching ggml needs every a * b + c rounded twice, as written. Forbid
// fusing them into FMAs, which a build with -march=native would otherwise do
// (ggml's own reference quantizers are built without FMA).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace loom::ref {
namespace {

// Sub-blocks whose largest |x| is below this are treated as all zero.
constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves
// no fraction bits in the sum, so the FPU's own rounding does the work and
// the integer sits in the low mantissa bits, offset by 2^22. Larger inputs
// give garbage, but the same garbage as ggml (which uses this trick too).
int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(shifted) & 0x007FFFFFu) - 0x00400000;
}

int clamp_int(int v, int lo, int hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// The element of largest magnitude (first one on ties), with its sign; the
// magnitude goes to *amax.
float signed_absmax(const float* x, int n, float* amax) {
  float best = 0.0f;
  float value = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > best) {
      best = a;
      value = x[i];
    }
  }
  *amax = best;
  return value;
}

// Symmetric fit for Q6_K: quants l in [-nmax, nmax - 1] with y ~ scale * l,
// error weighted by x^2. Starts from the grid that maps the signed extreme
// to -nmax, then tries 18 slightly stretched grids (nmax +- 0.1k) and keeps
// the one whose least-squares scale explains the most weighted energy
// (largest sumlx^2 / suml2). Writes l + nmax to L[0..n), returns the scale.
float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0.0f;
  const float extreme = signed_absmax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float nmax_f = static_cast<float>(nmax);
  float iscale = -nmax_f / extreme;
  float sumlx = 0.0f;  // sum w x l
  float suml2 = 0.0f;  // sum w l^2
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(nmax_f + 0.1f * static_cast<float>(step)) / extreme;
    float trial_lx = 0.0f;
    float trial_l2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float fl = static_cast<float>(clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      const float w = x[i] * x[i];
      trial_lx += w * x[i] * fl;
      trial_l2 += w * fl * fl;
    }
    // Compare sumlx^2/suml2 without dividing.
    if (trial_l2 > 0.0f && trial_lx * trial_lx > best * trial_l2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<int8_t>(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      }
      scale = trial_lx / trial_l2;
      best = scale * trial_lx;
    }
  }
  return scale;
}

// Symmetric fit for Q3_K (nmax = 4, quants -4..3), weighted by x^2. After
// the first guess it walks the quants one at a time, moving each to the
// value that is optimal given all the others, and keeps a move only if the
// weighted fit improves; up to 5 passes. Writes l + nmax, returns the scale.
float fit_q3_scale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0.0f;
  const float extreme = signed_absmax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = -static_cast<float>(nmax) / extreme;
  float sumlx = 0.0f;
  float suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float old_l = static_cast<float>(L[i]);
      // Sums without element i; its best quant is then x * sl2 / slx.
      float slx = sumlx - w * x[i] * old_l;
      if (slx > 0.0f) {
        float sl2 = suml2 - w * old_l * old_l;
        const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          const float fl = static_cast<float>(new_l);
          slx += w * x[i] * fl;
          sl2 += w * fl * fl;
          if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric fit for Q2_K/Q4_K/Q5_K: y ~ scale * l - min_out with l in
// [0, nmax] and min_out >= 0 (the offset never exceeds 0). Starts from the
// min/max grid, then for nstep+1 stretched grids (nmax + rmin + k*rdelta
// levels across the current range) solves the weighted least squares for
// scale and offset and keeps whichever gives the smallest weighted error
// (|e| with use_mad, e^2 otherwise). n <= 32. Writes l to L[0..n).
float fit_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                    float* min_out, float rmin, float rdelta, int nstep, bool use_mad) {
  float lo = x[0];
  float hi = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (lo > 0.0f) lo = 0.0f;
  if (hi == lo) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *min_out = -lo;
    return 0.0f;
  }
  const float nmax_f = static_cast<float>(nmax);
  float iscale = nmax_f / (hi - lo);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax));
    float diff = scale * static_cast<float>(L[i]) + lo - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *min_out = -lo;
    return scale;
  }
  uint8_t trial[32];
  assert(n <= 32);
  for (int step = 0; step <= nstep; ++step) {
    // `lo` may have moved in an earlier step; the grid follows it.
    iscale = (rmin + rdelta * static_cast<float>(step) + nmax_f) / (hi - lo);
    float sum_l = 0.0f;
    float sum_l2 = 0.0f;
    float sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    // Normal equations of min over (s, m) of sum w (s l + m - x)^2.
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0.0f) {
        // A positive offset is not representable: refit the scale alone.
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0.0f;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(trial[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        error += weights[i] * diff;
      }
      if (error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = trial[i];
        best_error = error;
        scale = this_scale;
        lo = this_min;
      }
    }
  }
  *min_out = -lo;
  return scale;
}

// Packs 2-bit quants L[0..256) as Q2_K/Q3_K store them: in each half h,
// byte 32h + l holds elements 128h + l + 32k at bits 2k..2k+1.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = L + 128 * h;
    for (int l = 0; l < 32; ++l) {
      qs[32 * h + l] =
          static_cast<uint8_t>(q[l] | (q[l + 32] << 2) | (q[l + 64] << 4) | (q[l + 96] << 6));
    }
  }
}

// The 2-bit field of element e (0..255) from Q2_K/Q3_K's qs.
int unpack_2bit(const uint8_t* qs, int e) {
  const int h = e / 128;
  const int k = (e % 128) / 32;
  return (qs[32 * h + e % 32] >> (2 * k)) & 3;
}

// Quantizes a sub-block scale (or min) to 6 bits: the uint8_t wrap and the
// clamp to 63 reproduce ggml (a negative scale wraps and clamps to 63).
uint8_t six_bits(float scaled) {
  const uint8_t v = static_cast<uint8_t>(nearest_int(scaled));
  return v < 63 ? v : 63;
}

// Packs 8 six-bit scales and mins into Q4_K/Q5_K's 12 bytes (layout in
// blocks.h); the inverse of scale_min_k4.
void pack_scales_k4(const uint8_t* sc, const uint8_t* mn, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = sc[j];
    out[j + 4] = mn[j];
  }
  for (int j = 4; j < 8; ++j) {
    out[j + 4] = static_cast<uint8_t>((sc[j] & 0x0F) | ((mn[j] & 0x0F) << 4));
    out[j - 4] = static_cast<uint8_t>(out[j - 4] | ((sc[j] >> 4) << 6));
    out[j] = static_cast<uint8_t>(out[j] | ((mn[j] >> 4) << 6));
  }
}

// The first pass of Q4_K/Q5_K: fits each 32-element sub-block, quantizes
// scales and mins to 6 bits against d and dmin, then recomputes the quants
// L (0..nmax) against the stored values.
template <typename Block>
void quantize_scales_mins_k(const float* x, Block* y, int nmax, float rmin, int nstep, uint8_t* L) {
  float scales[8];
  float mins[8];
  float weights[32];
  float max_scale = 0.0f;
  float max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    // Weight: the sub-block's rms plus |x|, so large values matter more
    // without the small ones being ignored.
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] =
        fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  uint8_t sc[8];
  uint8_t mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = six_bits(inv_scale * scales[j]);
    mn[j] = six_bits(inv_min * mins[j]);
  }
  pack_scales_k4(sc, mn, y->scales);
  y->d = fp32_to_fp16(max_scale / 63.0f);
  y->dmin = fp32_to_fp16(max_min / 63.0f);

  for (int j = 0; j < 8; ++j) {
    uint8_t s = 0;
    uint8_t m = 0;
    scale_min_k4(j, y->scales, &s, &m);
    const float d = fp16_to_fp32(y->d) * static_cast<float>(s);
    if (d == 0.0f) continue;  // keep the fit's quants
    const float dm = fp16_to_fp32(y->dmin) * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] =
          static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
    }
  }
}

// Signed 6-bit scale s (0..15) of a Q3_K block, minus its offset 32.
int q3_scale(const uint8_t* scales, int s) {
  const int low = s < 8 ? (scales[s] & 0x0F) : (scales[s - 8] >> 4);
  const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace

void scale_min_k4(int j, const uint8_t* scales, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// ---- Q2_K ---------------------------------------------------------------------

void dequantize_row_q2_k(const BlockQ2_K* x, float* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = fp16_to_fp32(x[b].d);
    const float dmin = fp16_to_fp32(x[b].dmin);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(x[b].scales[s] & 0x0F);
      const float ml = dmin * static_cast<float>(x[b].scales[s] >> 4);
      for (int e = 16 * s; e < 16 * s + 16; ++e) {
        y[e] = dl * static_cast<float>(unpack_2bit(x[b].qs, e)) - ml;
      }
    }
  }
}

void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n) {
  assert(n % kQK_K == 0);
  constexpr float kLevels = 15.0f;  // 4-bit scales and mins
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    uint8_t L[kQK_K];
    float scales[16];
    float mins[16];
    float weights[16];
    float max_scale = 0.0f;
    float max_min = 0.0f;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] =
          fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    BlockQ2_K& out = y[b];
    if (max_scale > 0.0f) {
      const float iscale = kLevels / max_scale;
      for (int j = 0; j < 16; ++j)
        out.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      out.d = fp32_to_fp16(max_scale / kLevels);
    } else {
      for (int j = 0; j < 16; ++j) out.scales[j] = 0;
      out.d = fp32_to_fp16(0.0f);
    }
    if (max_min > 0.0f) {
      const float iscale = kLevels / max_min;
      for (int j = 0; j < 16; ++j) {
        const auto m = static_cast<unsigned>(nearest_int(iscale * mins[j]));
        out.scales[j] = static_cast<uint8_t>(out.scales[j] | (m << 4));
      }
      out.dmin = fp32_to_fp16(max_min / kLevels);
    } else {
      out.dmin = fp32_to_fp16(0.0f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(out.d) * static_cast<float>(out.scales[j] & 0x0F);
      if (d == 0.0f) continue;
      const float dm = fp16_to_fp32(out.dmin) * static_cast<float>(out.scales[j] >> 4);
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] =
            static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
      }
    }
    pack_2bit(L, out.qs);
  }
}

// ---- Q3_K ---------------------------------------------------------------------

void dequantize_row_q3_k(const BlockQ3_K* x, float* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d_all = fp16_to_fp32(x[b].d);
    for (int s = 0; s < 16; ++s) {
      const float dl = d_all * static_cast<float>(q3_scale(x[b].scales, s));
      for (int e = 16 * s; e < 16 * s + 16; ++e) {
        const bool high = ((x[b].hmask[e % 32] >> (e / 32)) & 1) != 0;
        y[e] = dl * static_cast<float>(unpack_2bit(x[b].qs, e) - (high ? 0 : 4));
      }
    }
  }
}

void quantize_row_q3_k(const float* x, BlockQ3_K* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0.0f;  // signed: the scale of largest magnitude
    float amax = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_q3_scale(16, 4, x + 16 * j, L + 16 * j);
      const float a = std::fabs(scales[j]);
      if (a > amax) {
        amax = a;
        max_scale = scales[j];
      }
    }
    BlockQ3_K& out = y[b];
    std::memset(out.scales, 0, sizeof(out.scales));
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        // Stored as 6 bits, offset 32; the int8_t step mirrors ggml's wrap.
        const int l = clamp_int(static_cast<int8_t>(nearest_int(iscale * scales[j])), -32, 31) + 32;
        if (j < 8) {
          out.scales[j] = static_cast<uint8_t>(l & 0x0F);
        } else {
          out.scales[j - 8] = static_cast<uint8_t>(out.scales[j - 8] | ((l & 0x0F) << 4));
        }
        out.scales[8 + j % 4] =
            static_cast<uint8_t>(out.scales[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
      }
      out.d = fp32_to_fp16(1.0f / iscale);
    } else {
      out.d = fp32_to_fp16(0.0f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(out.d) * static_cast<float>(q3_scale(out.scales, j));
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
      }
    }
    // Bit 2 of each quant goes to hmask; the low 2 bits stay for qs.
    uint8_t low[kQK_K];
    std::memset(out.hmask, 0, sizeof(out.hmask));
    for (int e = 0; e < kQK_K; ++e) {
      int q = L[e];
      if (q > 3) {
        out.hmask[e % 32] = static_cast<uint8_t>(out.hmask[e % 32] | (1u << (e / 32)));
        q -= 4;
      }
      low[e] = static_cast<uint8_t>(q);
    }
    pack_2bit(low, out.qs);
  }
}

// ---- Q4_K ---------------------------------------------------------------------

void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = fp16_to_fp32(x[b].d);
    const float dmin = fp16_to_fp32(x[b].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc = 0;
      uint8_t m = 0;
      scale_min_k4(s, x[b].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      // Sub-block s: nibble (s % 2) of bytes 32 * (s / 2) .. +31.
      const uint8_t* q = x[b].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l)
        y[32 * s + l] = dl * static_cast<float>((q[l] >> shift) & 0x0F) - ml;
    }
  }
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    uint8_t L[kQK_K];
    quantize_scales_mins_k(x, &y[b], 15, -1.0f, 20, L);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        y[b].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
      }
    }
  }
}

// ---- Q5_K ---------------------------------------------------------------------

void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = fp16_to_fp32(x[b].d);
    const float dmin = fp16_to_fp32(x[b].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc = 0;
      uint8_t m = 0;
      scale_min_k4(s, x[b].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc);
      const float ml = dmin * static_cast<float>(m);
      const uint8_t* q = x[b].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const int q5 = ((q[l] >> shift) & 0x0F) + (((x[b].qh[l] >> s) & 1) != 0 ? 16 : 0);
        y[32 * s + l] = dl * static_cast<float>(q5) - ml;
      }
    }
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    uint8_t L[kQK_K];
    quantize_scales_mins_k(x, &y[b], 31, -0.5f, 15, L);
    // Sub-block s (elements 32s..32s+31) keeps its fifth bits in bit s of qh.
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        int lo = L[64 * c + l];
        int hi = L[64 * c + 32 + l];
        if (lo > 15) {
          lo -= 16;
          y[b].qh[l] = static_cast<uint8_t>(y[b].qh[l] | (1u << (2 * c)));
        }
        if (hi > 15) {
          hi -= 16;
          y[b].qh[l] = static_cast<uint8_t>(y[b].qh[l] | (2u << (2 * c)));
        }
        y[b].qs[32 * c + l] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

// ---- Q6_K ---------------------------------------------------------------------

void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = fp16_to_fp32(x[b].d);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128;         // half
      const int k = (e % 128) / 32;  // quarter within the half
      const int l = e % 32;
      const uint8_t lo_byte = x[b].ql[64 * h + 32 * (k % 2) + l];
      const int low = (lo_byte >> (4 * (k / 2))) & 0x0F;
      const int high = (x[b].qh[32 * h + l] >> (2 * k)) & 3;
      const int q = (low | (high << 4)) - 32;
      // (d * scale) first, then the quant: the order ggml multiplies in.
      y[e] = d * static_cast<float>(x[b].scales[e / 16]) * static_cast<float>(q);
    }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0.0f;  // signed: the scale of largest magnitude
    float max_abs_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_scale(16, 32, x + 16 * j, L + 16 * j);
      const float a = std::fabs(scales[j]);
      if (a > max_abs_scale) {
        max_abs_scale = a;
        max_scale = scales[j];
      }
    }
    BlockQ6_K& out = y[b];
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&out, 0, sizeof(out));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    out.d = fp32_to_fp16(1.0f / iscale);
    for (int j = 0; j < 16; ++j) {
      const int s = nearest_int(iscale * scales[j]);
      out.scales[j] = static_cast<int8_t>(s < 127 ? s : 127);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(out.d) * static_cast<float>(out.scales[j]);
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] =
            static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* q = L + 128 * h;
      uint8_t* ql = out.ql + 64 * h;
      uint8_t* qh = out.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((q[l] & 0x0F) | ((q[l + 64] & 0x0F) << 4));
        ql[l + 32] = static_cast<uint8_t>((q[l + 32] & 0x0F) | ((q[l + 96] & 0x0F) << 4));
        qh[l] = static_cast<uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) |
                                     ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
      }
    }
  }
}

// ---- Q8_K ---------------------------------------------------------------------

void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    for (int e = 0; e < kQK_K; ++e) y[e] = x[b].d * static_cast<float>(x[b].qs[e]);
  }
}

void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  assert(n % kQK_K == 0);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ8_K& out = y[b];
    float amax = 0.0f;
    const float extreme = signed_absmax(x, kQK_K, &amax);
    if (amax == 0.0f) {
      // ggml leaves bsums untouched here; zero is what they sum to.
      std::memset(&out, 0, sizeof(out));
      continue;
    }
    // The extreme maps to -127 (not -128) so that qs stays symmetric.
    const float iscale = -127.0f / extreme;
    for (int e = 0; e < kQK_K; ++e) {
      const int v = nearest_int(iscale * x[e]);
      out.qs[e] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sum += out.qs[e];
      out.bsums[s] = static_cast<int16_t>(sum);
    }
    out.d = 1.0f / iscale;
  }
}

}  // namespace loom::ref
