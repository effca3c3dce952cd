// The CPU ops of cpu/ops.h (norms, activations, softmax, RoPE, KV cache,
// paged attention) against their scalar references in cpu/ref/ops_ref.h, at
// every ISA level this CPU has. Every output buffer has sentinel floats on
// both sides that must survive, and every output must be finite.
//
// Error bounds (inputs as generated below):
//   add, get_row, kv_store       exact (bit for bit)
//   rms_norm                     |err| <= 1e-6 |ref|   (double sum of squares, float scale)
//   silu_mul                     |err| <= 2e-6 |ref| + 1e-30 (exp within ~2e-7 relative)
//   softmax                      |err| <= 5e-6 |ref| + 1e-30: x - max is rounded to float
//                                (|x - max| <= 60 here: up to 60 * 2^-24 = 3.6e-6 in the exponent)
//   rope                         |err| <= 1e-6 (|x| <= 1; same float expressions as the reference)
//   attention                    normalized error sum (o - r)^2 / sum r^2 <= 1e-11 and
//                                |err| <= 2e-5 max|ref| (fp32 dot products and sums vs double)
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "cpu/ref/fp16.h"
#include "cpu/ref/fp8.h"
#include "cpu/ref/ops_ref.h"
#include "cpu/ref/quants.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/runtime/kv_cache.h"
#include "tests/kv_tier_checks.h"

namespace loom {
namespace {

using cpu::Isa;

constexpr int64_t kGuard = 16;                   // sentinel floats on each side of an output
constexpr uint32_t kSentinelBits = 0xC2F6E979u;  // -123.456f: no kernel writes this by chance

// A float buffer of n elements with kGuard sentinels before and after.
class Guarded {
 public:
  explicit Guarded(int64_t n)
      : n_(n), buf_(static_cast<size_t>(n + 2 * kGuard), std::bit_cast<float>(kSentinelBits)) {}
  Guarded(int64_t n, const std::vector<float>& init) : Guarded(n) {
    std::copy(init.begin(), init.end(), data());
  }
  float* data() { return buf_.data() + kGuard; }
  const float* data() const { return buf_.data() + kGuard; }
  std::vector<float> values() const { return {data(), data() + n_}; }
  bool sentinel(int64_t i) const { return std::bit_cast<uint32_t>(data()[i]) == kSentinelBits; }
  // True when all guards before and after the n elements are intact.
  bool guards_intact() const {
    for (int64_t i = -kGuard; i < 0; ++i) {
      if (!sentinel(i)) return false;
    }
    for (int64_t i = n_; i < n_ + kGuard; ++i) {
      if (!sentinel(i)) return false;
    }
    return true;
  }

 private:
  int64_t n_;
  std::vector<float> buf_;
};

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> normal_floats(std::mt19937& rng, int64_t n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

// Largest |got - want| / (|want| + floor) over n elements (index in *where).
double max_rel_error(const float* got, const float* want, int64_t n, double floor,
                     int64_t* where = nullptr) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]) /
                     (std::fabs(static_cast<double>(want[i])) + floor);
    if (e > worst) {
      worst = e;
      if (where) *where = i;
    }
  }
  return worst;
}

constexpr int64_t kSizes[] = {1, 3, 17, 64, 65, 257, 4099};

// ---- fixture: one ISA level per instantiation ------------------------------------

class CpuOpsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    saved_ = cpu::active_isa();
    if (!cpu::set_isa(GetParam())) GTEST_SKIP() << "this CPU has no " << cpu::isa_name(GetParam());
  }
  void TearDown() override { ASSERT_TRUE(cpu::set_isa(saved_)); }

 private:
  Isa saved_ = Isa::kScalar;
};

INSTANTIATE_TEST_SUITE_P(Isa, CpuOpsTest, ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& p) {
                           return std::string(cpu::isa_name(p.param));
                         });

// ---- element-wise ops --------------------------------------------------------------

TEST_P(CpuOpsTest, RmsNorm) {
  std::mt19937 rng(1);
  for (const int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = normal_floats(rng, n, 3.0f);
    const std::vector<float> w = random_floats(rng, n, -2.0f, 2.0f);
    std::vector<float> want(static_cast<size_t>(n));
    ref::rms_norm(x.data(), w.data(), 1e-5f, want.data(), n);

    Guarded y(n);
    cpu::rms_norm(x.data(), w.data(), 1e-5f, y.data(), n);
    EXPECT_TRUE(y.guards_intact());
    EXPECT_TRUE(all_finite(y.data(), n));
    EXPECT_LE(max_rel_error(y.data(), want.data(), n, 1e-30), 1e-6);

    // In place (y aliases x).
    Guarded inplace(n, x);
    cpu::rms_norm(inplace.data(), w.data(), 1e-5f, inplace.data(), n);
    EXPECT_TRUE(inplace.guards_intact());
    EXPECT_LE(max_rel_error(inplace.data(), want.data(), n, 1e-30), 1e-6);
  }
}

TEST_P(CpuOpsTest, SiluMul) {
  std::mt19937 rng(2);
  for (const int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> g = random_floats(rng, n, -20.0f, 20.0f);
    // Extremes: exp(-g) overflows or underflows without producing NaN.
    const float extremes[] = {-1000.0f, -100.0f, -88.5f, 0.0f, 88.5f, 100.0f, 1000.0f};
    for (size_t i = 0; i < std::size(extremes) && static_cast<int64_t>(i) < n; ++i)
      g[i * 7 % static_cast<size_t>(n)] = extremes[i];
    const std::vector<float> u = random_floats(rng, n, -3.0f, 3.0f);
    std::vector<float> want(static_cast<size_t>(n));
    ref::silu_mul(g.data(), u.data(), want.data(), n);

    Guarded out(n);
    cpu::silu_mul(g.data(), u.data(), out.data(), n);
    EXPECT_TRUE(out.guards_intact());
    EXPECT_TRUE(all_finite(out.data(), n));
    int64_t at = 0;
    EXPECT_LE(max_rel_error(out.data(), want.data(), n, 1e-30, &at), 2e-6) << "at gate " << g[at];

    // In place over gate.
    Guarded inplace(n, g);
    cpu::silu_mul(inplace.data(), u.data(), inplace.data(), n);
    EXPECT_TRUE(inplace.guards_intact());
    EXPECT_LE(max_rel_error(inplace.data(), want.data(), n, 1e-30), 2e-6);
  }
}

TEST_P(CpuOpsTest, Add) {
  std::mt19937 rng(3);
  for (const int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> a = normal_floats(rng, n, 1.0f);
    const std::vector<float> b = normal_floats(rng, n, 1.0f);
    std::vector<float> want(static_cast<size_t>(n));
    ref::add(a.data(), b.data(), want.data(), n);
    Guarded out(n);
    cpu::add(a.data(), b.data(), out.data(), n);
    EXPECT_TRUE(out.guards_intact());
    EXPECT_EQ(out.values(), want);
    Guarded inplace(n, a);
    cpu::add(inplace.data(), b.data(), inplace.data(), n);
    EXPECT_TRUE(inplace.guards_intact());
    EXPECT_EQ(inplace.values(), want);
  }
}

TEST_P(CpuOpsTest, Softmax) {
  std::mt19937 rng(4);
  for (const int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> x = random_floats(rng, n, -30.0f, 30.0f);
    if (n > 2) x[1] = -INFINITY;  // a masked logit
    std::vector<float> want = x;
    ref::softmax(want.data(), n);
    Guarded y(n, x);
    cpu::softmax(y.data(), n);
    EXPECT_TRUE(y.guards_intact());
    EXPECT_TRUE(all_finite(y.data(), n));
    EXPECT_LE(max_rel_error(y.data(), want.data(), n, 1e-30), 5e-6);
    const double sum = std::accumulate(y.data(), y.data() + n, 0.0);
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST_P(CpuOpsTest, GetRow) {
  std::mt19937 rng(5);
  for (const DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                        DType::kQ4_K, DType::kQ6_K}) {
    const int64_t n = 512;
    const int64_t rows = 3;
    const size_t rb = static_cast<size_t>(*dtype_row_bytes(t, n));
    std::vector<uint8_t> w(rb * rows);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> v = normal_floats(rng, n, 1.0f);
      ASSERT_TRUE(ref::quantize_row(t, v.data(), w.data() + r * rb, n).ok());
    }
    std::vector<float> want(static_cast<size_t>(n));
    ASSERT_TRUE(ref::dequantize_row(t, w.data() + 2 * rb, want.data(), n).ok());
    Guarded out(n);
    cpu::get_row(t, w.data(), rb, 2, out.data(), n);
    EXPECT_TRUE(out.guards_intact()) << dtype_name(t);
    EXPECT_EQ(out.values(), want) << dtype_name(t);
  }
}

// ---- RoPE ----------------------------------------------------------------------------

struct RopeCase {
  const char* name;
  int64_t head_dim;
  cpu::RopeParams p;
};

TEST_P(CpuOpsTest, Rope) {
  std::mt19937 rng(6);
  std::vector<float> factors = random_floats(rng, 64, 1.0f, 8.0f);
  std::vector<RopeCase> cases;
  for (const bool neox : {false, true}) {
    cpu::RopeParams p;
    p.neox = neox;
    p.n_rot = 64;
    cases.push_back({"plain", 64, p});
    p.n_rot = 32;  // partial rotation
    cases.push_back({"partial", 80, p});
    p.n_rot = 128;
    p.freq_base = 500000.0f;
    p.freq_factors = factors.data();  // llama3 rope_freqs
    cases.push_back({"freq_factors", 128, p});
    p = cpu::RopeParams{};
    p.neox = neox;
    p.n_rot = 64;
    p.freq_scale = 0.25f;  // linear scaling x4
    cases.push_back({"linear", 64, p});
    p.ext_factor = 1.0f;  // YaRN
    p.attn_factor = 0.9f;
    p.n_ctx_orig = 4096;
    p.freq_base = 1000000.0f;
    cases.push_back({"yarn", 96, p});
    p.n_rot = 48;
    cases.push_back({"yarn_partial", 64, p});
  }
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 4096, 32767, 99999, 100000};
  const int64_t T = static_cast<int64_t>(pos.size());
  const int64_t n_heads = 3;
  for (const RopeCase& c : cases) {
    SCOPED_TRACE(std::string(c.name) + (c.p.neox ? " neox" : " normal"));
    const int64_t n = T * n_heads * c.head_dim;
    const std::vector<float> x = random_floats(rng, n, -1.0f, 1.0f);
    std::vector<float> want = x;
    ref::rope(want.data(), T, n_heads, c.head_dim, pos.data(), c.p);
    Guarded y(n, x);
    cpu::rope(y.data(), T, n_heads, c.head_dim, pos.data(), c.p);
    EXPECT_TRUE(y.guards_intact());
    EXPECT_TRUE(all_finite(y.data(), n));
    double worst = 0.0;
    for (int64_t i = 0; i < n; ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(y.data()[i]) - want[i]));
    EXPECT_LE(worst, 1e-6);
    // Dimensions past n_rot are untouched.
    for (int64_t row = 0; row < T * n_heads; ++row) {
      for (int64_t d = c.p.n_rot; d < c.head_dim; ++d) {
        ASSERT_EQ(y.data()[row * c.head_dim + d], x[row * c.head_dim + d]);
      }
    }
  }
}

// The reference itself against RoPE written out in double, at small
// positions where ggml's float recurrence for theta has not drifted yet.
TEST(RefRope, MatchesDoubleFormula) {
  std::mt19937 rng(7);
  for (const bool neox : {false, true}) {
    for (const bool yarn : {false, true}) {
      cpu::RopeParams p;
      p.neox = neox;
      p.n_rot = 32;
      p.freq_base = 10000.0f;
      if (yarn) {
        p.freq_scale = 0.125f;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = 2048;
      }
      const int64_t hd = 40;
      const std::vector<int32_t> pos = {0, 3, 50};
      std::vector<float> x = random_floats(rng, 3 * hd, -1.0f, 1.0f);
      std::vector<float> y = x;
      ref::rope(y.data(), 3, 1, hd, pos.data(), p);
      // YaRN ramp bounds: beta_fast (32) and beta_slow (1) turns over n_ctx_orig.
      auto corr = [&](double beta) {
        return p.n_rot * std::log(p.n_ctx_orig / (beta * 2 * M_PI)) /
               (2 * std::log(static_cast<double>(p.freq_base)));
      };
      const double lo = std::max(0.0, std::floor(corr(p.beta_fast)));
      const double hi = std::min(static_cast<double>(p.n_rot - 1), std::ceil(corr(p.beta_slow)));
      for (int64_t t = 0; t < 3; ++t) {
        for (int64_t i = 0; i < p.n_rot / 2; ++i) {
          const double theta =
              pos[t] * std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
          double angle = theta * p.freq_scale;
          double mscale = 1.0;
          if (yarn) {
            const double ramp = 1.0 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
            angle = angle * (1 - ramp) + theta * ramp;
            mscale = 1.0 + 0.1 * std::log(1.0 / p.freq_scale);
          }
          const int64_t i0 = neox ? i : 2 * i;
          const int64_t i1 = neox ? i + p.n_rot / 2 : 2 * i + 1;
          const double x0 = x[t * hd + i0];
          const double x1 = x[t * hd + i1];
          EXPECT_NEAR(y[t * hd + i0], mscale * (x0 * std::cos(angle) - x1 * std::sin(angle)), 2e-5);
          EXPECT_NEAR(y[t * hd + i1], mscale * (x0 * std::sin(angle) + x1 * std::cos(angle)), 2e-5);
        }
      }
    }
  }
}

// ---- KV cache -----------------------------------------------------------------------

TEST_P(CpuOpsTest, KvStore) {
  std::mt19937 rng(8);
  for (const DType dt : {DType::kF16, DType::kQ8_0}) {
    for (const int64_t hd : {3, 17, 32, 64, 65, 128}) {
      if (dt == DType::kQ8_0 && hd % 32 != 0) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " head_dim=" + std::to_string(hd));
      const int64_t bs = 16;
      const int64_t n_kv = 3;
      const size_t stride = cpu::kv_head_bytes(dt, bs, hd) + 6;
      std::vector<uint8_t> got(stride * n_kv, 0xAB);
      std::vector<uint8_t> want = got;
      std::vector<float> src = normal_floats(rng, n_kv * hd, 2.0f);
      src[0] = 70000.0f;  // F16 overflow -> inf, as ref
      for (const int64_t row : {0, 5, 15}) {
        cpu::kv_store(dt, got.data(), stride, n_kv, hd, row, src.data());
        ref::kv_store(dt, want.data(), stride, n_kv, hd, row, src.data());
      }
      EXPECT_EQ(got, want);
    }
  }
}

// gemma2's soft-cap against tanh in double: values spread over the whole
// curve (tiny, around the kernel's switch at |x / cap| = 0.25, saturated,
// +-0, huge), for two caps, with guards around the row.
TEST_P(CpuOpsTest, Softcap) {
  std::mt19937 rng(12);
  for (const float cap : {50.0f, 30.0f}) {
    for (const int64_t n : kSizes) {
      SCOPED_TRACE("cap=" + std::to_string(cap) + " n=" + std::to_string(n));
      std::vector<float> x = random_floats(rng, n, -4.0f * cap, 4.0f * cap);
      const float special[] = {0.0f,           -0.0f,         1e-30f, -3e-4f, 0.25f * cap,
                               -0.2499f * cap, 0.2501f * cap, 1e4f,   -1e30f, 0.01f};
      for (size_t i = 0; i < std::size(special) && static_cast<int64_t>(i) < n; ++i)
        x[i * 5 % static_cast<size_t>(n)] = special[i];
      Guarded out(n, x);
      cpu::softcap(out.data(), n, cap);
      EXPECT_TRUE(out.guards_intact());
      for (int64_t i = 0; i < n; ++i) {
        const double want = cap * std::tanh(static_cast<double>(x[i]) / cap);
        const double got = out.data()[i];
        EXPECT_LE(std::fabs(got - want), 1e-6 * std::fabs(want) + 1e-37) << "x=" << x[i];
        EXPECT_EQ(std::signbit(got), std::signbit(x[i])) << "x=" << x[i];
      }
    }
  }
}

// The spill tier's read path: Q8_0 blocks and FP8 codes back to F16, against
// the reference dequantizers followed by ref's F16 rounding, over lengths that
// end inside a conversion piece and past one (tails), with sentinel bytes
// after the output that must survive.
TEST_P(CpuOpsTest, SpillPrecisionsBackToF16) {
  std::mt19937 rng(11);
  auto f16_of = [](const std::vector<float>& x) {
    std::vector<uint8_t> out(2 * x.size());
    (void)ref::quantize_row(DType::kF16, x.data(), out.data(), static_cast<int64_t>(x.size()));
    return out;
  };
  for (const int64_t n : {32, 224, 256, 288, 4096 + 96}) {
    SCOPED_TRACE("q8_0 n=" + std::to_string(n));
    std::vector<float> x = normal_floats(rng, n, 3.0f);
    x[1] = 0.0f;
    std::vector<uint8_t> q(static_cast<size_t>(n / 32 * 34));
    ASSERT_TRUE(ref::quantize_row(DType::kQ8_0, x.data(), q.data(), n));
    std::vector<float> deq(static_cast<size_t>(n));
    ASSERT_TRUE(ref::dequantize_row(DType::kQ8_0, q.data(), deq.data(), n));
    std::vector<uint8_t> got(static_cast<size_t>(2 * n + 8), 0xAB);
    cpu::q8_0_to_f16(q.data(), got.data(), n);
    std::vector<uint8_t> want = f16_of(deq);
    want.resize(got.size(), 0xAB);
    EXPECT_EQ(got, want);
  }
  // Every code (NaN 0x7F / 0xFF aside, compared as NaN), then random ones.
  for (const int64_t n : {1, 17, 255, 256, 257, 1000}) {
    SCOPED_TRACE("fp8 n=" + std::to_string(n));
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      codes[static_cast<size_t>(i)] = static_cast<uint8_t>(i < 256 ? i : rng() & 0xFF);
    for (const float scale : {1.0f, 0.0123f, 3.5f}) {
      std::vector<float> vals(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        vals[static_cast<size_t>(i)] = ref::fp8_e4m3_to_fp32(codes[static_cast<size_t>(i)]) * scale;
      std::vector<uint8_t> got(static_cast<size_t>(2 * n + 8), 0xAB);
      cpu::fp8_e4m3_to_f16(codes.data(), scale, got.data(), n);
      std::vector<uint8_t> want = f16_of(vals);
      for (int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<size_t>(i);
        uint16_t g = 0, w = 0;
        std::memcpy(&g, got.data() + 2 * k, 2);
        std::memcpy(&w, want.data() + 2 * k, 2);
        if (std::isnan(vals[k])) {
          EXPECT_TRUE(std::isnan(ref::fp16_to_fp32(g))) << "code " << int{codes[k]};
        } else {
          EXPECT_EQ(g, w) << "code " << int{codes[k]} << " scale " << scale;
        }
      }
      for (size_t k = static_cast<size_t>(2 * n); k < got.size(); ++k) EXPECT_EQ(got[k], 0xAB);
    }
  }
}

// ---- attention ------------------------------------------------------------------------

// A paged KV cache for one layer: blocks taken from a pool in shuffled order,
// heads `head_stride` bytes apart (a little more than kv_head_bytes).
class TestKvCache {
 public:
  TestKvCache(DType dt, int64_t block_size, int64_t n_kv_heads, int64_t head_dim, int64_t n_ctx,
              uint32_t seed)
      : dt_(dt), bs_(block_size), n_kv_(n_kv_heads), hd_(head_dim) {
    stride_ = cpu::kv_head_bytes(dt, bs_, hd_) + 34;
    const int64_t n_blocks = (n_ctx + bs_ - 1) / bs_;
    const size_t block_bytes = stride_ * static_cast<size_t>(n_kv_);
    pool_.assign(block_bytes * static_cast<size_t>(2 * n_blocks + 1), 0xEE);
    std::vector<int64_t> slots(static_cast<size_t>(2 * n_blocks));
    std::iota(slots.begin(), slots.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int64_t b = 0; b < n_blocks; ++b) {
      k_.push_back(pool_.data() + block_bytes * static_cast<size_t>(slots[2 * b]));
      v_.push_back(pool_.data() + block_bytes * static_cast<size_t>(slots[2 * b + 1]));
    }
    for (int64_t j = 0; j < n_ctx; ++j) {
      const std::vector<float> k = normal_floats(rng, n_kv_ * hd_, 1.0f);
      const std::vector<float> v = normal_floats(rng, n_kv_ * hd_, 1.0f);
      cpu::kv_store(dt_, const_cast<void*>(k_[j / bs_]), stride_, n_kv_, hd_, j % bs_, k.data());
      cpu::kv_store(dt_, const_cast<void*>(v_[j / bs_]), stride_, n_kv_, hd_, j % bs_, v.data());
    }
  }

  cpu::KvView view() const {
    cpu::KvView kv;
    kv.k_blocks = k_.data();
    kv.v_blocks = v_.data();
    kv.block_size = bs_;
    kv.n_kv_heads = n_kv_;
    kv.head_dim = hd_;
    kv.head_stride_bytes = stride_;
    kv.dtype = dt_;
    return kv;
  }

 private:
  DType dt_;
  int64_t bs_, n_kv_, hd_;
  size_t stride_ = 0;
  std::vector<uint8_t> pool_;
  std::vector<const void*> k_, v_;
};

struct AttnCase {
  DType dt;
  int64_t bs, hd, ratio, T, p0;
  float q_sigma = 1.0f;  // larger: peakier softmax
  int64_t n_kv = 2;

  std::string name() const {
    std::ostringstream s;
    s << dtype_name(dt) << " kv=" << n_kv << " bs=" << bs << " hd=" << hd << " gqa=" << ratio
      << " T=" << T << " p0=" << p0 << " q_sigma=" << q_sigma;
    return s.str();
  }
};

// Runs one case against the reference for the full head range and for a
// partial one; the reference output is cached across ISA levels.
void check_attention(const AttnCase& c) {
  SCOPED_TRACE(c.name());
  const int64_t n_heads = c.n_kv * c.ratio;
  const int64_t n_ctx = c.p0 + c.T;
  const uint32_t seed = static_cast<uint32_t>(c.bs * 7 + c.hd * 131 + c.ratio * 17 + c.T * 3 +
                                              c.p0 + static_cast<int>(c.dt));
  const TestKvCache cache(c.dt, c.bs, c.n_kv, c.hd, n_ctx, seed);
  const cpu::KvView kv = cache.view();
  std::mt19937 rng(seed + 1);
  const std::vector<float> q = normal_floats(rng, c.T * n_heads * c.hd, c.q_sigma);
  std::vector<int32_t> pos(static_cast<size_t>(c.T));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(c.p0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  const int64_t n_out = c.T * n_heads * c.hd;

  static std::map<std::string, std::vector<float>> ref_cache;
  std::vector<float>& want = ref_cache[c.name()];
  if (want.empty()) {
    want.assign(static_cast<size_t>(n_out), 0.0f);
    ref::attention(q.data(), c.T, pos.data(), n_heads, kv, scale, want.data(), 0, n_heads);
  }
  double ref_max = 0.0;
  for (const float w : want) ref_max = std::max(ref_max, std::fabs(static_cast<double>(w)));

  // Full range, then a partial one that cuts through GQA groups.
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, n_heads}};
  if (n_heads >= 3) ranges.push_back({1, n_heads - 1});
  if (c.ratio >= 4) ranges.push_back({c.ratio / 2, c.ratio / 2 + 1});
  for (const auto& [h0, h1] : ranges) {
    SCOPED_TRACE("heads [" + std::to_string(h0) + ", " + std::to_string(h1) + ")");
    Guarded out(n_out);
    const int64_t n_scratch = static_cast<int64_t>(cpu::attention_scratch_floats(kv));
    Guarded scratch(n_scratch, std::vector<float>(static_cast<size_t>(n_scratch), NAN));
    cpu::attention(q.data(), c.T, pos.data(), n_heads, kv, scale, out.data(), h0, h1,
                   scratch.data());
    ASSERT_TRUE(out.guards_intact());
    ASSERT_TRUE(scratch.guards_intact());
    double err2 = 0.0, ref2 = 0.0, worst = 0.0;
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t base = (t * n_heads + h) * c.hd;
        for (int64_t d = 0; d < c.hd; ++d) {
          if (h < h0 || h >= h1) {
            ASSERT_TRUE(out.sentinel(base + d)) << "wrote head " << h << " outside the range";
            continue;
          }
          const double o = out.data()[base + d];
          const double r = want[static_cast<size_t>(base + d)];
          ASSERT_TRUE(std::isfinite(o)) << "t=" << t << " h=" << h << " d=" << d;
          err2 += (o - r) * (o - r);
          ref2 += r * r;
          worst = std::max(worst, std::fabs(o - r));
        }
      }
    }
    EXPECT_LE(err2 / ref2, 1e-11);
    EXPECT_LE(worst, 2e-5 * ref_max);
  }
}

TEST_P(CpuOpsTest, Attention) {
  int n_cases = 0;
  for (const DType dt : {DType::kF16, DType::kQ8_0}) {
    for (const int64_t bs : {16, 32}) {
      for (const int64_t hd : {8, 64, 128}) {
        if (dt == DType::kQ8_0 && hd % 32 != 0) continue;
        for (const int64_t ratio : {1, 2, 4, 8}) {
          for (const int64_t T : {1, 3, 33}) {
            check_attention({dt, bs, hd, ratio, T, /*p0=*/21});
            ++n_cases;
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  EXPECT_EQ(n_cases, 120);
}

TEST_P(CpuOpsTest, AttentionOddShapes) {
  // Head dims and block sizes that are not multiples of the vector width,
  // MQA (one KV head for 12 query heads: several tiles per decode step).
  check_attention({DType::kF16, 16, 20, 2, 5, 9});
  check_attention({DType::kF16, 8, 72, 3, 4, 30});
  check_attention({DType::kF16, 24, 96, 1, 7, 40});
  check_attention({DType::kQ8_0, 12, 96, 4, 2, 50});
  AttnCase mqa{DType::kF16, 16, 64, 12, 3, 70};
  mqa.n_kv = 1;
  check_attention(mqa);
  // Blocks larger than one attention step (a step covers part of a block).
  check_attention({DType::kF16, 128, 128, 4, 3, 200});
  check_attention({DType::kQ8_0, 256, 64, 2, 2, 300});
  // The first position only.
  check_attention({DType::kF16, 16, 64, 2, 1, 0});
  // Several KV heads' rows in one tile: eight groups of 4 (Llama-3-8B's
  // decode), and groups of 9 rows at 4-aligned offsets that fill a tile
  // before the last group (a second tile).
  AttnCase eight{DType::kF16, 32, 128, 4, 1, 100};
  eight.n_kv = 8;
  check_attention(eight);
  AttnCase five{DType::kQ8_0, 16, 64, 3, 3, 60};
  five.n_kv = 5;
  check_attention(five);
}

TEST_P(CpuOpsTest, AttentionLongContext) {
  // Decode deep into the cache, with a peaky softmax (large q) so that the
  // running max moves and the online rescaling matters.
  for (const DType dt : {DType::kF16, DType::kQ8_0}) {
    check_attention({dt, 16, 128, 4, 1, 1500, 1.0f});
    check_attention({dt, 32, 64, 8, 2, 700, 6.0f});
  }
}

// gemma2's attention: scores soft-capped, and a sliding window, against a
// double-precision loop over the dequantized rows. Windows shorter than, equal
// to and longer than an attention step, and rows of one tile whose windows
// start in different steps (T > 1).
TEST_P(CpuOpsTest, AttentionSoftcapAndWindow) {
  for (const DType dt : {DType::kF16, DType::kQ8_0}) {
    for (const int64_t hd : {64, 256}) {
      for (const int64_t T : {1, 6, 40}) {
        for (const int64_t window : {0, 5, 32, 47, 500}) {
          for (const float cap : {0.0f, 30.0f}) {
            const int64_t n_kv = 2, ratio = 2, n_heads = n_kv * ratio, bs = 16, p0 = 90;
            SCOPED_TRACE(std::string(dtype_name(dt)) + " hd=" + std::to_string(hd) +
                         " T=" + std::to_string(T) + " window=" + std::to_string(window) +
                         " cap=" + std::to_string(cap));
            const uint32_t seed = static_cast<uint32_t>(hd * 3 + T * 7 + window);
            const TestKvCache cache(dt, bs, n_kv, hd, p0 + T, seed);
            const cpu::KvView kv = cache.view();
            std::mt19937 rng(seed + 1);
            // Large q: scores of tens, where the cap changes them.
            const std::vector<float> q = normal_floats(rng, T * n_heads * hd, 4.0f);
            std::vector<int32_t> pos(static_cast<size_t>(T));
            std::iota(pos.begin(), pos.end(), static_cast<int32_t>(p0));
            const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
            std::vector<float> out(static_cast<size_t>(T * n_heads * hd), NAN);
            std::vector<float> scratch(cpu::attention_scratch_floats(kv));
            cpu::attention(q.data(), T, pos.data(), n_heads, kv, scale, out.data(), 0, n_heads,
                           scratch.data(), nullptr, cpu::AttnMods{cap, window});
            const size_t rb = cpu::kv_head_bytes(dt, 1, hd);
            auto row = [&](const void* const* blocks, int64_t j, int64_t g) {
              std::vector<float> r(static_cast<size_t>(hd));
              const auto* b = static_cast<const uint8_t*>(blocks[j / bs]) +
                              static_cast<size_t>(g) * kv.head_stride_bytes +
                              static_cast<size_t>(j % bs) * rb;
              EXPECT_TRUE(ref::dequantize_row(dt, b, r.data(), hd).ok());
              return r;
            };
            double err2 = 0, ref2 = 0;
            for (int64_t t = 0; t < T; ++t) {
              for (int64_t h = 0; h < n_heads; ++h) {
                const int64_t p = pos[static_cast<size_t>(t)], g = h / ratio;
                const int64_t j0 = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
                const float* qh = q.data() + (t * n_heads + h) * hd;
                std::vector<double> sc;
                double mx = -INFINITY;
                for (int64_t j = j0; j <= p; ++j) {
                  const std::vector<float> k = row(kv.k_blocks, j, g);
                  double s = 0;
                  for (int64_t d = 0; d < hd; ++d) s += double{qh[d]} * k[static_cast<size_t>(d)];
                  s *= scale;
                  if (cap > 0) s = cap * std::tanh(s / cap);
                  sc.push_back(s);
                  mx = std::max(mx, s);
                }
                double sum = 0;
                for (double& s : sc) sum += s = std::exp(s - mx);
                std::vector<double> o(static_cast<size_t>(hd), 0.0);
                for (int64_t j = j0; j <= p; ++j) {
                  const std::vector<float> v = row(kv.v_blocks, j, g);
                  for (int64_t d = 0; d < hd; ++d)
                    o[static_cast<size_t>(d)] +=
                        sc[static_cast<size_t>(j - j0)] / sum * v[static_cast<size_t>(d)];
                }
                for (int64_t d = 0; d < hd; ++d) {
                  const double got = out[static_cast<size_t>((t * n_heads + h) * hd + d)];
                  ASSERT_TRUE(std::isfinite(got));
                  err2 += (got - o[static_cast<size_t>(d)]) * (got - o[static_cast<size_t>(d)]);
                  ref2 += o[static_cast<size_t>(d)] * o[static_cast<size_t>(d)];
                }
              }
            }
            EXPECT_LE(err2 / ref2, 1e-10);
          }
        }
      }
    }
  }
}

// Decode-sized attention through the CPU backend over a long cache: the
// blocks in ranges, a task each, the partials merged (CpuBackend::attention).
// Against one cpu::attention call over the whole cache, for 1-3 threads, 1
// and 3 query tokens, GQA shapes with 8, 3 and 2 KV heads (head dims and
// block sizes not multiples of the vector width among them), F16 and Q8_0.
TEST(CpuBackendOps, DecodeAttentionInBlockRanges) {
  struct Case {
    DType dt;
    int64_t n_kv, ratio, hd, bs, n;
  };
  const Case cases[] = {{DType::kF16, 8, 4, 128, 32, 1200},
                        {DType::kF16, 3, 2, 72, 16, 700},
                        {DType::kQ8_0, 2, 3, 64, 32, 900}};
  for (const Case& c : cases) {
    const int64_t n_heads = c.n_kv * c.ratio, d = c.n_kv * c.hd;
    std::mt19937 rng(static_cast<uint32_t>(c.n));
    const std::vector<float> k = normal_floats(rng, c.n * d, 1.0f);
    const std::vector<float> v = normal_floats(rng, c.n * d, 1.0f);
    const auto cache =
        test::tier_host_cache(KvCacheConfig{1, c.n_kv, c.hd, c.n, c.bs, c.dt}, k, v, c.n);
    KvCache& kv = *cache;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    for (const int64_t T : {int64_t{1}, int64_t{3}}) {
      const std::vector<float> q = normal_floats(rng, T * n_heads * c.hd, 2.0f);
      std::vector<int32_t> pos;
      for (int64_t t = 0; t < T; ++t) pos.push_back(static_cast<int32_t>(c.n - T + t));
      const cpu::KvView view = kv.view(0);
      std::vector<float> scratch(cpu::attention_scratch_floats(view));
      std::vector<float> want(q.size());
      cpu::attention(q.data(), T, pos.data(), n_heads, view, scale, want.data(), 0, n_heads,
                     scratch.data());
      for (const int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(dtype_name(c.dt)) + " kv=" + std::to_string(c.n_kv) +
                     " T=" + std::to_string(T) + " threads=" + std::to_string(threads));
        CpuBackend be(threads);
        std::vector<float> qi = q;
        Guarded out(static_cast<int64_t>(q.size()));
        be.attention(kv, 0, Act{qi.data(), T, n_heads * c.hd}, pos.data(), n_heads, scale,
                     Act{out.data(), T, n_heads * c.hd});
        EXPECT_TRUE(out.guards_intact());
        // Only the order of the sums differs: within 1e-5 of the largest output.
        double diff = 0.0, top = 0.0;
        for (size_t i = 0; i < q.size(); ++i) {
          diff = std::max(diff, std::fabs(static_cast<double>(out.data()[i]) - want[i]));
          top = std::max(top, std::fabs(static_cast<double>(want[i])));
        }
        EXPECT_LE(diff, 1e-5 * top);
      }
    }
  }
}

// The CPU backend's GeGLU (gemma2's FFN) against the double reference, with
// gates where exp overflows, and in place over the gate as the forward pass calls it.
// Bound 1e-4 relative: for negative gates the result is g exp(-2|u|), and the
// float exponent (up to ~150 for |g| = 12) carries ~1e-7 of it as error.
TEST(CpuBackendOps, GeluMul) {
  std::mt19937 rng(9);
  CpuBackend be(2);
  for (const int64_t n : {int64_t{1}, int64_t{17}, int64_t{65}, int64_t{40001}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> g = random_floats(rng, n, -12.0f, 12.0f);
    const float extremes[] = {-1000.0f, -100.0f, -30.0f, 0.0f, 30.0f, 100.0f, 1000.0f};
    for (size_t i = 0; i < std::size(extremes) && static_cast<int64_t>(i) < n; ++i)
      g[i * 7 % static_cast<size_t>(n)] = extremes[i];
    const std::vector<float> u = random_floats(rng, n, -3.0f, 3.0f);
    std::vector<float> want(static_cast<size_t>(n));
    ref::gelu_mul(g.data(), u.data(), want.data(), n);
    Guarded out(n);
    std::vector<float> gi = g, ui = u;
    be.gelu_mul(Act{gi.data(), 1, n}, Act{ui.data(), 1, n}, Act{out.data(), 1, n});
    EXPECT_TRUE(out.guards_intact());
    EXPECT_TRUE(all_finite(out.data(), n));
    int64_t at = 0;
    EXPECT_LE(max_rel_error(out.data(), want.data(), n, 1e-30, &at), 1e-4) << "at gate " << g[at];
    be.gelu_mul(Act{gi.data(), 1, n}, Act{ui.data(), 1, n}, Act{gi.data(), 1, n});
    EXPECT_LE(max_rel_error(gi.data(), want.data(), n, 1e-30, &at), 1e-4)
        << "at " << at << " gate " << g[at] << " got " << gi[at] << " want " << want[at];
  }
}

}  // namespace
}  // namespace loom
