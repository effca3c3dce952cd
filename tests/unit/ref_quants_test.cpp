// cpu/ref: fp16/bf16 conversions, block layouts, reference (de)quantization
// of every format, and the generic dispatchers.
//
//   - known blocks: bytes written by hand, values worked out by hand;
//   - round trips: relative RMSE of quantize -> dequantize under a per-format bound;
//   - golden hashes: bytes and values produced by ggml's reference functions,
//     so CI checks bit-exactness with ggml without having ggml;
//   - fp16/bf16: all 65536 patterns, rounding ties, NaN/Inf, against an
//     independent computation in double;
//   - errors: unsupported dtypes and bad element counts.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "cpu/ref/fp8.h"
#include "cpu/ref/quants.h"

namespace loom {
namespace {

using ref::bf16_to_fp32;
using ref::fp16_to_fp32;
using ref::fp32_to_bf16;
using ref::fp32_to_fp16;

uint16_t h16(float f) {
  return fp32_to_fp16(f);
}

uint64_t fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// ---- test inputs --------------------------------------------------------------
// Golden inputs use only IEEE-exact operations (and double sin rounded to
// float), so they are the same on every machine.

// x[i] = sin(0.37 i) * (1 + i % 7), 512 elements.
std::vector<float> sine_input() {
  std::vector<float> x(512);
  for (int i = 0; i < 512; ++i) x[i] = static_cast<float>(std::sin(0.37 * i) * (1 + i % 7));
  return x;
}

// Uniform [-1, 1) from a 32-bit LCG, with outliers (x24) and tiny values (x0.001).
std::vector<float> noise_input() {
  std::vector<float> x(512);
  uint32_t s = 12345;
  for (int i = 0; i < 512; ++i) {
    s = s * 1664525u + 1013904223u;
    float u = static_cast<float>(s >> 8) * (1.0f / 8388608.0f) - 1.0f;
    if (i % 61 == 7) u *= 24.0f;
    if (i % 97 == 50) u *= 0.001f;
    x[i] = u;
  }
  return x;
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(*dtype_row_bytes(t, x.size()));
  Status s = ref::quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  EXPECT_TRUE(s.ok()) << s.message();
  return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> y(n);
  Status s = ref::dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(n));
  EXPECT_TRUE(s.ok()) << s.message();
  return y;
}

// ---- per-format table ---------------------------------------------------------

struct FormatCase {
  DType type;
  // Bound on sqrt(sum (x - y)^2 / sum x^2) for N(0,1) and offset uniform data
  // (4096 elements). Measured worst over 20 seeds, plus ~25% margin.
  double max_rel_rmse;
  // FNV-1a 64 of the quantized bytes and of the dequantized floats (as bytes)
  // for sine_input() and noise_input(). Computed with ggml's
  // quantize_row_*_ref / dequantize_row_* (ggml-base, llama.cpp de3ff81,
  // GCC 12 -O3, x86-64) in a harness outside this repository.
  uint64_t sine_bytes;
  uint64_t sine_values;
  uint64_t noise_bytes;
  uint64_t noise_values;
};

// Relative RMSE bounds (normal data, worst of 20 seeds ~ x1.25):
//   F32 0 | F16 3e-4 | BF16 2.5e-3 | Q8_0 0.008 | Q8_K 0.01 | Q6_K 0.024
//   Q5_1 0.05 | Q5_0 0.055 | Q5_K 0.048 | Q4_1 0.10 | Q4_0 0.11 | Q4_K 0.095
//   Q3_K 0.20 | Q2_K 0.38
const FormatCase kFormats[] = {
    {DType::kF32, 0.0, 0x9dd195f48112c547ull, 0x9dd195f48112c547ull, 0x2bdb6ca0eb65a5b3ull,
     0x2bdb6ca0eb65a5b3ull},
    {DType::kF16, 3e-4, 0x52be69f7456d6a0full, 0x653b94e24b0da344ull, 0xbc7943d2cd959abcull,
     0x3d5cf24df35c35b3ull},
    {DType::kBF16, 2.5e-3, 0xeebeb8c91168d4fbull, 0x06ebb6e8eb80c4a3ull, 0x29692b119096f9ddull,
     0x1b70ec0c4d14d115ull},
    {DType::kQ4_0, 0.11, 0x9109b6c5b5a14aeeull, 0xb9e8a21876541927ull, 0x0ae02e81c9d52e05ull,
     0xe0b3becb25759f4cull},
    {DType::kQ4_1, 0.10, 0x9d824c4311e2fb34ull, 0x34585577e2f788ecull, 0x4bab87a7138a3959ull,
     0x3b0c5436e38876e1ull},
    {DType::kQ5_0, 0.055, 0x7ab31bf1cf659174ull, 0xb2ca636a1e3ad48full, 0xdcf969366ccecb85ull,
     0x459e81af349200f3ull},
    {DType::kQ5_1, 0.05, 0x85fddc35cbf1e2acull, 0x454b78b1ad88e327ull, 0xf3d901da48c5b5c8ull,
     0xe19d68d87d2550c8ull},
    {DType::kQ8_0, 0.008, 0x1b49a285c45defa7ull, 0xd95c657666d59841ull, 0xc980a5ce432db9fdull,
     0xc4e3452f0e12ee1eull},
    {DType::kQ2_K, 0.38, 0x31bf2055a65bbc77ull, 0xb1a54f61cc1c57c5ull, 0x53a66d0ff104b1acull,
     0x3a934cc682b99fa1ull},
    {DType::kQ3_K, 0.20, 0x4950c9181ba3d465ull, 0x76b0d0b41c6415b5ull, 0x209ab5c2368aeceaull,
     0xb77b13a97c924899ull},
    {DType::kQ4_K, 0.095, 0x658650687d423679ull, 0xd38526d54cc6f109ull, 0x535983b0a04764c1ull,
     0xe00fd96ce2cdd3deull},
    {DType::kQ5_K, 0.048, 0xf56febb222e99a04ull, 0x7081fd1bd81c92c0ull, 0xda623bf194ac15b2ull,
     0xb230c1eaeffffd8full},
    {DType::kQ6_K, 0.024, 0xac3b8bba6fa59541ull, 0xc91e5911d92bffdaull, 0x2378d559d71549f0ull,
     0x0b5336a1bbfa69f2ull},
    {DType::kQ8_K, 0.01, 0xf91e522a580cbfa6ull, 0x771b4e2e39d2ac36ull, 0x743b371a8f4b4914ull,
     0x504fc54d2414e8b6ull},
};

class RefFormat : public ::testing::TestWithParam<FormatCase> {};

TEST_P(RefFormat, RoundTripErrorWithinBound) {
  const FormatCase& c = GetParam();
  const int n = 4096;
  for (int kind = 0; kind < 2; ++kind) {
    std::mt19937 rng(42 + kind);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(1.0f, 4.0f);
    std::vector<float> x(n);
    for (float& v : x) v = kind == 0 ? normal(rng) : uniform(rng);
    const std::vector<float> y = dequantize(c.type, quantize(c.type, x), n);
    double err2 = 0.0;
    double sig2 = 0.0;
    for (int i = 0; i < n; ++i) {
      err2 += static_cast<double>(x[i] - y[i]) * (x[i] - y[i]);
      sig2 += static_cast<double>(x[i]) * x[i];
    }
    const double rel = std::sqrt(err2 / sig2);
    EXPECT_LE(rel, c.max_rel_rmse) << (kind == 0 ? "normal" : "uniform [1,4)") << " data";
  }
}

TEST_P(RefFormat, GoldenHashesMatchGgml) {
  const FormatCase& c = GetParam();
  const std::vector<float> sine = sine_input();
  const std::vector<float> noise = noise_input();
  const std::vector<uint8_t> qs = quantize(c.type, sine);
  const std::vector<uint8_t> qn = quantize(c.type, noise);
  const std::vector<float> ys = dequantize(c.type, qs, sine.size());
  const std::vector<float> yn = dequantize(c.type, qn, noise.size());
  EXPECT_EQ(fnv1a(qs.data(), qs.size()), c.sine_bytes) << "quantized bytes (sine)";
  EXPECT_EQ(fnv1a(ys.data(), ys.size() * sizeof(float)), c.sine_values)
      << "dequantized values (sine)";
  EXPECT_EQ(fnv1a(qn.data(), qn.size()), c.noise_bytes) << "quantized bytes (noise)";
  EXPECT_EQ(fnv1a(yn.data(), yn.size() * sizeof(float)), c.noise_values)
      << "dequantized values (noise)";
}

TEST_P(RefFormat, ZerosStayZero) {
  const FormatCase& c = GetParam();
  const std::vector<float> x(512, 0.0f);
  for (float v : dequantize(c.type, quantize(c.type, x), x.size())) ASSERT_EQ(v, 0.0f);
}

TEST_P(RefFormat, UnalignedBuffersGiveTheSameResult) {
  const FormatCase& c = GetParam();
  const std::vector<float> x = noise_input();
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<uint8_t> aligned = quantize(c.type, x);
  // One byte off: the generic entry points must copy blocks, not cast.
  std::vector<uint8_t> buf(aligned.size() + 1);
  ASSERT_TRUE(ref::quantize_row(c.type, x.data(), buf.data() + 1, n).ok());
  EXPECT_EQ(0, std::memcmp(buf.data() + 1, aligned.data(), aligned.size()));
  std::vector<float> y_unaligned(x.size());
  ASSERT_TRUE(ref::dequantize_row(c.type, buf.data() + 1, y_unaligned.data(), n).ok());
  const std::vector<float> y = dequantize(c.type, aligned, x.size());
  EXPECT_EQ(0, std::memcmp(y.data(), y_unaligned.data(), y.size() * sizeof(float)));
}

TEST_P(RefFormat, RejectsCountsOffTheBlockGrid) {
  const FormatCase& c = GetParam();
  const int64_t bs = traits(c.type).block_size;
  std::vector<float> x(2 * bs + 8, 1.0f);
  std::vector<uint8_t> q(4096);
  EXPECT_TRUE(ref::quantize_row(c.type, x.data(), q.data(), 0).ok());
  EXPECT_EQ(ref::quantize_row(c.type, x.data(), q.data(), -bs).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(ref::dequantize_row(c.type, q.data(), x.data(), -1).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(ref::quantize_row(c.type, nullptr, q.data(), bs).error().code(),
            ErrorCode::kInvalidArgument);
  if (bs > 1) {
    Status s = ref::quantize_row(c.type, x.data(), q.data(), bs + 1);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.message().find(std::string(dtype_name(c.type))), std::string::npos) << s.message();
    EXPECT_EQ(ref::dequantize_row(c.type, q.data(), x.data(), 2 * bs - 1).error().code(),
              ErrorCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, RefFormat, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<FormatCase>& p) {
                           return std::string(dtype_name(p.param.type));
                         });

// ---- layouts and the dispatcher ----------------------------------------------

TEST(RefBlocks, SizesMatchTheDtypeTable) {
  EXPECT_EQ(sizeof(ref::BlockQ4_0), traits(DType::kQ4_0).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ4_1), traits(DType::kQ4_1).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ5_0), traits(DType::kQ5_0).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ5_1), traits(DType::kQ5_1).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ8_0), traits(DType::kQ8_0).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ8_1), traits(DType::kQ8_1).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ2_K), traits(DType::kQ2_K).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ3_K), traits(DType::kQ3_K).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ4_K), traits(DType::kQ4_K).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ5_K), traits(DType::kQ5_K).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ6_K), traits(DType::kQ6_K).block_bytes);
  EXPECT_EQ(sizeof(ref::BlockQ8_K), traits(DType::kQ8_K).block_bytes);
  EXPECT_EQ(static_cast<uint32_t>(ref::kQK), traits(DType::kQ4_0).block_size);
  EXPECT_EQ(static_cast<uint32_t>(ref::kQK_K), traits(DType::kQ4_K).block_size);
}

TEST(RefDispatch, HasReferenceAgreesWithTheDtypeTable) {
  int known = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const auto tr = dtype_traits(id);
    if (!tr) continue;
    ++known;
    EXPECT_EQ(ref::has_reference(tr->type), tr->has_reference) << tr->name;
  }
  EXPECT_GE(known, 30);
}

TEST(RefDispatch, UnsupportedDtypesAreErrors) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> q(4096);
  for (DType t : {DType::kQ8_1, DType::kIQ2_XXS, DType::kIQ4_NL, DType::kI8, DType::kF64,
                  DType::kTQ1_0, DType::kMXFP4}) {
    const int64_t n = 256;
    Status s = ref::quantize_row(t, x.data(), q.data(), n);
    ASSERT_FALSE(s.ok()) << dtype_name(t);
    EXPECT_EQ(s.error().code(), ErrorCode::kUnsupported);
    EXPECT_NE(s.message().find(std::string(dtype_name(t))), std::string::npos) << s.message();
    s = ref::dequantize_row(t, q.data(), x.data(), n);
    ASSERT_FALSE(s.ok()) << dtype_name(t);
    EXPECT_EQ(s.error().code(), ErrorCode::kUnsupported);
  }
}

TEST(RefDispatch, Q8_KBlockSumsAreTheSumsOfTheQuants) {
  std::vector<float> x = sine_input();
  std::vector<ref::BlockQ8_K> q(2);
  ref::quantize_row_q8_k(x.data(), q.data(), 512);
  for (const auto& b : q) {
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sum += b.qs[e];
      EXPECT_EQ(b.bsums[s], sum);
    }
  }
}

// ---- known blocks -------------------------------------------------------------
// Scales are powers of two, so every expected value is exact.

TEST(RefKnownBlocks, Q4_0) {
  ref::BlockQ4_0 b{};
  b.d = h16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  ref::dequantize_row_q4_0(&b, y, 32);
  // Low nibbles 0..15 are elements 0..15, high nibbles 15..0 elements 16..31.
  EXPECT_EQ(y[0], -4.0f);  // (0 - 8) * 0.5
  EXPECT_EQ(y[8], 0.0f);
  EXPECT_EQ(y[15], 3.5f);  // (15 - 8) * 0.5
  EXPECT_EQ(y[16], 3.5f);
  EXPECT_EQ(y[31], -4.0f);
  for (int e = 0; e < 32; ++e)
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(e < 16 ? e - 8 : 23 - e)) << e;
}

TEST(RefKnownBlocks, Q4_1) {
  ref::BlockQ4_1 b{};
  b.d = h16(0.25f);
  b.m = h16(-1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  ref::dequantize_row_q4_1(&b, y, 32);
  EXPECT_EQ(y[0], -1.0f);   // 0 * 0.25 - 1
  EXPECT_EQ(y[15], 2.75f);  // 15 * 0.25 - 1
  EXPECT_EQ(y[16], 2.75f);
  EXPECT_EQ(y[31], -1.0f);
  for (int e = 0; e < 32; ++e)
    EXPECT_EQ(y[e], 0.25f * static_cast<float>(e < 16 ? e : 31 - e) - 1.0f) << e;
}

TEST(RefKnownBlocks, Q5_0) {
  ref::BlockQ5_0 b{};
  b.d = h16(1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  // Fifth bit set for elements 16..31 (bits 16..31 of the little-endian word).
  b.qh[0] = 0x00;
  b.qh[1] = 0x00;
  b.qh[2] = 0xFF;
  b.qh[3] = 0xFF;
  float y[32];
  ref::dequantize_row_q5_0(&b, y, 32);
  // q[e] = e, so y = e - 16.
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 15.0f);
  for (int e = 0; e < 32; ++e) EXPECT_EQ(y[e], static_cast<float>(e - 16)) << e;
}

TEST(RefKnownBlocks, Q5_1) {
  ref::BlockQ5_1 b{};
  b.d = h16(0.5f);
  b.m = h16(2.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  // Fifth bit set for elements 0..7 and 24..31 only.
  b.qh[0] = 0xFF;
  b.qh[1] = 0x00;
  b.qh[2] = 0x00;
  b.qh[3] = 0xFF;
  float y[32];
  ref::dequantize_row_q5_1(&b, y, 32);
  EXPECT_EQ(y[0], 10.0f);   // (0 + 16) * 0.5 + 2
  EXPECT_EQ(y[8], 6.0f);    // 8 * 0.5 + 2
  EXPECT_EQ(y[23], 5.5f);   // 7 * 0.5 + 2
  EXPECT_EQ(y[31], 17.5f);  // (15 + 16) * 0.5 + 2
  for (int e = 0; e < 32; ++e) {
    const int q = (e % 16) + ((e < 8 || e >= 24) ? 16 : 0);
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(q) + 2.0f) << e;
  }
}

TEST(RefKnownBlocks, Q8_0) {
  ref::BlockQ8_0 b{};
  b.d = h16(0.125f);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(8 * j - 127);
  float y[32];
  ref::dequantize_row_q8_0(&b, y, 32);
  EXPECT_EQ(y[0], -15.875f);  // -127 / 8
  EXPECT_EQ(y[31], 15.125f);  // 121 / 8
  for (int e = 0; e < 32; ++e) EXPECT_EQ(y[e], static_cast<float>(8 * e - 127) * 0.125f) << e;
}

TEST(RefKnownBlocks, Q2_K) {
  ref::BlockQ2_K b{};
  b.d = h16(0.5f);
  b.dmin = h16(0.25f);
  // Sub-block s: scale s, min 15 - s.
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<uint8_t>(s | ((15 - s) << 4));
  // 0xE4 = 0b11'10'01'00: the four 2-bit fields of every byte are 0, 1, 2, 3,
  // so q[e] = (e % 128) / 32.
  std::memset(b.qs, 0xE4, sizeof(b.qs));
  float y[256];
  ref::dequantize_row_q2_k(&b, y, 256);
  EXPECT_EQ(y[0], -3.75f);                      // s 0: 0.5*0*0 - 0.25*15
  EXPECT_EQ(y[40], 0.5f * 2 * 1 - 0.25f * 13);  // s 2, q 1
  EXPECT_EQ(y[255], 0.5f * 15 * 3 - 0.0f);      // s 15, q 3: 22.5
  for (int e = 0; e < 256; ++e) {
    const int s = e / 16;
    const int q = (e % 128) / 32;
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(s * q) - 0.25f * static_cast<float>(15 - s)) << e;
  }
}

TEST(RefKnownBlocks, Q3_K) {
  ref::BlockQ3_K b{};
  b.d = h16(0.25f);
  // Low scale nibbles: 1 for s < 8 (low nibble of bytes 0..7), 2 for s >= 8
  // (high nibble). High bits: 0xE4 in bytes 8..11 gives s / 4.
  // So scale - 32 = {1, 17, 34, 50} - 32 = -31, -15, 2, 18 for s / 4 = 0..3.
  for (int j = 0; j < 8; ++j) b.scales[j] = 0x21;
  for (int j = 8; j < 12; ++j) b.scales[j] = 0xE4;
  const int kScale[4] = {-31, -15, 2, 18};
  std::memset(b.qs, 0xE4, sizeof(b.qs));        // low bits (e % 128) / 32
  std::memset(b.hmask, 0x0F, sizeof(b.hmask));  // high bit set for e < 128
  float y[256];
  ref::dequantize_row_q3_k(&b, y, 256);
  EXPECT_EQ(y[0], 0.0f);               // q 0 with high bit: 0
  EXPECT_EQ(y[96], 0.25f * -15 * 3);   // s 6, q 3
  EXPECT_EQ(y[128], 0.25f * 2 * -4);   // s 8, no high bit: 0 - 4
  EXPECT_EQ(y[255], 0.25f * 18 * -1);  // s 15, 3 - 4
  for (int e = 0; e < 256; ++e) {
    const int q = (e % 128) / 32 - (e < 128 ? 0 : 4);
    EXPECT_EQ(y[e], 0.25f * static_cast<float>(kScale[e / 64]) * static_cast<float>(q)) << e;
  }
}

// Scales shared by the Q4_K and Q5_K known blocks, with what they decode to.
void fill_k4_scales(uint8_t* s) {
  const uint8_t bytes[12] = {1, 2, 3, 0x40 | 4, 5, 6, 7, 0x80 | 8, 0x21, 0x43, 0x65, 0x87};
  std::memcpy(s, bytes, 12);
}
// s < 4: low 6 bits of bytes 0..3 / 4..7. s >= 4: nibbles of bytes 8..11,
// plus top bits of byte 3 (scale 7: 1 << 4) and byte 7 (min 7: 2 << 4).
constexpr int kK4Scale[8] = {1, 2, 3, 4, 1, 3, 5, 7 + 16};
constexpr int kK4Min[8] = {5, 6, 7, 8, 2, 4, 6, 8 + 32};

TEST(RefKnownBlocks, ScaleMinK4) {
  uint8_t s[12];
  fill_k4_scales(s);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc = 0;
    uint8_t mn = 0;
    ref::scale_min_k4(j, s, &sc, &mn);
    EXPECT_EQ(sc, kK4Scale[j]) << j;
    EXPECT_EQ(mn, kK4Min[j]) << j;
  }
}

TEST(RefKnownBlocks, Q4_K) {
  ref::BlockQ4_K b{};
  b.d = h16(0.5f);
  b.dmin = h16(0.125f);
  fill_k4_scales(b.scales);
  // Every 32-byte group: low nibble l % 16 (even sub-blocks), high 15 - l % 16 (odd).
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  float y[256];
  ref::dequantize_row_q4_k(&b, y, 256);
  EXPECT_EQ(y[0], -0.625f);  // 0.5*1*0 - 0.125*5
  EXPECT_EQ(y[32 + 1], 0.5f * 2 * 14 - 0.125f * 6);
  EXPECT_EQ(y[255], 0.5f * 23 * 0 - 0.125f * 40);  // s 7, l 31: 15 - 15
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const int l = e % 32;
    const int q = s % 2 == 0 ? l % 16 : 15 - l % 16;
    EXPECT_EQ(y[e],
              0.5f * static_cast<float>(kK4Scale[s] * q) - 0.125f * static_cast<float>(kK4Min[s]))
        << e;
  }
}

TEST(RefKnownBlocks, Q5_K) {
  ref::BlockQ5_K b{};
  b.d = h16(0.5f);
  b.dmin = h16(0.125f);
  fill_k4_scales(b.scales);
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  // qh[l] = l: bit s of qh[l] is the fifth bit of element 32s + l.
  for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(l);
  float y[256];
  ref::dequantize_row_q5_k(&b, y, 256);
  EXPECT_EQ(y[1], 0.5f * 1 * 17 - 0.125f * 5);              // s 0, l 1: 1 + 16
  EXPECT_EQ(y[32 + 2], 0.5f * 2 * (13 + 16) - 0.125f * 6);  // s 1, l 2: bit 1 of 2
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const int l = e % 32;
    const int q = (s % 2 == 0 ? l % 16 : 15 - l % 16) + 16 * ((l >> s) & 1);
    EXPECT_EQ(y[e],
              0.5f * static_cast<float>(kK4Scale[s] * q) - 0.125f * static_cast<float>(kK4Min[s]))
        << e;
  }
}

TEST(RefKnownBlocks, Q6_K) {
  ref::BlockQ6_K b{};
  b.d = h16(0.25f);
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s - 8);
  // Low nibbles 1, high nibbles 2; qh fields 0, 1, 2, 3. Quarter k of each
  // half: low 4 bits 1, 1, 2, 2 and high 2 bits k -> q - 32 = -31, -15, 2, 18.
  std::memset(b.ql, 0x21, sizeof(b.ql));
  std::memset(b.qh, 0xE4, sizeof(b.qh));
  const int kQ[4] = {-31, -15, 2, 18};
  float y[256];
  ref::dequantize_row_q6_k(&b, y, 256);
  EXPECT_EQ(y[0], 0.25f * -8 * -31);  // 62
  EXPECT_EQ(y[255], 0.25f * 7 * 18);  // 31.5
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.25f * static_cast<float>(e / 16 - 8) * static_cast<float>(kQ[(e % 128) / 32]))
        << e;
  }
}

TEST(RefKnownBlocks, Q8_K) {
  ref::BlockQ8_K b{};
  b.d = 0.03125f;
  for (int e = 0; e < 256; ++e) b.qs[e] = static_cast<int8_t>(e % 255 - 127);
  float y[256];
  ref::dequantize_row_q8_k(&b, y, 256);
  EXPECT_EQ(y[0], -3.96875f);  // -127 / 32
  EXPECT_EQ(y[254], 3.96875f);
  EXPECT_EQ(y[255], -3.96875f);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], static_cast<float>(e % 255 - 127) / 32.0f) << e;
}

TEST(RefKnownBlocks, F16AndBF16) {
  const uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x3555};
  const float hv[] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 0x1p-14f, 0x1.554p-2f};
  const uint16_t b[] = {0x3F80, 0xC040, 0x7F7F, 0x0001, 0x3EAB};
  const float bv[] = {1.0f, -3.0f, 0x1.FEp127f, 0x1p-133f, 0x1.56p-2f};
  std::vector<uint8_t> bytes(sizeof(h));
  std::memcpy(bytes.data(), h, sizeof(h));
  const std::vector<float> y = dequantize(DType::kF16, bytes, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], hv[i]) << i;
  bytes.resize(sizeof(b));
  std::memcpy(bytes.data(), b, sizeof(b));
  const std::vector<float> yb = dequantize(DType::kBF16, bytes, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(yb[i], bv[i]) << i;
}

// ---- fp16 / bf16 ----------------------------------------------------------------

// Value of a half computed independently, in double.
double half_value(uint16_t h) {
  const int sign = h >> 15;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return sign ? -mag : mag;
}

bool is_half_nan(uint16_t h) {
  return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
}

TEST(RefFp16, AllHalvesWidenExactlyAndRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fp16_to_fp32(h);
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    if (is_half_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << i;
      ASSERT_NE(bits & 0x00400000u, 0u) << "NaN not quiet: " << i;
      ASSERT_EQ(bits >> 31, static_cast<uint32_t>(h >> 15)) << i;
      ASSERT_EQ(fp32_to_fp16(f), (h & 0x8000) | 0x7E00) << i;
      continue;
    }
    if ((h & 0x7FFF) == 0x7C00) {
      ASSERT_TRUE(std::isinf(f)) << i;
    } else {
      ASSERT_EQ(static_cast<double>(f), half_value(h)) << i;
    }
    ASSERT_EQ(bits >> 31, static_cast<uint32_t>(h >> 15)) << "sign of " << i;
    ASSERT_EQ(fp32_to_fp16(f), h) << i;
  }
}

TEST(RefFp16, TiesRoundToEven) {
  // Midpoints between consecutive positive finite halves (exact in fp32),
  // across subnormals, normals and every binade boundary.
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const double lo = half_value(static_cast<uint16_t>(h));
    const double hi = half_value(static_cast<uint16_t>(h + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h % 2 == 0) ? static_cast<uint16_t>(h) : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(fp32_to_fp16(mid), even) << h;
    ASSERT_EQ(fp32_to_fp16(-mid), even | 0x8000) << h;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 1e9f)), h + 1) << h;
  }
}

TEST(RefFp16, OverflowUnderflowInfNan) {
  EXPECT_EQ(h16(65504.0f), 0x7BFF);
  EXPECT_EQ(h16(65519.99f), 0x7BFF);
  EXPECT_EQ(h16(65520.0f), 0x7C00);  // tie with the next (inf) step: even is inf
  EXPECT_EQ(h16(1e10f), 0x7C00);
  EXPECT_EQ(h16(-1e10f), 0xFC00);
  EXPECT_EQ(h16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(h16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(h16(0x1p-25f), 0x0000);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(h16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(h16(0x1.8p-24f), 0x0002);  // 1.5 ulp: tie to 2
  EXPECT_EQ(h16(-0x1p-30f), 0x8000);
  EXPECT_EQ(h16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(h16(-0.0f), 0x8000);
  // Every NaN, quiet or signalling, any payload, becomes the canonical 0x7E00.
  for (uint32_t bits : {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FC01234u}) {
    EXPECT_EQ(h16(std::bit_cast<float>(bits)), 0x7E00) << bits;
    EXPECT_EQ(h16(std::bit_cast<float>(bits | 0x80000000u)), 0xFE00) << bits;
  }
}

TEST(RefFp16, RandomFloatsRoundToNearest) {
  // Against a search over the half grid in double; halves ordered by code.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0x477FEFFFu);  // |f| < 65520
  for (int i = 0; i < 20000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    uint32_t lo = 0;
    uint32_t hi = 0x7BFF;
    while (lo < hi) {  // largest code with value <= f
      const uint32_t mid = (lo + hi + 1) / 2;
      if (half_value(static_cast<uint16_t>(mid)) <= f)
        lo = mid;
      else
        hi = mid - 1;
    }
    uint32_t want = lo;
    if (lo < 0x7BFF) {
      const double dlo = f - half_value(static_cast<uint16_t>(lo));
      const double dhi = half_value(static_cast<uint16_t>(lo + 1)) - f;
      if (dhi < dlo || (dhi == dlo && lo % 2 == 1)) want = lo + 1;
    }
    ASSERT_EQ(fp32_to_fp16(f), want) << f;
  }
}

TEST(RefBf16, AllPatternsRoundTripAndNansStayQuiet) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = bf16_to_fp32(h);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), i << 16);
    const bool nan = (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
    ASSERT_EQ(fp32_to_bf16(f), nan ? (h | 0x40) : h) << i;
  }
}

TEST(RefBf16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3F80);    // tie, 0x3F80 even
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1.8p-7f), 0x3F82);  // tie between 0x3F81 and 0x3F82
  EXPECT_EQ(fp32_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(-1.0f - 0x1p-8f), 0xBF80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::denorm_min()),
            0x0000);                           // subnormal, not flushed:
  EXPECT_EQ(fp32_to_bf16(0x1p-130f), 0x0008);  // 2^19 * 2^-149: kept exactly
  // A NaN whose payload lives only in the dropped bits must stay a NaN.
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0xFF800001u)), 0xFFC0);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7FC12345u)), 0x7FC1);
  // Random floats against nearest-even picked in double.
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t bits = rng() & 0x7F7FFFFFu;  // finite, below FLT_MAX's binade top
    const float f = std::bit_cast<float>(bits);
    const uint32_t lo = bits & 0xFFFF0000u;
    const double dlo = static_cast<double>(f) - std::bit_cast<float>(lo);
    // The step above the largest finite bf16 is 2^128 (it rounds to inf).
    const double next =
        lo == 0x7F7F0000u ? std::ldexp(1.0, 128) : std::bit_cast<float>(lo + 0x10000u);
    const double dhi = next - f;
    const uint32_t want =
        (dhi < dlo || (dhi == dlo && ((lo >> 16) & 1))) ? (lo >> 16) + 1 : lo >> 16;
    ASSERT_EQ(fp32_to_bf16(f), want) << bits;
  }
}

}  // namespace
}  // namespace loom

// FP8 E4M3: every code decodes and encodes back to itself, and the encoder
// picks the nearest code (ties to the even code) for values between them.
TEST(RefFp8, EveryCodeRoundTripsAndEncodingIsNearest) {
  std::vector<std::pair<float, int>> finite;  // (value, code) of the positive finite codes
  for (int c = 0; c < 256; ++c) {
    const float v = loom::ref::fp8_e4m3_to_fp32(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(loom::ref::fp32_to_fp8_e4m3(v) & 0x7F, 0x7F);
      continue;
    }
    EXPECT_EQ(loom::ref::fp32_to_fp8_e4m3(v), c) << "code " << c << " value " << v;
    if (c < 0x80) finite.push_back({v, c});
  }
  EXPECT_EQ(loom::ref::fp8_e4m3_to_fp32(0x7E), 448.0f);
  EXPECT_EQ(loom::ref::fp8_e4m3_to_fp32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(loom::ref::fp32_to_fp8_e4m3(1e6f), 0x7E);  // saturates
  EXPECT_EQ(loom::ref::fp32_to_fp8_e4m3(-1e6f), 0xFE);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-9.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(1.0f, static_cast<int>(std::floor(u(rng)))) *
                    std::uniform_real_distribution<float>(1.0f, 2.0f)(rng);
    // Brute force: the nearest positive finite code; on a tie, the even one.
    int best = 0;
    float bd = std::numeric_limits<float>::infinity();
    for (auto [v, c] : finite) {
      const float d = std::fabs(v - x);
      if (d < bd || (d == bd && (c & 1) == 0)) {
        bd = d;
        best = c;
      }
    }
    if (x > 448.0f) best = 0x7E;
    EXPECT_EQ(loom::ref::fp32_to_fp8_e4m3(x), best) << x;
    EXPECT_EQ(loom::ref::fp32_to_fp8_e4m3(-x), best | 0x80) << -x;
  }
}
