// Portable quantized matrix products: the fallback for CPUs without AVX2 and
// the model the SIMD kernels follow.
//
// Every dot product is the one ggml's scalar vec_dot computes: exact integer
// sums of (weight quant) x (activation quant) per block or sub-block, then
// one float scaling per block (d_w * d_x), minus the offset term for the
// formats with mins. Only the order of the final float additions differs.
// Activation layouts are described in cpu/matmul_internal.h.
//
// Blocks are copied into local structs with memcpy before use: weight rows
// come from memory-mapped files and nothing here relies on their alignment.
#include <cassert>
#include <cstring>

#include "cpu/matmul_internal.h"
#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "cpu/ref/quants.h"

namespace loom::cpu::scalar {
namespace {

using ref::kQK;
using ref::kQK_K;

template <typename Block>
Block load_block(const uint8_t* row, int64_t b) {
  Block blk;
  std::memcpy(&blk, row + b * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return blk;
}

float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The split Q8_0 activation row (see matmul_internal.h): quants, scales, sums.
struct ActQ8 {
  const int8_t* qs;
  const uint8_t* d;  // nb floats
  const uint8_t* s;  // nb floats
};

ActQ8 act_q8(const void* x, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(x);
  const int64_t nb = n / kQK;
  return {reinterpret_cast<const int8_t*>(p), p + n, p + n + 4 * nb};
}

// ---- 32-element formats: one function per weight block, returning the
// integer dot of the 32 weight quants (as the format defines them, offsets
// removed) with the 32 activation quants.

int dot_block(const ref::BlockQ4_0& w, const int8_t* x) {
  int sum = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    sum += ((w.qs[j] & 0x0F) - 8) * x[j];
    sum += ((w.qs[j] >> 4) - 8) * x[j + kQK / 2];
  }
  return sum;
}

// Q4_1/Q5_1: unsigned quants; the offset m is applied in float with s.
int dot_block(const ref::BlockQ4_1& w, const int8_t* x) {
  int sum = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    sum += (w.qs[j] & 0x0F) * x[j];
    sum += (w.qs[j] >> 4) * x[j + kQK / 2];
  }
  return sum;
}

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, sizeof(v));
  return v;  // little-endian hosts only (x86)
}

int dot_block(const ref::BlockQ5_0& w, const int8_t* x) {
  const uint32_t qh = load_qh(w.qh);
  int sum = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (w.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (w.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    sum += (lo - 16) * x[j] + (hi - 16) * x[j + kQK / 2];
  }
  return sum;
}

int dot_block(const ref::BlockQ5_1& w, const int8_t* x) {
  const uint32_t qh = load_qh(w.qh);
  int sum = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (w.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (w.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    sum += lo * x[j] + hi * x[j + kQK / 2];
  }
  return sum;
}

int dot_block(const ref::BlockQ8_0& w, const int8_t* x) {
  int sum = 0;
  for (int j = 0; j < kQK; ++j) sum += w.qs[j] * x[j];
  return sum;
}

// Blocks with an offset term m * sum(x): Q4_1 and Q5_1.
template <typename Block>
constexpr bool kHasMin = false;
template <>
constexpr bool kHasMin<ref::BlockQ4_1> = true;
template <>
constexpr bool kHasMin<ref::BlockQ5_1> = true;

template <typename Block>
float dot_row_32(const uint8_t* w, const ActQ8& x, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const Block blk = load_block<Block>(w, b);
    const int isum = dot_block(blk, x.qs + b * kQK);
    const float dx = load_f32(x.d + 4 * b);
    sum += (ref::fp16_to_fp32(blk.d) * dx) * static_cast<float>(isum);
    if constexpr (kHasMin<Block>) sum += ref::fp16_to_fp32(blk.m) * load_f32(x.s + 4 * b);
  }
  return sum;
}

template <typename Block>
void matmul_32(LOOM_QUANT_KERNEL_ARGS) {
  const int64_t nb = n / kQK;
  for (int64_t t = 0; t < T; ++t) {
    const ActQ8 x = act_q8(static_cast<const uint8_t*>(X) + t * x_row_bytes, n);
    for (int64_t r = r0; r < r1; ++r) {
      const auto* w = static_cast<const uint8_t*>(W) + r * w_row_bytes;
      Y[t * ldy + r] = dot_row_32<Block>(w, x, nb);
    }
  }
}

// ---- K-quants: each super-block is decoded to 256 signed quants q and 16
// sub-block scales sc (and mins mn) over 16 elements each, so that
//   y[e] = d * sc[e / 16] * q[e] - dmin * mn[e / 16]
// (Q4_K/Q5_K sub-blocks of 32 appear as two equal entries). Then
//   dot = d * dx * sum_s sc[s] * sum_{e in s} q[e] x[e]  -  dmin * dx * sum_s mn[s] * bsums[s].
struct KDecoded {
  int8_t q[kQK_K];
  int sc[16];
  int mn[16];
  float d;
  float dmin;  // 0 for the formats without mins
};

void decode(const ref::BlockQ2_K& b, KDecoded* out) {
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l)
        out->q[128 * h + 32 * k + l] = static_cast<int8_t>((b.qs[32 * h + l] >> (2 * k)) & 3);
    }
  }
  for (int s = 0; s < 16; ++s) {
    out->sc[s] = b.scales[s] & 0x0F;
    out->mn[s] = b.scales[s] >> 4;
  }
  out->d = ref::fp16_to_fp32(b.d);
  out->dmin = ref::fp16_to_fp32(b.dmin);
}

void decode(const ref::BlockQ3_K& b, KDecoded* out) {
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const int e = 128 * h + 32 * k + l;
        const int low = (b.qs[32 * h + l] >> (2 * k)) & 3;
        const int high = (b.hmask[l] >> (e / 32)) & 1;
        out->q[e] = static_cast<int8_t>((low | (high << 2)) - 4);
      }
    }
  }
  for (int s = 0; s < 16; ++s) {
    const int low = s < 8 ? (b.scales[s] & 0x0F) : (b.scales[s - 8] >> 4);
    const int high = (b.scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    out->sc[s] = (low | (high << 4)) - 32;
    out->mn[s] = 0;
  }
  out->d = ref::fp16_to_fp32(b.d);
  out->dmin = 0.0f;
}

void decode_scales_k4(const uint8_t* scales, KDecoded* out) {
  for (int j = 0; j < 8; ++j) {
    uint8_t sc = 0;
    uint8_t mn = 0;
    ref::scale_min_k4(j, scales, &sc, &mn);
    out->sc[2 * j] = out->sc[2 * j + 1] = sc;
    out->mn[2 * j] = out->mn[2 * j + 1] = mn;
  }
}

void decode(const ref::BlockQ4_K& b, KDecoded* out) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out->q[64 * c + l] = static_cast<int8_t>(b.qs[32 * c + l] & 0x0F);
      out->q[64 * c + 32 + l] = static_cast<int8_t>(b.qs[32 * c + l] >> 4);
    }
  }
  decode_scales_k4(b.scales, out);
  out->d = ref::fp16_to_fp32(b.d);
  out->dmin = ref::fp16_to_fp32(b.dmin);
}

void decode(const ref::BlockQ5_K& b, KDecoded* out) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int h0 = (b.qh[l] >> (2 * c)) & 1;
      const int h1 = (b.qh[l] >> (2 * c + 1)) & 1;
      out->q[64 * c + l] = static_cast<int8_t>((b.qs[32 * c + l] & 0x0F) | (h0 << 4));
      out->q[64 * c + 32 + l] = static_cast<int8_t>((b.qs[32 * c + l] >> 4) | (h1 << 4));
    }
  }
  decode_scales_k4(b.scales, out);
  out->d = ref::fp16_to_fp32(b.d);
  out->dmin = ref::fp16_to_fp32(b.dmin);
}

void decode(const ref::BlockQ6_K& b, KDecoded* out) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int8_t* q = out->q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      q[l] = static_cast<int8_t>(((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32);
      q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32);
      q[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
  for (int s = 0; s < 16; ++s) {
    out->sc[s] = b.scales[s];
    out->mn[s] = 0;
  }
  out->d = ref::fp16_to_fp32(b.d);
  out->dmin = 0.0f;
}

template <typename Block>
float dot_row_k(const uint8_t* w, const uint8_t* x, int64_t nb) {
  float sum = 0.0f;
  KDecoded dec;
  for (int64_t b = 0; b < nb; ++b) {
    decode(load_block<Block>(w, b), &dec);
    const auto xb = load_block<ref::BlockQ8_K>(x, b);
    int isum = 0;
    int msum = 0;
    for (int s = 0; s < 16; ++s) {
      int sub = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sub += dec.q[e] * xb.qs[e];
      isum += dec.sc[s] * sub;
      msum += dec.mn[s] * xb.bsums[s];
    }
    sum += dec.d * xb.d * static_cast<float>(isum);
    if (dec.dmin != 0.0f) sum -= dec.dmin * xb.d * static_cast<float>(msum);
  }
  return sum;
}

template <typename Block>
void matmul_k(LOOM_QUANT_KERNEL_ARGS) {
  const int64_t nb = n / kQK_K;
  for (int64_t t = 0; t < T; ++t) {
    const auto* x = static_cast<const uint8_t*>(X) + t * x_row_bytes;
    for (int64_t r = r0; r < r1; ++r) {
      const auto* w = static_cast<const uint8_t*>(W) + r * w_row_bytes;
      Y[t * ldy + r] = dot_row_k<Block>(w, x, nb);
    }
  }
}

}  // namespace

LOOM_DEFINE_QUANT_KERNELS(matmul_32, matmul_k, ref::Block)

// Q8_0 values exactly as ref::quantize_row_q8_0 writes them, split into
// quants / fp32 scales / fp32 sums.
void quantize_act_q8_0(const float* x, void* out, int64_t n) {
  assert(n % kQK == 0);
  const int64_t nb = n / kQK;
  auto* p = static_cast<uint8_t*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    ref::BlockQ8_0 blk;
    ref::quantize_row_q8_0(x + b * kQK, &blk, kQK);
    std::memcpy(p + b * kQK, blk.qs, kQK);
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += blk.qs[j];
    const float d = ref::fp16_to_fp32(blk.d);
    const float s = d * static_cast<float>(isum);
    std::memcpy(p + n + 4 * b, &d, 4);
    std::memcpy(p + n + 4 * nb + 4 * b, &s, 4);
  }
}

void quantize_act_q8_k(const float* x, void* out, int64_t n) {
  assert(n % kQK_K == 0);
  auto* p = static_cast<uint8_t*>(out);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    ref::BlockQ8_K blk;
    ref::quantize_row_q8_k(x + b * kQK_K, &blk, kQK_K);
    std::memcpy(p + b * static_cast<int64_t>(sizeof(blk)), &blk, sizeof(blk));
  }
}

}  // namespace loom::cpu::scalar
