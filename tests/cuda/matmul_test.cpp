// The CUDA matmul kernels (loom_cuda_matmul) against cpu/ref: every weight
// dtype x odd shapes (n_in tails, odd n_out) x T in {1, 3, 8} (the matvec
// kernels, on Q8 activations for quantized types), {9, 17, 33, 64, 100}
// (gemm_q for quantized types; 100 in two token tiles) and 130 (F16 GEMMs through cuBLAS), with
// bias and accumulate; gemm_q's token tiles and k splits; the fused gate/up product;
// dequantize_rows; both ways of reading quantized rows in the matvecs
// (direct, staged through shared memory); the RMS norm that writes the Q8
// activations with its output. The reference dequantizes with cpu/ref and
// multiplies in double. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cpu/ref/fp16.h"
#include "cpu/ref/quants.h"
#include "engine/backends/cuda/matmul/cublas_loader.h"
#include "engine/backends/cuda/matmul/cuda_matmul.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using test::DevBuf;

// A weight quantized by cpu/ref: its bytes and what they dequantize to.
struct HostMatrix {
  DType dtype;
  int64_t n_out, n_in;
  uint64_t row_bytes;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [n_out, n_in]
};

HostMatrix make_matrix(DType dt, int64_t n_out, int64_t n_in, uint64_t seed) {
  HostMatrix m{dt, n_out, n_in, *dtype_row_bytes(dt, static_cast<uint64_t>(n_in)), {}, {}};
  const std::vector<float> src = test::random_floats(static_cast<size_t>(n_out * n_in), seed);
  m.bytes.resize(m.row_bytes * static_cast<uint64_t>(n_out));
  m.deq.resize(src.size());
  for (int64_t r = 0; r < n_out; ++r) {
    void* row = m.bytes.data() + static_cast<uint64_t>(r) * m.row_bytes;
    EXPECT_TRUE(ref::quantize_row(dt, src.data() + r * n_in, row, n_in).ok());
    EXPECT_TRUE(ref::dequantize_row(dt, row, m.deq.data() + r * n_in, n_in).ok());
  }
  return m;
}

// x as the matvec kernels see it for quantized weights: per 32 values a scale
// amax / 127 (kept rounded to F16) and int8 quants (round(x * 127 / amax),
// halves away from zero), dequantized again.
std::vector<float> as_q8(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t g = 0; g + 32 <= x.size(); g += 32) {
    float amax = 0.0f;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[g + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (size_t j = 0; j < 32; ++j)
      r[g + j] = std::clamp(std::round(x[g + j] * id), -127.0f, 127.0f) *
                 ref::fp16_to_fp32(ref::fp32_to_fp16(d));
  }
  return r;
}

bool quantized(DType d);

// A non-null address for matrices whose data no kernel reads.
const void* wd_dummy() {
  static const uint8_t byte = 0;
  return &byte;
}

// The matvec kernels to run a case with (both for the matvec's token
// counts); restores the default on destruction.
struct MatvecKernels {
  ~MatvecKernels() { cuda::set_matvec_kernel(cuda::kMatvecStagedWords); }
  static std::vector<int> for_tokens(int64_t T) {
    if (T > 8) return {cuda::kMatvecStaged};
    return {cuda::kMatvecDirect, cuda::kMatvecStaged, cuda::kMatvecStagedWords};
  }
};
const char* kernel_name(int k) {
  return k == cuda::kMatvecDirect ? " direct" : (k == cuda::kMatvecStaged ? " staged" : " words");
}

// y [T, n_out] = x W^T (+ bias) (+ y0), in double. For quantized weights and
// T <= 8 (the matvec kernels), x goes through the kernels' Q8 step first, so
// the bound checks the kernels' arithmetic rather than the Q8 rounding.
std::vector<double> reference(const HostMatrix& m, const std::vector<float>& x_in, int64_t T,
                              const std::vector<float>* bias, const std::vector<float>* y0) {
  const std::vector<float> x = quantized(m.dtype) && T <= 8 ? as_q8(x_in) : x_in;
  std::vector<double> y(static_cast<size_t>(T * m.n_out));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t r = 0; r < m.n_out; ++r) {
      double s = 0.0;
      for (int64_t i = 0; i < m.n_in; ++i)
        s += static_cast<double>(m.deq[static_cast<size_t>(r * m.n_in + i)]) *
             static_cast<double>(x[static_cast<size_t>(t * m.n_in + i)]);
      if (bias) s += (*bias)[static_cast<size_t>(r)];
      if (y0) s += (*y0)[static_cast<size_t>(t * m.n_out + r)];
      y[static_cast<size_t>(t * m.n_out + r)] = s;
    }
  }
  return y;
}

bool quantized(DType d) {
  return d != DType::kF32 && d != DType::kF16 && d != DType::kBF16;
}

// Relative error bounds: F32 accumulation of exact integer dots for the
// quantized matvecs (the reference takes the same Q8 activations); F16
// weights and activations with F32 accumulation for the GEMMs; float
// products otherwise.
double tolerance(DType d, int64_t T) {
  if (T > 8) return d == DType::kF32 ? 2e-3 : 3e-3;
  return quantized(d) ? 1e-3 : 1e-5;
}

// Row lengths per dtype: several blocks, a group count that is not a
// multiple of the 32 lanes, and (for float types) lengths with tails.
std::vector<int64_t> row_lengths(DType d) {
  const uint32_t bs = traits(d).block_size;
  // The staged matvec copies rows whose size is a multiple of 16 bytes (8
  // for Q6_K): 4352 (136 groups: four chunks and a tail) and 3072 (Q6_K:
  // three chunks) take it; the other lengths the direct reads. Float rows
  // of 4104 (513 chunks of 8) end in a tail after four full unrolled steps
  // of the F16 / BF16 kernel.
  if (bs == 256) return {256, 768, 2816, 3072};
  if (bs == 32) return {32, 416, 1056, 4160, 4352};
  return {1, 7, 33, 264, 1000, 4096, 4104};
}

class CudaMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CudaMatmul, MatchesReferenceOnOddShapes) {
  LOOM_CUDA_OR_SKIP();
  const DType dt = GetParam();
  test::Stream stream;  // declared first: destroyed after what uses it
  ASSERT_NE(stream.s, nullptr);
  cudaStream_t s = stream.s;
  auto mm = cuda::Matmul::create(0);
  ASSERT_TRUE(mm.ok()) << mm.message();
  uint64_t seed = 1;
  for (const int64_t n_in : row_lengths(dt)) {
    for (const int64_t n_out : {1, 67, 130}) {
      const HostMatrix hm = make_matrix(dt, n_out, n_in, seed++);
      DevBuf<uint8_t> wd(hm.bytes);
      const cuda::DevMatrix w{wd.p, dt, n_out, n_in, hm.row_bytes};
      const std::vector<float> bias = test::random_floats(static_cast<size_t>(n_out), seed++);
      DevBuf<float> bd(bias);
      MatvecKernels restore;
      for (const int64_t T : {1, 3, 8, 9, 17, 33, 64, 100, 130})
        for (const int kernel : MatvecKernels::for_tokens(T)) {
          cuda::set_matvec_kernel(kernel);
          SCOPED_TRACE(std::string(dtype_name(dt)) + " n_out " + std::to_string(n_out) + " n_in " +
                       std::to_string(n_in) + " T " + std::to_string(T) + kernel_name(kernel));
          const std::vector<float> x = test::random_floats(static_cast<size_t>(T * n_in), seed++);
          const std::vector<float> y0 =
              test::random_floats(static_cast<size_t>(T * n_out), seed++, 0.5f);
          DevBuf<float> xd(x), yd(static_cast<size_t>(T * n_out));
          // Plain.
          ASSERT_TRUE((*mm)->run(w, xd.p, T, yd.p, nullptr, false, s).ok());
          ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
          std::vector<float> y = yd.download();
          EXPECT_TRUE(test::all_finite(y));
          EXPECT_LT(test::rel_error(y, reference(hm, x, T, nullptr, nullptr)), tolerance(dt, T));
          // With a bias.
          ASSERT_TRUE((*mm)->run(w, xd.p, T, yd.p, bd.p, false, s).ok());
          y = yd.download();
          EXPECT_LT(test::rel_error(y, reference(hm, x, T, &bias, nullptr)), tolerance(dt, T));
          // Accumulating into y0: the error relative to what was added, as
          // y0 + x W^T may cancel to far less than either.
          yd.upload(y0);
          ASSERT_TRUE((*mm)->run(w, xd.p, T, yd.p, nullptr, true, s).ok());
          y = yd.download();
          const std::vector<double> want = reference(hm, x, T, nullptr, &y0);
          std::vector<float> err(y.size());
          for (size_t i = 0; i < y.size(); ++i)
            err[i] = static_cast<float>(static_cast<double>(y[i]) - want[i]);
          const std::vector<double> plain = reference(hm, x, T, nullptr, nullptr);
          EXPECT_LT(test::norm(err) / (test::norm(plain) + test::norm(y0)), tolerance(dt, T));
        }
    }
  }
  EXPECT_GT((*mm)->scratch_bytes(), 0u);
}

// Rows only as aligned as their format guarantees (2 bytes for F16, BF16,
// Q4_0, Q5_0, Q8_0 and Q6_K; 4 for the rest): the kernels take their narrow
// load paths (no 128-bit loads) and still match.
TEST_P(CudaMatmul, RowsAtTheirFormatsAlignment) {
  LOOM_CUDA_OR_SKIP();
  const DType dt = GetParam();
  auto mm = cuda::Matmul::create(0);
  ASSERT_TRUE(mm.ok()) << mm.message();
  const bool two = dt == DType::kF16 || dt == DType::kBF16 || dt == DType::kQ4_0 ||
                   dt == DType::kQ5_0 || dt == DType::kQ8_0 || dt == DType::kQ6_K;
  const size_t off = two ? 2 : 4;
  const int64_t n_in = row_lengths(dt)[1], n_out = 41;
  const HostMatrix m = make_matrix(dt, n_out, n_in, 77);
  std::vector<uint8_t> shifted(m.bytes.size() + off, 0);
  std::copy(m.bytes.begin(), m.bytes.end(), shifted.begin() + static_cast<std::ptrdiff_t>(off));
  DevBuf<uint8_t> wd(shifted);
  const cuda::DevMatrix w{wd.p + off, dt, n_out, n_in, m.row_bytes};
  for (const int64_t T : {1, 4, 12}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const std::vector<float> x = test::random_floats(static_cast<size_t>(T * n_in), 78 + T);
    DevBuf<float> xd(x), yd(static_cast<size_t>(T * n_out));
    ASSERT_TRUE((*mm)->run(w, xd.p, T, yd.p, nullptr, false, nullptr).ok());
    EXPECT_LT(test::rel_error(yd.download(), reference(m, x, T, nullptr, nullptr)),
              tolerance(dt, T));
  }
}

TEST_P(CudaMatmul, GluIsSiluOfGateTimesUp) {
  LOOM_CUDA_OR_SKIP();
  const DType dt = GetParam();
  auto mm = cuda::Matmul::create(0);
  ASSERT_TRUE(mm.ok()) << mm.message();
  // The longest rows: whole 32-group chunks (staged) and a tail (direct).
  const int64_t n_in = row_lengths(dt).back(), n_out = 75;
  const HostMatrix g = make_matrix(dt, n_out, n_in, 11), u = make_matrix(dt, n_out, n_in, 12);
  DevBuf<uint8_t> gd(g.bytes), ud(u.bytes);
  const cuda::DevMatrix gw{gd.p, dt, n_out, n_in, g.row_bytes},
      uw{ud.p, dt, n_out, n_in, u.row_bytes};
  MatvecKernels restore;
  for (const int64_t T : {1, 5, 8, 9, 70})
    for (const int kernel : MatvecKernels::for_tokens(T)) {
      cuda::set_matvec_kernel(kernel);
      SCOPED_TRACE("T " + std::to_string(T) + kernel_name(kernel));
      const std::vector<float> x = test::random_floats(static_cast<size_t>(T * n_in), 13 + T);
      DevBuf<float> xd(x), yd(static_cast<size_t>(T * n_out));
      ASSERT_TRUE((*mm)->run_glu(gw, uw, xd.p, T, yd.p, nullptr).ok());
      const std::vector<float> y = yd.download();
      const std::vector<double> a = reference(g, x, T, nullptr, nullptr);
      const std::vector<double> b = reference(u, x, T, nullptr, nullptr);
      std::vector<double> want(a.size());
      for (size_t i = 0; i < a.size(); ++i) want[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
      EXPECT_LT(test::rel_error(y, want), 2 * tolerance(dt, T));
    }
}

TEST_P(CudaMatmul, DequantizeRowsMatchesReference) {
  LOOM_CUDA_OR_SKIP();
  const DType dt = GetParam();
  const int64_t n_in = row_lengths(dt).back(), n_out = 19;
  const HostMatrix m = make_matrix(dt, n_out, n_in, 21);
  DevBuf<uint8_t> wd(m.bytes);
  const cuda::DevMatrix w{wd.p, dt, n_out, n_in, m.row_bytes};
  const std::vector<int32_t> ids = {18, 0, 7, 7, 3};
  DevBuf<int32_t> idd(ids);
  DevBuf<float> out(ids.size() * static_cast<size_t>(n_in));
  ASSERT_TRUE(
      cuda::dequantize_rows(w, idd.p, static_cast<int64_t>(ids.size()), out.p, nullptr).ok());
  const std::vector<float> got = out.download();
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t i = 0; i < n_in; ++i) {
      const float want = m.deq[static_cast<size_t>(ids[t] * n_in + i)];
      // The same products as cpu/ref, up to a fused multiply-add.
      ASSERT_NEAR(got[t * static_cast<size_t>(n_in) + static_cast<size_t>(i)], want,
                  1e-6f * (1.0f + std::fabs(want)))
          << "token " << t << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaMatmul,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                           DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const auto& pi) { return std::string(dtype_name(pi.param)); });

// Products of one input by matrices of different types and heights (q, k
// and v of a Q4_K_M layer, and a float one), x quantized or converted once.
TEST(CudaMatmulMulti, MatchesReferenceForEachMatrix) {
  LOOM_CUDA_OR_SKIP();
  auto mm = cuda::Matmul::create(0);
  ASSERT_TRUE(mm.ok()) << mm.message();
  const int64_t n_in = 512;
  const HostMatrix a = make_matrix(DType::kQ4_K, 96, n_in, 31);
  const HostMatrix b = make_matrix(DType::kQ6_K, 33, n_in, 32);
  const HostMatrix c = make_matrix(DType::kF16, 33, n_in, 33);
  const HostMatrix d = make_matrix(DType::kQ8_0, 5, n_in, 34);
  DevBuf<uint8_t> ad(a.bytes), bd(b.bytes), cd(c.bytes), dd(d.bytes);
  const cuda::DevMatrix ws[4] = {{ad.p, a.dtype, a.n_out, n_in, a.row_bytes},
                                 {bd.p, b.dtype, b.n_out, n_in, b.row_bytes},
                                 {cd.p, c.dtype, c.n_out, n_in, c.row_bytes},
                                 {dd.p, d.dtype, d.n_out, n_in, d.row_bytes}};
  const HostMatrix* hs[4] = {&a, &b, &c, &d};
  const std::vector<float> bias = test::random_floats(33, 35);
  DevBuf<float> biasd(bias);
  for (const int64_t T : {1, 5, 8, 9, 40}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const std::vector<float> x = test::random_floats(static_cast<size_t>(T * n_in), 36 + T);
    DevBuf<float> xd(x), y0(static_cast<size_t>(T * 96)), y1(static_cast<size_t>(T * 33)),
        y2(static_cast<size_t>(T * 33)), y3(static_cast<size_t>(T * 5));
    float* ys[4] = {y0.p, y1.p, y2.p, y3.p};
    const float* biases[4] = {nullptr, biasd.p, nullptr, nullptr};
    ASSERT_TRUE((*mm)->run_multi(ws, biases, ys, 4, xd.p, T, nullptr).ok());
    const DevBuf<float>* outs[4] = {&y0, &y1, &y2, &y3};
    for (int i = 0; i < 4; ++i) {
      const std::vector<float> got = outs[i]->download();
      const std::vector<double> want = reference(*hs[i], x, T, i == 1 ? &bias : nullptr, nullptr);
      EXPECT_LT(test::rel_error(got, want), tolerance(hs[i]->dtype, T)) << "matrix " << i;
    }
  }
}

// q, k and v of one quantized type (and row size) go through one launch
// (matvec_multi): the grid runs over the three matrices' rows end to end, so
// odd heights put a matrix boundary inside a block.
TEST(CudaMatmulMulti, OneLaunchForMatricesOfOneType) {
  LOOM_CUDA_OR_SKIP();
  auto mm = cuda::Matmul::create(0);
  ASSERT_TRUE(mm.ok()) << mm.message();
  MatvecKernels restore;
  for (const DType dt : {DType::kQ4_0, DType::kQ4_K, DType::kQ8_0, DType::kQ6_K})
    for (const int kernel : MatvecKernels::for_tokens(1)) {
      cuda::set_matvec_kernel(kernel);
      // Whole 32-group chunks and a tail of groups.
      const int64_t n_in = dt == DType::kQ4_K ? 2816 : (dt == DType::kQ6_K ? 3072 : 4352);
      const HostMatrix a = make_matrix(dt, 97, n_in, 41), b = make_matrix(dt, 33, n_in, 42),
                       c = make_matrix(dt, 35, n_in, 43);
      DevBuf<uint8_t> ad(a.bytes), bd(b.bytes), cd(c.bytes);
      const cuda::DevMatrix ws[3] = {{ad.p, dt, a.n_out, n_in, a.row_bytes},
                                     {bd.p, dt, b.n_out, n_in, b.row_bytes},
                                     {cd.p, dt, c.n_out, n_in, c.row_bytes}};
      const HostMatrix* hs[3] = {&a, &b, &c};
      const std::vector<float> bias = test::random_floats(33, 44);
      DevBuf<float> biasd(bias);
      for (const int64_t T : {1, 3, 8}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(T) + kernel_name(kernel));
        const std::vector<float> x = test::random_floats(static_cast<size_t>(T * n_in), 45 + T);
        DevBuf<float> xd(x), y0(static_cast<size_t>(T * 97)), y1(static_cast<size_t>(T * 33)),
            y2(static_cast<size_t>(T * 35));
        float* ys[3] = {y0.p, y1.p, y2.p};
        const float* biases[3] = {nullptr, biasd.p, nullptr};
        ASSERT_TRUE((*mm)->run_multi(ws, biases, ys, 3, xd.p, T, nullptr).ok());
        const DevBuf<float>* outs[3] = {&y0, &y1, &y2};
        for (int i = 0; i < 3; ++i) {
          const std::vector<double> want =
              reference(*hs[i], x, T, i == 1 ? &bias : nullptr, nullptr);
          EXPECT_LT(test::rel_error(outs[i]->download(), want), tolerance(dt, T)) << "matrix " << i;
        }
      }
    }
}

// rms_norm_q8: the norm's output against a double reference, and products
// on its Q8 activations equal, bit for bit, to those that quantize the
// output themselves (the quants and scale pairs are the same bytes), for
// both kernels; Q4_K reads the pairs' quant sums (its min).
TEST(CudaMatmulNormQ8, ProductsOnTheNormsQ8EqualQuantizingItsOutput) {
  LOOM_CUDA_OR_SKIP();
  auto mm = cuda::Matmul::create(0);
  ASSERT_TRUE(mm.ok()) << mm.message();
  MatvecKernels restore;
  for (const auto& [dt, n] : std::vector<std::pair<DType, int64_t>>{
           {DType::kQ4_0, 32}, {DType::kQ4_0, 4096}, {DType::kQ4_0, 4160}, {DType::kQ4_K, 4352}}) {
    const HostMatrix m = make_matrix(dt, 70, n, 51);
    DevBuf<uint8_t> wd(m.bytes);
    const cuda::DevMatrix w{wd.p, m.dtype, m.n_out, n, m.row_bytes};
    const std::vector<float> nw = test::random_floats(static_cast<size_t>(n), 53);
    DevBuf<float> nwd(nw);
    for (const int64_t T : {1, 3, 8}) {
      const std::vector<float> x = test::random_floats(static_cast<size_t>(T * n), 54 + T, 3.0f);
      DevBuf<float> xd(x), out(static_cast<size_t>(T * n));
      DevBuf<int8_t> xq(static_cast<size_t>(T * static_cast<int64_t>(cuda::q8_token_bytes(n))));
      DevBuf<float2> xs(static_cast<size_t>(T * n / 32));
      ASSERT_TRUE(cuda::rms_norm_q8(xd.p, nwd.p, 1e-5f, out.p, T, n, xq.p, xs.p, nullptr).ok());
      const std::vector<float> got = out.download();
      std::vector<double> want(got.size());
      for (int64_t t = 0; t < T; ++t) {
        double ss = 0.0;
        for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[t * n + i]) * x[t * n + i];
        const double sc = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-5);
        for (int64_t i = 0; i < n; ++i) want[t * n + i] = x[t * n + i] * sc * nw[i];
      }
      EXPECT_LT(test::rel_error(got, want), 1e-6) << "n " << n << " T " << T;
      for (const int kernel : MatvecKernels::for_tokens(T)) {
        cuda::set_matvec_kernel(kernel);
        SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n) + " T " +
                     std::to_string(T) + kernel_name(kernel));
        DevBuf<float> y1(static_cast<size_t>(T * 70)), y2(static_cast<size_t>(T * 70));
        const cuda::Q8Act q8{xq.p, xs.p};
        ASSERT_TRUE((*mm)->run(w, out.p, T, y1.p, nullptr, false, nullptr, &q8).ok());
        ASSERT_TRUE((*mm)->run(w, out.p, T, y2.p, nullptr, false, nullptr).ok());
        EXPECT_EQ(y1.download(), y2.download());
        EXPECT_LT(test::rel_error(y1.download(), reference(m, got, T, nullptr, nullptr)),
                  tolerance(m.dtype, T));
      }
    }
  }
}

// gemm_q itself past what Matmul gives it: several 64-token tiles (T 130,
// whose last tile holds 2 tokens) and every count of k splits up to 5 (the
// last split shorter), with bias and accumulate; its splits rule.
TEST(CudaGemmQ, TokenTilesAndSplitsMatchReference) {
  LOOM_CUDA_OR_SKIP();
  uint64_t seed = 71;
  for (const DType dt : {DType::kQ4_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t n_in = dt == DType::kQ4_0 ? 1056 : 2816, n_out = 83;  // 33 and 88 groups
    const HostMatrix hm = make_matrix(dt, n_out, n_in, seed++);
    DevBuf<uint8_t> wd(hm.bytes);
    const cuda::DevMatrix w{wd.p, dt, n_out, n_in, hm.row_bytes};
    const std::vector<float> bias = test::random_floats(static_cast<size_t>(n_out), seed++);
    DevBuf<float> bd(bias);
    for (const int64_t T : {12, 130})
      for (int splits = 1; splits <= 5; ++splits) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(T) + " splits " +
                     std::to_string(splits));
        const std::vector<float> x = test::random_floats(static_cast<size_t>(T * n_in), seed++);
        const std::vector<float> y0 =
            test::random_floats(static_cast<size_t>(T * n_out), seed++, 0.5f);
        DevBuf<float> xd(x), yd(y0), part(static_cast<size_t>(splits * T * n_out));
        DevBuf<uint16_t> xh(static_cast<size_t>(T * n_in));
        ASSERT_TRUE(cuda::to_f16(xd.p, T * n_in, xh.p, nullptr).ok());
        ASSERT_TRUE(cuda::gemm_q(w, xh.p, T, yd.p, bd.p, true, splits, part.p, nullptr).ok());
        EXPECT_LT(test::rel_error(yd.download(), reference(hm, x, T, &bias, &y0)),
                  tolerance(dt, T));
      }
  }
  // Splits until the blocks fill every SM four times over, at most 8, each
  // split at least 2 stages of 256 values.
  const cuda::DevMatrix small{wd_dummy(), DType::kQ4_K, 1024, 4096, 2304};
  EXPECT_EQ(cuda::gemm_q_splits(small, 16, 132), 8);
  const cuda::DevMatrix tall{wd_dummy(), DType::kQ4_K, 14336, 4096, 2304};
  EXPECT_EQ(cuda::gemm_q_splits(tall, 64, 132), 4);
  const cuda::DevMatrix shortrows{wd_dummy(), DType::kQ4_0, 64, 256, 144};
  EXPECT_EQ(cuda::gemm_q_splits(shortrows, 16, 132), 1);
}

// No device needed: what is supported, and cuBLAS found or the paths named.
TEST(CudaMatmulHost, SupportedTypes) {
  EXPECT_TRUE(cuda::matmul_supported(DType::kQ4_K));
  EXPECT_TRUE(cuda::matmul_supported(DType::kBF16));
  EXPECT_FALSE(cuda::matmul_supported(DType::kQ2_K));
  EXPECT_FALSE(cuda::matmul_supported(DType::kIQ4_XS));
}

TEST(CudaMatmulHost, CublasLoadsOrSaysWhere) {
  auto api = cuda::load_cublas();
  if (api.ok()) {
    EXPECT_NE((*api)->gemm_ex, nullptr);
    EXPECT_FALSE((*api)->path.empty());
  } else {
    EXPECT_NE(api.message().find("libcublas"), std::string::npos) << api.message();
  }
}

TEST(CudaMatmulErrors, UnsupportedTypeIsAnError) {
  LOOM_CUDA_OR_SKIP();
  auto mm = cuda::Matmul::create(0);
  ASSERT_TRUE(mm.ok()) << mm.message();
  DevBuf<uint8_t> wd(84 * 4);
  DevBuf<float> x(256), y(4);
  const cuda::DevMatrix w{wd.p, DType::kQ2_K, 4, 256, 84};
  const Status st = (*mm)->run(w, x.p, 1, y.p, nullptr, false, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace loom
