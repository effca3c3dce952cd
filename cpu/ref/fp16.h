// Scalar conversions between fp32 and the two 16-bit float storage formats
// GGUF uses: IEEE binary16 ("half", F16) and bfloat16 (BF16).
//
// These are the reference conversions: every SIMD/GPU path is tested against
// them, and the quantizers use them for their fp16 scales, so they must round
// exactly as ggml stores these formats:
//   - fp32 -> fp16: round to nearest, ties to even; overflow gives +-inf;
//     results below the smallest normal become subnormals (no flush to zero);
//     any NaN becomes the canonical quiet NaN 0x7E00 with the sign kept.
//   - fp32 -> bf16: round to nearest, ties to even; a NaN keeps its sign and
//     upper payload bits and is forced quiet (bit 6 of the half set).
//   - fp16/bf16 -> fp32: exact. A signalling fp16 NaN comes back quiet, as
//     the hardware conversion (F16C, or an fp32 multiply) returns it.
// Table-free: plain integer arithmetic on the bit patterns, no FPU modes.
//
// Not for cpu/avx2 or cpu/avx512 sources: an inline function compiled there
// with ISA flags could be the copy the linker keeps for every caller (see
// cpu/CMakeLists.txt). Those folders convert with their own intrinsics.
#pragma once

#include <bit>
#include <cstdint>

namespace loom::ref {

/// Widens an IEEE half (bit pattern) to fp32. Exact for every finite value.
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;  // biased by 15
  const uint32_t mantissa = h & 0x3FFu;         // 10 bits
  uint32_t bits = 0;
  if (exponent == 0x1F) {
    // Inf or NaN: same payload in the top mantissa bits; NaNs made quiet.
    bits = 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  } else if (exponent != 0) {
    // Normal: rebias 15 -> 127 (+112) and widen the mantissa 10 -> 23 bits.
    bits = ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {
    // Subnormal half m * 2^-24: normal in fp32. Shift the leading one up to
    // the implicit bit; each shift lowers the exponent by one.
    uint32_t m = mantissa;
    uint32_t e = 113;  // fp32 biased exponent of 2^-14, the half subnormal scale
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    bits = (e << 23) | ((m & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(sign | bits);
}

/// Narrows fp32 to an IEEE half (bit pattern), round to nearest even.
inline uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u;  // NaN: canonical quiet
  if (magnitude >= 0x38800000u) {
    // |f| >= 2^-14, the smallest normal half. Rebias the exponent (127 -> 15)
    // in place, then round away the 13 low mantissa bits: adding 0xFFF plus
    // the kept lsb rounds half to even, and a carry out of the mantissa bumps
    // the exponent as it should. Anything that lands at or above the inf
    // pattern (|f| >= 65520, or inf itself) is inf.
    const uint32_t rebiased = magnitude - (112u << 23);
    const uint32_t rounded = (rebiased + 0x0FFFu + ((rebiased >> 13) & 1u)) >> 13;
    return sign | static_cast<uint16_t>(rounded >= 0x7C00u ? 0x7C00u : rounded);
  }
  // Subnormal (or zero) half: the result is round(|f| / 2^-24). With
  // |f| = m * 2^(e - 150) (m with its implicit bit), that is m >> (126 - e).
  const uint32_t e = magnitude >> 23;
  const uint32_t shift = 126u - e;        // >= 14 here
  if (e == 0 || shift > 24) return sign;  // below half the smallest subnormal
  const uint32_t m = (magnitude & 0x7FFFFFu) | 0x800000u;
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;  // may become 0x400: smallest normal
  return sign | static_cast<uint16_t>(q);
}

/// Widens a bfloat16 (bit pattern) to fp32: the top half of the fp32 bits.
inline float bf16_to_fp32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

/// Narrows fp32 to bfloat16 (bit pattern), round to nearest even.
inline uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: keep sign and the payload that fits, force the quiet bit so a
    // payload living only in the dropped bits cannot turn it into inf.
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  // Adding 0x7FFF plus the kept lsb rounds half to even; the largest finite
  // values carry into the exponent and become inf, as they should.
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace loom::ref
