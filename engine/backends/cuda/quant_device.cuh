// Device-side decoding of the GGUF block formats (layouts: cpu/ref/blocks.h),
// shared by the matmul kernels and the embedding lookup. Two views of a row:
//   dequant_one<D>(row, i): element i as a float, computed as cpu/ref does
//     (same products in the same order), for dequantization and get_rows;
//   decode_group<D>(row, g): elements [32g, 32g + 32) as eight words of four
//     signed 8-bit quants plus their scales, for int8 dot products against Q8
//     activations (dp4a).
// Row pointers must be aligned as the format's blocks are in a file: 2 bytes
// for Q4_0, Q5_0, Q8_0 and Q6_K (18, 22, 34 and 210-byte blocks), 4 for the
// others. Device allocations are 256-aligned and rows are whole blocks apart.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cpu/ref/blocks.h"
#include "engine/core/dtype.h"

namespace loom::cuda {

__device__ __forceinline__ float h2f(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float bf2f(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
/// 32 bits at a 2-byte aligned address (little endian).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}
/// 32 bits at a 4-byte aligned address.
__device__ __forceinline__ uint32_t ld_u32_a4(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
/// Bit 4 of four consecutive quants: bits 0..3 of `bits` into bit 4 of each byte.
__device__ __forceinline__ uint32_t spread_bit4(uint32_t bits) {
  return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

/// Scale and min of sub-block j of Q4_K/Q5_K (ref::scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// scale_min_k4 of sub-block j from the scales as three little-endian words
/// (bytes 0-3, 4-7, 8-11): shifts and a select, where scale_min_k4 takes a
/// branch that the lanes of a warp (j = lane % 8) split on.
__device__ __forceinline__ void scale_min_k4_words(int j, uint32_t w1, uint32_t w2, uint32_t w3,
                                                   int* sc, int* mn) {
  const int sh = 8 * (j & 3);
  const uint32_t a = w1 >> sh, b = w2 >> sh, c = w3 >> sh;
  const uint32_t sc_hi = (c & 0x0Fu) | ((a >> 2) & 0x30u);  // j >= 4: 4 bits + 2 top bits of j - 4
  const uint32_t mn_hi = ((c >> 4) & 0x0Fu) | ((b >> 2) & 0x30u);
  *sc = static_cast<int>(j < 4 ? a & 63u : sc_hi);
  *mn = static_cast<int>(j < 4 ? b & 63u : mn_hi);
}

/// Element i of a row of dtype D, as the cpu/ref dequantizers compute it.
template <DType D>
__device__ __forceinline__ float dequant_one(const uint8_t* row, int64_t i) {
  using namespace loom::ref;
  if constexpr (D == DType::kF32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (D == DType::kF16) {
    return h2f(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (D == DType::kBF16) {
    return bf2f(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (D == DType::kQ8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + i / kQK;
    return static_cast<float>(b->qs[i % kQK]) * h2f(b->d);
  } else if constexpr (D == DType::kQ4_0) {
    const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + i / kQK;
    const int e = static_cast<int>(i % kQK);
    const int q = e < 16 ? (b->qs[e] & 0x0F) : (b->qs[e - 16] >> 4);
    return static_cast<float>(q - 8) * h2f(b->d);
  } else if constexpr (D == DType::kQ4_1) {
    const BlockQ4_1* b = reinterpret_cast<const BlockQ4_1*>(row) + i / kQK;
    const int e = static_cast<int>(i % kQK);
    const int q = e < 16 ? (b->qs[e] & 0x0F) : (b->qs[e - 16] >> 4);
    return static_cast<float>(q) * h2f(b->d) + h2f(b->m);
  } else if constexpr (D == DType::kQ5_0 || D == DType::kQ5_1) {
    using B = typename BlockOf<D>::type;
    const B* b = reinterpret_cast<const B*>(row) + i / kQK;
    const int e = static_cast<int>(i % kQK);
    const int lo = e < 16 ? (b->qs[e] & 0x0F) : (b->qs[e - 16] >> 4);
    const int q = lo | (((b->qh[e / 8] >> (e % 8)) & 1) << 4);
    if constexpr (D == DType::kQ5_0) {
      return static_cast<float>(q - 16) * h2f(b->d);
    } else {
      return static_cast<float>(q) * h2f(b->d) + h2f(b->m);
    }
  } else if constexpr (D == DType::kQ4_K || D == DType::kQ5_K) {
    using B = typename BlockOf<D>::type;
    const B* b = reinterpret_cast<const B*>(row) + i / kQK_K;
    const int e = static_cast<int>(i % kQK_K);
    const int s = e / 32, l = e % 32;
    int sc = 0, mn = 0;
    scale_min_k4(s, b->scales, &sc, &mn);
    const float dl = h2f(b->d) * static_cast<float>(sc);
    const float ml = h2f(b->dmin) * static_cast<float>(mn);
    int q = (b->qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
    if constexpr (D == DType::kQ5_K) q += ((b->qh[l] >> s) & 1) != 0 ? 16 : 0;
    return dl * static_cast<float>(q) - ml;
  } else {
    static_assert(D == DType::kQ6_K, "dtype without a CUDA decoder");
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + i / kQK_K;
    const int e = static_cast<int>(i % kQK_K);
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const int low = (b->ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
    const int high = (b->qh[32 * h + l] >> (2 * k)) & 3;
    const int q = (low | (high << 4)) - 32;
    return h2f(b->d) * static_cast<float>(b->scales[e / 16]) * static_cast<float>(q);
  }
}

/// 32 elements of a row as int8 quants q (four to a word, element 4w + j in
/// byte j of q[w]) with y[e] = d_lo * q[e] + m for e < 16, d_hi * q[e] + m
/// for e >= 16. So sum_e y[e] x[e], with x[e] = xd * xq[e], is
///   xd * (d_lo * dot(q[0..3], xq) + d_hi * dot(q[4..7], xq) + m * sum(xq)).
struct QGroup {
  int q[8];
  float d_lo, d_hi, m;
};

/// Whether D has decode_group (the int8 dot-product matvec).
__host__ __device__ constexpr bool has_group_decode(DType d) {
  return d == DType::kQ8_0 || d == DType::kQ4_0 || d == DType::kQ4_1 || d == DType::kQ5_0 ||
         d == DType::kQ5_1 || d == DType::kQ4_K || d == DType::kQ5_K || d == DType::kQ6_K;
}

/// 32 bytes at a 16-byte aligned address as eight little-endian words (two 128-bit loads).
__device__ __forceinline__ void ld_32bytes_a16(const uint8_t* p, uint32_t (&w)[8]) {
  const uint4 a = reinterpret_cast<const uint4*>(p)[0];
  const uint4 b = reinterpret_cast<const uint4*>(p)[1];
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

/// Group g (elements 32g .. 32g + 31) of a row of dtype D. kVec16 (Q4_K and
/// Q5_K only, whose 144- and 176-byte blocks keep 16-byte alignment when the
/// row does): the quants (and Q5_K's fifth bits) in 128-bit loads.
template <DType D, bool kVec16 = false>
__device__ __forceinline__ QGroup decode_group(const uint8_t* row, int64_t g) {
  using namespace loom::ref;
  QGroup r;
  r.m = 0.0f;
  if constexpr (D == DType::kQ8_0) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + g;
    const uint8_t* qs = reinterpret_cast<const uint8_t*>(b->qs);
#pragma unroll
    for (int w = 0; w < 8; ++w) r.q[w] = static_cast<int>(ld_u32_a2(qs + 4 * w));
    r.d_lo = r.d_hi = h2f(b->d);
  } else if constexpr (D == DType::kQ4_0 || D == DType::kQ4_1) {
    using B = typename BlockOf<D>::type;
    const B* b = reinterpret_cast<const B*>(row) + g;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t v = D == DType::kQ4_0 ? ld_u32_a2(b->qs + 4 * w) : ld_u32_a4(b->qs + 4 * w);
      uint32_t lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
      if constexpr (D == DType::kQ4_0) {
        lo = __vsub4(lo, 0x08080808u);
        hi = __vsub4(hi, 0x08080808u);
      }
      r.q[w] = static_cast<int>(lo);
      r.q[w + 4] = static_cast<int>(hi);
    }
    r.d_lo = r.d_hi = h2f(b->d);
    if constexpr (D == DType::kQ4_1) r.m = h2f(b->m);
  } else if constexpr (D == DType::kQ5_0 || D == DType::kQ5_1) {
    using B = typename BlockOf<D>::type;
    const B* b = reinterpret_cast<const B*>(row) + g;
    const uint32_t qh = D == DType::kQ5_0 ? ld_u32_a2(b->qh) : ld_u32_a4(b->qh);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t v = D == DType::kQ5_0 ? ld_u32_a2(b->qs + 4 * w) : ld_u32_a4(b->qs + 4 * w);
      uint32_t lo = (v & 0x0F0F0F0Fu) | spread_bit4((qh >> (4 * w)) & 0xFu);
      uint32_t hi = ((v >> 4) & 0x0F0F0F0Fu) | spread_bit4((qh >> (16 + 4 * w)) & 0xFu);
      if constexpr (D == DType::kQ5_0) {
        lo = __vsub4(lo, 0x10101010u);
        hi = __vsub4(hi, 0x10101010u);
      }
      r.q[w] = static_cast<int>(lo);
      r.q[w + 4] = static_cast<int>(hi);
    }
    r.d_lo = r.d_hi = h2f(b->d);
    if constexpr (D == DType::kQ5_1) r.m = h2f(b->m);
  } else if constexpr (D == DType::kQ4_K || D == DType::kQ5_K) {
    using B = typename BlockOf<D>::type;
    const B* b = reinterpret_cast<const B*>(row) + g / 8;
    const int s = static_cast<int>(g % 8);
    int sc = 0, mn = 0;
    float d = 0.0f, dmin = 0.0f;
    const uint8_t* qs = b->qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    uint32_t qw[8], hw[8] = {};
    if constexpr (kVec16) {
      // The block's first 16 bytes in one load: d, dmin and the 12 scale bytes.
      const uint4 head = *reinterpret_cast<const uint4*>(b);
      d = __half2float(__ushort_as_half(static_cast<uint16_t>(head.x & 0xFFFFu)));
      dmin = __half2float(__ushort_as_half(static_cast<uint16_t>(head.x >> 16)));
      scale_min_k4_words(s, head.y, head.z, head.w, &sc, &mn);
      ld_32bytes_a16(qs, qw);
      if constexpr (D == DType::kQ5_K) ld_32bytes_a16(b->qh, hw);
    } else {
      d = h2f(b->d);
      dmin = h2f(b->dmin);
      scale_min_k4(s, b->scales, &sc, &mn);
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        qw[w] = ld_u32_a4(qs + 4 * w);
        if constexpr (D == DType::kQ5_K) hw[w] = ld_u32_a4(b->qh + 4 * w);
      }
    }
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      uint32_t v = (qw[w] >> shift) & 0x0F0F0F0Fu;
      // Q5_K: bit s of qh[4w .. 4w + 3] becomes bit 4 of each byte.
      if constexpr (D == DType::kQ5_K) v |= ((hw[w] >> s) & 0x01010101u) << 4;
      r.q[w] = static_cast<int>(v);
    }
    r.d_lo = r.d_hi = d * static_cast<float>(sc);
    r.m = -dmin * static_cast<float>(mn);
  } else {
    static_assert(D == DType::kQ6_K, "dtype without a group decoder");
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + g / 8;
    const int gi = static_cast<int>(g % 8);  // 32-element group in the super-block
    const int h = gi / 4, k = gi % 4;
    const uint8_t* ql = b->ql + 64 * h + 32 * (k % 2);
    const uint8_t* qh = b->qh + 32 * h;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const uint32_t low = (ld_u32_a2(ql + 4 * w) >> (4 * (k / 2))) & 0x0F0F0F0Fu;
      const uint32_t high = (ld_u32_a2(qh + 4 * w) >> (2 * k)) & 0x03030303u;
      r.q[w] = static_cast<int>(__vsub4(low | (high << 4), 0x20202020u));
    }
    const float d = h2f(b->d);
    r.d_lo = d * static_cast<float>(b->scales[2 * gi]);
    r.d_hi = d * static_cast<float>(b->scales[2 * gi + 1]);
  }
  return r;
}

/// Whether decode_group of D sets a min (QGroup::m), else m is 0.
__host__ __device__ constexpr bool group_has_min(DType d) {
  return d == DType::kQ4_1 || d == DType::kQ5_1 || d == DType::kQ4_K || d == DType::kQ5_K;
}

/// sum_e y[e] x[e] of a decoded group and 32 Q8 activations (xq: 8 words;
/// xd: their scale and scale * the sum of the quants, q8_act.cuh). kMin
/// false (group_has_min): m is 0 and xd.y is not read.
template <bool kMin = true>
__device__ __forceinline__ float group_dot(const QGroup& g, const int* xq, float2 xd) {
  int lo = 0, hi = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    lo = __dp4a(g.q[w], xq[w], lo);
    hi = __dp4a(g.q[w + 4], xq[w + 4], hi);
  }
  const float p = xd.x * (g.d_lo * static_cast<float>(lo) + g.d_hi * static_cast<float>(hi));
  if constexpr (!kMin)
    return p;
  else
    return fmaf(g.m, xd.y, p);
}

/// Calls f.template operator()<D>() for the runtime dtype `d` among those
/// the CUDA kernels decode; returns false for any other.
template <typename F>
bool dispatch_dtype(DType d, F&& f) {
  switch (d) {
    case DType::kF32: f.template operator()<DType::kF32>(); return true;
    case DType::kF16: f.template operator()<DType::kF16>(); return true;
    case DType::kBF16: f.template operator()<DType::kBF16>(); return true;
    case DType::kQ8_0: f.template operator()<DType::kQ8_0>(); return true;
    case DType::kQ4_0: f.template operator()<DType::kQ4_0>(); return true;
    case DType::kQ4_1: f.template operator()<DType::kQ4_1>(); return true;
    case DType::kQ5_0: f.template operator()<DType::kQ5_0>(); return true;
    case DType::kQ5_1: f.template operator()<DType::kQ5_1>(); return true;
    case DType::kQ4_K: f.template operator()<DType::kQ4_K>(); return true;
    case DType::kQ5_K: f.template operator()<DType::kQ5_K>(); return true;
    case DType::kQ6_K: f.template operator()<DType::kQ6_K>(); return true;
    default: return false;
  }
}

}  // namespace loom::cuda
