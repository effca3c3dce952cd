// The CUDA KV storage and attention (loom_cuda_attention) against cpu/ref:
// kv_store rows exported byte for byte as the host cache writes them (F16,
// Q8_0), growth by reserve() keeping rows, and causal GQA attention against
// a double-precision reference over the same stored K/V: decode (T = 1) at
// contexts 1, 33, 1000 and 5000, a 77-token prefill from position 0 and on
// top of a context, GQA 4:1 and 1:1, head_dim 64 and 128 (and 80 and 8 for
// the masked lanes), both kernels and the split-K merge forced on small
// shapes. The tensor-core prefill (flash_prefill.cu) on its own suite: T 1 to
// 600 over contexts up to 5000 with a prefix already cached, head_dim 64 to
// 256, GQA groups 1 to 8 (and 3, whose rows straddle the 64-row tiles), F16
// and Q8_0, positions with gaps, out of order and repeated. Skips without a
// CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/ref/ops_ref.h"
#include "cpu/ref/quants.h"
#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/backends/cuda/attention/flash_prefill.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using test::DevBuf;

uint64_t row_bytes(DType dt, int64_t head_dim) {
  return dt == DType::kF16 ? static_cast<uint64_t>(head_dim) * 2
                           : static_cast<uint64_t>(head_dim / 32) * 34;
}

// A storage with layer 0 resident and room for n_ctx tokens, whose rows
// 0..n-1 were written by kv_store from k, v [n, n_kv_heads * head_dim].
struct Filled {
  std::unique_ptr<cuda::CudaKvStorage> st;
  std::vector<float> k, v;
};

Filled fill(const KvCacheConfig& cfg, int64_t n, cudaStream_t s, uint64_t seed) {
  Filled f;
  auto st = cuda::CudaKvStorage::create(cfg, s);
  EXPECT_TRUE(st.ok()) << st.message();
  f.st = std::move(st).value();
  EXPECT_TRUE(f.st->set_layer_resident(0, true).ok());
  EXPECT_TRUE(f.st->reserve(n).ok());
  const int64_t width = cfg.n_kv_heads * cfg.head_dim;
  f.k = test::random_floats(static_cast<size_t>(n * width), seed);
  f.v = test::random_floats(static_cast<size_t>(n * width), seed + 1);
  // In chunks of up to 1000 tokens, as prefill steps store them.
  for (int64_t t0 = 0; t0 < n; t0 += 1000) {
    const int64_t m = std::min<int64_t>(1000, n - t0);
    std::vector<int32_t> pos(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(t0 + i);
    DevBuf<float> kd(std::vector<float>(f.k.begin() + t0 * width, f.k.begin() + (t0 + m) * width));
    DevBuf<float> vd(std::vector<float>(f.v.begin() + t0 * width, f.v.begin() + (t0 + m) * width));
    DevBuf<int32_t> pd(pos);
    EXPECT_TRUE(cuda::kv_store(f.st->layer(0), kd.p, vd.p, m, pd.p, s).ok());
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  return f;
}

// Host rows [n_kv_heads][n][row] as the host cache would hold them.
std::vector<uint8_t> host_rows(const KvCacheConfig& cfg, const std::vector<float>& x, int64_t n) {
  const uint64_t rb = row_bytes(cfg.dtype, cfg.head_dim);
  std::vector<uint8_t> out(static_cast<size_t>(cfg.n_kv_heads * n) * rb);
  for (int64_t t = 0; t < n; ++t) {
    // ref::kv_store writes one token's heads into row t of a block [head][n][row].
    ref::kv_store(cfg.dtype, out.data(), static_cast<size_t>(n) * rb, cfg.n_kv_heads, cfg.head_dim,
                  t, x.data() + t * cfg.n_kv_heads * cfg.head_dim);
  }
  return out;
}

// Dequantized rows [n_kv_heads][n][head_dim] of exported bytes.
std::vector<float> dequant_rows(const KvCacheConfig& cfg, const std::vector<uint8_t>& rows,
                                int64_t n) {
  const uint64_t rb = row_bytes(cfg.dtype, cfg.head_dim);
  std::vector<float> out(static_cast<size_t>(cfg.n_kv_heads * n * cfg.head_dim));
  for (int64_t r = 0; r < cfg.n_kv_heads * n; ++r)
    EXPECT_TRUE(ref::dequantize_row(cfg.dtype, rows.data() + static_cast<uint64_t>(r) * rb,
                                    out.data() + r * cfg.head_dim, cfg.head_dim)
                    .ok());
  return out;
}

// out [T, n_heads, head_dim] in double, from K/V [n_kv_heads][n][head_dim].
std::vector<double> reference(const KvCacheConfig& cfg, const std::vector<float>& kf,
                              const std::vector<float>& vf, int64_t n, const std::vector<float>& q,
                              const std::vector<int32_t>& pos, int64_t n_heads, float scale) {
  const int64_t T = static_cast<int64_t>(pos.size()), hd = cfg.head_dim;
  const int64_t group = n_heads / cfg.n_kv_heads;
  std::vector<double> out(static_cast<size_t>(T * n_heads * hd));
  std::vector<double> sc;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      const float* qv = q.data() + (t * n_heads + h) * hd;
      sc.assign(static_cast<size_t>(pos[static_cast<size_t>(t)] + 1), 0.0);
      double mx = -1e300;
      for (size_t j = 0; j < sc.size(); ++j) {
        const float* kr = kf.data() + (kvh * n + static_cast<int64_t>(j)) * hd;
        double d = 0.0;
        for (int64_t i = 0; i < hd; ++i) d += static_cast<double>(qv[i]) * kr[i];
        sc[j] = d * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0.0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      double* o = out.data() + (t * n_heads + h) * hd;
      for (size_t j = 0; j < sc.size(); ++j) {
        const float* vr = vf.data() + (kvh * n + static_cast<int64_t>(j)) * hd;
        const double w = sc[j] / sum;  // (o may alias sc for the compiler: hoisted by hand)
        for (int64_t i = 0; i < hd; ++i) o[i] += w * vr[i];
      }
    }
  }
  return out;
}

struct Case {
  DType dtype;
  int64_t head_dim, n_heads, n_kv_heads;
};

class CudaAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttention, StoreExportsHostRows) {
  LOOM_CUDA_OR_SKIP();
  const Case c = GetParam();
  const KvCacheConfig cfg{1, c.n_kv_heads, c.head_dim, 600, 32, c.dtype};
  test::Stream stream;  // declared first: destroyed after what uses it
  ASSERT_NE(stream.s, nullptr);
  cudaStream_t s = stream.s;
  const int64_t n = 300;  // past the first capacity (256): reserve grew the layer
  Filled f = fill(cfg, n, s, 5);
  const uint64_t rb = row_bytes(c.dtype, c.head_dim);
  std::vector<uint8_t> k(static_cast<size_t>(c.n_kv_heads * n) * rb), v(k.size());
  ASSERT_TRUE(f.st->export_layer(0, n, k.data(), v.data()).ok());
  EXPECT_EQ(k, host_rows(cfg, f.k, n));
  EXPECT_EQ(v, host_rows(cfg, f.v, n));
  // Growing keeps the rows; import then export round-trips.
  ASSERT_TRUE(f.st->reserve(600).ok());
  std::vector<uint8_t> k2(k.size()), v2(v.size());
  ASSERT_TRUE(f.st->export_layer(0, n, k2.data(), v2.data()).ok());
  EXPECT_EQ(k2, k);
  std::reverse(k2.begin(), k2.end());
  ASSERT_TRUE(f.st->import_layer(0, n, k2.data(), v2.data()).ok());
  std::vector<uint8_t> k3(k.size()), v3(v.size());
  ASSERT_TRUE(f.st->export_layer(0, n, k3.data(), v3.data()).ok());
  EXPECT_EQ(k3, k2);
  EXPECT_EQ(v3, v2);
  EXPECT_TRUE(f.st->reserve(640).ok());  // whole blocks past n_ctx: clamped
  EXPECT_GT(f.st->allocated_bytes(), 0u);
  ASSERT_TRUE(f.st->set_layer_resident(0, false).ok());
  EXPECT_EQ(f.st->allocated_bytes(), 0u);
}

// Relative error allowed of the FP32 kernels (tile, split-K) against the
// double reference: float sums over up to 5000 keys.
constexpr double kTolFloat = 1e-4;
// ... and of the tensor-core prefill: it rounds q * scale * log2(e) and the
// softmax weights P to F16, and Q8_0 K/V values (scale * int8, exact in float)
// too, each a relative error of at most 2^-11 (4.9e-4; rms about 2.8e-4,
// independent from value to value). Summed over head_dim products and over the
// keys' weights they average out rather than add up (l sums the rounded P, so
// the output stays a convex combination of V rows): a host emulation of the
// kernel's arithmetic on these inputs (q in [-2, 2), K/V in [-1, 1)) gives
// 1.4e-4 to 3.3e-4 for F16 and Q8_0, head_dim 64 to 256, contexts 9 to 5000,
// and 6e-4 with scores 4x sharper. 2e-3 leaves a factor 6, and is what
// backend_ops_test allows the CUDA attention against the CPU's.
constexpr double kTolFlash = 2e-3;

// Attention of queries at `pos` over a context of n stored tokens, with the
// kernel choice `kernel` (0 by T and head_dim, 1 tiles, 2 split-K, 3 the
// tensor-core prefill, 4 the same with one stage) and `split_keys`.
void check_attention(const Case& c, int64_t n, const std::vector<int32_t>& pos, int kernel,
                     int64_t split_keys) {
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " hd " + std::to_string(c.head_dim) + " heads " +
               std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " ctx " +
               std::to_string(n) + " T " + std::to_string(pos.size()) + " kernel " +
               std::to_string(kernel) + " split " + std::to_string(split_keys));
  const KvCacheConfig cfg{1, c.n_kv_heads, c.head_dim, std::max<int64_t>(n, 1), 32, c.dtype};
  test::Stream stream;  // declared first: destroyed after what uses it
  ASSERT_NE(stream.s, nullptr);
  cudaStream_t s = stream.s;
  Filled f = fill(cfg, n, s, 100 + static_cast<uint64_t>(n));
  const uint64_t rb = row_bytes(c.dtype, c.head_dim);
  std::vector<uint8_t> kb(static_cast<size_t>(c.n_kv_heads * n) * rb), vb(kb.size());
  ASSERT_TRUE(f.st->export_layer(0, n, kb.data(), vb.data()).ok());
  const std::vector<float> kf = dequant_rows(cfg, kb, n), vf = dequant_rows(cfg, vb, n);
  const int64_t T = static_cast<int64_t>(pos.size());
  const std::vector<float> q =
      test::random_floats(static_cast<size_t>(T * c.n_heads * c.head_dim), 7, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  DevBuf<float> qd(q), od(q.size());
  DevBuf<int32_t> pd(pos);
  auto scratch = cuda::AttentionScratch::create();
  scratch->set_kernel(kernel);
  scratch->set_split_keys(split_keys);
  const int64_t max_pos = *std::max_element(pos.begin(), pos.end());
  ASSERT_TRUE(
      cuda::attention(f.st->layer(0), qd.p, T, pd.p, max_pos, c.n_heads, scale, od.p, *scratch, s)
          .ok());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const std::vector<float> got = od.download();
  EXPECT_TRUE(test::all_finite(got));
  // Kernel 0 picks the tensor cores for T > 8 where they have a kernel.
  const bool flash = kernel == cuda::kAttnKernelFlash || kernel == cuda::kAttnKernelFlashOneStage ||
                     (kernel == 0 && T > 8 && cuda::flash_prefill_enabled() &&
                      cuda::flash_prefill_supports(c.head_dim));
  EXPECT_LT(test::rel_error(got, reference(cfg, kf, vf, n, q, pos, c.n_heads, scale)),
            flash ? kTolFlash : kTolFloat);
}

std::vector<int32_t> positions(int64_t from, int64_t count) {
  std::vector<int32_t> p(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(from + i);
  return p;
}

TEST_P(CudaAttention, DecodeMatchesReference) {
  LOOM_CUDA_OR_SKIP();
  for (const int64_t ctx : {1, 33, 1000, 5000})
    check_attention(GetParam(), ctx, {static_cast<int32_t>(ctx - 1)}, 0, 0);
  // A few decode tokens at once (speculative steps), and forced small splits (the merge).
  check_attention(GetParam(), 1000, positions(995, 5), 0, 0);
  check_attention(GetParam(), 300, positions(297, 3), 2, 7);
  check_attention(GetParam(), 300, {299}, 1, 0);  // the tile kernel on one token
}

TEST_P(CudaAttention, PrefillMatchesReference) {
  LOOM_CUDA_OR_SKIP();
  check_attention(GetParam(), 77, positions(0, 77), 0, 0);
  check_attention(GetParam(), 177, positions(100, 77), 0, 0);   // on top of a context
  check_attention(GetParam(), 177, positions(100, 77), 2, 40);  // the split kernel, prefill-sized
  // Positions out of order (a batch of sequences' tokens): each sees its own prefix.
  check_attention(GetParam(), 64, {5, 63, 0, 31, 32, 17, 40, 1, 2, 3, 60, 61, 62, 9, 10, 11, 12}, 0,
                  0);
}

const Case kCases[] = {
    {DType::kF16, 64, 8, 2},   {DType::kF16, 128, 8, 2}, {DType::kF16, 64, 4, 4},
    {DType::kF16, 128, 4, 4},  {DType::kQ8_0, 64, 8, 2}, {DType::kQ8_0, 128, 8, 2},
    {DType::kQ8_0, 128, 4, 4}, {DType::kF16, 80, 6, 2},  {DType::kF16, 8, 8, 4},
    {DType::kF16, 256, 4, 1},
};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(kCases), [](const auto& pi) {
  return std::string(dtype_name(pi.param.dtype)) + "_hd" + std::to_string(pi.param.head_dim) +
         "_h" + std::to_string(pi.param.n_heads) + "_kv" + std::to_string(pi.param.n_kv_heads);
});

// The tensor-core prefill kernel forced (kernel 3), at every T it may meet:
// rows are (token, head of the GQA group) pairs in tiles of 64, so T 1 and 9
// leave most of a tile as padding, 64 and 600 fill tiles, and a group of 3
// splits a token's heads across two tiles.
class CudaFlashPrefill : public ::testing::TestWithParam<Case> {};

TEST_P(CudaFlashPrefill, MatchesReference) {
  LOOM_CUDA_OR_SKIP();
  const Case c = GetParam();
  constexpr int kFlash = cuda::kAttnKernelFlash;
  check_attention(c, 9, positions(0, 9), kFlash, 0);          // part of one key tile
  check_attention(c, 64, positions(0, 64), kFlash, 0);        // whole 64-key tiles
  check_attention(c, 137, positions(37, 100), kFlash, 0);     // on top of a 37-token prefix
  check_attention(c, 1600, positions(1000, 600), kFlash, 0);  // 600 on a 1000-token prefix
  // 100 tokens ending 5000 keys: the capacity is 5000, so a read past the last
  // position would leave the allocation (compute-sanitizer).
  check_attention(c, 5000, positions(4900, 100), kFlash, 0);
  check_attention(c, 1000, {999}, kFlash, 0);         // one token
  check_attention(c, 137, positions(37, 100), 0, 0);  // chosen by T and head_dim
  // The one-stage variant (F16 through registers: LOOM_CUDA_ATTN=sync).
  check_attention(c, 137, positions(37, 100), cuda::kAttnKernelFlashOneStage, 0);
}

TEST_P(CudaFlashPrefill, NonContiguousPositions) {
  LOOM_CUDA_OR_SKIP();
  const Case c = GetParam();
  // 100 distinct positions in 0..400, out of order with gaps: each query sees
  // its own prefix, and a tile's key range is its rows' largest position.
  std::vector<int32_t> p(100);
  for (size_t t = 0; t < p.size(); ++t) p[t] = static_cast<int32_t>((37 * t + 5) % 401);
  check_attention(c, 401, p, cuda::kAttnKernelFlash, 0);
  // Descending, then one position repeated (the same query position twice).
  std::vector<int32_t> r;
  for (int32_t t = 0; t < 70; ++t) r.push_back(t < 35 ? 300 - 7 * t : 50);
  check_attention(c, 301, r, cuda::kAttnKernelFlash, 0);
  check_attention(c, 301, r, cuda::kAttnKernelFlashOneStage, 0);
}

const Case kFlashCases[] = {
    {DType::kF16, 64, 4, 4},   {DType::kF16, 64, 8, 1},   {DType::kF16, 80, 8, 2},
    {DType::kF16, 80, 6, 2},   {DType::kF16, 96, 4, 1},   {DType::kF16, 128, 8, 2},
    {DType::kF16, 128, 8, 1},  {DType::kF16, 256, 4, 2},  {DType::kQ8_0, 64, 4, 4},
    {DType::kQ8_0, 128, 8, 2}, {DType::kQ8_0, 128, 8, 1}, {DType::kQ8_0, 256, 4, 1},
};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashPrefill, ::testing::ValuesIn(kFlashCases),
                         [](const auto& pi) {
                           return std::string(dtype_name(pi.param.dtype)) + "_hd" +
                                  std::to_string(pi.param.head_dim) + "_h" +
                                  std::to_string(pi.param.n_heads) + "_kv" +
                                  std::to_string(pi.param.n_kv_heads);
                         });

TEST(CudaAttentionHost, FlashPrefillHeadDims) {
  // No device needed: which head_dims the tensor-core kernel has.
  for (const int64_t hd : {64, 80, 96, 128, 256}) EXPECT_TRUE(cuda::flash_prefill_supports(hd));
  for (const int64_t hd : {8, 32, 48, 112, 160, 512})
    EXPECT_FALSE(cuda::flash_prefill_supports(hd));
}

TEST(CudaAttentionHost, RejectsBadConfigs) {
  // No device needed: the checks come before any allocation.
  EXPECT_FALSE(cuda::CudaKvStorage::create({1, 2, 48, 64, 32, DType::kQ8_0}, nullptr).ok());
  EXPECT_FALSE(cuda::CudaKvStorage::create({1, 2, 64, 64, 32, DType::kF32}, nullptr).ok());
  EXPECT_FALSE(cuda::CudaKvStorage::create({0, 2, 64, 64, 32, DType::kF16}, nullptr).ok());
}

TEST(CudaAttentionErrors, PositionPastTheCacheIsAnError) {
  LOOM_CUDA_OR_SKIP();
  const KvCacheConfig cfg{1, 2, 64, 64, 32, DType::kF16};
  test::Stream stream;  // declared first: destroyed after what uses it
  ASSERT_NE(stream.s, nullptr);
  cudaStream_t s = stream.s;
  Filled f = fill(cfg, 10, s, 3);
  DevBuf<float> q(8 * 64), o(8 * 64);
  DevBuf<int32_t> pd(std::vector<int32_t>{64});
  auto scratch = cuda::AttentionScratch::create();
  const Status st = cuda::attention(f.st->layer(0), q.p, 1, pd.p, 64, 8, 0.125f, o.p, *scratch, s);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(f.st->export_layer(1, 5, nullptr, nullptr).ok());  // no such layer
}

}  // namespace
}  // namespace loom
