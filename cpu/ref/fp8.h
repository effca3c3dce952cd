// FP8 E4M3 (the OCP "E4M3FN" format: 1 sign, 4 exponent bits with bias 7, 3
// mantissa bits; no infinities, 0x7F / 0xFF are NaN, the largest finite value
// is 448). Used for KV blocks on the SSD, each block with its own float scale.
#pragma once

#include <cstdint>

namespace loom::ref {

/// The value of an E4M3 byte.
float fp8_e4m3_to_fp32(uint8_t v);
/// The E4M3 byte nearest to x (ties to even); beyond ±448 saturates to ±448;
/// NaN stays NaN.
uint8_t fp32_to_fp8_e4m3(float x);

}  // namespace loom::ref
