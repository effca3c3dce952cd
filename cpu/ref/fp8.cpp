#include "cpu/ref/fp8.h"

#include <cmath>
#include <limits>

namespace loom::ref {

float fp8_e4m3_to_fp32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int e = (v >> 3) & 15;
  const int m = v & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

uint8_t fp32_to_fp8_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;
  int e2 = 0;
  const float f = std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1)
  int exp = e2 + 6;                    // the biased exponent of a normal number
  if (a == 0.0f || exp < 1) {
    // Subnormal: steps of 2^-9 (rint rounds ties to even); 8 steps is the
    // smallest normal number, whose code is 8 too.
    const auto m = static_cast<int>(std::rint(std::ldexp(a, 9)));
    return sign | static_cast<uint8_t>(m);
  }
  auto q = static_cast<int>(std::rint(f * 16.0f));  // 8..16: the implicit 1 and 3 bits
  if (q == 16) {
    q = 8;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && q - 8 == 7)) return sign | 0x7E;  // past 448 (0x7F is NaN)
  return sign | static_cast<uint8_t>((exp << 3) | (q - 8));
}

}  // namespace loom::ref
