// The KV cache's device tier: blocks of layers whose attention runs on a GPU
// spill to host RAM (and from there to the SSD), and attention merges the
// GPU's partial softmax over its slots with the CPU's over the host blocks.
//   - the CPU partials of two block subsets, merged, equal cpu/ref attention;
//   - on Vulkan (lavapipe here; skipped without a device): a cache fed token
//     by token under each tier mix (device only, device + RAM, device + RAM
//     + SSD) attends like cpu/ref over all its tokens, at odd block counts,
//     for decode and for several query rows at once;
//   - greedy output of a `loom synth` model is identical to the all-on-device
//     run under each mix and both policies, with bytes in every tier.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cpu/ref/ops_ref.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"
#include "tests/unit/vulkan_test_util.h"

namespace loom {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Largest |a - b| over the largest |b|.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}

// A host cache holding `n` tokens of random K/V ([layer 0][token][n_kv * hd]).
std::unique_ptr<KvCache> host_cache(const KvCacheConfig& cfg, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t n) {
  auto kv = KvCache::create(cfg);
  EXPECT_TRUE(kv.ok());
  EXPECT_TRUE((*kv)->reserve(n).ok());
  const int64_t d = cfg.n_kv_heads * cfg.head_dim;
  for (int64_t p = 0; p < n; ++p) (*kv)->store(0, p, k.data() + p * d, v.data() + p * d);
  (*kv)->set_n_tokens(n);
  return std::move(kv).value();
}

// cpu/ref attention of q [T, n_heads * hd] at positions pos over the cache.
std::vector<float> ref_attention(const KvCache& kv, const std::vector<float>& q,
                                 const std::vector<int32_t>& pos, int64_t n_heads) {
  const int64_t hd = kv.config().head_dim, T = static_cast<int64_t>(pos.size());
  std::vector<float> out(static_cast<size_t>(T * n_heads * hd));
  ref::attention(q.data(), T, pos.data(), n_heads, kv.view(0),
                 1.0f / std::sqrt(static_cast<float>(hd)), out.data(), 0, n_heads);
  return out;
}

// ---- CPU partials ----------------------------------------------------------------

class CpuPartials : public ::testing::TestWithParam<DType> {};

// Blocks split into two subsets (every third block, and the rest), each
// attended with attention_partial at the positions as the host part sees them,
// then merged: the same as cpu/ref over all of them.
TEST_P(CpuPartials, TwoSubsetsMergedEqualTheReference) {
  const DType t = GetParam();
  const int64_t n_heads = 6, n_kv = 2, hd = 64, bs = 32;
  for (const int64_t n : {int64_t{1}, int64_t{33}, int64_t{7 * 32 - 5}, int64_t{9 * 32}}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    const KvCacheConfig cfg{1, n_kv, hd, 512, bs, t};
    const auto k = randn(static_cast<size_t>(n * n_kv * hd), 1);
    const auto v = randn(static_cast<size_t>(n * n_kv * hd), 2);
    auto kv = host_cache(cfg, k, v, n);
    const std::vector<int32_t> pos =
        n >= 4 ? std::vector<int32_t>{static_cast<int32_t>(n - 4), static_cast<int32_t>(n - 3),
                                      static_cast<int32_t>(n - 1)}
               : std::vector<int32_t>{static_cast<int32_t>(n - 1)};
    const auto T = static_cast<int64_t>(pos.size());
    const auto q = randn(static_cast<size_t>(T * n_heads * hd), 3);
    const cpu::KvView all = kv->view(0);
    const int64_t n_blocks = (n + bs - 1) / bs;
    std::vector<float> parts[2];
    for (int set = 0; set < 2; ++set) {
      std::vector<const void*> kb, vb;
      std::vector<int64_t> ids;
      for (int64_t b = 0; b < n_blocks; ++b) {
        if ((b % 3 == 1) != (set == 1)) continue;
        kb.push_back(all.k_blocks[b]);
        vb.push_back(all.v_blocks[b]);
        ids.push_back(b);
      }
      cpu::KvView sub = all;
      sub.k_blocks = kb.data();
      sub.v_blocks = vb.data();
      std::vector<int32_t> hpos;
      for (int32_t p : pos) {
        int64_t c = 0;
        for (int64_t b : ids) c += std::clamp<int64_t>(p - b * bs + 1, 0, bs);
        hpos.push_back(static_cast<int32_t>(c - 1));
      }
      auto& part = parts[set];
      part.assign(static_cast<size_t>(T * n_heads * (hd + 2)), 0.0f);
      int64_t t0 = 0;
      while (t0 < T && hpos[static_cast<size_t>(t0)] < 0) ++t0;
      for (int64_t r = 0; r < t0 * n_heads; ++r)
        part[static_cast<size_t>(r * (hd + 2))] = cpu::kAttnEmptyMax;
      if (t0 == T) continue;
      std::vector<float> scratch(cpu::attention_scratch_floats(sub));
      cpu::attention_partial(q.data() + t0 * n_heads * hd, T - t0, hpos.data() + t0, n_heads, sub,
                             1.0f / std::sqrt(static_cast<float>(hd)),
                             part.data() + t0 * n_heads * (hd + 2), 0, n_heads, scratch.data());
    }
    std::vector<float> got(static_cast<size_t>(T * n_heads * hd));
    cpu::attention_merge_partials(parts[0].data(), parts[1].data(), T * n_heads, hd, got.data());
    EXPECT_LT(rel_err(got, ref_attention(*kv, q, pos, n_heads)), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuPartials, ::testing::Values(DType::kF16, DType::kQ8_0),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// A backend without a device tier says so instead of keeping the budget silently.
TEST(KvDeviceTier, StorageWithoutSlotsIsUnsupported) {
  class WholeLayers final : public KvStorage {
   public:
    Status reserve(int64_t) override { return {}; }
    uint64_t allocated_bytes() const override { return 0; }
    bool layer_resident(int64_t) const override { return resident_; }
    Status set_layer_resident(int64_t, bool r) override {
      resident_ = r;
      return {};
    }
    Status export_layer(int64_t, int64_t, uint8_t*, uint8_t*) override { return {}; }
    Status import_layer(int64_t, int64_t, const uint8_t*, const uint8_t*) override { return {}; }
    bool resident_ = false;
  };
  auto kv = KvCache::create(KvCacheConfig{1, 2, 64, 512, 32, DType::kF16});
  ASSERT_TRUE(kv.ok());
  KvTierConfig t;
  t.device_budget = 64ull << 20;
  ASSERT_TRUE((*kv)->configure_tiers(t).ok());
  ASSERT_TRUE((*kv)->attach_storage(std::make_unique<WholeLayers>()).ok());
  const Status s = (*kv)->move_layer(0, true);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("--kv-gpu"), std::string::npos) << s.message();
  EXPECT_FALSE((*kv)->on_device(0));
}

#ifdef LOOM_HAVE_VULKAN

// ---- Vulkan: the cache alone -------------------------------------------------------

// One (layer, block) of K+V: 2 heads of 64, 32 rows.
constexpr uint64_t kPair = 2ull * 32 * 2 * 64 * 2;  // F16
uint64_t pair_bytes(DType t) {
  return 2ull * 2 * cpu::kv_head_bytes(t, 32, 64);
}

struct Mix {
  const char* name;
  int64_t device_slots;  ///< per layer (0: no device tier)
  uint64_t ram_pairs;    ///< RAM budget in pairs (0: no limit)
};
const Mix kMixes[] = {{"device_only", 0, 0}, {"device_ram", 6, 0}, {"device_ram_ssd", 6, 3}};

class VulkanKvTier : public ::testing::TestWithParam<std::tuple<DType, Mix>> {};

// A layer fed token by token (prefill chunks of 20, then single tokens) with
// rebalancing between steps, then attention at the last positions: equal to
// cpu/ref over all tokens whatever tier each block ended on.
TEST_P(VulkanKvTier, AttentionAcrossTiersMatchesTheReference) {
  LOOM_VULKAN_OR_SKIP(be, false);
  const auto [t, mix] = GetParam();
  const int64_t n_heads = 4, n_kv = 2, hd = 64, bs = 32;
  const KvCacheConfig cfg{1, n_kv, hd, 512, bs, t};
  CpuBackend cpu(2);
  // 11 and 14 blocks (the last one part full): 6 on the device, the rest on
  // the host, of which RAM holds 3 under the SSD mix.
  for (const int64_t n : {int64_t{11 * 32 - 11}, int64_t{13 * 32 + 1}}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    const int64_t d = n_kv * hd;
    const auto k = randn(static_cast<size_t>(n * d), 11);
    const auto v = randn(static_cast<size_t>(n * d), 12);
    auto kvr = KvCache::create(cfg);
    ASSERT_TRUE(kvr.ok());
    KvCache& kv = **kvr;
    KvTierConfig tiers;
    tiers.device_budget = static_cast<uint64_t>(mix.device_slots) * pair_bytes(t);
    tiers.ram_budget = mix.ram_pairs * pair_bytes(t);
    tiers.spill_dir = test::temp_dir("kv_device_tier");
    tiers.sink_tokens = 32;
    tiers.window_tokens = 64;
    tiers.policy = "lru";
    ASSERT_TRUE(kv.configure_tiers(tiers).ok());
    auto st = be->create_kv_storage(cfg);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(kv.attach_storage(std::move(st).value()).ok());
    kv.set_device_layers(1);
    ASSERT_TRUE(kv.move_layer(0, true).ok());
    EXPECT_EQ(kv.device_tiered(0), mix.device_slots > 0);
    auto dk = be->alloc_act(20 * d), dv = be->alloc_act(20 * d);
    ASSERT_TRUE(dk.ok() && dv.ok());
    for (int64_t p0 = 0; p0 < n;) {
      const int64_t m = std::min<int64_t>(p0 < 100 ? 20 : 1, n - p0);
      ASSERT_TRUE(kv.reserve(p0 + m).ok());
      const Act ka = (*dk)->view(m, d), va = (*dv)->view(m, d);
      ASSERT_TRUE(be->upload(k.data() + p0 * d, ka).ok());
      ASSERT_TRUE(be->upload(v.data() + p0 * d, va).ok());
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < m; ++i) pos.push_back(static_cast<int32_t>(p0 + i));
      be->kv_store(kv, 0, ka, va, pos.data());
      ASSERT_TRUE(be->synchronize().ok());
      p0 += m;
      kv.set_n_tokens(p0);
      ASSERT_TRUE(kv.rebalance().ok());
    }
    const KvTierStats ts = kv.tier_stats();
    if (mix.device_slots > 0) {
      EXPECT_GT(ts.ram_bytes + ts.ssd_bytes, 0u) << "nothing left the device";
      EXPECT_GT(ts.blocks_to_host, 0u);
    }
    if (mix.ram_pairs > 0) {
      EXPECT_GT(ts.ssd_bytes, 0u) << "nothing reached the SSD";
    }

    auto ref_kv = host_cache(cfg, k, v, n);
    // 40: gathered (prefill); with 3 slots per split on the device (no mass: lru).
    const std::pair<int64_t, uint32_t> runs[] = {{1, 0}, {3, 0}, {40, 0}, {1, 3}, {3, 3}};
    for (const auto& [T, chunks] : runs) {
      SCOPED_TRACE("query rows " + std::to_string(T) + ", slots per split " +
                   std::to_string(chunks));
      be->set_attn_split_chunks(chunks);
      std::vector<int32_t> pos;
      for (int64_t i = T; i >= 1; --i) pos.push_back(static_cast<int32_t>(n - i));
      const auto q = randn(static_cast<size_t>(T * n_heads * hd), 13);
      auto dq = be->alloc_act(T * n_heads * hd), dout = be->alloc_act(T * n_heads * hd);
      ASSERT_TRUE(dq.ok() && dout.ok());
      const Act qa = (*dq)->view(T, n_heads * hd), oa = (*dout)->view(T, n_heads * hd);
      ASSERT_TRUE(be->upload(q.data(), qa).ok());
      ASSERT_TRUE(kv.fetch_layer(0).ok());
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      if (kv.device_tiered(0)) {
        HostAttentionFn host = [&](const float* qh, int64_t tn, const int32_t* p, const float* ml,
                                   float* part, float* mass) {
          cpu.attention_host_part(kv, 0, qh, tn, p, n_heads, scale, ml, part, mass);
        };
        ASSERT_TRUE(be->attention_split(kv, 0, qa, pos.data(), n_heads, scale, oa, host).ok());
      } else {
        be->attention(kv, 0, qa, pos.data(), n_heads, scale, oa);
      }
      std::vector<float> got(static_cast<size_t>(T * n_heads * hd));
      ASSERT_TRUE(be->download(oa, got.data()).ok());
      // The GPU's Q8_0 store may round a quant the other way than the CPU's.
      EXPECT_LT(rel_err(got, ref_attention(*ref_kv, q, pos, n_heads)),
                t == DType::kF16 ? 2e-3 : 2e-2);
    }
    be->set_attn_split_chunks(0);
    // A placement moves the layer's attention to the CPU and back: its
    // blocks come off the device and go up again (the pinned ones at once).
    if (kv.device_tiered(0)) {
      ASSERT_TRUE(kv.move_layer(0, false).ok());
      EXPECT_FALSE(kv.on_device(0));
      ASSERT_TRUE(kv.move_layer(0, true).ok());
      ASSERT_TRUE(kv.device_tiered(0));
      ASSERT_TRUE(kv.rebalance().ok());
      const std::vector<int32_t> pos{static_cast<int32_t>(n - 1)};
      const auto q = randn(static_cast<size_t>(n_heads * hd), 14);
      auto dq = be->alloc_act(n_heads * hd), dout = be->alloc_act(n_heads * hd);
      ASSERT_TRUE(dq.ok() && dout.ok());
      const Act qa = (*dq)->view(1, n_heads * hd), oa = (*dout)->view(1, n_heads * hd);
      ASSERT_TRUE(be->upload(q.data(), qa).ok());
      ASSERT_TRUE(kv.fetch_layer(0).ok());
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      HostAttentionFn host = [&](const float* qh, int64_t tn, const int32_t* p, const float* ml,
                                 float* part, float* mass) {
        cpu.attention_host_part(kv, 0, qh, tn, p, n_heads, scale, ml, part, mass);
      };
      ASSERT_TRUE(be->attention_split(kv, 0, qa, pos.data(), n_heads, scale, oa, host).ok());
      std::vector<float> got(static_cast<size_t>(n_heads * hd));
      ASSERT_TRUE(be->download(oa, got.data()).ok());
      EXPECT_LT(rel_err(got, ref_attention(*ref_kv, q, pos, n_heads)),
                t == DType::kF16 ? 2e-3 : 2e-2)
          << "after the layer moved off the device and back";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndMixes, VulkanKvTier,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kQ8_0),
                                            ::testing::ValuesIn(kMixes)),
                         [](const auto& p) {
                           return std::string(dtype_name(std::get<0>(p.param))) + "_" +
                                  std::get<1>(p.param).name;
                         });

// A prefill chunk takes a slot for each new block, evicting as many blocks
// to RAM: their rows leave in one submission (export_blocks), and they are
// the blocks' rows (attention over every tier still matches the reference).
TEST(VulkanKvTierExports, AChunksEvictionsShareOneSubmission) {
  LOOM_VULKAN_OR_SKIP(be, false);
  const int64_t n_heads = 4, n_kv = 2, hd = 64, bs = 32, d = n_kv * hd;
  const KvCacheConfig cfg{1, n_kv, hd, 1024, bs, DType::kF16};
  auto kvr = KvCache::create(cfg);
  ASSERT_TRUE(kvr.ok());
  KvCache& kv = **kvr;
  KvTierConfig tiers;
  tiers.device_budget = 12 * pair_bytes(DType::kF16);  // 12 slots
  tiers.sink_tokens = 32;
  tiers.window_tokens = 64;
  tiers.policy = "lru";
  ASSERT_TRUE(kv.configure_tiers(tiers).ok());
  auto st = be->create_kv_storage(cfg);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(kv.attach_storage(std::move(st).value()).ok());
  kv.set_device_layers(1);
  ASSERT_TRUE(kv.move_layer(0, true).ok());
  ASSERT_TRUE(kv.device_tiered(0));
  const int64_t n = 16 * bs;  // 12 blocks fill the slots, then a chunk of 4 more
  const auto k = randn(static_cast<size_t>(n * d), 21);
  const auto v = randn(static_cast<size_t>(n * d), 22);
  auto dk = be->alloc_act(128 * d), dv = be->alloc_act(128 * d);
  ASSERT_TRUE(dk.ok() && dv.ok());
  for (int64_t p0 = 0; p0 < n; p0 += 128) {
    ASSERT_TRUE(be->synchronize().ok());
    const uint64_t subs = be->submissions(), to_host = kv.tier_stats().blocks_to_host;
    ASSERT_TRUE(kv.reserve(p0 + 128).ok());
    const uint64_t evicted = kv.tier_stats().blocks_to_host - to_host;
    if (p0 == 12 * bs) {
      EXPECT_EQ(evicted, 4u);
      EXPECT_EQ(be->submissions() - subs, 1u) << "one submission for the chunk's evictions";
    }
    const Act ka = (*dk)->view(128, d), va = (*dv)->view(128, d);
    ASSERT_TRUE(be->upload(k.data() + p0 * d, ka).ok());
    ASSERT_TRUE(be->upload(v.data() + p0 * d, va).ok());
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < 128; ++i) pos.push_back(static_cast<int32_t>(p0 + i));
    be->kv_store(kv, 0, ka, va, pos.data());
    kv.set_n_tokens(p0 + 128);
  }
  ASSERT_TRUE(be->synchronize().ok());
  ASSERT_GT(kv.tier_stats().ram_bytes, 0u);
  // Decode-sized attention (the split path) over device and host blocks.
  CpuBackend cpu(2);
  const std::vector<int32_t> pos{static_cast<int32_t>(n - 1)};
  const auto q = randn(static_cast<size_t>(n_heads * hd), 23);
  auto dq = be->alloc_act(n_heads * hd), dout = be->alloc_act(n_heads * hd);
  ASSERT_TRUE(dq.ok() && dout.ok());
  const Act qa = (*dq)->view(1, n_heads * hd), oa = (*dout)->view(1, n_heads * hd);
  ASSERT_TRUE(be->upload(q.data(), qa).ok());
  ASSERT_TRUE(kv.fetch_layer(0).ok());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  HostAttentionFn host = [&](const float* qh, int64_t tn, const int32_t* p, const float* ml,
                             float* part, float* mass) {
    cpu.attention_host_part(kv, 0, qh, tn, p, n_heads, scale, ml, part, mass);
  };
  ASSERT_TRUE(be->attention_split(kv, 0, qa, pos.data(), n_heads, scale, oa, host).ok());
  std::vector<float> got(static_cast<size_t>(n_heads * hd));
  ASSERT_TRUE(be->download(oa, got.data()).ok());
  auto ref_kv = host_cache(cfg, k, v, n);
  EXPECT_LT(rel_err(got, ref_attention(*ref_kv, q, pos, n_heads)), 2e-3);
}

// ---- Vulkan: whole sessions ---------------------------------------------------------

class VulkanKvTierSession : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SynthSpec s;
    s.arch = "llama";
    s.n_layer = 2;
    s.n_embd = 256;
    s.n_ff = 512;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ctx = 1024;
    // F16 weights: no matvec reads a Q8 copy of its input. (With Q8_0 ones
    // the o matvec reads the attention output's Q8 copy, and the few ulps
    // by which the CPU's sum over the host blocks differs from the GPU's can
    // round one of its values the other way: a different but equally valid
    // run, measured in the test below.)
    s.weight_type = "f16";
    s.seed = 17;
    const std::string path = test::temp_dir("kv_device_tier_model") + "/m.gguf";
    ASSERT_TRUE(write_synthetic_model(s, path).ok());
    auto m = load_model(path);
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  std::vector<int32_t> greedy(Backend& be, const KvTierConfig& t, int n, KvTierStats* ts,
                              std::vector<KvLayerTiers>* layers = nullptr) {
    SessionConfig c;
    c.n_ctx = 1024;
    c.max_chunk = 64;
    c.kv_tiers = t;
    auto s = Session::create(*model_, be, c);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return {};
    std::vector<int32_t> p;
    std::mt19937 rng(5);
    for (int i = 0; i < 400; ++i)
      p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(model_->hp.n_vocab)));
    GenerateParams gp;
    gp.sampling.temperature = 0;
    gp.max_tokens = n;
    gp.stop_at_eog = false;
    auto r = (*s)->generate(p, gp, nullptr);
    EXPECT_TRUE(r.ok()) << r.message();
    if (ts) *ts = (*s)->kv().tier_stats();
    if (layers) *layers = (*s)->kv().layer_tiers();
    return std::vector<int32_t>((*s)->tokens().begin() + static_cast<ptrdiff_t>(p.size()),
                                (*s)->tokens().end());
  }

  static Model* model_;
};
Model* VulkanKvTierSession::model_ = nullptr;

TEST_F(VulkanKvTierSession, GreedyOutputIsIdenticalInEveryTierMix) {
  LOOM_VULKAN_OR_SKIP(be, false);
  KvTierStats all_dev;
  std::vector<KvLayerTiers> layers;
  const auto want = greedy(*be, KvTierConfig{}, 40, &all_dev, &layers);
  ASSERT_EQ(want.size(), 39u);
  EXPECT_EQ(all_dev.ram_bytes, 0u);
  EXPECT_GT(all_dev.device_bytes, 0u);
  ASSERT_EQ(layers.size(), 2u);
  for (const KvLayerTiers& lt : layers) {  // 439 tokens: 14 blocks, all on the device
    EXPECT_EQ(lt.device, 14 * kPair);
    EXPECT_EQ(lt.ram + lt.ssd, 0u);
  }
  const std::string dir = test::temp_dir("kv_device_tier_spill");
  for (const char* policy : {"lru", "importance"}) {
    for (const Mix& mix : kMixes) {
      if (mix.device_slots == 0) continue;
      SCOPED_TRACE(std::string(policy) + " " + mix.name);
      // 7 of the 14 blocks of each of the 2 layers on the device; of the 14
      // host blocks, 6 in RAM under the SSD mix (the least it takes).
      KvTierConfig t;
      t.device_budget = 2 * 7 * kPair;
      t.ram_budget = mix.ram_pairs > 0 ? 6 * kPair : 0;
      t.spill_dir = dir;
      t.policy = policy;
      t.sink_tokens = 32;
      t.window_tokens = 64;
      KvTierStats ts;
      EXPECT_EQ(greedy(*be, t, 40, &ts, &layers), want);
      // Per layer: at most its 7 slots on the device, the rest on the host.
      ASSERT_EQ(layers.size(), 2u);
      uint64_t dev = 0;
      for (const KvLayerTiers& lt : layers) {
        EXPECT_GT(lt.device, 0u);
        EXPECT_LE(lt.device, 7 * kPair);
        EXPECT_GT(lt.ram + lt.ssd, 0u);
        if (mix.ram_pairs == 0) {
          EXPECT_EQ(lt.ssd, 0u);
        }
        dev += lt.device;
      }
      EXPECT_LE(dev, ts.device_used_bytes);
      EXPECT_GT(ts.device_bytes, 0u);
      EXPECT_LE(ts.device_bytes, 2 * 7 * kPair);
      EXPECT_GT(ts.blocks_to_host, 0u);
      EXPECT_GT(ts.ram_bytes + ts.ssd_bytes, 0u);
      if (mix.ram_pairs > 0) {
        EXPECT_GT(ts.blocks_spilled, 0u);
        EXPECT_GT(ts.ssd_bytes, 0u);
        EXPECT_LE(ts.ram_bytes, 6 * kPair);
      } else {
        EXPECT_EQ(ts.ssd_bytes, 0u);
      }
      EXPECT_EQ(ts.blocks_lost, 0u);
    }
  }
  be->release_weights();
}

// A second conversation after a first, longer one: its blocks find the slots
// and host blocks the first left (forgotten tokens leave without a copy).
TEST_F(VulkanKvTierSession, ASecondConversationReusesTheTiers) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto two_turns = [&](const KvTierConfig& t) {
    SessionConfig c;
    c.n_ctx = 1024;
    c.max_chunk = 64;
    c.kv_tiers = t;
    auto s = Session::create(*model_, *be, c);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return std::vector<int32_t>{};
    GenerateParams gp;
    gp.sampling.temperature = 0;
    gp.max_tokens = 20;
    gp.stop_at_eog = false;
    std::vector<int32_t> out;
    for (const uint32_t seed : {7u, 8u}) {
      std::vector<int32_t> p;
      std::mt19937 rng(seed);
      for (int i = 0; i < (seed == 7u ? 420 : 150); ++i)
        p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(model_->hp.n_vocab)));
      auto r = (*s)->generate(p, gp, nullptr);
      EXPECT_TRUE(r.ok()) << r.message();
      out.insert(out.end(), (*s)->tokens().begin() + static_cast<ptrdiff_t>(p.size()),
                 (*s)->tokens().end());
    }
    return out;
  };
  const auto want = two_turns(KvTierConfig{});
  ASSERT_EQ(want.size(), 38u);
  KvTierConfig t;
  t.device_budget = 2 * 7 * kPair;
  t.policy = "importance";
  t.sink_tokens = 32;
  t.window_tokens = 64;
  EXPECT_EQ(two_turns(t), want);
  be->release_weights();
}

// Blocks of GPU layers that went down to the SSD and cannot be read back are
// recomputed into their host blocks (the GPU's kv_store hands those tokens to
// the cache and leaves its slots alone): the output stays the same.
TEST_F(VulkanKvTierSession, LostBlocksOfGpuLayersAreRecomputed) {
  LOOM_VULKAN_OR_SKIP(be, false);
  const auto want = greedy(*be, KvTierConfig{}, 30, nullptr);
  ASSERT_EQ(want.size(), 29u);
  for (const storage::SpillFaults f :
       {storage::SpillFaults{.fail_read = 3}, storage::SpillFaults{.short_read = 5}}) {
    SCOPED_TRACE(f.fail_read ? "io_error" : "short_read");
    KvTierConfig t;
    t.device_budget = 2 * 7 * kPair;
    t.ram_budget = 6 * kPair;
    t.spill_dir = test::temp_dir("kv_device_tier_faults");
    t.policy = "importance";
    t.sink_tokens = 32;
    t.window_tokens = 64;
    t.faults = f;
    KvTierStats ts;
    EXPECT_EQ(greedy(*be, t, 30, &ts), want);
    EXPECT_GT(ts.blocks_lost, 0u) << "no fault reached a read";
  }
  be->release_weights();
}

// A budget that cannot hold the sinks, the window and a step is refused with the sizes.
TEST_F(VulkanKvTierSession, ATooSmallDeviceBudgetIsAClearError) {
  LOOM_VULKAN_OR_SKIP(be, false);
  SessionConfig c;
  c.n_ctx = 1024;
  c.kv_tiers.device_budget = 2 * 2 * kPair;
  c.kv_tiers.window_tokens = 64;
  auto s = Session::create(*model_, *be, c);
  std::vector<float> logits(static_cast<size_t>(model_->hp.n_vocab));
  const std::vector<int32_t> toks = {1, 2, 3};
  Status st = s.ok() ? (*s)->append(toks, logits.data()) : s.status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--kv-gpu"), std::string::npos) << st.message();
  be->release_weights();
}

#endif  // LOOM_HAVE_VULKAN

}  // namespace
}  // namespace loom
