// Backend conformance of the Vulkan backend: every op x dtype it claims, over
// shapes with odd sizes and tails, against cpu/ref (quants.h dequantizers,
// ops_ref.h for norms, RoPE and attention) or double-precision loops. Runs on
// any Vulkan device (lavapipe in CI) with the Khronos validation layer on and
// requires zero validation messages; skips when there is no loader or device.
//
// Every output has sentinel floats on both sides that must survive, and every
// output must be finite. Error bounds, as normalized error
// sqrt(sum (o - r)^2 / sum r^2) against the reference:
//   matmul (all dtypes)   1e-5  float accumulation vs double; weights dequantize exactly
//   get_rows              1e-6  the same products as the dequantizers (FMA may round once less)
//   rms_norm              1e-6  float sum of squares vs double (vec4 path where n % 4 == 0)
//   rope                  1e-6  same angle recurrence as the reference; cos/sin of the device
//                         (1e-5 with frequency factors: some GPUs divide to within an ulp)
//   silu_mul              1e-6  exp of the device;  add, copy: exact
//   attention F16 KV      1e-5  same F16 rounding of K/V as the reference; float sums
//   attention Q8_0 KV     1e-3  a quant may round the other way (reciprocal of the scale)
//
// KV storage: export/import against rows cpu::kv_store wrote (bit-exact round
// trips, F16 and Q8_0, odd token counts, chunked staging), attention over
// imported rows against the CPU cache, residency changes and their errors.
// Also weight accounting and release, and scope timing (one entry per scope).
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/ref/fp16.h"
#include "cpu/ref/ops_ref.h"
#include "cpu/ref/quants.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/runtime/kv_cache.h"
#include "tests/unit/vulkan_test_util.h"

namespace loom {
namespace {

#ifndef LOOM_HAVE_VULKAN
TEST(VulkanBackend, NotBuilt) {
  EXPECT_FALSE(vulkan_built());
  auto be = create_vulkan_backend(VulkanOptions{});
  ASSERT_FALSE(be.ok());
  EXPECT_EQ(be.error().code(), ErrorCode::kUnsupported);
  CpuBackend cpu(1);
  EXPECT_TRUE(take_vulkan_gpu_times(cpu).empty());
  EXPECT_EQ(vulkan_submissions(cpu), 0u);
  GTEST_SKIP() << "this build has no Vulkan backend (LOOM_VULKAN=OFF)";
}
#else

constexpr int64_t kGuard = 16;
constexpr uint32_t kSentinelBits = 0xC2F6E979u;  // -123.456f

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double normalized_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// A [rows, cols] device matrix with kGuard sentinel floats on each side.
class DevMat {
 public:
  DevMat(VulkanBackend* be, int64_t rows, int64_t cols, const std::vector<float>& init = {})
      : be_(be), rows_(rows), cols_(cols) {
    const int64_t total = rows * cols + 2 * kGuard;
    auto b = be->alloc_act(total);
    EXPECT_TRUE(b.ok()) << b.message();
    buf_ = std::move(b).value();
    std::vector<float> h(static_cast<size_t>(total), std::bit_cast<float>(kSentinelBits));
    std::copy(init.begin(), init.end(), h.begin() + kGuard);
    Status st = be->upload(h.data(), buf_->view(1, total));
    EXPECT_TRUE(st.ok()) << st.message();
  }
  Act act() const {
    Act a = buf_->view(1, rows_ * cols_ + 2 * kGuard);
    a.offset += kGuard * sizeof(float);
    a.rows = rows_;
    a.cols = cols_;
    return a;
  }
  // The values (rows * cols), after checking the guards survived.
  std::vector<float> fetch() const {
    const int64_t total = rows_ * cols_ + 2 * kGuard;
    std::vector<float> h(static_cast<size_t>(total));
    Status st = be_->download(buf_->view(1, total), h.data());
    EXPECT_TRUE(st.ok()) << st.message();
    for (int64_t i = 0; i < kGuard; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(h[static_cast<size_t>(i)]), kSentinelBits)
          << "guard before, " << i;
      EXPECT_EQ(std::bit_cast<uint32_t>(h[static_cast<size_t>(total - 1 - i)]), kSentinelBits)
          << "guard after, " << i;
    }
    return {h.begin() + kGuard, h.end() - kGuard};
  }

 private:
  VulkanBackend* be_;
  int64_t rows_, cols_;
  std::unique_ptr<ActBuffer> buf_;
};

// A weight [n_out, n_in] of dtype `t` made by the reference quantizer, kept
// alive with its bytes (host memory the backend mirrors).
struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight w;
  std::vector<float> deq;  // the dequantized values, [n_out, n_in]
};

HostWeight make_weight(DType t, int64_t n_in, int64_t n_out, uint32_t seed) {
  HostWeight h;
  const size_t rb = static_cast<size_t>(*dtype_row_bytes(t, static_cast<uint64_t>(n_in)));
  h.bytes.resize(rb * static_cast<size_t>(n_out));
  h.deq.resize(static_cast<size_t>(n_in * n_out));
  const auto f = random_floats(static_cast<size_t>(n_in * n_out), seed);
  for (int64_t r = 0; r < n_out; ++r) {
    EXPECT_TRUE(ref::quantize_row(t, f.data() + r * n_in, h.bytes.data() + rb * r, n_in).ok());
    EXPECT_TRUE(
        ref::dequantize_row(t, h.bytes.data() + rb * r, h.deq.data() + r * n_in, n_in).ok());
  }
  h.w.data = h.bytes.data();
  h.w.dtype = t;
  h.w.n_in = n_in;
  h.w.n_out = n_out;
  h.w.row_bytes = rb;
  return h;
}

// A row's Q8 round trip as the shaders quantize (q8.glsl): 32-element blocks,
// d = max|v| / 127, round to even.
std::vector<double> q8_round_trip(const std::vector<double>& row) {
  std::vector<double> q(row.size());
  for (size_t b = 0; b + 32 <= row.size(); b += 32) {
    double amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::abs(row[b + i]));
    for (size_t i = 0; i < 32; ++i)
      q[b + i] = amax > 0 ? std::nearbyint(row[b + i] * 127.0 / amax) * (amax / 127.0) : 0.0;
  }
  return q;
}

// rms_norm of row x with weight nw (its dequantized values), in double.
std::vector<double> normed_row(const std::vector<float>& x, const HostWeight& nw, float eps) {
  double ss = 0;
  for (float f : x) ss += static_cast<double>(f) * f;
  const double sc = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> xn(x.size());
  for (size_t i = 0; i < x.size(); ++i) xn[i] = x[i] * sc * nw.deq[i];
  return xn;
}

// Row r of W (dequantized) dotted with a.
double row_dot(const HostWeight& h, int64_t r, const std::vector<double>& a) {
  const auto n = static_cast<int64_t>(a.size());
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += h.deq[static_cast<size_t>(r * n + i)] * a[static_cast<size_t>(i)];
  return s;
}

class VulkanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    be_ = test::vulkan_backend(&why, fallbacks());
    if (!be_) GTEST_SKIP() << "no Vulkan device: " << why;
    messages_before_ = be_->validation_messages();
    // The exact (F32) tiled prefill matmul unless a test asks for the
    // cooperative-matrix one (F16 inputs), which has tests of its own.
    be_->set_matmul_coopmat(false);
  }
  void TearDown() override {
    if (!be_) return;
    be_->set_matmul_coopmat(true);
    EXPECT_TRUE(be_->synchronize().ok());
    EXPECT_EQ(be_->validation_messages(), messages_before_)
        << "Vulkan validation messages during this test";
  }
  virtual bool fallbacks() const { return false; }
  VulkanBackend* be_ = nullptr;
  uint64_t messages_before_ = 0;
};

// ---- matmul -------------------------------------------------------------------

struct MatmulCase {
  DType dtype;
  int64_t n_in, n_out;
};

// accumulate: matmul_add() into y that starts random (ref: y0 + W x). tol:
// the normalized error allowed (F16 inputs, as on cooperative matrices, need more).
void check_matmul(VulkanBackend* be, DType t, int64_t n_in, int64_t n_out, int64_t T, bool bias,
                  bool view, uint32_t seed, bool accumulate = false, double tol = 1e-5) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " n_in=" + std::to_string(n_in) + " n_out=" +
               std::to_string(n_out) + " T=" + std::to_string(T) + (bias ? " bias" : "") +
               (view ? " rows-view" : "") + (accumulate ? " matmul_add" : ""));
  HostWeight hw = make_weight(t, n_in, n_out, seed);
  HostWeight hb = make_weight(DType::kF32, n_out, 1, seed + 1);
  ASSERT_TRUE(be->upload_weight(hw.w).ok());
  ASSERT_TRUE(be->upload_weight(hb.w).ok());
  // A row range of the tensor, as fused tensors are used (phi3's qkv).
  const int64_t r0 = view ? n_out / 3 : 0, rows = view ? n_out - n_out / 3 - 1 : n_out;
  const Weight w = hw.w.rows(r0, rows);
  ASSERT_TRUE(be->has_weight(OpKind::kMatmul, w));
  const auto x = random_floats(static_cast<size_t>(T * n_in), seed + 2);
  const auto y0 = random_floats(static_cast<size_t>(T * rows), seed + 3);
  DevMat dx(be, T, n_in, x), dy(be, T, rows, y0), tmp(be, T, rows);
  if (accumulate)
    be->matmul_add(w, dx.act(), dy.act(), tmp.act());
  else
    be->matmul(w, dx.act(), dy.act(), bias ? &hb.w : nullptr);
  const auto y = dy.fetch();
  std::vector<double> ref(static_cast<size_t>(T * rows));
  for (int64_t t0 = 0; t0 < T; ++t0) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = bias ? hb.deq[static_cast<size_t>(r)] : 0.0;
      if (accumulate) s = y0[static_cast<size_t>(t0 * rows + r)];
      for (int64_t k = 0; k < n_in; ++k) {
        s += static_cast<double>(hw.deq[static_cast<size_t>((r0 + r) * n_in + k)]) *
             x[static_cast<size_t>(t0 * n_in + k)];
      }
      ref[static_cast<size_t>(t0 * rows + r)] = s;
    }
  }
  EXPECT_TRUE(all_finite(y));
  EXPECT_LT(normalized_error(y, ref), tol);
}

class VulkanMatmul : public VulkanTest, public ::testing::WithParamInterface<DType> {};

TEST_P(VulkanMatmul, MatchesReference) {
  const DType t = GetParam();
  const bool dense = t == DType::kF32 || t == DType::kF16;
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  // (n_in, n_out): odd row lengths and tails where the dtype allows them, row
  // counts that leave partial workgroups and tiles.
  std::vector<std::pair<int64_t, int64_t> > shapes;
  if (dense)
    shapes = {{67, 13}, {32, 130}, {5, 3}};
  else if (kq)
    shapes = {{256, 19}, {512, 70}};
  else
    shapes = {{96, 37}, {64, 130}};
  uint32_t seed = 100;
  for (auto [n_in, n_out] : shapes) {
    for (int64_t T : {1, 3, 8, 9, 70, 131}) {
      check_matmul(be_, t, n_in, n_out, T, /*bias=*/T == 3 || T == 70, /*view=*/T == 9, seed++);
    }
  }
  // The prefill matmul's 128 x 64 tiles (devices with less shared memory).
  be_->set_matmul_n64(true);
  for (int64_t T : {70, 131}) {
    check_matmul(be_, t, shapes[0].first, shapes[0].second, T, T == 70, false, seed++);
  }
  be_->set_matmul_n64(false);
}

// The prefill matmul on cooperative matrices (mul_mat_cm.comp: F16 weights
// and activations, F32 sums), in every variant: row counts that leave
// partial 128-row tiles, token counts that leave partial 64- and 128-token
// tiles, odd and even unit counts (the double buffer), bias and row views.
TEST_P(VulkanMatmul, CoopmatMatchesReference) {
  const DType t = GetParam();
  if (t == DType::kF32) GTEST_SKIP() << "F32 weights keep the tiled kernel (exact F32 products)";
  if (!be_->caps().coopmat)
    GTEST_SKIP() << "the device has no cooperative matrices (VK_NV_cooperative_matrix, "
                    "16x16x16 F16 -> F32): prefill takes the tiled kernel";
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  std::vector<std::pair<int64_t, int64_t> > shapes;
  if (t == DType::kF16)
    shapes = {{67, 13}, {32, 40}, {96, 200}, {1024, 130}};
  else if (kq)
    shapes = {{256, 19}, {512, 200}, {1280, 131}};
  else
    shapes = {{96, 37}, {64, 200}, {1024, 130}};
  // F16 rounding of x and W: about 4e-4 relative; a wrong index gives ~1.
  constexpr double kTol = 2e-3;
  uint32_t seed = 300;
  auto check_all = [&] {
    for (auto [n_in, n_out] : shapes) {
      for (int64_t T : {9, 64, 70, 131, 257}) {
        check_matmul(be_, t, n_in, n_out, T, /*bias=*/T == 70 || T == 257, /*view=*/T == 131,
                     seed++, false, kTol);
      }
    }
  };
  for (uint32_t v : {2u, 3u, 0u}) {
    SCOPED_TRACE("variant " + std::to_string(v));
    be_->set_matmul_coopmat(true, v);
    check_all();
  }
  for (const std::string& tile : VulkanBackend::matmul_cm_tiles()) {
    SCOPED_TRACE(tile);
    be_->set_matmul_cm_tile(tile);
    check_all();
  }
  be_->set_matmul_coopmat(true, 0);
}

// The F16 copy the cooperative-matrix matmul reads (to_f16.comp), on every
// device: odd row lengths (scalar loads and zeros to the unit's end), row
// views at odd offsets, values past F16's range and below it (zero).
TEST_F(VulkanTest, F16CopyOfActivations) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 67}, {5, 64}, {2, 300}}) {
    const uint32_t units = static_cast<uint32_t>((cols + 31) / 32);
    auto x = random_floats(static_cast<size_t>((rows + 1) * cols),
                           7000 + static_cast<uint32_t>(cols), -3.0f, 3.0f);
    x[1] = 1e6f;   // past 65504: +Inf
    x[2] = -1e6f;  // -Inf
    x[3] = 1e-9f;  // below the smallest subnormal half: 0
    DevMat dx(be_, rows + 1, cols, x);
    // Rows 1 .. rows of the matrix: an offset of `cols` floats.
    const Act view = dx.act().rows_view(1, rows);
    auto h = be_->f16_copy(view, units);
    ASSERT_TRUE(h.ok()) << h.message();
    ASSERT_EQ(h->size(), static_cast<size_t>(rows) * units * 32);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < int64_t{units} * 32; ++k) {
        // GLSL leaves packHalf2x16's rounding to the device: the nearest half
        // or its neighbour toward zero.
        const int got = (*h)[static_cast<size_t>(r * units * 32 + k)];
        const float want = k < cols ? x[static_cast<size_t>((r + 1) * cols + k)] : 0.0f;
        EXPECT_LE(std::abs(got - int{ref::fp32_to_fp16(want)}), 1) << "row " << r << " k " << k;
      }
    }
    // Row 0 of the whole matrix: the Inf, -Inf and zero cases.
    auto h0 = be_->f16_copy(dx.act().rows_view(0, 1), units);
    ASSERT_TRUE(h0.ok()) << h0.message();
    // Past F16's range: Inf (round to nearest) or the largest half (toward zero).
    EXPECT_TRUE((*h0)[1] == 0x7C00u || (*h0)[1] == 0x7BFFu) << (*h0)[1];
    EXPECT_TRUE((*h0)[2] == 0xFC00u || (*h0)[2] == 0xFBFFu) << (*h0)[2];
    EXPECT_EQ((*h0)[3] & 0x7FFFu, 0u);
  }
}

// The F16 copy of a quantized weight that the direct tensor-core matmul reads
// (dequant_f16.comp), on every device: whole matrices and row ranges against
// the reference dequantizer rounded to half.
TEST_P(VulkanMatmul, F16CopyOfWeights) {
  const DType t = GetParam();
  if (t == DType::kF32 || t == DType::kF16) GTEST_SKIP() << "F32 and F16 weights are not copied";
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  uint32_t seed = 1300;
  for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{kq ? 256 : 96, 37}, {kq ? 512 : 160, 5}}) {
    HostWeight h = make_weight(t, n_in, n_out, seed++);
    ASSERT_TRUE(be_->upload_weight(h.w).ok());
    const int64_t units = (n_in + 31) / 32;
    for (auto [row0, rows] : {std::pair<int64_t, int64_t>{0, n_out}, {1, n_out - 2}}) {
      SCOPED_TRACE(testing::Message() << n_in << "x" << n_out << " rows " << row0 << "+" << rows);
      auto c = be_->f16_weight_copy(h.w, static_cast<uint64_t>(row0), static_cast<uint32_t>(rows));
      ASSERT_TRUE(c.ok()) << c.message();
      ASSERT_EQ(c->size(), static_cast<size_t>(rows * units * 32));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < units * 32; ++k) {
          const float want = k < n_in ? h.deq[static_cast<size_t>((row0 + r) * n_in + k)] : 0.0f;
          const int got = (*c)[static_cast<size_t>(r * units * 32 + k)];
          ASSERT_LE(std::abs(got - int{ref::fp32_to_fp16(want)}), 1) << "row " << r << " k " << k;
        }
      }
    }
    be_->release_weight(h.w);
  }
  // Not uploaded. (The shared backend may hold weights of earlier tests whose
  // freed host bytes this one's reuse: release whatever covers them first.)
  HostWeight nw = make_weight(t, kq ? 256 : 64, 2, 1);
  be_->release_weight(nw.w);
  EXPECT_FALSE(be_->f16_weight_copy(nw.w, 0, 2).ok());
}

// matmul_add (y += W x): one fused matvec for a single token (both row
// splits), the plain ops for more tokens.
TEST_P(VulkanMatmul, MatmulAdd) {
  const DType t = GetParam();
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  const int64_t n_in = kq ? 512 : 96;
  uint32_t seed = 900;
  for (int64_t T : {1, 3}) check_matmul(be_, t, n_in, 37, T, false, /*view=*/T == 1, seed++, true);
  be_->set_matvec_threads_per_row(2 * std::max<uint32_t>(1, be_->caps().subgroup_size));
  check_matmul(be_, t, n_in * 3, 37, 1, false, false, seed++, true);
  be_->set_matvec_threads_per_row(0);
}

// Integer-dot matvecs (Q4_0, Q8_0, Q4_K, Q6_K): after rms_norm of one token, its Q8 copy
// feeds matmul, matmul_glu and matmul_qkv; against a double reference that
// quantizes the normed row as the shader does (32-element blocks, d = max|v| /
// 127, round to even), over row splits. A write over the normed row (upload)
// makes the copy stale: the float matvec runs and matches the new row. With
// the option, matmul_add quantizes its own input first (quant_q8).
TEST_P(VulkanMatmul, IntDotAfterNorm) {
  const DType t = GetParam();
  if (t != DType::kQ4_0 && t != DType::kQ8_0 && t != DType::kQ4_K && t != DType::kQ6_K)
    GTEST_SKIP() << "integer dots: Q4_0, Q8_0, Q4_K and Q6_K";
  if (!be_->caps().int_dot) GTEST_SKIP() << "the device has no 8-bit integer dot products";
  const int64_t n = 512, m = 70;
  const float eps = 1e-5f;
  const HostWeight w = make_weight(t, n, m, 990), g = make_weight(t, n, m, 991),
                   u = make_weight(t, n, m, 992), k = make_weight(t, n, 18, 993),
                   v = make_weight(t, n, 18, 994), nw = make_weight(DType::kF32, n, 1, 995);
  ASSERT_TRUE(be_->upload_weights({&w.w, &g.w, &u.w, &k.w, &v.w, &nw.w}).ok());
  const auto x = random_floats(static_cast<size_t>(n), 996, -3.0f, 3.0f);
  // The normed row's Q8 round trip.
  const std::vector<double> xq = q8_round_trip(normed_row(x, nw, eps));
  const auto dot = row_dot;
  const uint32_t sg = std::max<uint32_t>(1, be_->caps().subgroup_size);
  for (uint32_t tpr : {0u, sg, 2u}) {
    SCOPED_TRACE("threads per row " + std::to_string(tpr));
    be_->set_matvec_threads_per_row(tpr);
    DevMat dx(be_, 1, n, x), dn(be_, 1, n), dy(be_, 1, m), dt(be_, 1, m), dk(be_, 1, 18),
        dv(be_, 1, 18);
    std::vector<double> ry(static_cast<size_t>(m)), rg(ry.size()), rk(18), rv(18);
    for (int64_t r = 0; r < m; ++r) {
      ry[static_cast<size_t>(r)] = dot(w, r, xq);
      const double a = dot(g, r, xq), b = dot(u, r, xq);
      rg[static_cast<size_t>(r)] = a / (1.0 + std::exp(-a)) * b;
    }
    for (int64_t r = 0; r < 18; ++r) {
      rk[static_cast<size_t>(r)] = dot(k, r, xq);
      rv[static_cast<size_t>(r)] = dot(v, r, xq);
    }
    const uint64_t i0 = be_->int_dot_dispatches();
    be_->rms_norm(dx.act(), nw.w, eps, dn.act());
    be_->matmul(w.w, dn.act(), dy.act(), nullptr);
    EXPECT_LT(normalized_error(dy.fetch(), ry), 1e-4);
    be_->matmul_glu(g.w, u.w, dn.act(), dy.act(), dt.act());
    EXPECT_LT(normalized_error(dy.fetch(), rg), 1e-4);
    const Weight none;
    be_->matmul_qkv(w.w, k.w, v.w, none, none, none, dn.act(), dy.act(), dk.act(), dv.act());
    EXPECT_LT(normalized_error(dy.fetch(), ry), 1e-4);
    EXPECT_LT(normalized_error(dk.fetch(), rk), 1e-4);
    EXPECT_LT(normalized_error(dv.fetch(), rv), 1e-4);
    EXPECT_EQ(be_->int_dot_dispatches() - i0, 3u);
    // A new row over the normed one: the copy is stale, the float matvec reads the row.
    const auto x2 = random_floats(static_cast<size_t>(n), 997);
    ASSERT_TRUE(be_->upload(x2.data(), dn.act()).ok());
    be_->matmul(w.w, dn.act(), dy.act(), nullptr);
    std::vector<double> r2(static_cast<size_t>(m));
    const std::vector<double> x2d(x2.begin(), x2.end());
    for (int64_t r = 0; r < m; ++r) r2[static_cast<size_t>(r)] = dot(w, r, x2d);
    EXPECT_LT(normalized_error(dy.fetch(), r2), 1e-5);
    EXPECT_EQ(be_->int_dot_dispatches() - i0, 3u);
  }
  be_->set_matvec_threads_per_row(0);
  // With copies of matmul_add's inputs too (quant_q8): y += W x on the Q8 round trip of x.
  {
    be_->set_int_dot(true, /*inputs=*/true);
    const std::vector<double> x1q = q8_round_trip(std::vector<double>(x.begin(), x.end()));
    std::vector<double> ry(static_cast<size_t>(m));
    const auto y0 = random_floats(static_cast<size_t>(m), 998);
    for (int64_t r = 0; r < m; ++r)
      ry[static_cast<size_t>(r)] = y0[static_cast<size_t>(r)] + dot(w, r, x1q);
    DevMat dx(be_, 1, n, x), dy(be_, 1, m, y0), dt(be_, 1, m);
    const uint64_t i0 = be_->int_dot_dispatches();
    be_->matmul_add(w.w, dx.act(), dy.act(), dt.act());
    EXPECT_LT(normalized_error(dy.fetch(), ry), 1e-4);
    EXPECT_EQ(be_->int_dot_dispatches() - i0, 1u);
    be_->set_int_dot(true);
  }
  for (const HostWeight* h : {&w, &g, &u, &k, &v, &nw}) be_->release_weight(h->w);
}

// The fused gate+up matvec on a norm's Q8 copy also writes the Q8 copy of its
// output (matvec1x_glu_q8: the last workgroup of each 32-element block), and
// the down matrix's matmul_add takes integer dots on it: y0 + down q8(glu),
// glu = silu(g q8(xn)) * (u q8(xn)), against the double reference. Row splits
// whose workgroups span several blocks make no copy: down is then float.
// (lavapipe: 8-wide subgroups, 128-thread workgroups.)
// Twice per split, so the arrival counters must be back at zero.
TEST_P(VulkanMatmul, IntDotOfGateUpOutput) {
  const DType t = GetParam();
  if (t != DType::kQ4_0 && t != DType::kQ8_0 && t != DType::kQ4_K && t != DType::kQ6_K)
    GTEST_SKIP() << "integer dots: Q4_0, Q8_0, Q4_K and Q6_K";
  if (!be_->caps().int_dot) GTEST_SKIP() << "the device has no 8-bit integer dot products";
  const int64_t n = 256, n_ff = 512, m = 40;
  const float eps = 1e-5f;
  const HostWeight g = make_weight(t, n, n_ff, 981), u = make_weight(t, n, n_ff, 982),
                   dw = make_weight(t, n_ff, m, 983), nw = make_weight(DType::kF32, n, 1, 984);
  ASSERT_TRUE(be_->upload_weights({&g.w, &u.w, &dw.w, &nw.w}).ok());
  const auto x = random_floats(static_cast<size_t>(n), 985, -3.0f, 3.0f);
  const auto y0 = random_floats(static_cast<size_t>(m), 986);
  const std::vector<double> xq = q8_round_trip(normed_row(x, nw, eps));
  std::vector<double> h(static_cast<size_t>(n_ff));
  for (int64_t r = 0; r < n_ff; ++r) {
    const double a = row_dot(g, r, xq), b = row_dot(u, r, xq);
    h[static_cast<size_t>(r)] = a / (1.0 + std::exp(-a)) * b;
  }
  const std::vector<double> hq = q8_round_trip(h);
  std::vector<double> ry(static_cast<size_t>(m)), rf(ry.size());
  for (int64_t r = 0; r < m; ++r) {
    ry[static_cast<size_t>(r)] = y0[static_cast<size_t>(r)] + row_dot(dw, r, hq);
    rf[static_cast<size_t>(r)] = y0[static_cast<size_t>(r)] + row_dot(dw, r, h);
  }
  const uint32_t sg = std::max<uint32_t>(1, be_->caps().subgroup_size);
  // Default and one subgroup per row group: each subgroup counts its outputs;
  // two subgroups: the workgroup counts after a barrier; 2: no copy.
  for (uint32_t tpr : {0u, 0u, sg, 2 * sg, 2u}) {
    SCOPED_TRACE("threads per row " + std::to_string(tpr));
    be_->set_matvec_threads_per_row(tpr);
    DevMat dx(be_, 1, n, x), dn(be_, 1, n), dh(be_, 1, n_ff), dt(be_, 1, n_ff), dy(be_, 1, m, y0),
        dt2(be_, 1, m);
    be_->rms_norm(dx.act(), nw.w, eps, dn.act());
    be_->matmul_glu(g.w, u.w, dn.act(), dh.act(), dt.act());
    EXPECT_LT(normalized_error(dh.fetch(), h), 1e-4);
    const uint64_t i0 = be_->int_dot_dispatches();
    be_->matmul_add(dw.w, dh.act(), dy.act(), dt2.act());
    const bool int_down = be_->int_dot_dispatches() - i0 == 1;
    const auto y = dy.fetch();
    EXPECT_TRUE(all_finite(y));
    if (int_down) {
      EXPECT_LT(normalized_error(y, ry), 2e-4);
    } else {
      EXPECT_LT(normalized_error(y, rf), 1e-4);
    }
    if (tpr == 0 || tpr == sg || tpr == 2 * sg) {
      EXPECT_TRUE(int_down) << "this split makes the copy";
    }
  }
  be_->set_matvec_threads_per_row(0);
  for (const HostWeight* hw : {&g, &u, &dw, &nw}) be_->release_weight(hw->w);
}

// matmul_glu (silu(gate x) * (up x)): one fused matvec for a single token,
// under several row splits (pairs of rows per row group), the plain ops for
// more tokens; against the double reference.
TEST_P(VulkanMatmul, MatmulGlu) {
  const DType t = GetParam();
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  const int64_t n_in = kq ? 512 : 160, n_out = 37;
  const HostWeight g = make_weight(t, n_in, n_out, 950), u = make_weight(t, n_in, n_out, 951);
  ASSERT_TRUE(be_->upload_weight(g.w).ok());
  ASSERT_TRUE(be_->upload_weight(u.w).ok());
  const uint32_t sg = std::max<uint32_t>(1, be_->caps().subgroup_size);
  const std::pair<uint32_t, uint32_t> splits[] = {{0, 0}, {sg, 4}, {2 * sg, 2}, {2, 1}};
  for (int64_t T : {1, 3}) {
    for (auto [tpr, nr] : splits) {
      if (T > 1 && tpr) continue;
      SCOPED_TRACE("T " + std::to_string(T) + ", threads per row " + std::to_string(tpr) +
                   ", rows " + std::to_string(nr));
      be_->set_matvec_threads_per_row(tpr);
      be_->set_matvec_rows(nr);
      const auto x = random_floats(static_cast<size_t>(T * n_in), 952);
      DevMat dx(be_, T, n_in, x), dy(be_, T, n_out), tmp(be_, T, n_out);
      be_->matmul_glu(g.w, u.w, dx.act(), dy.act(), tmp.act());
      const auto y = dy.fetch();
      std::vector<double> ref(static_cast<size_t>(T * n_out));
      for (int64_t t0 = 0; t0 < T; ++t0) {
        for (int64_t r = 0; r < n_out; ++r) {
          double a = 0, b = 0;
          for (int64_t k = 0; k < n_in; ++k) {
            const double xv = x[static_cast<size_t>(t0 * n_in + k)];
            a += g.deq[static_cast<size_t>(r * n_in + k)] * xv;
            b += u.deq[static_cast<size_t>(r * n_in + k)] * xv;
          }
          ref[static_cast<size_t>(t0 * n_out + r)] = a / (1.0 + std::exp(-a)) * b;
        }
      }
      EXPECT_TRUE(all_finite(y));
      EXPECT_LT(normalized_error(y, ref), 1e-5);
    }
  }
  be_->set_matvec_threads_per_row(0);
  be_->set_matvec_rows(0);
}

// matmul_qkv: q, k and v in one matvec for a single token when the three
// share a type (q and k alone when v's differs, the plain ops with a bias),
// over row counts that split row groups across the matrices; against the
// double reference.
TEST_P(VulkanMatmul, MatmulQkv) {
  const DType t = GetParam();
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  const int64_t n_in = kq ? 512 : 160;
  const DType other = t == DType::kQ8_0 ? DType::kF16 : DType::kQ8_0;
  const HostWeight wq = make_weight(t, n_in, 37, 960), wk = make_weight(t, n_in, 13, 961),
                   wv = make_weight(t, n_in, 13, 962), wv2 = make_weight(other, n_in, 13, 963),
                   bq = make_weight(DType::kF32, 37, 1, 964);
  for (const HostWeight* h : {&wq, &wk, &wv, &wv2, &bq}) ASSERT_TRUE(be_->upload_weight(h->w).ok());
  const Weight none;
  struct Case {
    const HostWeight* v;
    bool bias;
    uint64_t dispatches;  // for one token
  };
  const uint32_t sg = std::max<uint32_t>(1, be_->caps().subgroup_size);
  for (const Case& c : {Case{&wv, false, 1}, Case{&wv2, false, 2}, Case{&wv, true, 3}}) {
    for (int64_t T : {1, 3}) {
      for (uint32_t tpr : {0u, 2 * sg}) {
        if (T > 1 && tpr) continue;
        SCOPED_TRACE("v " + std::string(dtype_name(c.v->w.dtype)) + (c.bias ? ", q bias" : "") +
                     ", T " + std::to_string(T) + ", threads per row " + std::to_string(tpr));
        be_->set_matvec_threads_per_row(tpr);
        be_->set_matvec_rows(tpr ? 4 : 0);
        const auto x = random_floats(static_cast<size_t>(T * n_in), 965);
        DevMat dx(be_, T, n_in, x), dq(be_, T, 37), dk(be_, T, 13), dv(be_, T, 13);
        const uint64_t d0 = be_->dispatches();
        be_->matmul_qkv(wq.w, wk.w, c.v->w, c.bias ? bq.w : none, none, none, dx.act(), dq.act(),
                        dk.act(), dv.act());
        if (T == 1) {
          EXPECT_EQ(be_->dispatches() - d0, c.dispatches);
        }
        const std::pair<const HostWeight*, DevMat*> outs[] = {{&wq, &dq}, {&wk, &dk}, {c.v, &dv}};
        for (const auto& [h, d] : outs) {
          const int64_t n = h->w.n_out;
          const auto y = d->fetch();
          std::vector<double> ref(static_cast<size_t>(T * n));
          for (int64_t t0 = 0; t0 < T; ++t0) {
            for (int64_t r = 0; r < n; ++r) {
              double a = (c.bias && h == &wq) ? bq.deq[static_cast<size_t>(r)] : 0.0;
              for (int64_t k = 0; k < n_in; ++k)
                a += h->deq[static_cast<size_t>(r * n_in + k)] *
                     x[static_cast<size_t>(t0 * n_in + k)];
              ref[static_cast<size_t>(t0 * n + r)] = a;
            }
          }
          EXPECT_TRUE(all_finite(y));
          EXPECT_LT(normalized_error(y, ref), 1e-5);
        }
      }
    }
  }
  be_->set_matvec_threads_per_row(0);
  be_->set_matvec_rows(0);
}

// upload_weights: one allocation cut in pieces for the tensors of a group; the
// fused matvec reads them in one dispatch, and each piece is released and
// uploaded again on its own.
TEST_P(VulkanMatmul, GroupUpload) {
  const DType t = GetParam();
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  const int64_t n_in = kq ? 256 : 96;
  const HostWeight wq = make_weight(t, n_in, 21, 970), wk = make_weight(t, n_in, 9, 971),
                   wv = make_weight(t, n_in, 9, 972);
  ASSERT_TRUE(be_->upload_weights({&wq.w, &wk.w, &wv.w, &wq.w}).ok());
  for (const HostWeight* h : {&wq, &wk, &wv}) EXPECT_TRUE(be_->has_weight(OpKind::kMatmul, h->w));
  const Weight none;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round ? "k released and uploaded again" : "uploaded as a group");
    const auto x = random_floats(static_cast<size_t>(n_in), 973);
    DevMat dx(be_, 1, n_in, x), dq(be_, 1, 21), dk(be_, 1, 9), dv(be_, 1, 9);
    const uint64_t d0 = be_->dispatches();
    be_->matmul_qkv(wq.w, wk.w, wv.w, none, none, none, dx.act(), dq.act(), dk.act(), dv.act());
    if (be_->caps().subgroup_arithmetic) {
      EXPECT_EQ(be_->dispatches() - d0, 1u);
    }
    const std::pair<const HostWeight*, DevMat*> outs[] = {{&wq, &dq}, {&wk, &dk}, {&wv, &dv}};
    for (const auto& [h, d] : outs) {
      const auto y = d->fetch();
      std::vector<double> ref(static_cast<size_t>(h->w.n_out));
      for (int64_t r = 0; r < h->w.n_out; ++r) {
        for (int64_t k = 0; k < n_in; ++k)
          ref[static_cast<size_t>(r)] +=
              h->deq[static_cast<size_t>(r * n_in + k)] * x[static_cast<size_t>(k)];
      }
      EXPECT_LT(normalized_error(y, ref), 1e-5);
    }
    be_->release_weight(wk.w);
    ASSERT_TRUE(be_->upload_weight(wk.w).ok());
  }
  for (const HostWeight* h : {&wq, &wk, &wv}) {
    be_->release_weight(h->w);
    EXPECT_FALSE(be_->has_weight(OpKind::kMatmul, h->w));
  }
}

// keep_busy: after each batch a one-thread kernel polls until the next batch
// starts recording; the batches' results are unaffected and nothing waits for
// the kernel's cap. (CPU devices leave it off; the test forces it on.)
TEST_F(VulkanTest, KeepBusyBetweenBatches) {
  be_->force_keep_busy();
  be_->set_keep_busy(true);
  const HostWeight w = make_weight(DType::kQ8_0, 64, 9, 980);
  ASSERT_TRUE(be_->upload_weight(w.w).ok());
  const uint64_t starts0 = be_->keep_busy_starts();
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < 3; ++step) {
    const auto x = random_floats(64, 981 + static_cast<uint32_t>(step));
    DevMat dx(be_, 1, 64, x), dy(be_, 1, 9);
    be_->matmul(w.w, dx.act(), dy.act(), nullptr);
    const auto y = dy.fetch();  // a batch: the kernel starts after its fence
    std::vector<double> ref(9);
    for (int64_t r = 0; r < 9; ++r) {
      for (int64_t k = 0; k < 64; ++k)
        ref[static_cast<size_t>(r)] +=
            w.deq[static_cast<size_t>(r * 64 + k)] * x[static_cast<size_t>(k)];
    }
    EXPECT_LT(normalized_error(y, ref), 1e-5);
  }
  EXPECT_GE(be_->keep_busy_starts() - starts0, 3u);
  be_->set_keep_busy(false);
  EXPECT_TRUE(be_->synchronize().ok());
  const uint64_t starts1 = be_->keep_busy_starts();
  DevMat dx(be_, 1, 64, random_floats(64, 990)), dy(be_, 1, 9);
  be_->matmul(w.w, dx.act(), dy.act(), nullptr);
  (void)dy.fetch();
  EXPECT_EQ(be_->keep_busy_starts(), starts1);  // off: no more starts
  be_->release_weight(w.w);
  be_->force_keep_busy(false);  // the backend is shared with later tests
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 30.0);  // a generous bound against a kernel nobody stops (not a speed test)
}

// Single-token matvecs (the decode path) over rows long enough for the
// unrolled loop, with every way mul_mat_vec.comp may split a row: fewer
// threads per row than a subgroup (shared memory only), one subgroup, several
// subgroups (subgroupAdd, then shared memory); and 1 to 4 rows per row group.
TEST_P(VulkanMatmul, DecodeRowSplits) {
  const DType t = GetParam();
  const bool dense = t == DType::kF32 || t == DType::kF16;
  const bool kq = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  const int64_t n_in = dense ? 1031 : kq ? 2304 : 1120;
  const uint32_t sg = std::max<uint32_t>(1, be_->caps().subgroup_size);
  uint32_t seed = 500;
  // (threads per row group, rows per row group); 0: the backend's choice.
  const std::pair<uint32_t, uint32_t> splits[] = {{0, 0},  {1, 3},      {2, 1},
                                                  {sg, 4}, {2 * sg, 3}, {128, 1}};
  for (auto [tpr, nr] : splits) {
    if (tpr > 128) continue;
    SCOPED_TRACE("threads per row " + std::to_string(tpr) + ", rows " + std::to_string(nr));
    be_->set_matvec_threads_per_row(tpr);
    be_->set_matvec_rows(nr);
    check_matmul(be_, t, n_in, 37, 1, /*bias=*/nr == 3, /*view=*/nr == 1, seed++);
  }
  be_->set_matvec_threads_per_row(0);
  be_->set_matvec_rows(0);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, VulkanMatmul,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0,
                                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const auto& pi) { return std::string(dtype_name(pi.param)); });

// ---- get_rows -------------------------------------------------------------------

class VulkanGetRows : public VulkanTest, public ::testing::WithParamInterface<DType> {};

TEST_P(VulkanGetRows, MatchesDequantizer) {
  const DType t = GetParam();
  const int64_t n_in =
      (t == DType::kF32 || t == DType::kF16) ? 67 : (traits(t).block_size == 256 ? 512 : 96);
  HostWeight hw = make_weight(t, n_in, 11, 7);
  ASSERT_TRUE(be_->upload_weight(hw.w).ok());
  const std::vector<int32_t> ids = {3, 0, 10, 3, 7};
  DevMat out(be_, 5, n_in);
  be_->get_rows(hw.w, ids.data(), out.act());
  const auto y = out.fetch();
  std::vector<double> ref;
  for (int32_t id : ids)
    ref.insert(ref.end(), hw.deq.begin() + id * n_in, hw.deq.begin() + (id + 1) * n_in);
  EXPECT_TRUE(all_finite(y));
  EXPECT_LT(normalized_error(y, ref), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, VulkanGetRows,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0,
                                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const auto& pi) { return std::string(dtype_name(pi.param)); });

// ---- element-wise, norm, RoPE ----------------------------------------------------

TEST_F(VulkanTest, RmsNorm) {
  for (int64_t n : {1, 67, 4101, 4096}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const int64_t rows = 3;
    const auto x = random_floats(static_cast<size_t>(rows * n), 11, -3.0f, 3.0f);
    HostWeight w = make_weight(DType::kF32, n, 1, 12);
    ASSERT_TRUE(be_->upload_weight(w.w).ok());
    DevMat dx(be_, rows, n, x), dy(be_, rows, n);
    be_->rms_norm(dx.act(), w.w, 1e-5f, dy.act());
    const auto y = dy.fetch();
    std::vector<float> r(static_cast<size_t>(rows * n));
    for (int64_t t = 0; t < rows; ++t)
      ref::rms_norm(x.data() + t * n, w.deq.data(), 1e-5f, r.data() + t * n, n);
    EXPECT_TRUE(all_finite(y));
    EXPECT_LT(normalized_error(y, std::vector<double>(r.begin(), r.end())), 1e-6);
  }
}

TEST_F(VulkanTest, SiluMulAddCopy) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 1}, {3, 67}, {2, 1000}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " n=" + std::to_string(n));
    const auto a = random_floats(static_cast<size_t>(rows * n), 21, -8.0f, 8.0f);
    const auto b = random_floats(static_cast<size_t>(rows * n), 22);
    DevMat da(be_, rows, n, a), db(be_, rows, n, b), ds(be_, rows, n), dsum(be_, rows, n),
        dc(be_, rows, n);
    be_->silu_mul(da.act(), db.act(), ds.act());
    be_->add(da.act(), db.act(), dsum.act());
    be_->copy(da.act(), dc.act());
    std::vector<float> rs(a.size()), radd(a.size());
    ref::silu_mul(a.data(), b.data(), rs.data(), rows * n);
    ref::add(a.data(), b.data(), radd.data(), rows * n);
    const auto s = ds.fetch(), sum = dsum.fetch(), c = dc.fetch();
    EXPECT_TRUE(all_finite(s));
    EXPECT_LT(normalized_error(s, std::vector<double>(rs.begin(), rs.end())), 1e-6);
    EXPECT_EQ(sum, radd);
    EXPECT_EQ(c, a);
  }
}

// gemma2's GeGLU: odd lengths (scalar and vec4 paths), gates where exp overflows.
TEST_F(VulkanTest, GeluMul) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 1}, {3, 67}, {2, 1000}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " n=" + std::to_string(n));
    auto a = random_floats(static_cast<size_t>(rows * n), 23, -12.0f, 12.0f);
    const float extremes[] = {-1000.0f, -100.0f, -30.0f, 30.0f, 100.0f, 1000.0f};
    for (size_t i = 0; i < std::size(extremes) && i < a.size(); ++i)
      a[i * 5 % a.size()] = extremes[i];
    const auto b = random_floats(static_cast<size_t>(rows * n), 24);
    DevMat da(be_, rows, n, a), db(be_, rows, n, b), dg(be_, rows, n);
    be_->gelu_mul(da.act(), db.act(), dg.act());
    be_->gelu_mul(da.act(), db.act(), da.act());  // in place over the gate
    std::vector<float> r(a.size());
    ref::gelu_mul(a.data(), b.data(), r.data(), rows * n);
    const std::vector<double> rd(r.begin(), r.end());
    const auto g = dg.fetch(), gi = da.fetch();
    EXPECT_TRUE(all_finite(g));
    EXPECT_LT(normalized_error(g, rd), 1e-6);
    EXPECT_EQ(gi, g);
  }
}

TEST_F(VulkanTest, AddInPlaceOnRowViews) {
  // x += y on the last rows of a wider matrix: in-place and offset views, as the forward pass uses
  // them.
  const int64_t n = 33;
  const auto x = random_floats(static_cast<size_t>(4 * n), 31),
             y = random_floats(static_cast<size_t>(4 * n), 32);
  DevMat dx(be_, 4, n, x), dy(be_, 4, n, y);
  be_->add(dx.act().rows_view(1, 3), dy.act().rows_view(0, 3), dx.act().rows_view(1, 3));
  const auto out = dx.fetch();
  for (int64_t i = 0; i < 4 * n; ++i) {
    const float want = i < n ? x[static_cast<size_t>(i)]
                             : x[static_cast<size_t>(i)] + y[static_cast<size_t>(i - n)];
    ASSERT_EQ(out[static_cast<size_t>(i)], want) << i;
  }
}

struct RopeCase {
  const char* name;
  bool neox;
  int64_t n_rot;
  bool freq_factors;
  bool yarn;
};

TEST_F(VulkanTest, Rope) {
  const RopeCase cases[] = {{"normal", false, 64, false, false},
                            {"neox", true, 64, false, false},
                            {"partial_neox", true, 32, false, false},
                            {"freq_factors", false, 64, true, false},
                            {"yarn_neox", true, 64, false, true}};
  const int64_t n_heads = 3, hd = 64, T = 4;
  const std::vector<int32_t> pos = {0, 7, 1000, 4095};
  const auto ff = random_floats(32, 41, 1.0f, 8.0f);
  for (const RopeCase& c : cases) {
    SCOPED_TRACE(c.name);
    cpu::RopeParams p;
    p.n_rot = c.n_rot;
    p.neox = c.neox;
    p.freq_base = 500000.0f;
    if (c.freq_factors) p.freq_factors = ff.data();
    if (c.yarn) {
      p.freq_scale = 0.25f;
      p.ext_factor = 1.0f;
      p.attn_factor = 1.1f;
      p.n_ctx_orig = 4096;
    }
    const auto x = random_floats(static_cast<size_t>(T * n_heads * hd), 42);
    DevMat dx(be_, T, n_heads * hd, x);
    be_->rope(dx.act(), n_heads, hd, pos.data(), p);
    const auto y = dx.fetch();
    std::vector<float> r = x;
    ref::rope(r.data(), T, n_heads, hd, pos.data(), p);
    EXPECT_TRUE(all_finite(y));
    const double tol = c.freq_factors ? 1e-5 : 1e-6;
    EXPECT_LT(normalized_error(y, std::vector<double>(r.begin(), r.end())), tol);
    // q and k (fewer heads) in one dispatch.
    const int64_t n_kv = 2;
    const auto k = random_floats(static_cast<size_t>(T * n_kv * hd), 43);
    DevMat dq(be_, T, n_heads * hd, x), dk(be_, T, n_kv * hd, k);
    be_->rope_qk(dq.act(), dk.act(), n_heads, n_kv, hd, pos.data(), p);
    std::vector<float> rk = k;
    ref::rope(rk.data(), T, n_kv, hd, pos.data(), p);
    EXPECT_LT(normalized_error(dq.fetch(), std::vector<double>(r.begin(), r.end())), tol);
    EXPECT_LT(normalized_error(dk.fetch(), std::vector<double>(rk.begin(), rk.end())), tol);
  }
}

// ---- KV store + attention ----------------------------------------------------------

struct AttnCase {
  DType kv;
  int64_t n_heads, n_kv_heads, head_dim;
  int64_t n_past;  ///< tokens stored before the queries
  int64_t T;       ///< queries (prefill when > 1), at positions n_past .. n_past + T - 1
};

std::string attn_name(const AttnCase& c) {
  return std::string(dtype_name(c.kv)) + "_h" + std::to_string(c.n_heads) + "_kv" +
         std::to_string(c.n_kv_heads) + "_d" + std::to_string(c.head_dim) + "_past" +
         std::to_string(c.n_past) + "_T" + std::to_string(c.T);
}

void check_attention(VulkanBackend* be, const AttnCase& c) {
  SCOPED_TRACE(attn_name(c));
  const int64_t n_ctx = c.n_past + c.T + 3;
  KvCacheConfig cfg{1, c.n_kv_heads, c.head_dim, n_ctx, 16, c.kv};
  auto dev_kv = KvCache::create(cfg);
  auto host_kv = KvCache::create(cfg);
  ASSERT_TRUE(dev_kv.ok() && host_kv.ok());
  auto storage = be->create_kv_storage(cfg);
  ASSERT_TRUE(storage.ok()) << storage.message();
  ASSERT_TRUE((*dev_kv)->attach_storage(std::move(storage).value()).ok());
  ASSERT_TRUE((*dev_kv)->storage()->set_layer_resident(0, true).ok());
  const int64_t n_tok = c.n_past + c.T, kv_dim = c.n_kv_heads * c.head_dim,
                q_dim = c.n_heads * c.head_dim;
  ASSERT_TRUE((*dev_kv)->reserve(n_tok).ok());
  ASSERT_TRUE((*host_kv)->reserve(n_tok).ok());
  const auto k = random_floats(static_cast<size_t>(n_tok * kv_dim), 51, -2.0f, 2.0f);
  const auto v = random_floats(static_cast<size_t>(n_tok * kv_dim), 52);
  std::vector<int32_t> pos(static_cast<size_t>(n_tok));
  for (int64_t i = 0; i < n_tok; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  // Past tokens in two uneven chunks, then the queries' own K/V, as a forward pass stores them.
  DevMat dk(be, n_tok, kv_dim, k), dv(be, n_tok, kv_dim, v);
  const int64_t first = c.n_past / 3;
  if (first > 0)
    be->kv_store(**dev_kv, 0, dk.act().rows_view(0, first), dv.act().rows_view(0, first),
                 pos.data());
  if (n_tok > first) {
    be->kv_store(**dev_kv, 0, dk.act().rows_view(first, n_tok - first),
                 dv.act().rows_view(first, n_tok - first), pos.data() + first);
  }
  for (int64_t i = 0; i < n_tok; ++i) {
    (*host_kv)->store(0, i, k.data() + i * kv_dim, v.data() + i * kv_dim);
  }
  const auto q = random_floats(static_cast<size_t>(c.T * q_dim), 53, -2.0f, 2.0f);
  DevMat dq(be, c.T, q_dim, q), dout(be, c.T, q_dim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // A Q8_0 o matrix for one token's integer-dot check.
  const int64_t o_rows = 24;
  HostWeight o_w;
  if (c.T == 1 && c.head_dim % 32 == 0 && be->caps().int_dot) {
    o_w = make_weight(DType::kQ8_0, q_dim, o_rows, 54);
    EXPECT_TRUE(be->upload_weights({&o_w.w}).ok());
  }
  DevMat dy(be, 1, o_rows);
  std::vector<float> r(static_cast<size_t>(c.T * q_dim));
  ref::attention(q.data(), c.T, pos.data() + c.n_past, c.n_heads, (*host_kv)->view(0), scale,
                 r.data(), 0, c.n_heads);
  // Keys per split as chosen, and few (several threads per key, many splits
  // to merge: more than a workgroup's worth at 3 keys and 300 on lavapipe).
  // Prefill: the tiled kernel here, the tensor-core one below.
  be->set_attn_coopmat(false);
  auto check_out = [&] {
    be->attention(**dev_kv, 0, dq.act(), pos.data() + c.n_past, c.n_heads, scale, dout.act());
    const auto out = dout.fetch();
    EXPECT_TRUE(all_finite(out));
    EXPECT_LT(normalized_error(out, std::vector<double>(r.begin(), r.end())),
              c.kv == DType::kF16 ? 1e-5 : 1e-3);
    // One token (head sizes of 32-element blocks): the kernel that writes
    // the output, attn_split with one split or attn_merge, also writes its
    // Q8 copy, which feeds o's integer-dot matvec.
    if (o_w.w.data) {
      const uint64_t i0 = be->int_dot_dispatches();
      be->matmul(o_w.w, dout.act(), dy.act(), nullptr);
      EXPECT_EQ(be->int_dot_dispatches() - i0, 1u);
      const std::vector<double> oq = q8_round_trip(std::vector<double>(out.begin(), out.end()));
      std::vector<double> ry(static_cast<size_t>(o_rows));
      for (int64_t i = 0; i < o_rows; ++i) ry[static_cast<size_t>(i)] = row_dot(o_w, i, oq);
      EXPECT_LT(normalized_error(dy.fetch(), ry), 2e-4);
    }
  };
  {
    // Then splits of several chunks (online softmax inside a split).
    const std::pair<uint32_t, uint32_t> splits[] = {{0, 0}, {8, 0}, {3, 0}, {8, 5}, {3, 7}};
    for (const auto& [keys, chunks] : splits) {
      SCOPED_TRACE("keys per split " + std::to_string(keys) + ", chunks " + std::to_string(chunks));
      be->set_attn_split_keys(keys);
      be->set_attn_split_chunks(chunks);
      check_out();
    }
  }
  be->set_attn_split_keys(0);
  be->set_attn_split_chunks(0);
  // Decode in one pass (attn_decode.comp: F16 rows, and Q8_0 rows of
  // 32-value blocks) at every context, where the device has subgroup
  // shuffles (lavapipe has: 8-lane subgroups, two 16-byte segments of F16
  // a lane past 64 values), and attn_split alone.
  const bool decode_default = be->attn_decode_on();
  for (const bool one_pass : {true, false}) {
    SCOPED_TRACE(one_pass ? "attn_decode" : "attn_split only");
    be->set_attn_decode(one_pass, true);
    check_out();
  }
  be->set_attn_decode(decode_default);
  be->set_attn_coopmat(true);
  // Prefill on cooperative matrices (attn_cm.comp: F16 Q, K, V and P, F32
  // sums), where the device has them (from 16 query rows); lavapipe has not.
  if (c.T >= 16 && be->caps().coopmat) {
    be->attention(**dev_kv, 0, dq.act(), pos.data() + c.n_past, c.n_heads, scale, dout.act());
    const auto out = dout.fetch();
    EXPECT_TRUE(all_finite(out));
    EXPECT_LT(normalized_error(out, std::vector<double>(r.begin(), r.end())), 3e-3) << "attn_cm";
  }
  if (o_w.w.data) be->release_weight(o_w.w);
}

class VulkanAttention : public VulkanTest, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(VulkanAttention, MatchesReference) {
  check_attention(be_, GetParam());
}

// Decode (T = 1, attn_split, and attn_decode for F16 rows): over 1 key, a
// full split, 300, 701 and 1001 keys (several splits, merged; a head of 80:
// lanes past the row); GQA groups of 2, 4 and 12 (head chunks); a
// head of 18 and 21 keys (tails of attn_split's unrolled K and V loops).
// Prefill (T > 1, attn_tile): partial and several query tiles, odd head sizes,
// the causal mask inside a tile; a head of 256 (too big for the tiles: split).
INSTANTIATE_TEST_SUITE_P(
    Cases, VulkanAttention,
    ::testing::Values(
        AttnCase{DType::kF16, 4, 2, 64, 0, 1}, AttnCase{DType::kF16, 4, 2, 64, 127, 1},
        AttnCase{DType::kF16, 4, 2, 64, 299, 1}, AttnCase{DType::kF16, 12, 1, 32, 40, 1},
        AttnCase{DType::kF16, 4, 2, 18, 20, 1}, AttnCase{DType::kF16, 6, 3, 128, 130, 5},
        AttnCase{DType::kF16, 4, 1, 64, 100, 70}, AttnCase{DType::kQ8_0, 4, 2, 64, 40, 65},
        AttnCase{DType::kF16, 2, 2, 18, 0, 7}, AttnCase{DType::kF16, 4, 2, 64, 40, 37},
        AttnCase{DType::kF16, 2, 1, 256, 10, 3}, AttnCase{DType::kQ8_0, 4, 2, 64, 299, 1},
        AttnCase{DType::kQ8_0, 8, 8, 32, 3, 6}, AttnCase{DType::kF16, 8, 2, 128, 1000, 1},
        AttnCase{DType::kF16, 4, 1, 80, 700, 1}, AttnCase{DType::kQ8_0, 8, 2, 128, 1000, 1}),
    [](const auto& pi) { return attn_name(pi.param); });

// ---- KV residency and transfers -----------------------------------------------------

size_t kv_row_bytes(DType t, int64_t head_dim) {
  return static_cast<size_t>(*dtype_row_bytes(t, static_cast<uint64_t>(head_dim)));
}

// Host rows of n tokens ([n, n_kv_heads * head_dim] floats) in the export
// format, [n_kv_heads][n][row], written by the CPU backend's kv_store.
std::vector<uint8_t> cpu_rows(DType t, int64_t n_kv_heads, int64_t head_dim, int64_t n,
                              const std::vector<float>& x) {
  const size_t rb = kv_row_bytes(t, head_dim);
  std::vector<uint8_t> rows(rb * static_cast<size_t>(n_kv_heads * n));
  for (int64_t i = 0; i < n; ++i) {
    cpu::kv_store(t, rows.data(), rb * static_cast<size_t>(n), n_kv_heads, head_dim, i,
                  x.data() + i * n_kv_heads * head_dim);
  }
  return rows;
}

// One row's values, dequantized.
std::vector<float> row_values(DType t, const uint8_t* row, int64_t head_dim) {
  std::vector<float> f(static_cast<size_t>(head_dim));
  EXPECT_TRUE(ref::dequantize_row(t, row, f.data(), head_dim).ok());
  return f;
}

// A KV cache with device storage, layer `layer` resident there (null on failure).
std::unique_ptr<KvCache> device_kv(VulkanBackend* be, const KvCacheConfig& cfg, int64_t layer) {
  auto kv = KvCache::create(cfg);
  auto storage = be->create_kv_storage(cfg);
  if (!kv.ok() || !storage.ok()) return nullptr;
  std::unique_ptr<KvCache> c = std::move(kv).value();
  if (!c->attach_storage(std::move(storage).value()).ok() ||
      !c->storage()->set_layer_resident(layer, true).ok())
    return nullptr;
  return c;
}

class VulkanKv : public VulkanTest, public ::testing::WithParamInterface<DType> {
 protected:
  void TearDown() override {
    if (be_) be_->set_transfer_chunk(0);
    VulkanTest::TearDown();
  }
};

TEST_P(VulkanKv, ExportImportRoundTripIsBitExact) {
  const DType t = GetParam();
  const int64_t n_kv = 3, hd = 64, n = 37, kv_dim = n_kv * hd;
  KvCacheConfig cfg{3, n_kv, hd, 50, 16, t};
  auto st = be_->create_kv_storage(cfg);
  ASSERT_TRUE(st.ok()) << st.message();
  KvStorage& s = **st;
  EXPECT_FALSE(s.layer_resident(0));
  EXPECT_EQ(s.allocated_bytes(), 0u);  // nothing until a layer is made resident
  ASSERT_TRUE(s.set_layer_resident(1, true).ok());
  EXPECT_TRUE(s.layer_resident(1));
  EXPECT_FALSE(s.layer_resident(0));
  EXPECT_FALSE(s.layer_resident(2));
  EXPECT_GT(s.allocated_bytes(), 0u);
  const auto k = random_floats(static_cast<size_t>(n * kv_dim), 91, -3.0f, 3.0f);
  const auto v = random_floats(static_cast<size_t>(n * kv_dim), 92);
  const auto hk = cpu_rows(t, n_kv, hd, n, k), hv = cpu_rows(t, n_kv, hd, n, v);
  // Whole ring, then chunks of a few rows (several submissions, rows split
  // between chunks) over the same data.
  for (uint64_t chunk : {uint64_t{0}, uint64_t{1500}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    be_->set_transfer_chunk(chunk);
    ASSERT_TRUE(s.import_layer(1, n, hk.data(), hv.data()).ok());
    std::vector<uint8_t> ek(hk.size(), 0xAB), ev(hv.size(), 0xCD);
    ASSERT_TRUE(s.export_layer(1, n, ek.data(), ev.data()).ok());
    EXPECT_TRUE(ek == hk) << "K differs after the round trip";
    EXPECT_TRUE(ev == hv) << "V differs after the round trip";
    // A prefix: the first 20 rows of each head, packed [head][20][row].
    const size_t rb = kv_row_bytes(t, hd);
    std::vector<uint8_t> pk(rb * 20 * n_kv), pv(pk.size());
    ASSERT_TRUE(s.export_layer(1, 20, pk.data(), pv.data()).ok());
    for (int64_t h = 0; h < n_kv; ++h) {
      EXPECT_EQ(std::memcmp(pk.data() + rb * 20 * h, hk.data() + rb * n * h, rb * 20), 0)
          << "head " << h;
      EXPECT_EQ(std::memcmp(pv.data() + rb * 20 * h, hv.data() + rb * n * h, rb * 20), 0)
          << "head " << h;
    }
  }
}

TEST_P(VulkanKv, ExportOfStoredRowsMatchesTheCpu) {
  // kv_store on the device, then export: the rows the CPU would have written
  // (the GPU may round a quant or an F16 value the other way).
  const DType t = GetParam();
  const int64_t n_kv = 2, hd = 64, n = 37, kv_dim = n_kv * hd;
  const auto kv = device_kv(be_, KvCacheConfig{1, n_kv, hd, 40, 16, t}, 0);
  ASSERT_TRUE(kv);
  KvStorage& s = *kv->storage();
  const auto k = random_floats(static_cast<size_t>(n * kv_dim), 93, -3.0f, 3.0f);
  const auto v = random_floats(static_cast<size_t>(n * kv_dim), 94);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  DevMat dk(be_, n, kv_dim, k), dv(be_, n, kv_dim, v);
  be_->kv_store(*kv, 0, dk.act(), dv.act(), pos.data());
  const size_t rb = kv_row_bytes(t, hd);
  std::vector<uint8_t> ek(rb * static_cast<size_t>(n * n_kv)), ev(ek.size());
  ASSERT_TRUE(s.export_layer(0, n, ek.data(), ev.data()).ok());
  const auto hk = cpu_rows(t, n_kv, hd, n, k), hv = cpu_rows(t, n_kv, hd, n, v);
  for (size_t r = 0; r < static_cast<size_t>(n * n_kv); ++r) {
    for (const auto& [dev, cpu] : {std::pair{&ek, &hk}, std::pair{&ev, &hv}}) {
      const auto a = row_values(t, dev->data() + r * rb, hd),
                 b = row_values(t, cpu->data() + r * rb, hd);
      float amax = 0;
      for (float x : b) amax = std::max(amax, std::abs(x));
      // One F16 ulp (2^-10 relative), or one Q8_0 step (amax / 127).
      const float tol = t == DType::kF16 ? amax * 1e-3f : amax / 126.0f;
      for (int64_t e = 0; e < hd; ++e) {
        ASSERT_NEAR(a[static_cast<size_t>(e)], b[static_cast<size_t>(e)], tol)
            << "row " << r << " element " << e;
      }
    }
  }
}

// rope_qk_kv (one dispatch for an F16 cache, normal ordering) leaves q, k and
// the cache bit for bit as rope_qk then kv_store do; Q8_0 caches and NeoX
// ordering take those two ops.
TEST_P(VulkanKv, RopeQkKvMatchesRopeThenStore) {
  const DType t = GetParam();
  const int64_t n_heads = 4, n_kv = 2, hd = 64, T = 5, n_ctx = 40;
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4};
  for (const bool neox : {false, true}) {
    SCOPED_TRACE(neox ? "neox" : "normal");
    cpu::RopeParams p;
    p.n_rot = hd;
    p.neox = neox;
    p.freq_base = 500000.0f;
    const auto q = random_floats(static_cast<size_t>(T * n_heads * hd), 71, -2.0f, 2.0f);
    const auto k = random_floats(static_cast<size_t>(T * n_kv * hd), 72, -2.0f, 2.0f);
    const auto v = random_floats(static_cast<size_t>(T * n_kv * hd), 73);
    std::vector<uint8_t> out[2][2];
    std::vector<float> qs[2], ks[2];
    for (int fused = 0; fused < 2; ++fused) {
      const auto kv = device_kv(be_, KvCacheConfig{2, n_kv, hd, n_ctx, 16, t}, 1);
      ASSERT_TRUE(kv);
      KvStorage& s = *kv->storage();
      DevMat dq(be_, T, n_heads * hd, q), dk(be_, T, n_kv * hd, k), dv(be_, T, n_kv * hd, v);
      const uint64_t d0 = be_->dispatches();
      if (fused) {
        be_->rope_qk_kv(dq.act(), dk.act(), dv.act(), *kv, 1, n_heads, n_kv, hd, pos.data(), p);
        EXPECT_EQ(be_->dispatches() - d0, t == DType::kF16 && !neox ? 1u : 2u);
      } else {
        be_->rope_qk(dq.act(), dk.act(), n_heads, n_kv, hd, pos.data(), p);
        be_->kv_store(*kv, 1, dk.act(), dv.act(), pos.data());
      }
      qs[fused] = dq.fetch();
      ks[fused] = dk.fetch();
      const size_t rb = kv_row_bytes(t, hd);
      out[fused][0].resize(rb * static_cast<size_t>(T * n_kv));
      out[fused][1].resize(out[fused][0].size());
      ASSERT_TRUE(s.export_layer(1, T, out[fused][0].data(), out[fused][1].data()).ok());
    }
    EXPECT_TRUE(qs[0] == qs[1]) << "q differs";
    EXPECT_TRUE(ks[0] == ks[1]) << "k differs";
    EXPECT_TRUE(out[0][0] == out[1][0]) << "K cache differs";
    EXPECT_TRUE(out[0][1] == out[1][1]) << "V cache differs";
  }
}

// matmul_qkv_rope_kv: for a single token with an F16 cache, one matvec
// (matvec1_qkv_rope) that leaves q, k and the cache as matmul_qkv, then
// rope_qk_kv do (to float rounding of the rotation), over weight types, row
// splits (pairs across row groups and subgroups), frequency factors and YaRN;
// a Q8_0 cache takes the ops apart.
TEST_P(VulkanKv, MatmulQkvRopeKvMatchesTheOpsApart) {
  const DType t = GetParam();
  // Heads of 18 (nine pairs: pairs split across row groups); Q8_0 caches need 32.
  const int64_t n_heads = 4, n_kv = 2, hd = t == DType::kQ8_0 ? 32 : 18, n_ctx = 12, n_in = 256;
  const std::vector<int32_t> pos = {7};
  const auto ff = random_floats(static_cast<size_t>(hd / 2), 74, 1.0f, 4.0f);
  const uint32_t sg = std::max<uint32_t>(1, be_->caps().subgroup_size);
  const Weight none;
  for (DType wt : {DType::kQ4_0, DType::kQ4_K, DType::kF16}) {
    const HostWeight wq = make_weight(wt, n_in, n_heads * hd, 75),
                     wk = make_weight(wt, n_in, n_kv * hd, 76),
                     wv = make_weight(wt, n_in, n_kv * hd, 77);
    ASSERT_TRUE(be_->upload_weights({&wq.w, &wk.w, &wv.w}).ok());
    const auto x = random_floats(static_cast<size_t>(n_in), 78);
    for (int variant = 0; variant < 3; ++variant) {
      cpu::RopeParams p;
      p.n_rot = hd;
      p.freq_base = 10000.0f;
      if (variant == 1) p.freq_factors = ff.data();
      if (variant == 2) {
        p.freq_scale = 0.25f;
        p.ext_factor = 1.0f;
        p.attn_factor = 1.1f;
        p.n_ctx_orig = 8;
      }
      for (auto [tpr, nr] : {std::pair{0u, 0u}, {2u, 4u}, {2 * sg, 1u}}) {
        SCOPED_TRACE(std::string(dtype_name(wt)) + " weights, rope variant " +
                     std::to_string(variant) + ", threads per row " + std::to_string(tpr) +
                     ", rows " + std::to_string(nr));
        be_->set_matvec_threads_per_row(tpr);
        be_->set_matvec_rows(nr);
        std::vector<float> qs[2], ks[2], vs[2];
        std::vector<uint8_t> cache[2][2];
        for (int fused = 0; fused < 2; ++fused) {
          be_->set_qkv_rope(fused == 1);
          const auto kv = device_kv(be_, KvCacheConfig{1, n_kv, hd, n_ctx, 16, t}, 0);
          ASSERT_TRUE(kv);
          ASSERT_TRUE(kv->reserve(8).ok());
          DevMat dx(be_, 1, n_in, x), dq(be_, 1, n_heads * hd), dk(be_, 1, n_kv * hd),
              dv(be_, 1, n_kv * hd);
          const uint64_t d0 = be_->dispatches();
          be_->matmul_qkv_rope_kv(wq.w, wk.w, wv.w, none, none, none, dx.act(), dq.act(), dk.act(),
                                  dv.act(), *kv, 0, n_heads, n_kv, hd, pos.data(), p);
          const uint64_t n_disp = be_->dispatches() - d0;
          if (fused && t == DType::kF16) {
            EXPECT_EQ(n_disp, 1u);
          } else {
            EXPECT_GE(n_disp, 2u);
          }
          qs[fused] = dq.fetch();
          ks[fused] = dk.fetch();
          vs[fused] = dv.fetch();
          const size_t rb = kv_row_bytes(t, hd);
          cache[fused][0].resize(rb * static_cast<size_t>(8 * n_kv));
          cache[fused][1].resize(cache[fused][0].size());
          ASSERT_TRUE(kv->storage()
                          ->export_layer(0, 8, cache[fused][0].data(), cache[fused][1].data())
                          .ok());
        }
        auto as_double = [](const std::vector<float>& v) {
          return std::vector<double>(v.begin(), v.end());
        };
        EXPECT_LT(normalized_error(qs[1], as_double(qs[0])), 1e-6);
        EXPECT_LT(normalized_error(ks[1], as_double(ks[0])), 1e-6);
        EXPECT_LT(normalized_error(vs[1], as_double(vs[0])), 1e-6);
        // Position 7's rows of each head: K and V cache values.
        const size_t rb = kv_row_bytes(t, hd);
        for (int kvi = 0; kvi < 2; ++kvi) {
          for (int64_t h = 0; h < n_kv; ++h) {
            const size_t at = rb * static_cast<size_t>(h * 8 + 7);
            std::vector<float> a(static_cast<size_t>(hd)), b(a.size());
            ASSERT_TRUE(ref::dequantize_row(t, cache[0][kvi].data() + at, a.data(), hd).ok());
            ASSERT_TRUE(ref::dequantize_row(t, cache[1][kvi].data() + at, b.data(), hd).ok());
            EXPECT_LT(normalized_error(b, as_double(a)), 2e-3)
                << (kvi ? "V" : "K") << " head " << h;
          }
        }
      }
    }
    for (const HostWeight* h : {&wq, &wk, &wv}) be_->release_weight(h->w);
  }
  be_->set_matvec_threads_per_row(0);
  be_->set_matvec_rows(0);
  be_->set_qkv_rope(true);
}

TEST_P(VulkanKv, AttentionAfterImportMatchesTheCpuCache) {
  const DType t = GetParam();
  const int64_t n_heads = 4, n_kv = 2, hd = 64, n = 37, kv_dim = n_kv * hd, q_dim = n_heads * hd;
  KvCacheConfig cfg{2, n_kv, hd, 45, 16, t};
  auto dev_kv = KvCache::create(cfg), host_kv = KvCache::create(cfg);
  ASSERT_TRUE(dev_kv.ok() && host_kv.ok());
  auto storage = be_->create_kv_storage(cfg);
  ASSERT_TRUE(storage.ok());
  ASSERT_TRUE((*dev_kv)->attach_storage(std::move(storage).value()).ok());
  KvStorage& s = *(*dev_kv)->storage();
  ASSERT_TRUE(s.set_layer_resident(1, true).ok());
  ASSERT_TRUE((*host_kv)->reserve(n).ok());
  const auto k = random_floats(static_cast<size_t>(n * kv_dim), 95, -2.0f, 2.0f);
  const auto v = random_floats(static_cast<size_t>(n * kv_dim), 96);
  for (int64_t i = 0; i < n; ++i)
    (*host_kv)->store(1, i, k.data() + i * kv_dim, v.data() + i * kv_dim);
  const auto hk = cpu_rows(t, n_kv, hd, n, k), hv = cpu_rows(t, n_kv, hd, n, v);
  ASSERT_TRUE(s.import_layer(1, n, hk.data(), hv.data()).ok());
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Prefill (tiles) over the last 5 positions, decode (splits) at the last.
  for (int64_t T : {5, 1}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const auto q = random_floats(static_cast<size_t>(T * q_dim), 97, -2.0f, 2.0f);
    DevMat dq(be_, T, q_dim, q), dout(be_, T, q_dim);
    be_->attention(**dev_kv, 1, dq.act(), pos.data() + n - T, n_heads, scale, dout.act());
    const auto out = dout.fetch();
    std::vector<float> r(static_cast<size_t>(T * q_dim));
    ref::attention(q.data(), T, pos.data() + n - T, n_heads, (*host_kv)->view(1), scale, r.data(),
                   0, n_heads);
    EXPECT_TRUE(all_finite(out));
    // The very same K/V bytes on both sides: only the float sums differ.
    EXPECT_LT(normalized_error(out, std::vector<double>(r.begin(), r.end())), 1e-5);
  }
}

TEST_P(VulkanKv, ResidencyCanBeDroppedAndRestored) {
  const DType t = GetParam();
  const int64_t n_kv = 1, hd = 32, n = 9;
  KvCacheConfig cfg{2, n_kv, hd, 16, 16, t};
  auto st = be_->create_kv_storage(cfg);
  ASSERT_TRUE(st.ok());
  KvStorage& s = **st;
  ASSERT_TRUE(s.set_layer_resident(0, true).ok());
  const uint64_t one = s.allocated_bytes();
  ASSERT_TRUE(s.set_layer_resident(0, true).ok());  // already there: nothing changes
  EXPECT_EQ(s.allocated_bytes(), one);
  ASSERT_TRUE(s.set_layer_resident(1, true).ok());
  EXPECT_EQ(s.allocated_bytes(), 2 * one);
  const auto hk = cpu_rows(t, n_kv, hd, n, random_floats(static_cast<size_t>(n * hd), 98));
  const auto hv = cpu_rows(t, n_kv, hd, n, random_floats(static_cast<size_t>(n * hd), 99));
  ASSERT_TRUE(s.import_layer(0, n, hk.data(), hv.data()).ok());
  ASSERT_TRUE(s.set_layer_resident(0, false).ok());
  EXPECT_FALSE(s.layer_resident(0));
  EXPECT_TRUE(s.layer_resident(1));
  EXPECT_EQ(s.allocated_bytes(), one);
  std::vector<uint8_t> ek(hk.size()), ev(hv.size());
  Status e = s.export_layer(0, n, ek.data(),
                            ev.data());  // not there: an error, not a read of freed memory
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), ErrorCode::kInternal);
  EXPECT_NE(e.message().find("layer 0"), std::string::npos) << e.message();
  EXPECT_FALSE(s.import_layer(0, n, hk.data(), hv.data()).ok());
  EXPECT_FALSE(s.set_layer_resident(2, true).ok());  // no such layer
  EXPECT_FALSE(
      s.export_layer(1, 17, ek.data(), ev.data()).ok());  // more tokens than the cache holds
  ASSERT_TRUE(s.set_layer_resident(0, true).ok());
  ASSERT_TRUE(s.import_layer(0, n, hk.data(), hv.data()).ok());
  ASSERT_TRUE(s.export_layer(0, n, ek.data(), ev.data()).ok());
  EXPECT_TRUE(ek == hk && ev == hv);
  ASSERT_TRUE(s.set_layer_resident(0, false).ok());
  ASSERT_TRUE(s.set_layer_resident(1, false).ok());
  EXPECT_EQ(s.allocated_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, VulkanKv, ::testing::Values(DType::kF16, DType::kQ8_0),
                         [](const auto& pi) { return std::string(dtype_name(pi.param)); });

// ---- weights ------------------------------------------------------------------------

TEST(VulkanWeights, WeightBytesFollowUploadsAndReleases) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  // A backend of its own: uploads replace stale copies of freed host tensors,
  // which the shared backend holds from earlier tests.
  VulkanOptions o;
  o.validation = test::vulkan_validation_on();
  auto own = VulkanBackend::create(o);
  ASSERT_TRUE(own.ok()) << own.message();
  VulkanBackend* be = own->get();
  const uint64_t before = be->weight_bytes();
  HostWeight a = make_weight(DType::kQ8_0, 96, 37, 111), b = make_weight(DType::kF32, 67, 13, 112);
  ASSERT_TRUE(be->upload_weight(a.w).ok());
  const uint64_t da = be->weight_bytes() - before;
  EXPECT_GE(da, a.bytes.size());  // repacked (scales as floats), padded to the allocation unit
  EXPECT_LT(da, 2 * a.bytes.size() + 4096);
  ASSERT_TRUE(be->upload_weight(a.w).ok());  // resident already: no second copy
  EXPECT_EQ(be->weight_bytes(), before + da);
  ASSERT_TRUE(be->upload_weight(b.w).ok());
  const uint64_t db = be->weight_bytes() - before - da;
  EXPECT_GE(db, b.bytes.size());
  be->release_weight(a.w.rows(5, 3));  // a row range names its whole tensor
  EXPECT_FALSE(be->has_weight(OpKind::kMatmul, a.w));
  EXPECT_TRUE(be->has_weight(OpKind::kMatmul, b.w));
  EXPECT_EQ(be->weight_bytes(), before + db);
  be->release_weight(a.w);  // gone already: nothing happens
  HostWeight never = make_weight(DType::kF32, 8, 2, 113);
  be->release_weight(never.w);
  EXPECT_EQ(be->weight_bytes(), before + db);
  be->release_weight(b.w);
  EXPECT_EQ(be->weight_bytes(), before);
  EXPECT_EQ(before, 0u);
  ASSERT_TRUE(be->upload_weight(a.w).ok());
  be->release_weights();
  EXPECT_EQ(be->weight_bytes(), 0u);
  EXPECT_EQ(be->validation_messages(), 0u);
  EXPECT_EQ(CpuBackend(1).weight_bytes(), 0u);
}

// ---- scope timing ----------------------------------------------------------------------

class VulkanScopes : public VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (!be_) return;
    if (!be_->device_timing()) GTEST_SKIP() << "the device's compute queue has no timestamps";
    be_->set_scope_timing(true);
    std::vector<Backend::ScopeTime> drop;
    be_->take_scope_times(&drop);
  }
  void TearDown() override {
    if (be_) be_->set_scope_timing(false);
    VulkanTest::TearDown();
  }
  std::vector<Backend::ScopeTime> take() {
    std::vector<Backend::ScopeTime> t;
    be_->take_scope_times(&t);
    return t;
  }
};

TEST_F(VulkanScopes, OneEntryPerScopeWithinTheWallTime) {
  HostWeight w = make_weight(DType::kQ8_0, 256, 192, 121);
  ASSERT_TRUE(be_->upload_weight(w.w).ok());
  DevMat x(be_, 8, 256, random_floats(8 * 256, 122)), y(be_, 8, 192), z(be_, 8, 192);
  ASSERT_TRUE(be_->synchronize().ok());
  const uint64_t subs = be_->submissions();
  const auto t0 = std::chrono::steady_clock::now();
  be_->begin_scope(3);
  be_->matmul(w.w, x.act().rows_view(0, 1), y.act().rows_view(0, 1), nullptr);
  be_->begin_scope(1);
  be_->add(y.act(), y.act(), z.act());
  be_->begin_scope(2);
  be_->matmul(w.w, x.act(), y.act(), nullptr);
  be_->begin_scope(-1);
  ASSERT_TRUE(be_->synchronize().ok());
  const auto wall_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  EXPECT_EQ(be_->submissions(), subs + 1);  // timing adds no submission
  const auto t = take();
  ASSERT_EQ(t.size(), 3u);
  uint64_t sum = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const std::array<int32_t, 3> want = {3, 1, 2};
    EXPECT_EQ(t[i].id, want[i]);
    EXPECT_GT(t[i].ns, 0u) << "scope " << t[i].id;
    sum += t[i].ns;
  }
  EXPECT_LE(sum, wall_ns);
  EXPECT_TRUE(take().empty());  // taken
}

TEST_F(VulkanScopes, AScopeCutByAFlushIsOneEntry) {
  DevMat a(be_, 2, 100, random_floats(200, 123)), b(be_, 2, 100);
  std::vector<float> host(200);
  be_->begin_scope(5);
  be_->add(a.act(), a.act(), b.act());
  ASSERT_TRUE(be_->download(b.act(), host.data()).ok());  // a submission inside the scope
  be_->add(b.act(), a.act(), b.act());
  be_->begin_scope(-1);
  ASSERT_TRUE(be_->synchronize().ok());
  auto t = take();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].id, 5);
  EXPECT_GT(t[0].ns, 0u);
  // Open over a synchronize: not finished, so not reported until it ends.
  be_->begin_scope(7);
  be_->add(a.act(), a.act(), b.act());
  ASSERT_TRUE(be_->synchronize().ok());
  EXPECT_TRUE(take().empty());
  be_->begin_scope(8);  // nothing queued: 7 ends with what it had, 8 starts
  be_->add(a.act(), a.act(), b.act());
  be_->begin_scope(-1);
  ASSERT_TRUE(be_->synchronize().ok());
  t = take();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].id, 7);
  EXPECT_EQ(t[1].id, 8);
  EXPECT_GT(t[0].ns, 0u);
  EXPECT_GT(t[1].ns, 0u);
}

TEST_F(VulkanScopes, ManyScopesFillAndGrowThePool) {
  // More boundaries than the first pools hold: early flushes, then larger pools.
  DevMat a(be_, 1, 64, random_floats(64, 124)), b(be_, 1, 64);
  constexpr int32_t kN = 2600;
  for (int32_t i = 0; i < kN; ++i) {
    be_->begin_scope(i);
    be_->add(a.act(), b.act(), b.act());
  }
  be_->begin_scope(-1);
  ASSERT_TRUE(be_->synchronize().ok());
  const auto t = take();
  ASSERT_EQ(t.size(), static_cast<size_t>(kN));
  for (int32_t i = 0; i < kN; ++i) {
    ASSERT_EQ(t[static_cast<size_t>(i)].id, i);
    ASSERT_GT(t[static_cast<size_t>(i)].ns, 0u) << i;
  }
}

TEST_F(VulkanScopes, OffRecordsNothing) {
  be_->set_scope_timing(false);
  DevMat a(be_, 1, 64, random_floats(64, 125)), b(be_, 1, 64);
  ASSERT_TRUE(be_->synchronize().ok());
  const uint64_t subs = be_->submissions();
  be_->begin_scope(1);
  be_->add(a.act(), a.act(), b.act());
  be_->begin_scope(-1);
  be_->begin_scope(2);  // nothing queued in it: no submission either
  be_->begin_scope(-1);
  ASSERT_TRUE(be_->synchronize().ok());
  EXPECT_EQ(be_->submissions(), subs + 1);
  EXPECT_TRUE(take().empty());
}

TEST(VulkanProfile, PerDispatchTimesNextToScopes) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  VulkanOptions o;
  o.profile = true;
  o.validation = test::vulkan_validation_on();
  auto be = VulkanBackend::create(o);
  ASSERT_TRUE(be.ok()) << be.message();
  Backend& b = **be;
  if (!b.device_timing()) GTEST_SKIP() << "the device's compute queue has no timestamps";
  b.set_scope_timing(true);
  const uint64_t subs = vulkan_submissions(b);
  {
    DevMat x(be->get(), 2, 50, random_floats(100, 126)), y(be->get(), 2, 50);
    b.begin_scope(0);
    b.add(x.act(), x.act(), y.act());
    b.silu_mul(x.act(), y.act(), y.act());
    b.begin_scope(-1);
    ASSERT_TRUE(b.synchronize().ok());
  }
  EXPECT_GT(vulkan_submissions(b), subs);
  auto times = take_vulkan_gpu_times(b);
  ASSERT_EQ(times.size(), 2u);
  for (const GpuOpTime& t : times) {
    EXPECT_TRUE(t.name == "add" || t.name == "silu_mul") << t.name;
    EXPECT_EQ(t.calls, 1u);
    EXPECT_GT(t.ms, 0.0);
  }
  EXPECT_TRUE(take_vulkan_gpu_times(b).empty());  // taken
  std::vector<Backend::ScopeTime> scopes;
  b.take_scope_times(&scopes);
  ASSERT_EQ(scopes.size(), 1u);
  EXPECT_GT(scopes[0].ns, 0u);
  EXPECT_EQ((*be)->validation_messages(), 0u);
  // Other backends have neither.
  CpuBackend cpu(1);
  EXPECT_TRUE(take_vulkan_gpu_times(cpu).empty());
  EXPECT_EQ(vulkan_submissions(cpu), 0u);
  EXPECT_FALSE(cpu.device_timing());
  // The shared backend was made without profiling.
  EXPECT_TRUE(take_vulkan_gpu_times(*test::vulkan_backend(&why)).empty());
}

// ---- shared-memory fallbacks ---------------------------------------------------------

// The variants without subgroup operations and 16-bit storage, on a second
// backend that is told not to use them (every device we test on has both).
class VulkanFallbacks : public VulkanTest {
 protected:
  bool fallbacks() const override { return true; }
};

TEST_F(VulkanFallbacks, ReductionsAndF16WithoutSubgroupsOr16BitStorage) {
  EXPECT_FALSE(be_->caps().subgroup_arithmetic);
  EXPECT_FALSE(be_->caps().f16_storage);
  check_matmul(be_, DType::kF16, 67, 13, 1, true, false, 300);
  check_matmul(be_, DType::kQ4_K, 512, 19, 3, false, true, 301);
  // Decode past one workgroup of keys (128 here): splits of fewer keys than threads.
  check_attention(be_, AttnCase{DType::kF16, 4, 2, 64, 299, 1});
  check_attention(be_, AttnCase{DType::kQ8_0, 4, 2, 64, 150, 1});
  check_attention(be_, AttnCase{DType::kF16, 4, 2, 18, 140, 1});
  check_attention(be_, AttnCase{DType::kF16, 4, 2, 64, 20, 18});
  const auto x = random_floats(3 * 333, 61);
  HostWeight w = make_weight(DType::kF32, 333, 1, 62);
  ASSERT_TRUE(be_->upload_weight(w.w).ok());
  DevMat dx(be_, 3, 333, x), dy(be_, 3, 333);
  be_->rms_norm(dx.act(), w.w, 1e-6f, dy.act());
  std::vector<float> r(x.size());
  for (int64_t t = 0; t < 3; ++t)
    ref::rms_norm(x.data() + t * 333, w.deq.data(), 1e-6f, r.data() + t * 333, 333);
  EXPECT_LT(normalized_error(dy.fetch(), std::vector<double>(r.begin(), r.end())), 1e-6);
}

// ---- capabilities and errors ------------------------------------------------------------

TEST_F(VulkanTest, CapabilitiesMatchTheShaders) {
  for (DType t : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K}) {
    EXPECT_TRUE(be_->supports(OpKind::kMatmul, t)) << dtype_name(t);
    EXPECT_TRUE(be_->supports(OpKind::kGetRows, t)) << dtype_name(t);
  }
  for (DType t :
       {DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kBF16}) {
    EXPECT_FALSE(be_->supports(OpKind::kMatmul, t)) << dtype_name(t);
  }
  EXPECT_TRUE(be_->supports(OpKind::kAttention, DType::kF16));
  EXPECT_TRUE(be_->supports(OpKind::kAttention, DType::kQ8_0));
  EXPECT_FALSE(be_->supports(OpKind::kAttention, DType::kF32));
  // An unsupported weight is refused with a message, never uploaded.
  HostWeight w = make_weight(DType::kQ4_1, 64, 2, 71);
  Status st = be_->upload_weight(w.w);
  EXPECT_EQ(st.error().code(), ErrorCode::kUnsupported);
  EXPECT_FALSE(be_->has_weight(OpKind::kMatmul, w.w));
}

TEST(VulkanErrors, OutOfDeviceMemoryIsAnError) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  VulkanOptions o;
  o.memory_limit = 8ull << 20;  // 8 MiB of "device memory"
  auto be = VulkanBackend::create(o);
  ASSERT_TRUE(be.ok()) << be.message();
  HostWeight big = make_weight(DType::kF32, 1024, 3000, 81);  // 12 MiB
  Status st = (*be)->upload_weight(big.w);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(st.message().find("out of device memory"), std::string::npos) << st.message();
  HostWeight small = make_weight(DType::kF32, 64, 4, 82);  // still fits: the backend keeps working
  EXPECT_TRUE((*be)->upload_weight(small.w).ok());
  // 5 MiB for K, as much for V: K fits in the block the small weight opened, V does not.
  KvCacheConfig cfg{2, 4, 128, 5120, 16, DType::kF16};
  auto kv = (*be)->create_kv_storage(cfg);
  ASSERT_TRUE(kv.ok()) << kv.message();  // holds no layer yet
  st = (*kv)->set_layer_resident(0, true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kOutOfMemory) << st.message();
  EXPECT_FALSE((*kv)->layer_resident(0));
  EXPECT_EQ((*kv)->allocated_bytes(), 0u);  // K fitted, V did not: K was given back
}

TEST(VulkanErrors, DeviceLostIsReportedAndSticky) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  auto be = VulkanBackend::create(VulkanOptions{});
  ASSERT_TRUE(be.ok()) << be.message();
  const std::vector<float> a = {1, 2, 3};
  DevMat da(be->get(), 1, 3, a), db(be->get(), 1, 3);
  (*be)->simulate_device_lost();
  (*be)->add(da.act(), da.act(), db.act());
  Status st = (*be)->synchronize();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("device was lost"), std::string::npos) << st.message();
  std::vector<float> out(3);
  EXPECT_FALSE((*be)->download(db.act(), out.data()).ok());  // later calls keep failing, never hang
  (*be)->add(da.act(), da.act(), db.act());
  EXPECT_FALSE((*be)->synchronize().ok());
}

TEST(VulkanErrors, PositionOutsideTheCacheIsAnError) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  auto be = VulkanBackend::create(VulkanOptions{});
  ASSERT_TRUE(be.ok()) << be.message();
  KvCacheConfig cfg{1, 1, 32, 8, 16, DType::kF16};
  auto kv = KvCache::create(cfg);
  ASSERT_TRUE(kv.ok());
  auto storage = (*be)->create_kv_storage(cfg);
  ASSERT_TRUE(storage.ok());
  ASSERT_TRUE((*kv)->attach_storage(std::move(storage).value()).ok());
  ASSERT_TRUE((*kv)->storage()->set_layer_resident(0, true).ok());
  const std::vector<float> k(32, 1.0f);
  DevMat dk(be->get(), 1, 32, k);
  const int32_t pos = 8;  // the cache holds positions 0..7
  (*be)->kv_store(**kv, 0, dk.act(), dk.act(), &pos);
  Status st = (*be)->synchronize();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("position 8 is outside the KV cache"), std::string::npos)
      << st.message();
}

TEST(VulkanErrors, KvOpsOnANonResidentLayerAreErrors) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  KvCacheConfig cfg{2, 1, 32, 8, 16, DType::kQ8_0};
  const std::vector<float> k(32, 1.0f);
  const int32_t pos = 0;
  // The first error sticks to a backend: one backend per op.
  for (const char* op : {"kv_store", "attention"}) {
    SCOPED_TRACE(op);
    auto be = VulkanBackend::create(VulkanOptions{});
    ASSERT_TRUE(be.ok()) << be.message();
    auto kv = KvCache::create(cfg);
    ASSERT_TRUE(kv.ok());
    auto storage = (*be)->create_kv_storage(cfg);
    ASSERT_TRUE(storage.ok());
    ASSERT_TRUE((*kv)->attach_storage(std::move(storage).value()).ok());
    ASSERT_TRUE((*kv)->storage()->set_layer_resident(0, true).ok());  // layer 1 stays on the host
    DevMat dk(be->get(), 1, 32, k), dout(be->get(), 1, 32);
    if (std::string(op) == "kv_store") {
      (*be)->kv_store(**kv, 1, dk.act(), dk.act(), &pos);
    } else {
      (*be)->attention(**kv, 1, dk.act(), &pos, 1, 1.0f, dout.act());
    }
    Status st = (*be)->synchronize();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code(), ErrorCode::kInternal);
    EXPECT_NE(st.message().find(std::string(op) + ": layer 1 of the KV cache is not resident"),
              std::string::npos)
        << st.message();
  }
}

TEST(VulkanErrors, MatmulOnAReleasedWeightIsAnError) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  auto be = VulkanBackend::create(VulkanOptions{});
  ASSERT_TRUE(be.ok()) << be.message();
  HostWeight w = make_weight(DType::kQ4_0, 64, 8, 131);
  ASSERT_TRUE((*be)->upload_weight(w.w).ok());
  EXPECT_GT((*be)->weight_bytes(), 0u);
  DevMat x(be->get(), 1, 64, random_floats(64, 132)), y(be->get(), 1, 8);
  (*be)->matmul(w.w, x.act(), y.act(), nullptr);
  ASSERT_TRUE((*be)->synchronize().ok());
  (*be)->matmul(w.w, x.act(), y.act(), nullptr);  // queued, then the weight goes: it runs first
  (*be)->release_weight(w.w);
  EXPECT_EQ((*be)->weight_bytes(), 0u);
  ASSERT_TRUE((*be)->synchronize().ok());
  (*be)->matmul(w.w, x.act(), y.act(), nullptr);
  Status st = (*be)->synchronize();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kInternal);
  EXPECT_NE(st.message().find("is not on the GPU"), std::string::npos) << st.message();
}

TEST(VulkanErrors, BadDeviceIndex) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  VulkanOptions o;
  o.device = 99;
  auto be = create_vulkan_backend(o);
  ASSERT_FALSE(be.ok());
  EXPECT_NE(be.message().find("device 99 does not exist"), std::string::npos) << be.message();
  auto list = list_vulkan_devices();
  ASSERT_TRUE(list.ok());
  ASSERT_FALSE(list->empty());
  EXPECT_FALSE((*list)[0].name.empty());
}

#endif  // LOOM_HAVE_VULKAN

}  // namespace
}  // namespace loom
