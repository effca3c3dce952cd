// The CPU backend's fused decode ops (engine/backends/cpu/cpu_fused.cpp)
// against the same backend with them unfused: q/k/v (mixed weight types, as
// Q4_K_M's Q4_K q/k and Q6_K v), gate/up with SiLU, and matmul with the
// residual add, over 1 to 6 tokens, row counts off the 16-row pieces and
// biases. Every row goes through the same kernel either way, so the results
// are equal.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cpu/ref/quants.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"

namespace loom {
namespace {

std::vector<float> randoms(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A weight [n_out, n_in] of dtype t (reference quantizer), with its bytes.
struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight w;
};

HostWeight make_weight(DType t, int64_t n_in, int64_t n_out, uint32_t seed) {
  HostWeight h;
  const size_t rb = static_cast<size_t>(*dtype_row_bytes(t, static_cast<uint64_t>(n_in)));
  h.bytes.resize(rb * static_cast<size_t>(n_out));
  const std::vector<float> f = randoms(static_cast<size_t>(n_in * n_out), seed);
  for (int64_t r = 0; r < n_out; ++r)
    EXPECT_TRUE(ref::quantize_row(t, f.data() + r * n_in, h.bytes.data() + rb * r, n_in).ok());
  h.w.data = h.bytes.data();
  h.w.dtype = t;
  h.w.n_in = n_in;
  h.w.n_out = n_out;
  h.w.row_bytes = rb;
  return h;
}

// An F32 vector weight (a bias) of n values.
HostWeight make_bias(int64_t n, uint32_t seed) {
  HostWeight h = make_weight(DType::kF32, n, 1, seed);
  h.w.n_in = n;
  return h;
}

struct Mat {
  std::vector<float> v;
  Act a;
  Mat(int64_t rows, int64_t cols, uint32_t seed)
      : v(randoms(static_cast<size_t>(rows * cols), seed)) {
    a.data = v.data();
    a.rows = rows;
    a.cols = cols;
  }
};

void expect_equal(const Mat& a, const Mat& b, const char* what) {
  ASSERT_EQ(a.v.size(), b.v.size());
  for (size_t i = 0; i < a.v.size(); ++i) ASSERT_EQ(a.v[i], b.v[i]) << what << " at " << i;
}

struct Types {
  DType qk, v;  // q and k; v
  int64_t n_in;
};

class CpuFused : public ::testing::TestWithParam<Types> {};

TEST_P(CpuFused, MatchesUnfused) {
  const Types ty = GetParam();
  const int64_t n = ty.n_in, nq = 72, nk = 24, nv = 24, nf = 53;
  uint32_t seed = 10;
  HostWeight wq = make_weight(ty.qk, n, nq, seed++), wk = make_weight(ty.qk, n, nk, seed++),
             wv = make_weight(ty.v, n, nv, seed++);
  HostWeight bq = make_bias(nq, seed++), bk = make_bias(nk, seed++), bv = make_bias(nv, seed++);
  HostWeight gate = make_weight(ty.qk, n, nf, seed++), up = make_weight(ty.qk, n, nf, seed++);
  HostWeight down = make_weight(ty.v, n, nf, seed++);
  const Weight none;
  for (int threads : {1, 3}) {
    CpuBackend fused(threads), plain(threads);
    plain.set_fuse(false);
    for (int64_t T : {1, 2, 6}) {
      SCOPED_TRACE(testing::Message() << threads << " threads, " << T << " tokens");
      Mat x(T, n, seed++);
      for (bool bias : {false, true}) {
        Mat q1(T, nq, 0), k1(T, nk, 0), v1(T, nv, 0), q2(T, nq, 0), k2(T, nk, 0), v2(T, nv, 0);
        const Weight& b0 = bias ? bq.w : none;
        const Weight& b1 = bias ? bk.w : none;
        const Weight& b2 = bias ? bv.w : none;
        fused.matmul_qkv(wq.w, wk.w, wv.w, b0, b1, b2, x.a, q1.a, k1.a, v1.a);
        plain.matmul_qkv(wq.w, wk.w, wv.w, b0, b1, b2, x.a, q2.a, k2.a, v2.a);
        expect_equal(q1, q2, "q");
        expect_equal(k1, k2, "k");
        expect_equal(v1, v2, "v");
      }
      Mat h1(T, nf, 0), t1(T, nf, 0), h2(T, nf, 0), t2(T, nf, 0);
      fused.matmul_glu(gate.w, up.w, x.a, h1.a, t1.a);
      plain.matmul_glu(gate.w, up.w, x.a, h2.a, t2.a);
      expect_equal(h1, h2, "silu(gate) * up");
      // y += W x: the same starting y for both.
      Mat y1(T, nf, 99), y2(T, nf, 99), s1(T, nf, 0), s2(T, nf, 0);
      fused.matmul_add(down.w, x.a, y1.a, s1.a);
      plain.matmul_add(down.w, x.a, y2.a, s2.a);
      expect_equal(y1, y2, "y + W x");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, CpuFused,
    ::testing::Values(Types{DType::kQ4_0, DType::kQ4_0, 96}, Types{DType::kQ8_0, DType::kQ8_0, 160},
                      Types{DType::kQ4_K, DType::kQ6_K, 512}, Types{DType::kF16, DType::kF16, 67},
                      Types{DType::kF32, DType::kF32, 40}),
    [](const ::testing::TestParamInfo<Types>& p) {
      return std::string(dtype_name(p.param.qk)) + "_" + std::string(dtype_name(p.param.v));
    });

// Different activation types (Q4_0 q/k, Q4_K v) are not fused: the separate
// matmuls run and give the same results.
TEST(CpuFusedMixed, DifferentActivationTypesFallBack) {
  HostWeight wq = make_weight(DType::kQ4_0, 256, 32, 1), wk = make_weight(DType::kQ4_0, 256, 16, 2),
             wv = make_weight(DType::kQ4_K, 256, 16, 3);
  const Weight none;
  CpuBackend fused(2), plain(2);
  plain.set_fuse(false);
  Mat x(1, 256, 4), q1(1, 32, 0), k1(1, 16, 0), v1(1, 16, 0), q2(1, 32, 0), k2(1, 16, 0),
      v2(1, 16, 0);
  fused.matmul_qkv(wq.w, wk.w, wv.w, none, none, none, x.a, q1.a, k1.a, v1.a);
  plain.matmul_qkv(wq.w, wk.w, wv.w, none, none, none, x.a, q2.a, k2.a, v2.a);
  expect_equal(q1, q2, "q");
  expect_equal(v1, v2, "v");
}

}  // namespace
}  // namespace loom
