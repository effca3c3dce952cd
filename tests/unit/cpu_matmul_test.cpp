// cpu/matmul: the quantized matrix products at every ISA level this CPU has,
// against a reference built from cpu/ref.
//
// Reference: dequantize the weights (ref::dequantize_row) and the converted
// activations (the values the kernel actually sees) and take the dot product
// in double. The kernels' integer sums are exact, so the only differences are
// fp32 roundings (block scale products, accumulation, and the reference's own
// fp32 dequantization); the normalized error
//     |y - y_ref| / sum_i |w_i x_i|
// is bounded per dtype (max_error below: 2e-6, or 1e-5 for the formats
// with mins). Shapes: n of 1, 3 and 7 blocks; 1, 3, 17 and 69 rows;
// T = 1, 2, 3 (GEMV tiles), 5 and 7 (on AVX-512 GEMV tiles in chunks of 4
// over row blocks), 8 and 11 (AVX-512: the repacking GEMM); full and partial row
// ranges; and T = 1700 (several GEMM token blocks). Weights start at an odd
// address (no alignment assumed); outputs outside [r0, r1) x [0, T) carry a
// sentinel that must survive.
//
// Levels: scalar, AVX2, AVX-512 with and without its VBMI paths; levels the
// CPU lacks are skipped.
//
// The activation conversion is checked bit for bit against
// ref::quantize_row (Q8_0: quants and fp16 scale; Q8_K: the whole block).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"
#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "cpu/ref/quants.h"

namespace loom {
namespace {

using cpu::Isa;

constexpr DType kQuantTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                 DType::kQ8_0, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                                 DType::kQ5_K, DType::kQ6_K};
// ISA levels, plus AVX-512 without its VBMI byte-permute paths.
enum class Level { kScalar, kAvx2, kAvx512NoVbmi, kAvx512 };
constexpr Level kLevels[] = {Level::kScalar, Level::kAvx2, Level::kAvx512NoVbmi, Level::kAvx512};

Isa level_isa(Level l) {
  switch (l) {
    case Level::kScalar: return Isa::kScalar;
    case Level::kAvx2: return Isa::kAvx2;
    default: return Isa::kAvx512;
  }
}
const char* level_name(Level l) {
  return l == Level::kAvx512NoVbmi ? "avx512_novbmi" : cpu::isa_name(level_isa(l));
}

// Normalized error bounds. Every kernel sums integers exactly; what is left is
// fp32 rounding of a few products per block and of the running sum over at
// most 7 blocks (~1e-7 each), plus, for the formats with
// mins, the cancellation between d*sum(sc*q*x) and dmin*sum(mn*x), each of
// which can be a few times larger than sum|w x|.
// Measured worst cases are below 2e-7, except ~1e-6 for Q4_1/Q5_1 on AVX2
// (offset term summed apart from the block products).
double max_error(DType t) {
  switch (t) {
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ4_K:
    case DType::kQ5_K: return 1e-5;
    default: return 2e-6;
  }
}

int64_t block_size(DType t) {
  return static_cast<int64_t>(traits(t).block_size);
}
size_t row_bytes(DType t, int64_t n) {
  return static_cast<size_t>(*dtype_row_bytes(t, static_cast<uint64_t>(n)));
}

// Floats like a layer's inputs: mostly N(0, 1), a few large outliers, some
// exact zeros and a block that is zero throughout (scale 0).
std::vector<float> random_floats(std::mt19937& rng, int64_t count, bool outliers) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 199);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) {
    x = normal(rng);
    const int p = pick(rng);
    if (outliers && p == 0) x *= 30.0f;
    if (p == 1) x = 0.0f;
  }
  return v;
}

// A weight matrix [rows_max, n] quantized once per (dtype, n) and shared by
// all ISA levels, plus its dequantized copy.
struct Weights {
  std::vector<uint8_t> bytes;  // 1 byte of offset, then the rows: never aligned
  std::vector<float> values;   // [rows_max, n]
  const uint8_t* data() const { return bytes.data() + 1; }
};

constexpr int64_t kRowsMax = 69;

const Weights& weights_for(DType t, int64_t n) {
  static std::map<std::pair<DType, int64_t>, Weights> cache;
  auto [it, inserted] = cache.try_emplace({t, n});
  Weights& w = it->second;
  if (!inserted) return w;
  std::mt19937 rng(static_cast<uint32_t>(n * 131 + static_cast<int64_t>(t)));
  const size_t rb = row_bytes(t, n);
  w.bytes.assign(1 + rb * kRowsMax, 0);
  w.values.resize(static_cast<size_t>(n * kRowsMax));
  for (int64_t r = 0; r < kRowsMax; ++r) {
    std::vector<float> row = random_floats(rng, n, false);
    if (r == 5) std::fill(row.begin(), row.begin() + block_size(t), 0.0f);  // an all-zero block
    std::vector<uint8_t> q(rb);
    EXPECT_TRUE(ref::quantize_row(t, row.data(), q.data(), n).ok());
    std::memcpy(w.bytes.data() + 1 + r * rb, q.data(), rb);
    EXPECT_TRUE(ref::dequantize_row(t, q.data(), w.values.data() + r * n, n).ok());
  }
  return w;
}

// The values the kernel sees for one converted activation row.
std::vector<float> activation_values(DType w, const uint8_t* act, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  if (cpu::activation_type(w) == DType::kQ8_K) {
    std::vector<ref::BlockQ8_K> blocks(static_cast<size_t>(n / ref::kQK_K));
    std::memcpy(blocks.data(), act, blocks.size() * sizeof(ref::BlockQ8_K));
    ref::dequantize_row_q8_k(blocks.data(), v.data(), n);
    return v;
  }
  // Split Q8_0 (cpu/matmul_internal.h): quants [n], fp32 scales [n / 32].
  for (int64_t i = 0; i < n; ++i) {
    float d;
    std::memcpy(&d, act + n + 4 * (i / ref::kQK), 4);
    v[static_cast<size_t>(i)] = static_cast<float>(static_cast<int8_t>(act[i])) * d;
  }
  return v;
}

class QuantMatmulTest : public ::testing::TestWithParam<std::tuple<DType, Level>> {
 protected:
  void SetUp() override {
    saved_ = cpu::active_isa();
    const Level level = std::get<1>(GetParam());
    const Isa isa = level_isa(level);
    if (!cpu::set_isa(isa)) GTEST_SKIP() << "this CPU has no " << cpu::isa_name(isa);
    if (level == Level::kAvx512 && !cpu::avx512::set_vbmi(true))
      GTEST_SKIP() << "this CPU has no AVX512_VBMI";
    if (level == Level::kAvx512NoVbmi) {
      ASSERT_TRUE(cpu::avx512::set_vbmi(false));
    }
  }
  void TearDown() override {
    if (std::get<1>(GetParam()) == Level::kAvx512NoVbmi) (void)cpu::avx512::set_vbmi(true);
    ASSERT_TRUE(cpu::set_isa(saved_));
  }

 private:
  Isa saved_ = Isa::kScalar;
};

// Runs matmul_rows on rows [r0, r1) of `rows` weight rows and T activation
// rows (acts: converted rows x_rb apart; xv: their values) and checks every
// output against the double-precision reference. Returns the worst error.
double check_matmul(DType t, const Weights& w, int64_t n, int64_t rows, const uint8_t* acts,
                    size_t x_rb, const std::vector<std::vector<float>>& xv, int64_t T, int64_t r0,
                    int64_t r1) {
  const size_t w_rb = row_bytes(t, n);
  const int64_t ldy = rows + 3;
  constexpr float kSentinel = -12345.5f;
  std::vector<float> y(static_cast<size_t>(ldy * (T + 1)), kSentinel);
  cpu::matmul_rows(t, w.data(), w_rb, acts, x_rb, T, y.data(), ldy, n, r0, r1);
  double worst = 0.0;
  for (int64_t s = 0; s <= T; ++s) {
    for (int64_t r = 0; r < ldy; ++r) {
      const float got = y[static_cast<size_t>(s * ldy + r)];
      const bool inside = s < T && r >= r0 && r < r1;
      if (!inside) {
        EXPECT_EQ(got, kSentinel) << "wrote outside [r0, r1) x [0, T): t=" << s << " r=" << r;
        if (got != kSentinel) return 1.0;
        continue;
      }
      double expect = 0.0;
      double scale = 0.0;
      const std::vector<float>& xs = xv[static_cast<size_t>(s) % xv.size()];
      for (int64_t i = 0; i < n; ++i) {
        const double p = static_cast<double>(w.values[static_cast<size_t>(r * n + i)]) *
                         xs[static_cast<size_t>(i)];
        expect += p;
        scale += std::fabs(p);
      }
      EXPECT_TRUE(std::isfinite(got)) << "t=" << s << " r=" << r;
      const double err = std::fabs(got - expect) / (scale + 1e-30);
      worst = std::max(worst, err);
      if (!(err <= max_error(t))) {
        ADD_FAILURE() << "n=" << n << " rows=" << rows << " T=" << T << " r0=" << r0 << " r1=" << r1
                      << " t=" << s << " r=" << r << ": got " << got << ", expected " << expect
                      << " (error " << err << ")";
        return err;
      }
    }
  }
  return worst;
}

// 64-byte aligned start inside a byte vector.
uint8_t* align64(std::vector<uint8_t>& v) {
  return v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64;
}

TEST_P(QuantMatmulTest, MatchesReference) {
  const DType t = std::get<0>(GetParam());
  ASSERT_TRUE(cpu::matmul_supported(t));
  double worst = 0.0;
  for (const int64_t n_blocks : {1, 3, 7}) {
    const int64_t n = n_blocks * block_size(t);
    const Weights& w = weights_for(t, n);

    // Activations: 11 rows, converted at a stride larger than one row.
    constexpr int64_t kTMax = 11;
    std::mt19937 rng(static_cast<uint32_t>(7 + n));
    const std::vector<float> x = random_floats(rng, n * kTMax, true);
    const size_t x_rb = cpu::activation_row_bytes(t, n) + 64;
    std::vector<uint8_t> act(x_rb * kTMax + 64);
    uint8_t* act0 = align64(act);
    std::vector<std::vector<float>> xv;
    for (int64_t s = 0; s < kTMax; ++s) {
      cpu::convert_activation(t, x.data() + s * n, act0 + s * x_rb, n);
      xv.push_back(activation_values(t, act0 + s * x_rb, n));
    }

    for (const int64_t rows : {1, 3, 17, 69}) {
      for (const int64_t T : {1, 2, 3, 5, 7, 8, 11}) {
        const std::pair<int64_t, int64_t> ranges[] = {{0, rows}, {rows / 3, rows - rows / 4}};
        for (const auto& [r0, r1] : ranges) {
          const double err = check_matmul(t, w, n, rows, act0, x_rb, xv, T, r0, r1);
          worst = std::max(worst, err);
          if (HasFailure()) return;
        }
      }
    }
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", worst);
  RecordProperty("worst_normalized_error", buf);
}

// Many activation rows (the GEMM packs them in blocks of ~1 MB): n of one
// block keeps it cheap; 1700 rows give more than one block.
TEST_P(QuantMatmulTest, ManyTokens) {
  const DType t = std::get<0>(GetParam());
  const int64_t n = block_size(t);
  const Weights& w = weights_for(t, n);
  constexpr int64_t kT = 1700;
  std::mt19937 rng(5);
  const std::vector<float> x = random_floats(rng, n * kT, true);
  const size_t x_rb = cpu::activation_row_bytes(t, n);
  std::vector<uint8_t> act(x_rb * kT + 64);
  uint8_t* act0 = align64(act);
  std::vector<std::vector<float>> xv;
  for (int64_t s = 0; s < kT; ++s) {
    cpu::convert_activation(t, x.data() + s * n, act0 + s * x_rb, n);
    xv.push_back(activation_values(t, act0 + s * x_rb, n));
  }
  check_matmul(t, w, n, 5, act0, x_rb, xv, kT, 0, 5);
}

TEST_P(QuantMatmulTest, ActivationMatchesRefQuantizer) {
  const DType t = std::get<0>(GetParam());
  const DType a = cpu::activation_type(t);
  const int64_t bs = block_size(a);
  const int64_t n = 48 * bs;
  std::mt19937 rng(99);
  std::vector<float> x = random_floats(rng, n, true);
  // Blocks 6.. at scales from 1e-6 to 1e6, so that every rounding path is taken.
  std::uniform_real_distribution<float> exponent(-6.0f, 6.0f);
  for (int64_t b = 6; b < 48; ++b) {
    const float scale = std::pow(10.0f, exponent(rng));
    for (int64_t i = 0; i < bs; ++i) x[static_cast<size_t>(b * bs + i)] *= scale;
  }
  // Block 1 all zero; block 2 with exact .5 ties after scaling (amax 127
  // makes the scale 1); block 3 with its extreme negative.
  std::fill(x.begin() + bs, x.begin() + 2 * bs, 0.0f);
  for (int64_t i = 0; i < bs; ++i)
    x[static_cast<size_t>(2 * bs + i)] = static_cast<float>(i % 9) - 3.5f;
  x[static_cast<size_t>(2 * bs)] = 127.0f;
  x[static_cast<size_t>(3 * bs + 5)] = -1000.0f;

  std::vector<uint8_t> got(cpu::activation_row_bytes(t, n) + 64);
  uint8_t* out = align64(got);
  cpu::convert_activation(t, x.data(), out, n);
  std::vector<uint8_t> want(row_bytes(a, n));
  ASSERT_TRUE(ref::quantize_row(a, x.data(), want.data(), n).ok());

  if (a == DType::kQ8_K) {
    ASSERT_GE(cpu::activation_row_bytes(t, n), want.size());
    EXPECT_EQ(std::memcmp(out, want.data(), want.size()), 0);
    return;
  }
  ASSERT_EQ(a, DType::kQ8_0);
  ASSERT_GE(cpu::activation_row_bytes(t, n), static_cast<size_t>(n + 8 * (n / 32)));
  const int64_t nb = n / ref::kQK;
  for (int64_t b = 0; b < nb; ++b) {
    ref::BlockQ8_0 blk;
    std::memcpy(&blk, want.data() + b * sizeof(blk), sizeof(blk));
    EXPECT_EQ(std::memcmp(out + b * ref::kQK, blk.qs, ref::kQK), 0) << "quants of block " << b;
    float d;
    float s;
    std::memcpy(&d, out + n + 4 * b, 4);
    std::memcpy(&s, out + n + 4 * nb + 4 * b, 4);
    EXPECT_EQ(d, ref::fp16_to_fp32(blk.d)) << "scale of block " << b;
    int sum = 0;
    for (int j = 0; j < ref::kQK; ++j) sum += blk.qs[j];
    EXPECT_EQ(s, d * static_cast<float>(sum)) << "sum of block " << b;
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, Level>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" +
         level_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllQuantTypes, QuantMatmulTest,
                         ::testing::Combine(::testing::ValuesIn(kQuantTypes),
                                            ::testing::ValuesIn(kLevels)),
                         param_name);

TEST(QuantMatmul, IsaLevels) {
  EXPECT_LE(cpu::active_isa(), cpu::detected_isa());
  EXPECT_TRUE(cpu::set_isa(Isa::kScalar));
  EXPECT_EQ(cpu::active_isa(), Isa::kScalar);
  EXPECT_TRUE(cpu::set_isa(cpu::detected_isa()));
  EXPECT_STREQ(cpu::isa_name(Isa::kAvx512), "avx512");
}

// F16 weights take their activations rounded to F16 (SIMD conversion since
// the scalar loop cost 2.6% of an F16 prefill): bit for bit what
// ref::quantize_row gives, at every ISA level, over F16's subnormals,
// rounding ties, values past its range, and a length with a tail.
TEST(QuantMatmul, F16ActivationsMatchRefRounding) {
  struct RestoreIsa {
    Isa saved = cpu::active_isa();
    ~RestoreIsa() { (void)cpu::set_isa(saved); }
  } restore;  // also when an assertion below returns early
  constexpr int64_t n = 1000;
  std::mt19937 rng(7);
  std::vector<float> x = random_floats(rng, n, true);
  std::uniform_real_distribution<float> exponent(-9.0f, 5.5f);
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] *= std::pow(10.0f, exponent(rng));
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 65504.0f;               // largest F16
  x[3] = 65520.0f;               // rounds up past it: infinity
  x[4] = -1.0e6f;                // -infinity
  x[5] = 5.96e-8f;               // near the smallest subnormal
  x[6] = 2.98e-8f;               // a tie to zero
  x[7] = 1.0f + 1.0f / 2048.0f;  // a tie between 1 and the next F16: even (1)
  x[8] = 1.0f + 3.0f / 2048.0f;  // a tie: rounds up to even
  std::vector<uint16_t> want(n);
  ASSERT_TRUE(ref::quantize_row(DType::kF16, x.data(), want.data(), n).ok());
  for (const Level level : {Level::kScalar, Level::kAvx2, Level::kAvx512}) {
    const Isa isa = level_isa(level);
    if (!cpu::set_isa(isa)) continue;
    std::vector<uint16_t> got(n + 8, 0xABCD);
    cpu::convert_activation(DType::kF16, x.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)])
          << cpu::isa_name(isa) << " element " << i << " = " << x[static_cast<size_t>(i)];
    for (int64_t i = n; i < n + 8; ++i)
      EXPECT_EQ(got[static_cast<size_t>(i)], 0xABCD) << "past the row";
  }
}

TEST(QuantMatmul, ActivationTypes) {
  EXPECT_EQ(cpu::activation_type(DType::kQ4_0), DType::kQ8_0);
  EXPECT_EQ(cpu::activation_type(DType::kQ5_1), DType::kQ8_0);
  EXPECT_EQ(cpu::activation_type(DType::kQ4_K), DType::kQ8_K);
  EXPECT_EQ(cpu::activation_type(DType::kQ6_K), DType::kQ8_K);
  EXPECT_EQ(cpu::activation_type(DType::kF16), DType::kF16);
  EXPECT_FALSE(cpu::matmul_supported(DType::kIQ2_XXS));
  EXPECT_FALSE(cpu::matmul_supported(DType::kQ8_K));
  EXPECT_EQ(cpu::activation_row_bytes(DType::kQ4_K, 512) % 64, 0u);
  EXPECT_EQ(cpu::activation_row_bytes(DType::kQ4_0, 64) % 64, 0u);
}

}  // namespace
}  // namespace loom
