// The KV cache's device tier checked through any GPU backend (Vulkan in
// tests/unit/kv_device_tier_test.cpp, CUDA in tests/cuda/backend_kv_tier_test.cpp):
//   - a cache fed token by token under each tier mix (device only, device +
//     RAM, device + RAM + SSD) attends like cpu/ref over all its tokens, at
//     odd block counts, for decode and for several query rows at once;
//   - greedy output of a `loom synth` model is identical to the all-on-device
//     run under each mix and both policies, with bytes in every tier; across
//     a second conversation; when blocks lost on the SSD are recomputed.
#include "tests/kv_tier_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cpu/ref/ops_ref.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"

namespace loom::test {

std::vector<float> tier_randn(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

double tier_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}

std::unique_ptr<KvCache> tier_host_cache(const KvCacheConfig& cfg, const std::vector<float>& k,
                                         const std::vector<float>& v, int64_t n) {
  auto kv = KvCache::create(cfg);
  EXPECT_TRUE(kv.ok());
  EXPECT_TRUE((*kv)->reserve(n).ok());
  const int64_t d = cfg.n_kv_heads * cfg.head_dim;
  for (int64_t p = 0; p < n; ++p) (*kv)->store(0, p, k.data() + p * d, v.data() + p * d);
  (*kv)->set_n_tokens(n);
  return std::move(kv).value();
}

std::vector<float> tier_ref_attention(const KvCache& kv, const std::vector<float>& q,
                                      const std::vector<int32_t>& pos, int64_t n_heads) {
  const int64_t hd = kv.config().head_dim, T = static_cast<int64_t>(pos.size());
  std::vector<float> out(static_cast<size_t>(T * n_heads * hd));
  ref::attention(q.data(), T, pos.data(), n_heads, kv.view(0),
                 1.0f / std::sqrt(static_cast<float>(hd)), out.data(), 0, n_heads);
  return out;
}

uint64_t tier_pair_bytes(DType t) {
  return 2ull * 2 * cpu::kv_head_bytes(t, 32, 64);
}

namespace {

// Feeds tokens [0, n) of k, v into layer 0 (chunks of 20 below `prefill_to`,
// then single tokens), rebalancing between steps.
void feed(Backend& be, KvCache& kv, const std::vector<float>& k, const std::vector<float>& v,
          int64_t n, int64_t prefill_to) {
  const int64_t d = kv.config().n_kv_heads * kv.config().head_dim;
  auto dk = be.alloc_act(20 * d), dv = be.alloc_act(20 * d);
  ASSERT_TRUE(dk.ok() && dv.ok());
  for (int64_t p0 = 0; p0 < n;) {
    const int64_t m = std::min<int64_t>(p0 < prefill_to ? 20 : 1, n - p0);
    ASSERT_TRUE(kv.reserve(p0 + m).ok());
    const Act ka = (*dk)->view(m, d), va = (*dv)->view(m, d);
    ASSERT_TRUE(be.upload(k.data() + p0 * d, ka).ok());
    ASSERT_TRUE(be.upload(v.data() + p0 * d, va).ok());
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < m; ++i) pos.push_back(static_cast<int32_t>(p0 + i));
    be.kv_store(kv, 0, ka, va, pos.data());
    ASSERT_TRUE(be.synchronize().ok());
    p0 += m;
    kv.set_n_tokens(p0);
    ASSERT_TRUE(kv.rebalance().ok());
  }
}

// Attention of T query rows (random, seeded) at the last T positions of n
// tokens, through attention_split where the layer is device-tiered, against
// cpu/ref over `ref`.
void expect_attention(Backend& be, CpuBackend& cpu, KvCache& kv, const KvCache& ref, int64_t n,
                      int64_t T, uint32_t seed) {
  const int64_t n_heads = 4, hd = kv.config().head_dim;
  std::vector<int32_t> pos;
  for (int64_t i = T; i >= 1; --i) pos.push_back(static_cast<int32_t>(n - i));
  const auto q = tier_randn(static_cast<size_t>(T * n_heads * hd), seed);
  auto dq = be.alloc_act(T * n_heads * hd), dout = be.alloc_act(T * n_heads * hd);
  ASSERT_TRUE(dq.ok() && dout.ok());
  const Act qa = (*dq)->view(T, n_heads * hd), oa = (*dout)->view(T, n_heads * hd);
  ASSERT_TRUE(be.upload(q.data(), qa).ok());
  ASSERT_TRUE(kv.fetch_layer(0).ok());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (kv.device_tiered(0)) {
    HostAttentionFn host = [&](const float* qh, int64_t tn, const int32_t* p, const float* ml,
                               float* part, float* mass, int64_t nb) {
      cpu.attention_host_part(kv, 0, qh, tn, p, n_heads, scale, ml, part, mass, nb);
    };
    ASSERT_TRUE(be.attention_split(kv, 0, qa, pos.data(), n_heads, scale, oa, host).ok());
  } else {
    be.attention(kv, 0, qa, pos.data(), n_heads, scale, oa);
  }
  std::vector<float> got(static_cast<size_t>(T * n_heads * hd));
  ASSERT_TRUE(be.download(oa, got.data()).ok());
  // The GPU's Q8_0 store may round a quant the other way than the CPU's.
  EXPECT_LT(tier_rel_err(got, tier_ref_attention(ref, q, pos, n_heads)),
            kv.config().dtype == DType::kF16 ? 2e-3 : 2e-2);
}

/// A session of `model` on `be` with n_ctx 1024, prompt chunks of `chunk` and
/// these tiers (null after a failed expectation).
std::unique_ptr<Session> tier_session(Model& model, Backend& be, const KvTierConfig& t,
                                      int64_t chunk = 64) {
  SessionConfig c;
  c.n_ctx = 1024;
  c.max_chunk = chunk;
  c.kv_tiers = t;
  auto s = Session::create(model, be, c);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? std::move(s).value() : nullptr;
}

}  // namespace

void check_attention_across_tiers(Backend& be, DType t, const TierMix& mix,
                                  const std::function<void(uint32_t)>& slots_per_split) {
  const int64_t n_kv = 2, hd = 64, bs = 32, d = n_kv * hd;
  const KvCacheConfig cfg{1, n_kv, hd, 512, bs, t};
  CpuBackend cpu(2);
  // 11 and 14 blocks (the last one part full): 6 on the device, the rest on
  // the host, of which RAM holds 3 under the SSD mix.
  for (const int64_t n : {int64_t{11 * 32 - 11}, int64_t{13 * 32 + 1}}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    const auto k = tier_randn(static_cast<size_t>(n * d), 11);
    const auto v = tier_randn(static_cast<size_t>(n * d), 12);
    auto kvr = KvCache::create(cfg);
    ASSERT_TRUE(kvr.ok());
    KvCache& kv = **kvr;
    KvTierConfig tiers;
    tiers.device_budget = static_cast<uint64_t>(mix.device_slots) * tier_pair_bytes(t);
    tiers.ram_budget = mix.ram_pairs * tier_pair_bytes(t);
    tiers.spill_dir = test::temp_dir("kv_device_tier");
    tiers.sink_tokens = 32;
    tiers.window_tokens = 64;
    tiers.policy = "lru";
    ASSERT_TRUE(kv.configure_tiers(tiers).ok());
    auto st = be.create_kv_storage(cfg);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(kv.attach_storage(std::move(st).value()).ok());
    kv.set_device_layers(1);
    ASSERT_TRUE(kv.move_layer(0, true).ok());
    EXPECT_EQ(kv.device_tiered(0), mix.device_slots > 0);
    feed(be, kv, k, v, n, 100);
    const KvTierStats ts = kv.tier_stats();
    if (mix.device_slots > 0) {
      EXPECT_GT(ts.ram_bytes + ts.ssd_bytes, 0u) << "nothing left the device";
      EXPECT_GT(ts.blocks_to_host, 0u);
    }
    if (mix.ram_pairs > 0) {
      EXPECT_GT(ts.ssd_bytes, 0u) << "nothing reached the SSD";
    }
    auto ref_kv = tier_host_cache(cfg, k, v, n);
    // 40: gathered (prefill); with 3 slots per split on the device (no mass: lru).
    const std::pair<int64_t, uint32_t> runs[] = {{1, 0}, {3, 0}, {40, 0}, {1, 3}, {3, 3}};
    for (const auto& [T, chunks] : runs) {
      SCOPED_TRACE("query rows " + std::to_string(T) + ", slots per split " +
                   std::to_string(chunks));
      slots_per_split(chunks);
      expect_attention(be, cpu, kv, *ref_kv, n, T, 13);
    }
    slots_per_split(0);
    // A placement moves the layer's attention to the CPU and back: its
    // blocks come off the device and go up again (the pinned ones at once).
    if (kv.device_tiered(0)) {
      ASSERT_TRUE(kv.move_layer(0, false).ok());
      EXPECT_FALSE(kv.on_device(0));
      ASSERT_TRUE(kv.move_layer(0, true).ok());
      ASSERT_TRUE(kv.device_tiered(0));
      ASSERT_TRUE(kv.rebalance().ok());
      SCOPED_TRACE("after the layer moved off the device and back");
      expect_attention(be, cpu, kv, *ref_kv, n, 1, 14);
    }
    // A second conversation in the same cache: 101 new tokens (4 blocks,
    // all on the device), over slots and host blocks that hold forgotten ones.
    kv.clear();
    const int64_t n2 = 3 * 32 + 5;
    const auto k2 = tier_randn(static_cast<size_t>(n2 * d), 15);
    const auto v2 = tier_randn(static_cast<size_t>(n2 * d), 16);
    feed(be, kv, k2, v2, n2, 60);
    auto ref2 = tier_host_cache(cfg, k2, v2, n2);
    for (const int64_t T : {int64_t{1}, int64_t{20}}) {
      SCOPED_TRACE("second conversation, query rows " + std::to_string(T));
      expect_attention(be, cpu, kv, *ref2, n2, T, 17);
    }
  }
}

std::unique_ptr<Model> tier_test_model() {
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
  // run.)
  s.weight_type = "f16";
  s.seed = 17;
  const std::string path = test::temp_dir("kv_device_tier_model") + "/m.gguf";
  EXPECT_TRUE(write_synthetic_model(s, path).ok());
  auto m = load_model(path);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<int32_t> greedy(Model& model, Backend& be, const KvTierConfig& t, int n,
                            KvTierStats* ts, std::vector<KvLayerTiers>* layers) {
  SessionConfig c;
  c.n_ctx = 1024;
  c.max_chunk = 64;
  c.kv_tiers = t;
  auto s = Session::create(model, be, c);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return {};
  std::vector<int32_t> p;
  std::mt19937 rng(5);
  for (int i = 0; i < 400; ++i)
    p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(model.hp.n_vocab)));
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

void check_greedy_identical_in_every_mix(Model& model, Backend& be) {
  KvTierStats all_dev;
  std::vector<KvLayerTiers> layers;
  const auto want = greedy(model, be, KvTierConfig{}, 40, &all_dev, &layers);
  ASSERT_EQ(want.size(), 39u);
  EXPECT_EQ(all_dev.ram_bytes, 0u);
  EXPECT_GT(all_dev.device_bytes, 0u);
  ASSERT_EQ(layers.size(), 2u);
  for (const KvLayerTiers& lt : layers) {  // 439 tokens: 14 blocks, all on the device
    EXPECT_EQ(lt.device, 14 * kTierPair);
    EXPECT_EQ(lt.ram + lt.ssd, 0u);
  }
  const std::string dir = test::temp_dir("kv_device_tier_spill");
  for (const char* policy : {"lru", "importance"}) {
    for (const TierMix& mix : kTierMixes) {
      if (mix.device_slots == 0) continue;
      SCOPED_TRACE(std::string(policy) + " " + mix.name);
      // 7 of the 14 blocks of each of the 2 layers on the device; of the 14
      // host blocks, 6 in RAM under the SSD mix (the least it takes).
      KvTierConfig t;
      t.device_budget = 2 * 7 * kTierPair;
      t.ram_budget = mix.ram_pairs > 0 ? 6 * kTierPair : 0;
      t.spill_dir = dir;
      t.policy = policy;
      t.sink_tokens = 32;
      t.window_tokens = 64;
      KvTierStats ts;
      EXPECT_EQ(greedy(model, be, t, 40, &ts, &layers), want);
      // Per layer: at most its 7 slots on the device, the rest on the host.
      ASSERT_EQ(layers.size(), 2u);
      uint64_t dev = 0;
      for (const KvLayerTiers& lt : layers) {
        EXPECT_GT(lt.device, 0u);
        EXPECT_LE(lt.device, 7 * kTierPair);
        EXPECT_GT(lt.ram + lt.ssd, 0u);
        if (mix.ram_pairs == 0) {
          EXPECT_EQ(lt.ssd, 0u);
        }
        dev += lt.device;
      }
      EXPECT_LE(dev, ts.device_used_bytes);
      EXPECT_GT(ts.device_bytes, 0u);
      EXPECT_LE(ts.device_bytes, 2 * 7 * kTierPair);
      EXPECT_GT(ts.blocks_to_host, 0u);
      EXPECT_GT(ts.ram_bytes + ts.ssd_bytes, 0u);
      if (mix.ram_pairs > 0) {
        EXPECT_GT(ts.blocks_spilled, 0u);
        EXPECT_GT(ts.ssd_bytes, 0u);
        EXPECT_LE(ts.ram_bytes, 6 * kTierPair);
      } else {
        EXPECT_EQ(ts.ssd_bytes, 0u);
      }
      EXPECT_EQ(ts.blocks_lost, 0u);
    }
  }
  be.release_weights();
}

void check_second_conversation(Model& model, Backend& be) {
  auto two_turns = [&](const KvTierConfig& t) {
    auto s = tier_session(model, be, t);
    if (!s) return std::vector<int32_t>{};
    GenerateParams gp;
    gp.sampling.temperature = 0;
    gp.max_tokens = 20;
    gp.stop_at_eog = false;
    std::vector<int32_t> out;
    for (const uint32_t seed : {7u, 8u}) {
      std::vector<int32_t> p;
      std::mt19937 rng(seed);
      for (int i = 0; i < (seed == 7u ? 420 : 150); ++i)
        p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(model.hp.n_vocab)));
      auto r = s->generate(p, gp, nullptr);
      EXPECT_TRUE(r.ok()) << r.message();
      out.insert(out.end(), s->tokens().begin() + static_cast<ptrdiff_t>(p.size()),
                 s->tokens().end());
    }
    return out;
  };
  const auto want = two_turns(KvTierConfig{});
  ASSERT_EQ(want.size(), 38u);
  KvTierConfig t;
  t.device_budget = 2 * 7 * kTierPair;
  t.policy = "importance";
  t.sink_tokens = 32;
  t.window_tokens = 64;
  EXPECT_EQ(two_turns(t), want);
  be.release_weights();
}

namespace {

/// Rows [0, n) of a layer's K then V, [kv_head][n][row] each, as the device
/// holds them (a tiered layer's blocks from their slots; a host block: 0xEE).
std::vector<uint8_t> device_rows(const KvCache& kv, int64_t layer, int64_t n) {
  const KvCacheConfig& c = kv.config();
  const uint64_t rb = c.dtype == DType::kF16 ? static_cast<uint64_t>(c.head_dim) * 2
                                             : static_cast<uint64_t>(c.head_dim / 32) * 34;
  const auto H = static_cast<uint64_t>(c.n_kv_heads), N = static_cast<uint64_t>(n);
  std::vector<uint8_t> k(H * N * rb, 0xEE), v(k.size(), 0xEE);
  if (!kv.device_tiered(layer)) {
    EXPECT_TRUE(kv.storage()->export_layer(layer, n, k.data(), v.data()).ok());
  } else {
    const int64_t bs = c.block_size;
    std::vector<uint8_t> tk(H * static_cast<uint64_t>(bs) * rb), tv(tk.size());
    for (int64_t b = 0; b * bs < n; ++b) {
      const int64_t row = kv.device_row(layer, b * bs);
      if (row < 0) continue;
      EXPECT_TRUE(kv.storage()->export_rows(layer, row, bs, tk.data(), tv.data()).ok());
      const uint64_t m = static_cast<uint64_t>(std::min(bs, n - b * bs));
      for (uint64_t h = 0; h < H; ++h) {
        const uint64_t dst = (h * N + static_cast<uint64_t>(b * bs)) * rb;
        std::memcpy(k.data() + dst, tk.data() + h * static_cast<uint64_t>(bs) * rb, m * rb);
        std::memcpy(v.data() + dst, tv.data() + h * static_cast<uint64_t>(bs) * rb, m * rb);
      }
    }
  }
  k.insert(k.end(), v.begin(), v.end());
  return k;
}

}  // namespace

// Which blocks' device rows [0, n) differ between two caches (per layer; the
// first differing position of each), and `b`'s slots' first positions.
void print_kv_diff(const KvCache& a_kv, const KvCache& b_kv, int64_t n, const char* name,
                   const char* when) {
  const int64_t bs = a_kv.config().block_size;
  for (int64_t l = 0; l < a_kv.config().n_layer; ++l) {
    const auto a = device_rows(a_kv, l, n), b = device_rows(b_kv, l, n);
    const uint64_t half = a.size() / 2;
    const uint64_t per_head = half / static_cast<uint64_t>(a_kv.config().n_kv_heads);
    const uint64_t rb = per_head / static_cast<uint64_t>(n);
    std::vector<std::pair<uint64_t, uint64_t>> blocks;  // block, first differing position
    for (uint64_t i = 0; i < a.size(); i += rb) {
      if (std::memcmp(a.data() + i, b.data() + i, rb) == 0) continue;
      const uint64_t p = (i % half) % per_head / rb, blk = p / static_cast<uint64_t>(bs);
      auto it = std::find_if(blocks.begin(), blocks.end(), [&](auto& x) { return x.first == blk; });
      if (it == blocks.end())
        blocks.emplace_back(blk, p);
      else
        it->second = std::min(it->second, p);
    }
    std::string bad, slots;
    for (auto [blk, p] : blocks)
      bad.append(" ").append(std::to_string(blk)).append("@").append(std::to_string(p));
    if (b_kv.device_tiered(l))
      for (int32_t p : b_kv.slot_positions(l)) slots.append(" ").append(std::to_string(p));
    std::printf("[%s] %s, %" PRId64 " tokens, layer %" PRId64
                ": device rows differing in blocks {%s }; slots' first positions:%s\n",
                name, when, n, l, bad.c_str(), slots.c_str());
  }
}

void diagnose_second_conversation(Model& model, Backend& be) {
  struct Variant {
    const char* name;
    const char* policy;
    bool generate_first;  // conv 1 generates 19 tokens after its prompt
    bool tokenwise;       // conv 2's prompt one token a step (no prompt attention)
    int64_t chunk;
  };
  const Variant variants[] = {{"importance", "importance", true, false, 64},
                              {"lru", "lru", true, false, 64},
                              {"lru_tokenwise", "lru", true, true, 64},
                              {"lru_no_generation", "lru", false, false, 64},
                              {"lru_chunk16", "lru", true, false, 16}};
  const int64_t V = model.hp.n_vocab;
  for (const Variant& var : variants) {
    auto make = [&](const KvTierConfig& t) { return tier_session(model, be, t, var.chunk); };
    KvTierConfig t;
    t.device_budget = 2 * 7 * kTierPair;
    t.policy = var.policy;
    t.sink_tokens = 32;
    t.window_tokens = 64;
    auto ref = make(KvTierConfig{});
    auto tie = make(t);
    if (!ref || !tie) return;
    std::vector<float> lr(static_cast<size_t>(V)), lt(lr.size());
    auto argmax = [](const std::vector<float>& x) {
      return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
    };
    int shown = 0, steps = 0, flips = 0;
    double worst = 0, worst_flip_gap = 0;
    auto step = [&](std::span<const int32_t> toks, const char* what, int64_t i) {
      Status a = ref->append(toks, lr.data()), b = tie->append(toks, lt.data());
      EXPECT_TRUE(a.ok() && b.ok()) << a.message() << " / " << b.message();
      double d = 0;
      for (size_t j = 0; j < lr.size(); ++j) d = std::max(d, double{std::fabs(lr[j] - lt[j])});
      ++steps;
      worst = std::max(worst, d);
      if (d > 1e-3 && shown++ < 12)
        std::printf("[%s] %s %" PRId64 " (pos %" PRId64 "): max|dlogit| %.4f argmax %d vs %d\n",
                    var.name, what, i, ref->kv().n_tokens() - 1, d, argmax(lr), argmax(lt));
      EXPECT_LE(d, 1e-3) << var.name << " " << what << " " << i;
      if (argmax(lr) != argmax(lt)) {
        // A different greedy token is rounding only where the reference's top two
        // logits are closer than the logits' difference.
        std::vector<float> top = lr;
        std::nth_element(top.begin(), top.begin() + 1, top.end(), std::greater<>());
        const double gap = double{top[0]} - double{top[1]};
        ++flips;
        worst_flip_gap = std::max(worst_flip_gap, gap);
        EXPECT_LE(gap, 2 * d + 1e-6) << var.name << " " << what << " " << i << ": argmax "
                                     << argmax(lr) << " vs " << argmax(lt);
      }
    };
    auto compare_kv = [&](const char* when) {
      print_kv_diff(ref->kv(), tie->kv(), ref->kv().n_tokens(), var.name, when);
    };
    std::mt19937 rng1(7), rng2(8);
    std::vector<int32_t> p1, p2;
    for (int i = 0; i < 420; ++i) p1.push_back(static_cast<int32_t>(rng1() % V));
    for (int i = 0; i < 150; ++i) p2.push_back(static_cast<int32_t>(rng2() % V));
    step(p1, "conv 1 prompt", 0);
    for (int i = 0; var.generate_first && i < 19; ++i) {
      const int32_t tok = argmax(lr);
      step(std::span<const int32_t>(&tok, 1), "conv 1 token", i);
    }
    compare_kv("end of conv 1");
    const int64_t k1 = ref->keep_prefix(p2), k2 = tie->keep_prefix(p2);
    std::printf("[%s] conv 2 keeps %" PRId64 " / %" PRId64 " tokens\n", var.name, k1, k2);
    if (var.tokenwise) {
      for (size_t i = 0; i < p2.size(); ++i)
        step(std::span<const int32_t>(p2).subspan(i, 1), "conv 2 prompt token",
             static_cast<int64_t>(i));
    } else {
      step(p2, "conv 2 prompt", 0);
    }
    compare_kv("conv 2 prompt");
    for (int i = 0; i < 20; ++i) {
      const int32_t tok = argmax(lr);
      step(std::span<const int32_t>(&tok, 1), "conv 2 token", i);
    }
    compare_kv("conv 2 end");
    std::printf(
        "[%s] done: %d steps, %d off by > 1e-3, max|dlogit| %.2e; argmax differs at %d "
        "(widest top-two gap there %.2e)\n",
        var.name, steps, shown, worst, flips, worst_flip_gap);
    std::fflush(stdout);
  }
  be.release_weights();
}

void diagnose_second_conversation_in_turn(Model& model, Backend& be) {
  const int64_t V = model.hp.n_vocab;
  auto make = [&](const KvTierConfig& t) { return tier_session(model, be, t); };
  KvTierConfig t;
  t.device_budget = 2 * 7 * kTierPair;
  t.policy = "importance";
  t.sink_tokens = 32;
  t.window_tokens = 64;
  std::mt19937 rng1(7), rng2(8);
  std::vector<int32_t> p1, p2;
  for (int i = 0; i < 420; ++i) p1.push_back(static_cast<int32_t>(rng1() % V));
  for (int i = 0; i < 150; ++i) p2.push_back(static_cast<int32_t>(rng2() % V));
  // The two conversations on one session; decode tokens from `toks` where it
  // has them, else the session's own greedy choice (appended to `toks`).
  const Session* reference = nullptr;  // when kept: KV rows compared after steps 20 to 23
  auto flow = [&](Session& s, std::vector<int32_t>* toks, std::vector<std::vector<float>>* out) {
    std::vector<float> l(static_cast<size_t>(V));
    size_t k = 0;
    auto step = [&](std::span<const int32_t> x) {
      Status st = s.append(x, l.data());
      EXPECT_TRUE(st.ok()) << st.message();
      out->push_back(l);
      if (reference && &s != reference && out->size() >= 21 && out->size() <= 24) {
        const std::string when = "in turn, after step " + std::to_string(out->size() - 1);
        print_kv_diff(reference->kv(), s.kv(), s.kv().n_tokens(), "in turn", when.c_str());
      }
    };
    auto decode = [&](int n) {
      for (int i = 0; i < n; ++i, ++k) {
        if (k == toks->size())
          toks->push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
        step(std::span<const int32_t>(&(*toks)[k], 1));
      }
    };
    step(p1);
    decode(19);
    s.keep_prefix(p2);
    step(p2);
    decode(20);
  };
  // Modes: the reference first and kept, first and destroyed, or the tiered
  // session first (fed the tokens the first mode's reference chose), with the
  // importance policy and with lru.
  const char* const modes[] = {"reference kept", "reference destroyed", "tiered first",
                               "tiered first, lru"};
  std::vector<int32_t> toks;
  for (int mode = 0; mode < 4; ++mode) {
    reference = nullptr;
    std::vector<std::vector<float>> lr, lt;
    KvTierConfig tm = t;
    if (mode == 3) tm.policy = "lru";
    std::unique_ptr<Session> ref, tie;
    if (mode < 2) {
      ref = make(KvTierConfig{});
      if (!ref) return;
      flow(*ref, &toks, &lr);
      reference = mode == 0 ? ref.get() : nullptr;
      if (mode == 1) ref.reset();
      tie = make(tm);
      if (!tie) return;
      flow(*tie, &toks, &lt);
    } else {
      tie = make(tm);
      if (!tie) return;
      flow(*tie, &toks, &lt);
      ref = make(KvTierConfig{});
      if (!ref) return;
      flow(*ref, &toks, &lr);
    }
    int off = 0;
    double worst = 0;
    for (size_t i = 0; i < lr.size() && i < lt.size(); ++i) {
      double d = 0;
      for (size_t j = 0; j < lr[i].size(); ++j)
        d = std::max(d, double{std::fabs(lr[i][j] - lt[i][j])});
      worst = std::max(worst, d);
      if (d > 1e-3 && off++ < 8) {
        const auto am = [](const std::vector<float>& x) {
          return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
        };
        std::printf("[in turn, %s] step %zu: max|dlogit| %.4f argmax %d vs %d\n", modes[mode], i, d,
                    am(lr[i]), am(lt[i]));
      }
    }
    std::printf("[in turn, %s] done: %zu steps, %d off by > 1e-3, max|dlogit| %.2e\n", modes[mode],
                lr.size(), off, worst);
    std::fflush(stdout);
    EXPECT_EQ(lr.size(), lt.size()) << modes[mode];
    EXPECT_LE(worst, 1e-3) << modes[mode] << ": " << off << " steps off";
  }
  be.release_weights();
}

void check_lost_blocks_recomputed(Model& model, Backend& be) {
  const auto want = greedy(model, be, KvTierConfig{}, 30, nullptr);
  ASSERT_EQ(want.size(), 29u);
  for (const storage::SpillFaults f :
       {storage::SpillFaults{.fail_read = 3}, storage::SpillFaults{.short_read = 5}}) {
    SCOPED_TRACE(f.fail_read ? "io_error" : "short_read");
    KvTierConfig t;
    t.device_budget = 2 * 7 * kTierPair;
    t.ram_budget = 6 * kTierPair;
    t.spill_dir = test::temp_dir("kv_device_tier_faults");
    t.policy = "importance";
    t.sink_tokens = 32;
    t.window_tokens = 64;
    t.faults = f;
    KvTierStats ts;
    EXPECT_EQ(greedy(model, be, t, 30, &ts), want);
    EXPECT_GT(ts.blocks_lost, 0u) << "no fault reached a read";
  }
  be.release_weights();
}

void check_too_small_device_budget(Model& model, Backend& be) {
  SessionConfig c;
  c.n_ctx = 1024;
  c.kv_tiers.device_budget = 2 * 2 * kTierPair;
  c.kv_tiers.window_tokens = 64;
  auto s = Session::create(model, be, c);
  std::vector<float> logits(static_cast<size_t>(model.hp.n_vocab));
  const std::vector<int32_t> toks = {1, 2, 3};
  Status st = s.ok() ? (*s)->append(toks, logits.data()) : s.status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--kv-gpu"), std::string::npos) << st.message();
  be.release_weights();
}

}  // namespace loom::test
