// Vulkan tests that need a real GPU (ctest label `gpu`): model-sized shapes
// where lavapipe would take minutes. They skip on a CPU implementation
// (lavapipe) and without a device. What they add to the lavapipe suite: wide
// subgroups (32/64 lanes), concurrent dispatches between barriers, long
// contexts (many attention splits and tiles), and real-size matrices.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "cpu/ops.h"
#include "cpu/ref/ops_ref.h"
#include "cpu/ref/quants.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/vulkan/vulkan_backend.h"
#include "engine/model/synth.h"
#include "engine/runtime/forward.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::unique_ptr<VulkanBackend> gpu_or_skip(std::string* why) {
  VulkanOptions o;
  o.validation = true;
  auto be = VulkanBackend::create(o);
  if (!be.ok()) {
    o.validation = false;  // no validation layer installed: test without
    be = VulkanBackend::create(o);
  }
  if (!be.ok()) {
    *why = be.message();
    return nullptr;
  }
  if ((*be)->device_info().type == "cpu") {
    *why = "the only device is a CPU implementation (" + (*be)->device_info().name + ")";
    return nullptr;
  }
  return std::move(be).value();
}

#define LOOM_GPU_OR_SKIP(var)         \
  std::string var##_why;              \
  auto var = gpu_or_skip(&var##_why); \
  if (!var) GTEST_SKIP() << "needs a GPU: " << var##_why

double nerr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// A mid-size model (dim 1024, 4 layers, GQA 16/4) in several weight types:
// prefill of 600 tokens in chunks of 256 (tiles, several chunks), then decode
// to ~650 positions (many attention splits), against the CPU backend.
class GpuModel : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuModel, MatchesCpuOverALongContext) {
  LOOM_GPU_OR_SKIP(be);
  SynthSpec s;
  s.n_layer = 4;
  s.n_embd = 1024;
  s.n_ff = 2816;
  s.n_head = 16;
  s.n_head_kv = 4;
  s.n_ctx = 1024;
  s.weight_type = GetParam();
  const std::string path = test::temp_dir(std::string("gpu_model_") + GetParam()) + "/m.gguf";
  ASSERT_TRUE(write_synthetic_model(s, path).ok());
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const Model& model = **m;
  const int64_t n_prompt = 600, n_gen = 48, V = model.hp.n_vocab;
  std::vector<int32_t> prompt(n_prompt);
  for (int64_t i = 0; i < n_prompt; ++i)
    prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 31 + 7) % V);
  KvCacheConfig kc{model.hp.n_layer, model.hp.n_head_kv, model.hp.head_dim, 1024, 32, DType::kF16};
  auto gkv = KvCache::create(kc), ckv = KvCache::create(kc);
  ForwardPass g(model, *be, **gkv, 256);
  CpuBackend cpu(static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency()))));
  ForwardPass cf(model, cpu, **ckv, 256);
  std::vector<float> gl(static_cast<size_t>(V)), cl(static_cast<size_t>(V));
  ASSERT_TRUE(g.eval(prompt, 0, gl.data()).ok());
  ASSERT_TRUE(cf.eval(prompt, 0, cl.data()).ok());
  // CPU activations are Q8 for quantized weights; the GPU's are f32.
  const double tol = std::string(GetParam()) == "f16" ? 5e-3 : 4e-2;
  EXPECT_LT(nerr(gl, cl), tol) << "after prefill";
  for (int64_t i = 0; i < n_gen; ++i) {
    const int32_t tok = static_cast<int32_t>(std::max_element(cl.begin(), cl.end()) - cl.begin());
    ASSERT_TRUE(g.eval(std::span<const int32_t>(&tok, 1), n_prompt + i, gl.data()).ok());
    ASSERT_TRUE(cf.eval(std::span<const int32_t>(&tok, 1), n_prompt + i, cl.data()).ok());
    EXPECT_LT(nerr(gl, cl), tol) << "decode step " << i;
  }
  EXPECT_EQ(be->validation_messages(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuModel, ::testing::Values("f16", "q8_0", "q4_0", "q4_k_m"));

// Real-size matrix-vector and matrix-matrix products against a double loop.
TEST(GpuOps, LargeMatmuls) {
  LOOM_GPU_OR_SKIP(be);
  std::printf("note: %s: %u bytes of shared memory, cooperative matrices %s\n",
              be->device_info().name.c_str(), be->caps().max_shared_bytes,
              be->caps().coopmat ? "on" : "off");
  for (DType t :
       {DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const int64_t n_in = 4096, n_out = 1536;
    const size_t rb = static_cast<size_t>(*dtype_row_bytes(t, n_in));
    std::vector<uint8_t> bytes(rb * n_out);
    std::vector<float> deq(static_cast<size_t>(n_in * n_out)), f(static_cast<size_t>(n_in));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> d(-1, 1);
    for (int64_t r = 0; r < n_out; ++r) {
      for (float& v : f) v = d(rng);
      ASSERT_TRUE(ref::quantize_row(t, f.data(), bytes.data() + rb * r, n_in).ok());
      ASSERT_TRUE(ref::dequantize_row(t, bytes.data() + rb * r, deq.data() + r * n_in, n_in).ok());
    }
    Weight w{bytes.data(), t, n_in, n_out, rb, nullptr};
    ASSERT_TRUE(be->upload_weight(w).ok());
    // 300 tokens: the tiled kernel (exact), then the cooperative-matrix
    // variants where the device has them (F16 inputs) and the shape's choice.
    struct Run {
      int64_t T;
      bool coopmat;
      uint32_t variant;
      std::string tile;  // a cooperative-matrix tile by name
    };
    std::vector<Run> runs = {Run{1, false, 0, {}}, Run{5, false, 0, {}}, Run{300, false, 0, {}},
                             Run{300, true, 2, {}}, Run{300, true, 0, {}}};
    for (const std::string& tile : VulkanBackend::matmul_cm_tiles())
      runs.push_back(Run{300, true, 0, tile});
    for (const Run& run : runs) {
      const int64_t T = run.T;
      if (run.coopmat && !be->caps().coopmat) {
        std::printf("note: no cooperative matrices on this device: coopmat matmul not tested\n");
        continue;
      }
      be->set_matmul_coopmat(run.coopmat, run.variant);
      if (!run.tile.empty()) be->set_matmul_cm_tile(run.tile);
      std::vector<float> x(static_cast<size_t>(T * n_in)), y(static_cast<size_t>(T * n_out));
      for (float& v : x) v = d(rng);
      auto bx = be->alloc_act(T * n_in), by = be->alloc_act(T * n_out);
      ASSERT_TRUE(bx.ok() && by.ok());
      Act ax = (*bx)->view(T, n_in), ay = (*by)->view(T, n_out);
      ASSERT_TRUE(be->upload(x.data(), ax).ok());
      be->matmul(w, ax, ay, nullptr);
      ASSERT_TRUE(be->download(ay, y.data()).ok());
      std::vector<float> ref(y.size());
      for (int64_t tt = 0; tt < T; ++tt) {
        for (int64_t r = 0; r < n_out; ++r) {
          double s = 0;
          for (int64_t k = 0; k < n_in; ++k) s += double(deq[r * n_in + k]) * x[tt * n_in + k];
          ref[static_cast<size_t>(tt * n_out + r)] = static_cast<float>(s);
        }
      }
      EXPECT_LT(nerr(y, ref), run.coopmat ? 2e-3 : 1e-5)
          << dtype_name(t) << " T=" << T << (run.coopmat ? " coopmat variant " : "")
          << (run.coopmat ? std::to_string(run.variant) + " " + run.tile : "");
    }
    be->release_weights();
  }
  be->set_matmul_coopmat(true);
  EXPECT_EQ(be->validation_messages(), 0u);
}

// One layer of n random tokens (values in [-2, 2) from rng) in a host cache,
// for cpu/ref, and imported into a device cache (KvStorage::import_layer)
// from the rows in `hk` / `hv`.
struct TwinKv {
  std::unique_ptr<KvCache> host, dev;
  std::vector<uint8_t> hk, hv;
};
void make_twin_kv(VulkanBackend* be, const KvCacheConfig& cfg, int64_t n, std::mt19937& rng,
                  TwinKv* tw) {
  const DType t = cfg.dtype;
  const int64_t n_kv = cfg.n_kv_heads, hd = cfg.head_dim, kv_dim = n_kv * hd;
  auto host_kv = KvCache::create(cfg), dev_kv = KvCache::create(cfg);
  ASSERT_TRUE(host_kv.ok() && dev_kv.ok());
  tw->host = std::move(host_kv).value();
  tw->dev = std::move(dev_kv).value();
  auto storage = be->create_kv_storage(cfg);
  ASSERT_TRUE(storage.ok()) << storage.message();
  ASSERT_TRUE(tw->dev->attach_storage(std::move(storage).value()).ok());
  ASSERT_TRUE(tw->dev->storage()->set_layer_resident(0, true).ok());
  ASSERT_TRUE(tw->host->reserve(n).ok());
  std::uniform_real_distribution<float> d(-2, 2);
  std::vector<float> k(static_cast<size_t>(n * kv_dim)), v(k.size());
  for (float& x : k) x = d(rng);
  for (float& x : v) x = d(rng);
  const size_t rb = static_cast<size_t>(*dtype_row_bytes(t, hd));
  tw->hk.assign(rb * static_cast<size_t>(n * n_kv), 0);
  tw->hv.assign(tw->hk.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    tw->host->store(0, i, k.data() + i * kv_dim, v.data() + i * kv_dim);
    cpu::kv_store(t, tw->hk.data(), rb * static_cast<size_t>(n), n_kv, hd, i,
                  k.data() + i * kv_dim);
    cpu::kv_store(t, tw->hv.data(), rb * static_cast<size_t>(n), n_kv, hd, i,
                  v.data() + i * kv_dim);
  }
  ASSERT_TRUE(tw->dev->storage()->import_layer(0, n, tw->hk.data(), tw->hv.data()).ok());
}

// A model-size layer (8 KV heads x 128, 8000 tokens: 16 MB of F16 K) through
// export/import, larger than the staging ring (several submissions), then
// decode attention over it against the reference on the host cache.
TEST(GpuKv, LargeLayerRoundTripAndAttention) {
  LOOM_GPU_OR_SKIP(be);
  for (DType t : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n_kv = 8, hd = 128, n = 8000, n_heads = 32;
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> d(-2, 2);
    TwinKv tw;
    ASSERT_NO_FATAL_FAILURE(make_twin_kv(be.get(), {1, n_kv, hd, 8192, 32, t}, n, rng, &tw));
    KvStorage& s = *tw.dev->storage();
    const std::vector<uint8_t>&hk = tw.hk, &hv = tw.hv;
    std::vector<uint8_t> ek(hk.size()), ev(hv.size());
    ASSERT_TRUE(s.export_layer(0, n, ek.data(), ev.data()).ok());
    EXPECT_TRUE(ek == hk && ev == hv) << "the round trip changed bytes";
    std::vector<float> q(static_cast<size_t>(n_heads * hd)), out(q.size()), ref(q.size());
    for (float& x : q) x = d(rng);
    auto bq = be->alloc_act(n_heads * hd), bo = be->alloc_act(n_heads * hd);
    ASSERT_TRUE(bq.ok() && bo.ok());
    const Act aq = (*bq)->view(1, n_heads * hd), ao = (*bo)->view(1, n_heads * hd);
    ASSERT_TRUE(be->upload(q.data(), aq).ok());
    const int32_t pos = static_cast<int32_t>(n - 1);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    be->attention(*tw.dev, 0, aq, &pos, n_heads, scale, ao);
    ASSERT_TRUE(be->download(ao, out.data()).ok());
    ref::attention(q.data(), 1, &pos, n_heads, tw.host->view(0), scale, ref.data(), 0, n_heads);
    EXPECT_LT(nerr(out, ref), 1e-5);
  }
  EXPECT_EQ(be->validation_messages(), 0u);
}

// Prefill attention at model size (32 heads over 8 KV heads of 128, 1,000
// tokens before 333 queries: several 64-row tiles, one partial, the causal
// edge inside key tiles), F16 and Q8_0 KV: the tiled kernel and the one on
// cooperative matrices (attn_cm.comp, where the device has them) against
// cpu/ref; a 64-wide head without GQA as well.
TEST(GpuAttention, PrefillMatchesReference) {
  LOOM_GPU_OR_SKIP(be);
  struct Case {
    DType t;
    int64_t n_heads, n_kv, hd;
  };
  for (const Case& cs : {Case{DType::kF16, 32, 8, 128}, Case{DType::kQ8_0, 32, 8, 128},
                         Case{DType::kF16, 8, 8, 64}}) {
    SCOPED_TRACE(std::string(dtype_name(cs.t)) + " head " + std::to_string(cs.hd));
    const int64_t past = 1000, T = 333, n = past + T, q_dim = cs.n_heads * cs.hd;
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> d(-2, 2);
    TwinKv tw;
    ASSERT_NO_FATAL_FAILURE(
        make_twin_kv(be.get(), {1, cs.n_kv, cs.hd, 2048, 32, cs.t}, n, rng, &tw));
    std::vector<float> q(static_cast<size_t>(T * q_dim));
    for (float& x : q) x = d(rng);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(past + i);
    const float scale = 1.0f / std::sqrt(static_cast<float>(cs.hd));
    std::vector<float> ref(q.size()), out(q.size());
    ref::attention(q.data(), T, pos.data(), cs.n_heads, tw.host->view(0), scale, ref.data(), 0,
                   cs.n_heads);
    auto bq = be->alloc_act(T * q_dim), bo = be->alloc_act(T * q_dim);
    ASSERT_TRUE(bq.ok() && bo.ok());
    const Act aq = (*bq)->view(T, q_dim), ao = (*bo)->view(T, q_dim);
    ASSERT_TRUE(be->upload(q.data(), aq).ok());
    for (bool cm : {false, true}) {
      if (cm && !be->caps().coopmat) {
        std::printf("note: no cooperative matrices on this device: attn_cm not tested\n");
        continue;
      }
      be->set_attn_coopmat(cm);
      be->attention(*tw.dev, 0, aq, pos.data(), cs.n_heads, scale, ao);
      ASSERT_TRUE(be->download(ao, out.data()).ok());
      EXPECT_LT(nerr(out, ref), cm ? 3e-3 : 1e-5) << (cm ? "attn_cm" : "attn_tile");
    }
    be->set_attn_coopmat(true);
  }
  EXPECT_EQ(be->validation_messages(), 0u);
}

// Scope timing over a decode-like step: 32 layers x 3 scopes of real-size
// matvecs in one submission; one entry per scope, within the wall time.
TEST(GpuScopes, ADecodeStepOfScopes) {
  LOOM_GPU_OR_SKIP(be);
  if (!be->device_timing()) GTEST_SKIP() << "no timestamps on the compute queue";
  const int64_t n = 4096;
  const size_t rb = static_cast<size_t>(*dtype_row_bytes(DType::kQ8_0, n));
  std::vector<uint8_t> bytes(rb * n);
  std::vector<float> f(static_cast<size_t>(n));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int64_t r = 0; r < n; ++r) {
    for (float& x : f) x = d(rng);
    ASSERT_TRUE(ref::quantize_row(DType::kQ8_0, f.data(), bytes.data() + rb * r, n).ok());
  }
  Weight w{bytes.data(), DType::kQ8_0, n, n, rb, nullptr};
  ASSERT_TRUE(be->upload_weight(w).ok());
  auto bx = be->alloc_act(n), by = be->alloc_act(n);
  ASSERT_TRUE(bx.ok() && by.ok());
  const Act ax = (*bx)->view(1, n), ay = (*by)->view(1, n);
  ASSERT_TRUE(be->upload(f.data(), ax).ok());
  ASSERT_TRUE(be->synchronize().ok());
  be->set_scope_timing(true);
  const uint64_t subs = be->submissions();
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t l = 0; l < 32; ++l) {
    be->begin_scope(3 * l);
    be->matmul(w, ax, ay, nullptr);
    be->begin_scope(3 * l + 1);
    be->add(ay, ax, ax);
    be->begin_scope(3 * l + 2);
    be->matmul(w, ax, ay, nullptr);
    be->matmul(w, ay, ax, nullptr);
  }
  be->begin_scope(-1);
  ASSERT_TRUE(be->synchronize().ok());
  const auto wall = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  // The step's 128 dispatches go out in the GPU's chunked command buffers
  // (16, then 64 each: 3 submissions); the scopes add no flush of their own.
  EXPECT_LE(be->submissions(), subs + 3);
  std::vector<Backend::ScopeTime> t;
  be->take_scope_times(&t);
  ASSERT_EQ(t.size(), 96u);
  uint64_t sum = 0, two = 0, one = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].id, static_cast<int32_t>(i));
    EXPECT_GT(t[i].ns, 0u);
    sum += t[i].ns;
    if (i % 3 == 2) two += t[i].ns;
    if (i % 3 == 0) one += t[i].ns;
  }
  EXPECT_LE(sum, wall);
  // Two matvecs take longer than one (loose: the first scope of a step also pays start-up).
  EXPECT_GT(two, one);
  be->set_scope_timing(false);
  EXPECT_EQ(be->validation_messages(), 0u);
}

}  // namespace
}  // namespace loom
