// The KV cache's device tier: blocks of layers whose attention runs on a GPU
// spill to host RAM (and from there to the SSD), and attention merges the
// GPU's partial softmax over its slots with the CPU's over the host blocks.
//   - the CPU partials of two block subsets, merged, equal cpu/ref attention;
//   - on Vulkan (lavapipe here; skipped without a device; the checks are
//     tests/kv_tier_checks.cpp, which the CUDA suite runs too): a cache fed token
//     by token under each tier mix (device only, device + RAM, device + RAM
//     + SSD) attends like cpu/ref over all its tokens, at odd block counts,
//     for decode and for several query rows at once;
//   - greedy output of a `loom synth` model is identical to the all-on-device
//     run under each mix and both policies, with bytes in every tier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
#include "tests/kv_tier_checks.h"
#include "tests/test_util.h"
#include "tests/unit/vulkan_test_util.h"

namespace loom {
namespace {

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
    const auto k = test::tier_randn(static_cast<size_t>(n * n_kv * hd), 1);
    const auto v = test::tier_randn(static_cast<size_t>(n * n_kv * hd), 2);
    auto kv = test::tier_host_cache(cfg, k, v, n);
    const std::vector<int32_t> pos =
        n >= 4 ? std::vector<int32_t>{static_cast<int32_t>(n - 4), static_cast<int32_t>(n - 3),
                                      static_cast<int32_t>(n - 1)}
               : std::vector<int32_t>{static_cast<int32_t>(n - 1)};
    const auto T = static_cast<int64_t>(pos.size());
    const auto q = test::tier_randn(static_cast<size_t>(T * n_heads * hd), 3);
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
    EXPECT_LT(test::tier_rel_err(got, test::tier_ref_attention(*kv, q, pos, n_heads)), 1e-5);
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

// A storage that hands out the host blocks of its tiered layers
// (KvStorage::alloc_host_pair, as the CUDA backend's mapped pinned memory):
// every block that leaves the device, or comes back from the SSD, is one of
// its blocks, and each goes back to it before it dies.
TEST(KvDeviceTier, HostBlocksOfTieredLayersComeFromTheStorage) {
  struct Counts {
    int given = 0, freed = 0, live_at_death = -1;
  } counts;
  class Slotted final : public KvStorage {
   public:
    explicit Slotted(Counts* c) : c_(c) {}
    ~Slotted() override { c_->live_at_death = static_cast<int>(live_.size()); }
    Status reserve(int64_t) override { return {}; }
    uint64_t allocated_bytes() const override { return 0; }
    bool layer_resident(int64_t) const override { return slots_ > 0; }
    Status set_layer_resident(int64_t, bool r) override {
      slots_ = r ? pending_ : 0;
      return {};
    }
    Status export_layer(int64_t, int64_t, uint8_t*, uint8_t*) override { return {}; }
    Status import_layer(int64_t, int64_t, const uint8_t*, const uint8_t*) override { return {}; }
    Status set_block_slots(int64_t, int64_t n) override {
      pending_ = n;
      return {};
    }
    int64_t layer_slots(int64_t) const override { return slots_; }
    Status export_rows(int64_t, int64_t, int64_t n, uint8_t* k, uint8_t* v) override {
      std::memset(k, 7, static_cast<size_t>(n) * 2 * 64 * 2);  // 2 heads of 64 F16 values
      std::memset(v, 9, static_cast<size_t>(n) * 2 * 64 * 2);
      return {};
    }
    Status import_rows(int64_t, int64_t, int64_t, const uint8_t*, const uint8_t*) override {
      return {};
    }
    uint8_t* alloc_host_pair(uint64_t bytes) override {
      auto* p = new uint8_t[bytes];
      live_.push_back(p);
      ++c_->given;
      return p;
    }
    void free_host_pair(uint8_t* p) override {
      const auto it = std::find(live_.begin(), live_.end(), p);
      ASSERT_NE(it, live_.end()) << "a block the storage did not give";
      live_.erase(it);
      delete[] p;
      ++c_->freed;
    }

   private:
    Counts* c_;
    int64_t pending_ = 0, slots_ = 0;
    std::vector<uint8_t*> live_;
  };
  const KvCacheConfig cfg{1, 2, 64, 512, 32, DType::kF16};
  const uint64_t pair = 2ull * 2 * 32 * 64 * 2;
  {
    auto kvr = KvCache::create(cfg);
    ASSERT_TRUE(kvr.ok());
    KvCache& kv = **kvr;
    KvTierConfig t;
    t.device_budget = 6 * pair;
    t.ram_budget = 3 * pair;
    t.spill_dir = test::temp_dir("kv_host_pairs");
    t.sink_tokens = 32;
    t.window_tokens = 32;
    t.policy = "lru";
    ASSERT_TRUE(kv.configure_tiers(t).ok());
    ASSERT_TRUE(kv.attach_storage(std::make_unique<Slotted>(&counts)).ok());
    kv.set_device_layers(1);
    ASSERT_TRUE(kv.move_layer(0, true).ok());
    ASSERT_TRUE(kv.device_tiered(0));
    for (int64_t n = 32; n <= 12 * 32; n += 32) {
      ASSERT_TRUE(kv.reserve(n).ok());
      kv.set_n_tokens(n);
      ASSERT_TRUE(kv.rebalance().ok());
    }
    const KvTierStats st = kv.tier_stats();
    EXPECT_GT(st.ram_bytes, 0u);
    EXPECT_GT(st.ssd_bytes, 0u);
    // Every block in RAM is the storage's, and a block read back from the
    // SSD gets the storage's memory too.
    EXPECT_EQ(static_cast<uint64_t>(counts.given - counts.freed) * pair, st.ram_bytes);
    // The host view's RAM blocks: V half a pair after K (what the CUDA
    // kernel reads in place); spilled ones have no address until fetched.
    std::vector<int32_t> blocks;
    const cpu::KvView hv = kv.host_view(0, 12, &blocks);
    ASSERT_FALSE(blocks.empty());
    int in_ram = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!hv.k_blocks[i]) continue;
      ++in_ram;
      EXPECT_EQ(static_cast<const uint8_t*>(hv.v_blocks[i]),
                static_cast<const uint8_t*>(hv.k_blocks[i]) + pair / 2);
    }
    EXPECT_EQ(static_cast<uint64_t>(in_ram) * pair, st.ram_bytes);
    ASSERT_TRUE(kv.fetch_layer(0).ok());
    const int before = counts.given;
    ASSERT_TRUE(kv.move_layer(0, false).ok());  // to the CPU: every block back in RAM
    EXPECT_GE(counts.given, before);
  }
  EXPECT_GT(counts.given, 0);
  EXPECT_EQ(counts.freed, counts.given);
  EXPECT_EQ(counts.live_at_death, 0) << "blocks outlived the storage's use";
}

// host_epoch() (which a device copy of host blocks is checked against)
// moves with every change that may move or write host blocks, and two
// caches, even one made where another was freed, never share a value.
TEST(KvDeviceTier, HostEpochMovesAndIsNeverShared) {
  const KvCacheConfig cfg{1, 2, 64, 512, 32, DType::kF16};
  uint64_t first = 0;
  {
    auto a = KvCache::create(cfg);
    ASSERT_TRUE(a.ok());
    first = (*a)->host_epoch();
    ASSERT_TRUE((*a)->reserve(40).ok());
    EXPECT_NE((*a)->host_epoch(), first);
    const uint64_t e = (*a)->host_epoch();
    (*a)->clear();
    EXPECT_NE((*a)->host_epoch(), e);
  }
  auto b = KvCache::create(cfg);
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)->host_epoch(), first);
}

#ifdef LOOM_HAVE_VULKAN

// ---- Vulkan: the cache alone -------------------------------------------------------

class VulkanKvTier : public ::testing::TestWithParam<std::tuple<DType, test::TierMix>> {};

// 40 query rows are gathered (prefill); 3 slots per split on the device (no mass: lru).
// Decode over the slots on attn_split.comp, and in one pass (attn_decode.comp).
TEST_P(VulkanKvTier, AttentionAcrossTiersMatchesTheReference) {
  LOOM_VULKAN_OR_SKIP(be, false);
  for (const bool one_pass : {false, true}) {
    SCOPED_TRACE(one_pass ? "attn_decode" : "attn_split");
    be->set_attn_decode(one_pass, true);
    test::check_attention_across_tiers(*be, std::get<0>(GetParam()), std::get<1>(GetParam()),
                                       [&](uint32_t c) { be->set_attn_split_chunks(c); });
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndMixes, VulkanKvTier,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kQ8_0),
                                            ::testing::ValuesIn(test::kTierMixes)),
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
  tiers.device_budget = 12 * test::tier_pair_bytes(DType::kF16);  // 12 slots
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
  const auto k = test::tier_randn(static_cast<size_t>(n * d), 21);
  const auto v = test::tier_randn(static_cast<size_t>(n * d), 22);
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
  const auto q = test::tier_randn(static_cast<size_t>(n_heads * hd), 23);
  auto dq = be->alloc_act(n_heads * hd), dout = be->alloc_act(n_heads * hd);
  ASSERT_TRUE(dq.ok() && dout.ok());
  const Act qa = (*dq)->view(1, n_heads * hd), oa = (*dout)->view(1, n_heads * hd);
  ASSERT_TRUE(be->upload(q.data(), qa).ok());
  ASSERT_TRUE(kv.fetch_layer(0).ok());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  HostAttentionFn host = [&](const float* qh, int64_t tn, const int32_t* p, const float* ml,
                             float* part, float* mass, int64_t nb) {
    cpu.attention_host_part(kv, 0, qh, tn, p, n_heads, scale, ml, part, mass, nb);
  };
  ASSERT_TRUE(be->attention_split(kv, 0, qa, pos.data(), n_heads, scale, oa, host).ok());
  std::vector<float> got(static_cast<size_t>(n_heads * hd));
  ASSERT_TRUE(be->download(oa, got.data()).ok());
  auto ref_kv = test::tier_host_cache(cfg, k, v, n);
  EXPECT_LT(test::tier_rel_err(got, test::tier_ref_attention(*ref_kv, q, pos, n_heads)), 2e-3);
}

// ---- Vulkan: whole sessions ---------------------------------------------------------

class VulkanKvTierSession : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = test::tier_test_model().release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;
};
Model* VulkanKvTierSession::model_ = nullptr;

TEST_F(VulkanKvTierSession, GreedyOutputIsIdenticalInEveryTierMix) {
  LOOM_VULKAN_OR_SKIP(be, false);
  ASSERT_NE(model_, nullptr);
  test::check_greedy_identical_in_every_mix(*model_, *be);
}

// A second conversation after a first, longer one: its blocks find the slots
// and host blocks the first left (forgotten tokens leave without a copy).
TEST_F(VulkanKvTierSession, ASecondConversationReusesTheTiers) {
  LOOM_VULKAN_OR_SKIP(be, false);
  ASSERT_NE(model_, nullptr);
  test::check_second_conversation(*model_, *be);
}

// The diagnosis the CUDA suite runs by hand (--gtest_also_run_disabled_tests).
TEST_F(VulkanKvTierSession, DISABLED_DiagnoseTheSecondConversation) {
  LOOM_VULKAN_OR_SKIP(be, false);
  ASSERT_NE(model_, nullptr);
  test::diagnose_second_conversation(*model_, *be);
}

// The CUDA suite's SecondConversationAfterAnotherSession, by hand here (8.7 s
// on lavapipe in a Release build).
TEST_F(VulkanKvTierSession, DISABLED_SecondConversationAfterAnotherSession) {
  LOOM_VULKAN_OR_SKIP(be, false);
  ASSERT_NE(model_, nullptr);
  test::diagnose_second_conversation_in_turn(*model_, *be);
}

// Blocks of GPU layers that went down to the SSD and cannot be read back are
// recomputed into their host blocks (the GPU's kv_store hands those tokens to
// the cache and leaves its slots alone): the output stays the same.
TEST_F(VulkanKvTierSession, LostBlocksOfGpuLayersAreRecomputed) {
  LOOM_VULKAN_OR_SKIP(be, false);
  ASSERT_NE(model_, nullptr);
  test::check_lost_blocks_recomputed(*model_, *be);
}

// A budget that cannot hold the sinks, the window and a step is refused with the sizes.
TEST_F(VulkanKvTierSession, ATooSmallDeviceBudgetIsAClearError) {
  LOOM_VULKAN_OR_SKIP(be, false);
  ASSERT_NE(model_, nullptr);
  test::check_too_small_device_budget(*model_, *be);
}

#endif  // LOOM_HAVE_VULKAN

}  // namespace
}  // namespace loom
