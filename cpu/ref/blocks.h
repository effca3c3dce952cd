// On-disk layouts of the GGUF block formats, exactly as they sit in a file.
//
// Each struct is one block: a fixed number of consecutive elements of a row,
// quantized together. Conventions shared by all of them:
//   - "fp16" fields hold IEEE half bit patterns (see fp16.h), little endian;
//   - quants of 4 bits or less are packed several to a byte, low bits first;
//   - element e of a block means x[block_start + e].
// The structs contain only uint8_t/int8_t/uint16_t/int16_t members (and one
// float in Q8_K), so they have no padding and alignment 1 or 2 (4 for Q8_K);
// the static_asserts below tie their sizes to the dtype table.
//
// Legacy formats (32 elements per block) store y = d * q (+ m), with one
// scale per block. K-quants (256 elements, QK_K) split the super-block into
// 16 or 32 sub-blocks whose scales (and mins) are themselves quantized to
// 4, 6 or 8 bits against one or two fp16 super-block scales.
#pragma once

#include <cstdint>

#include "engine/core/dtype.h"

namespace loom::ref {

/// Elements per block of the legacy formats (Q4_0 .. Q8_1).
inline constexpr int kQK = 32;
/// Elements per super-block of the K-quants (Q2_K .. Q8_K).
inline constexpr int kQK_K = 256;
/// Bytes of the packed 6-bit scales and mins of Q4_K and Q5_K.
inline constexpr int kKScaleSize = 12;

/// Q4_0: y[e] = d * (q[e] - 8), q in 0..15.
/// qs[j] holds q[j] in its low nibble and q[j + 16] in its high nibble.
struct BlockQ4_0 {
  uint16_t d;           ///< fp16 scale
  uint8_t qs[kQK / 2];  ///< 32 x 4-bit quants
};

/// Q4_1: y[e] = d * q[e] + m, q in 0..15. Nibbles packed as in Q4_0.
struct BlockQ4_1 {
  uint16_t d;           ///< fp16 scale
  uint16_t m;           ///< fp16 offset (the block minimum)
  uint8_t qs[kQK / 2];  ///< 32 x 4-bit quants
};

/// Q5_0: y[e] = d * (q[e] - 16), q in 0..31. The low 4 bits of q are packed
/// as in Q4_0; bit 4 of q[e] is bit e of the little-endian 32-bit word qh.
struct BlockQ5_0 {
  uint16_t d;           ///< fp16 scale
  uint8_t qh[4];        ///< fifth bits, bit e for element e
  uint8_t qs[kQK / 2];  ///< low 4 bits, nibbles as in Q4_0
};

/// Q5_1: y[e] = d * q[e] + m, q in 0..31; bits packed as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;           ///< fp16 scale
  uint16_t m;           ///< fp16 offset (the block minimum)
  uint8_t qh[4];        ///< fifth bits, bit e for element e
  uint8_t qs[kQK / 2];  ///< low 4 bits, nibbles as in Q4_0
};

/// Q8_0: y[e] = d * qs[e], qs in -127..127.
struct BlockQ8_0 {
  uint16_t d;      ///< fp16 scale
  int8_t qs[kQK];  ///< 32 x 8-bit quants
};

/// Q8_1: as Q8_0 plus s = d * sum(qs), the block sum kept for dot products
/// against Q4_1/Q5_1 (whose offsets multiply it). Activation-side only.
struct BlockQ8_1 {
  uint16_t d;      ///< fp16 scale
  uint16_t s;      ///< fp16 d * sum(qs)
  int8_t qs[kQK];  ///< 32 x 8-bit quants
};

/// Q2_K: 16 sub-blocks of 16 elements. Sub-block s has a 4-bit scale
/// sc = scales[s] & 15 and 4-bit min mn = scales[s] >> 4, and
///   y[e] = d * sc * q[e] - dmin * mn,  q in 0..3.
/// Quants: the block is two halves of 128; in half h, byte qs[32h + l]
/// holds, from its low bits up, q of elements 128h + l, +32, +64, +96.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  ///< per sub-block: low nibble scale, high nibble min
  uint8_t qs[kQK_K / 4];       ///< 256 x 2-bit quants
  uint16_t d;                  ///< fp16 super-scale of the scales
  uint16_t dmin;               ///< fp16 super-scale of the mins
};

/// Q3_K: 16 sub-blocks of 16 elements, signed 6-bit scales, no mins:
///   y[e] = d * (sc[s] - 32) * (q[e] - 4),  q in 0..7, sc in 0..63.
/// Low 2 bits of q packed as in Q2_K (qs). Bit 2 of q[e] is bit e / 32 of
/// hmask[e % 32]. Scale sc[s] (s = e / 16): its low 4 bits are the low
/// nibble of scales[s] for s < 8 and the high nibble of scales[s - 8]
/// otherwise; its high 2 bits are bits 2*(s/4)..+1 of scales[8 + s % 4].
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  ///< bit 2 of each quant
  uint8_t qs[kQK_K / 4];     ///< low 2 bits of each quant
  uint8_t scales[12];        ///< 16 x 6-bit scales, packed as above
  uint16_t d;                ///< fp16 super-scale
};

/// Q4_K: 8 sub-blocks of 32 elements with 6-bit scale sc and min mn:
///   y[e] = d * sc[s] * q[e] - dmin * mn[s],  q in 0..15, s = e / 32.
/// Scales (see scale_min_k4 in quants): for s < 4, sc = scales[s] & 63 and
/// mn = scales[s + 4] & 63; for s >= 4 the low 4 bits are the low/high
/// nibble of scales[s + 4] and the high 2 bits the top two bits of
/// scales[s - 4] (sc) and scales[s] (mn).
/// Quants: in each 64-element chunk c, qs[32c + l] holds q[64c + l] in its
/// low nibble and q[64c + 32 + l] in its high nibble.
struct BlockQ4_K {
  uint16_t d;                   ///< fp16 super-scale of the scales
  uint16_t dmin;                ///< fp16 super-scale of the mins
  uint8_t scales[kKScaleSize];  ///< 8 x (6-bit scale, 6-bit min)
  uint8_t qs[kQK_K / 2];        ///< 256 x 4-bit quants
};

/// Q5_K: as Q4_K with a fifth quant bit, q in 0..31. In chunk c (64
/// elements), bit 2c of qh[l] is bit 4 of q[64c + l] and bit 2c+1 is bit 4
/// of q[64c + 32 + l].
struct BlockQ5_K {
  uint16_t d;                   ///< fp16 super-scale of the scales
  uint16_t dmin;                ///< fp16 super-scale of the mins
  uint8_t scales[kKScaleSize];  ///< 8 x (6-bit scale, 6-bit min), as Q4_K
  uint8_t qh[kQK_K / 8];        ///< fifth bits
  uint8_t qs[kQK_K / 2];        ///< low 4 bits, as Q4_K
};

/// Q6_K: 16 sub-blocks of 16 elements with signed 8-bit scales:
///   y[e] = d * scales[e / 16] * (q[e] - 32),  q in 0..63.
/// Each half h (128 elements) uses ql[64h..64h+63] and qh[32h..32h+31]; for
/// l in 0..31 the four quants q[128h + l + 32k], k = 0..3, have low 4 bits
/// in the low nibble of ql[64h + l] (k=0), of ql[64h + 32 + l] (k=1), the
/// high nibble of ql[64h + l] (k=2), of ql[64h + 32 + l] (k=3), and high 2
/// bits in bits 2k..2k+1 of qh[32h + l].
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      ///< low 4 bits of each quant
  uint8_t qh[kQK_K / 4];      ///< high 2 bits of each quant
  int8_t scales[kQK_K / 16];  ///< per sub-block scale
  uint16_t d;                 ///< fp16 super-scale
};

/// Q8_K: y[e] = d * qs[e]; d is a full fp32. bsums[s] is the sum of the 16
/// quants of sub-block s, kept for dot products against K-quants with mins.
/// Activation-side format: never stored in model files.
struct BlockQ8_K {
  float d;                    ///< fp32 scale
  int8_t qs[kQK_K];           ///< 256 x 8-bit quants
  int16_t bsums[kQK_K / 16];  ///< sums of qs by 16
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

/// Maps a dtype to its block struct; specialised below for each format.
template <DType T>
struct BlockOf;
template <>
struct BlockOf<DType::kQ4_0> {
  using type = BlockQ4_0;
};
template <>
struct BlockOf<DType::kQ4_1> {
  using type = BlockQ4_1;
};
template <>
struct BlockOf<DType::kQ5_0> {
  using type = BlockQ5_0;
};
template <>
struct BlockOf<DType::kQ5_1> {
  using type = BlockQ5_1;
};
template <>
struct BlockOf<DType::kQ8_0> {
  using type = BlockQ8_0;
};
template <>
struct BlockOf<DType::kQ8_1> {
  using type = BlockQ8_1;
};
template <>
struct BlockOf<DType::kQ2_K> {
  using type = BlockQ2_K;
};
template <>
struct BlockOf<DType::kQ3_K> {
  using type = BlockQ3_K;
};
template <>
struct BlockOf<DType::kQ4_K> {
  using type = BlockQ4_K;
};
template <>
struct BlockOf<DType::kQ5_K> {
  using type = BlockQ5_K;
};
template <>
struct BlockOf<DType::kQ6_K> {
  using type = BlockQ6_K;
};
template <>
struct BlockOf<DType::kQ8_K> {
  using type = BlockQ8_K;
};

}  // namespace loom::ref
