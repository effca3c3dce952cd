// Dense (F32, F16, BF16) matmuls: detail::matmul_rows_dense at every ISA level
// this CPU has, and the oneDNN path (cpu/gemm_onednn.h), against a reference
// in double.
//
// Reference: the exact fp32 values of the weights and activations (F16/BF16
// widened by cpu/ref/fp16.h), multiplied and summed in double. Every path
// widens exactly and accumulates in fp32, so what is left is fp32 rounding:
// a dot product of n terms summed in any order is within
//     gamma_n * sum_i |w_i x_i|,   gamma_n = n u / (1 - n u),  u = 2^-24
// of the exact value (one rounding per product and per addition). That holds
// for vfmadd (the product is not rounded at all), for vdpbf16ps and AMX
// (bf16 products are exact in fp32, each addition rounds to nearest even) and
// for oneDNN's f32 kernels. vdpbf16ps also flushes subnormal inputs and sums
// to zero, at most 2^-126 per term: our data (uniform in [-1, 1)) has none.
// So the normalized error |y - y_ref| / sum|w x| must stay below gamma_n for
// every dtype; a lost or doubled term shows up as ~1/n, far above it.
//
// Shapes: n = 1, 7, 33, 257; rows 1, 5, 67; T = 1, 3, 9; the full row range
// and an inner one; then a few larger shapes that cross the packed path's
// blocks (k blocks of 256 units, 64-row panels, 128-token widening blocks).
// Row strides are padded and the padding holds NaN, so a read past a row end
// poisons the result; outputs outside [r0, r1) x [0, T) hold a sentinel that
// must survive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/gemm_onednn.h"
#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"
#include "cpu/ref/fp16.h"
#include "cpu/thread_pool.h"

// The two AVX-512 BF16 kernels (cpu/avx512/dense_avx512.cpp): the dispatcher
// picks one per CPU and T, so both are also called directly.
namespace loom::cpu::avx512 {
void dense_bf16(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes, int64_t T,
                float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1);
void dense_bf16_widen(const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes,
                      int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1);
}  // namespace loom::cpu::avx512

namespace loom {
namespace {

using cpu::Isa;

constexpr float kSentinel = -12345.0f;

double gamma_n(int64_t n) {
  const double nu = static_cast<double>(n) * std::ldexp(1.0, -24);
  return nu / (1.0 - nu);
}

size_t elem_bytes(DType w) {
  return w == DType::kF32 ? 4 : 2;
}

// A [rows, n] matrix in dtype w with `stride` elements per row (>= n); the
// padding holds NaN. `values` keeps the exact fp32 value of every element.
struct Matrix {
  DType type;
  int64_t rows = 0, n = 0, stride = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [rows, n]

  Matrix(DType w, int64_t rows_, int64_t n_, int64_t pad, std::mt19937* rng)
      : type(w), rows(rows_), n(n_), stride(n_ + pad) {
    const size_t eb = elem_bytes(w);
    bytes.resize(static_cast<size_t>(rows * stride) * eb +
                 64);  // + 64: room past the last row, NaN too
    values.resize(static_cast<size_t>(rows * n));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t count = bytes.size() / eb;
    for (size_t i = 0; i < count; ++i) set(i, std::nanf(""));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < n; ++i)
        values[static_cast<size_t>(r * n + i)] = set(static_cast<size_t>(r * stride + i), u(*rng));
    }
  }
  // Stores v rounded to the dtype at element index i; returns the stored value.
  float set(size_t i, float v) {
    if (type == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      return v;
    }
    const uint16_t h = type == DType::kF16 ? ref::fp32_to_fp16(v) : ref::fp32_to_bf16(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
    return type == DType::kF16 ? ref::fp16_to_fp32(h) : ref::bf16_to_fp32(h);
  }
  size_t row_bytes() const { return static_cast<size_t>(stride) * elem_bytes(type); }
  const float* row(int64_t r) const { return values.data() + r * n; }
};

struct Shape {
  int64_t n, rows, T, r0, r1;
};

std::string describe(DType w, const Shape& s) {
  return std::string(dtype_name(w)) + " n=" + std::to_string(s.n) +
         " rows=" + std::to_string(s.rows) + " T=" + std::to_string(s.T) + " r=[" +
         std::to_string(s.r0) + "," + std::to_string(s.r1) + ")";
}

std::vector<Shape> test_shapes() {
  std::vector<Shape> shapes;
  for (const int64_t n : {1, 7, 33, 257}) {
    for (const int64_t rows : {1, 5, 67}) {
      for (const int64_t T : {1, 3, 9}) {
        shapes.push_back({n, rows, T, 0, rows});
        if (rows > 1) shapes.push_back({n, rows, T, rows / 3, rows - rows / 4});
      }
    }
  }
  // Blocks of the packed path (T > 6): two k blocks with a tail (513 = 2 x 256 + 1,
  // odd for BF16 pairs), several panels with a partial one, a second widening block.
  shapes.push_back({513, 130, 7, 3, 130});
  shapes.push_back({1100, 70, 13, 0, 70});
  shapes.push_back({96, 20, 140, 1, 19});
  return shapes;
}

// Checks y [T, ldy] against the reference for rows [r0, r1) (every
// `row_step`-th one) and the sentinel elsewhere.
void check(DType w, const Shape& s, const Matrix& W, const Matrix& X, const std::vector<float>& y,
           int64_t ldy, const std::string& what, int64_t row_step = 1) {
  const double bound = gamma_n(s.n);
  for (int64_t t = 0; t < s.T; ++t) {
    for (int64_t r = 0; r < ldy; ++r) {
      const float got = y[static_cast<size_t>(t * ldy + r)];
      if (r < s.r0 || r >= s.r1) {
        ASSERT_EQ(got, kSentinel) << what << " " << describe(w, s)
                                  << ": wrote outside its rows at t=" << t << " r=" << r;
        continue;
      }
      if ((r - s.r0) % row_step != 0) continue;
      double exact = 0.0, scale = 0.0;
      for (int64_t i = 0; i < s.n; ++i) {
        const double p = static_cast<double>(W.row(r)[i]) * X.row(t)[i];
        exact += p;
        scale += std::fabs(p);
      }
      ASSERT_TRUE(std::isfinite(got)) << what << " " << describe(w, s) << " t=" << t << " r=" << r;
      const double err = std::fabs(got - exact) / (scale > 0.0 ? scale : 1.0);
      ASSERT_LE(err, bound) << what << " " << describe(w, s) << " t=" << t << " r=" << r << ": got "
                            << got << ", exact " << exact << ", sum|wx| " << scale;
    }
  }
}

using DenseKernel = std::function<void(const void*, size_t, const void*, size_t, int64_t, float*,
                                       int64_t, int64_t, int64_t, int64_t)>;

// Runs `kernel` on every test shape for dtype w.
void run_shapes(DType w, const DenseKernel& kernel, const std::string& what) {
  std::mt19937 rng(1234);
  for (const Shape& s : test_shapes()) {
    const Matrix W(w, s.rows, s.n, 3, &rng);
    const Matrix X(w, s.T, s.n, 5, &rng);
    const int64_t ldy = s.rows + 2;
    std::vector<float> y(static_cast<size_t>(s.T * ldy), kSentinel);
    kernel(W.bytes.data(), W.row_bytes(), X.bytes.data(), X.row_bytes(), s.T, y.data(), ldy, s.n,
           s.r0, s.r1);
    check(w, s, W, X, y, ldy, what);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// ---- our kernels, per ISA level ---------------------------------------------

class DenseIsaTest : public ::testing::TestWithParam<std::tuple<Isa, DType>> {
 protected:
  void TearDown() override { cpu::set_isa(cpu::detected_isa()); }
};

TEST_P(DenseIsaTest, MatchesDoubleReference) {
  const auto [isa, w] = GetParam();
  if (!cpu::set_isa(isa)) {
    GTEST_SKIP() << "this CPU (or $LOOM_CPU) does not allow " << cpu::isa_name(isa) << ": best is "
                 << cpu::isa_name(cpu::detected_isa());
  }
  run_shapes(
      w,
      [w = w](const void* W, size_t wrb, const void* X, size_t xrb, int64_t T, float* Y,
              int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
        cpu::detail::matmul_rows_dense(cpu::active_isa(), w, W, wrb, X, xrb, T, Y, ldy, n, r0, r1);
      },
      cpu::isa_name(isa));
}

INSTANTIATE_TEST_SUITE_P(
    All, DenseIsaTest,
    ::testing::Combine(::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
    [](const auto& param_info) {
      return std::string(cpu::isa_name(std::get<0>(param_info.param))) + "_" +
             std::string(dtype_name(std::get<1>(param_info.param)));
    });

TEST(DenseAvx512, Bf16WideningMatchesDoubleReference) {
  if (cpu::detected_isa() < Isa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  run_shapes(DType::kBF16, cpu::avx512::dense_bf16_widen, "avx512 bf16 (widening)");
}

TEST(DenseAvx512, Bf16DpbfMatchesDoubleReference) {
  if (cpu::detected_isa() < Isa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  if (!__builtin_cpu_supports("avx512bf16"))
    GTEST_SKIP() << "this CPU has no avx512_bf16 (vdpbf16ps)";
  run_shapes(DType::kBF16, cpu::avx512::dense_bf16, "avx512 bf16 (vdpbf16ps)");
}

// ---- oneDNN and the prefill entry point --------------------------------------

class DenseGemmTest : public ::testing::TestWithParam<DType> {};

TEST_P(DenseGemmTest, OneDnnMatchesDoubleReference) {
  const DType w = GetParam();
  cpu::OneDnnMatmul onednn;
  if (!onednn.available())
    GTEST_SKIP() << "Loom was built without oneDNN (or it has no CPU engine)";
  std::mt19937 rng(99);
  for (const Shape& full : test_shapes()) {
    // oneDNN computes all rows it is given: a sub-range is W and Y offset by r0.
    const Shape s = full;
    const Matrix W(w, s.rows, s.n, 3, &rng);
    const Matrix X(w, s.T, s.n, 5, &rng);
    const int64_t ldy = s.rows + 2;
    std::vector<float> y(static_cast<size_t>(s.T * ldy), kSentinel);
    for (const int threads : {1, 2}) {
      std::fill(y.begin(), y.end(), kSentinel);
      const Status st = onednn.run(w, W.bytes.data() + static_cast<size_t>(s.r0) * W.row_bytes(),
                                   W.row_bytes(), X.bytes.data(), X.row_bytes(), s.T,
                                   y.data() + s.r0, ldy, s.n, s.r1 - s.r0, threads);
      ASSERT_TRUE(st.ok()) << describe(w, s) << ": " << st.message();
      check(w, s, W, X, y, ldy, "onednn x" + std::to_string(threads));
    }
  }
  // A shape seen before reuses its primitive.
  EXPECT_GT(onednn.cached_primitives(), 0u);
  const Matrix W(w, 5, 33, 0, &rng), X(w, 3, 33, 0, &rng);
  std::vector<float> y(15);
  ASSERT_TRUE(onednn
                  .run(w, W.bytes.data(), W.row_bytes(), X.bytes.data(), X.row_bytes(), 3, y.data(),
                       5, 33, 5, 1)
                  .ok());
  const size_t cached = onednn.cached_primitives();
  ASSERT_TRUE(onednn
                  .run(w, W.bytes.data(), W.row_bytes(), X.bytes.data(), X.row_bytes(), 3, y.data(),
                       5, 33, 5, 1)
                  .ok());
  EXPECT_EQ(onednn.cached_primitives(), cached);
}

TEST_P(DenseGemmTest, PrefillMatchesDoubleReference) {
  const DType w = GetParam();
  cpu::OneDnnMatmul onednn;
  std::mt19937 rng(7);
  for (const int threads : {1, 2}) {
    cpu::ThreadPool pool(threads);
    for (const Shape& s : test_shapes()) {
      if (s.r0 != 0 || s.r1 != s.rows) continue;  // whole matrices only
      const Matrix W(w, s.rows, s.n, 3, &rng);
      const Matrix X(w, s.T, s.n, 5, &rng);
      const int64_t ldy = s.rows + 2;
      std::vector<float> y(static_cast<size_t>(s.T * ldy), kSentinel);
      const Status st =
          cpu::dense_matmul_prefill(w, W.bytes.data(), W.row_bytes(), X.bytes.data(), X.row_bytes(),
                                    s.T, y.data(), ldy, s.n, s.rows, pool, &onednn);
      ASSERT_TRUE(st.ok()) << describe(w, s) << ": " << st.message();
      check(w, s, W, X, y, ldy, "prefill x" + std::to_string(threads));
      std::fill(y.begin(), y.end(), kSentinel);
      const Status st2 =
          cpu::dense_matmul_loom(w, W.bytes.data(), W.row_bytes(), X.bytes.data(), X.row_bytes(),
                                 s.T, y.data(), ldy, s.n, s.rows, pool);
      ASSERT_TRUE(st2.ok()) << describe(w, s) << ": " << st2.message();
      check(w, s, W, X, y, ldy, "loom x" + std::to_string(threads));
    }
  }
  // One shape large enough (n * rows >= 1M) for the choice to go to oneDNN
  // on one thread, where it is available (F32; BF16 with AMX).
  const Shape s{1024, 1024, 8, 0, 1024};
  cpu::ThreadPool pool(1);
  const Matrix W(w, s.rows, s.n, 3, &rng);
  const Matrix X(w, s.T, s.n, 5, &rng);
  std::vector<float> y(static_cast<size_t>(s.T * s.rows), kSentinel);
  const Status st =
      cpu::dense_matmul_prefill(w, W.bytes.data(), W.row_bytes(), X.bytes.data(), X.row_bytes(),
                                s.T, y.data(), s.rows, s.n, s.rows, pool, &onednn);
  ASSERT_TRUE(st.ok()) << describe(w, s) << ": " << st.message();
  check(w, s, W, X, y, s.rows,
        std::string("prefill via ") +
            cpu::dense_impl_name(cpu::dense_prefill_choice(w, s.T, s.n, s.rows, 1)),
        /*row_step=*/13);
}

INSTANTIATE_TEST_SUITE_P(All, DenseGemmTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param));
                         });

TEST(DenseGemm, ChoiceKeepsGemvAndSmallShapesOurs) {
  for (const DType w : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const int threads : {1, 2}) {
      EXPECT_EQ(cpu::dense_prefill_choice(w, 1, 2048, 5632, threads), cpu::DenseImpl::kLoom);
      EXPECT_EQ(cpu::dense_prefill_choice(w, 6, 2048, 5632, threads), cpu::DenseImpl::kLoom);
      EXPECT_EQ(cpu::dense_prefill_choice(w, 512, 64, 64, threads), cpu::DenseImpl::kLoom);
    }
  }
  if (!cpu::onednn_available()) {
    EXPECT_EQ(cpu::dense_prefill_choice(DType::kF32, 512, 2048, 2048, 1), cpu::DenseImpl::kLoom);
  }
}

TEST(DenseGemm, RejectsBadArguments) {
  cpu::ThreadPool pool(1);
  cpu::OneDnnMatmul onednn;
  std::vector<float> w(64), x(64), y(64);
  // Not a dense dtype.
  Status st = cpu::dense_matmul_prefill(DType::kQ4_K, w.data(), 256, x.data(), 256, 1, y.data(), 8,
                                        256, 1, pool, &onednn);
  EXPECT_EQ(st.error().code(), ErrorCode::kUnsupported) << st.message();
  // Row stride shorter than a row (8 floats = 32 bytes).
  st = cpu::dense_matmul_loom(DType::kF32, w.data(), 16, x.data(), 32, 2, y.data(), 2, 8, 2, pool);
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument) << st.message();
  // Stride not a whole number of elements.
  st = cpu::dense_matmul_loom(DType::kF16, w.data(), 17, x.data(), 16, 2, y.data(), 2, 8, 2, pool);
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument) << st.message();
  // ldy < rows.
  st = onednn.run(DType::kF32, w.data(), 32, x.data(), 32, 2, y.data(), 1, 8, 2, 1);
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument) << st.message();
  // Negative sizes.
  st = cpu::dense_matmul_loom(DType::kF32, w.data(), 32, x.data(), 32, -1, y.data(), 2, 8, 2, pool);
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument) << st.message();
  // Nothing to do is not an error.
  EXPECT_TRUE(
      cpu::dense_matmul_loom(DType::kF32, w.data(), 32, x.data(), 32, 0, y.data(), 2, 8, 2, pool)
          .ok());
}

}  // namespace
}  // namespace loom
