// Reference (de)quantization of the plain float formats and the legacy
// 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
//
// The quantizers reproduce ggml's reference ones byte for byte; where that
// needs a particular float expression or a particular float->int conversion,
// the comment says so.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

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

// Float -> int truncating toward zero, as a C cast does for values in range.
// Out-of-range values and NaN give INT32_MIN (what x86's cvttss2si returns
// and what ggml's casts therefore produce) instead of undefined behaviour.
int truncate_to_int(float v) {
  if (!(v > -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
  return static_cast<int>(v);
}

// Quantizes v (already scaled to quant units, offset included) by
// truncation, as ggml's `(int8_t)(v)` / `(uint8_t)(v)` do: the low byte of
// the truncated integer.
int truncate_to_byte(float v) {
  return truncate_to_int(v) & 0xFF;
}

// Largest |x| of a block, returned with its sign (the first such element on
// ties). The symmetric formats map this element to the most negative quant.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float* lo, float* hi) {
  float mn = std::numeric_limits<float>::max();
  float mx = -std::numeric_limits<float>::max();
  for (int j = 0; j < n; ++j) {
    if (x[j] < mn) mn = x[j];
    if (x[j] > mx) mx = x[j];
  }
  *lo = mn;
  *hi = mx;
}

}  // namespace

// ---- plain floats -----------------------------------------------------------

void dequantize_row_f32(const float* x, float* y, int64_t n) {
  if (n > 0) std::memmove(y, x, static_cast<size_t>(n) * sizeof(float));
}

void quantize_row_f32(const float* x, float* y, int64_t n) {
  dequantize_row_f32(x, y, n);
}

void dequantize_row_f16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void quantize_row_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

void quantize_row_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

// ---- Q4_0: y = d * (q - 8) --------------------------------------------------

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (x[b].qs[j] & 0x0F) - 8;
      const int hi = (x[b].qs[j] >> 4) - 8;
      y[j] = static_cast<float>(lo) * d;
      y[j + kQK / 2] = static_cast<float>(hi) * d;
    }
  }
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    // The signed extreme maps to q = 0 (value -8 d); the other side reaches
    // at most +7 d, the 16th level is spent on that asymmetry.
    const float d = signed_absmax(x, kQK) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // +8.5 then truncation: round half up around the offset 8.
      const int lo =
          std::min(15, static_cast<int>(static_cast<int8_t>(truncate_to_byte(x[j] * id + 8.5f))));
      const int hi = std::min(
          15, static_cast<int>(static_cast<int8_t>(truncate_to_byte(x[j + kQK / 2] * id + 8.5f))));
      y[b].qs[j] = static_cast<uint8_t>((lo & 0xFF) | ((hi & 0xFF) << 4));
    }
  }
}

// ---- Q4_1: y = d * q + m ----------------------------------------------------

void dequantize_row_q4_1(const BlockQ4_1* x, float* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    const float m = fp16_to_fp32(x[b].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(x[b].qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(x[b].qs[j] >> 4) * d + m;
    }
  }
}

void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float lo = 0.0f;
    float hi = 0.0f;
    min_max(x, kQK, &lo, &hi);
    const float d = (hi - lo) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(lo);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(
          15, static_cast<int>(static_cast<int8_t>(truncate_to_byte((x[j] - lo) * id + 0.5f))));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(
                                      truncate_to_byte((x[j + kQK / 2] - lo) * id + 0.5f))));
      y[b].qs[j] = static_cast<uint8_t>((q0 & 0xFF) | ((q1 & 0xFF) << 4));
    }
  }
}

// ---- Q5_0: y = d * (q - 16), 5-bit q ----------------------------------------

namespace {

uint32_t load_qh(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

void store_qh(uint32_t v, uint8_t* qh) {
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Splits two 5-bit quants (elements j and j + 16) into nibbles and high bits.
void pack_q5(int j, int q0, int q1, uint8_t* qs, uint32_t* qh) {
  qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
  *qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
  *qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + kQK / 2);
}

// The 5-bit quant of element e of a Q5_0/Q5_1 block.
int unpack_q5(int e, const uint8_t* qs, uint32_t qh) {
  const int low = e < kQK / 2 ? (qs[e] & 0x0F) : (qs[e - kQK / 2] >> 4);
  return low | static_cast<int>(((qh >> e) & 1u) << 4);
}

}  // namespace

void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    const uint32_t qh = load_qh(x[b].qh);
    for (int e = 0; e < kQK; ++e) y[e] = static_cast<float>(unpack_q5(e, x[b].qs, qh) - 16) * d;
  }
}

void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    const float d = signed_absmax(x, kQK) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 =
          std::min(31, static_cast<int>(static_cast<int8_t>(truncate_to_byte(x[j] * id + 16.5f))));
      const int q1 = std::min(
          31, static_cast<int>(static_cast<int8_t>(truncate_to_byte(x[j + kQK / 2] * id + 16.5f))));
      pack_q5(j, q0 & 0xFF, q1 & 0xFF, y[b].qs, &qh);
    }
    store_qh(qh, y[b].qh);
  }
}

// ---- Q5_1: y = d * q + m, 5-bit q -------------------------------------------

void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    const float m = fp16_to_fp32(x[b].m);
    const uint32_t qh = load_qh(x[b].qh);
    for (int e = 0; e < kQK; ++e) y[e] = static_cast<float>(unpack_q5(e, x[b].qs, qh)) * d + m;
  }
}

void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float lo = 0.0f;
    float hi = 0.0f;
    min_max(x, kQK, &lo, &hi);
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(lo);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      // No clamp here (ggml has none): (x - lo) * id never exceeds 31.5.
      const int q0 = truncate_to_byte((x[j] - lo) * id + 0.5f);
      const int q1 = truncate_to_byte((x[j + kQK / 2] - lo) * id + 0.5f);
      pack_q5(j, q0, q1, y[b].qs, &qh);
    }
    store_qh(qh, y[b].qh);
  }
}

// ---- Q8_0: y = d * q, q in -127..127 ----------------------------------------

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[b].qs[j]) * d;
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  assert(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      // Written out rather than std::max so that a NaN propagates as in ggml.
      const float a = std::fabs(x[j]);
      amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    // roundf: halves away from zero (not to even), as ggml does here.
    for (int j = 0; j < kQK; ++j)
      y[b].qs[j] = static_cast<int8_t>(truncate_to_byte(std::round(x[j] * id)));
  }
}

}  // namespace loom::ref
