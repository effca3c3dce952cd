// The KV cache's RAM and SSD tiers: greedy output is identical with and
// without spilling, under both policies, and when the spill file fails in
// every way storage/ can fail (lost blocks are recomputed from their tokens);
// a full disk ends the context with a reason instead of an error. Also the
// attention mass per block that the importance policy ranks by.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cpu/ref/fp16.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// 2 layers, 2 KV heads of 64: one (layer, block) pair of F16 K+V is 16 KiB.
constexpr uint64_t kPairBytes = 2ull * 32 * 2 * 64 * 2;

class KvTiersTest : public ::testing::Test {
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
    s.weight_type = "q8_0";
    s.seed = 11;
    model_dir_ = new std::string(test::temp_dir("kv_tiers_model"));
    const std::string path = *model_dir_ + "/m.gguf";
    ASSERT_TRUE(write_synthetic_model(s, path).ok());
    auto m = load_model(path);
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    if (model_dir_) {
      std::error_code ec;
      fs::remove_all(fs::path(*model_dir_).parent_path(), ec);  // the per-process folder
      delete model_dir_;
      model_dir_ = nullptr;
    }
  }
  void SetUp() override {
    be_ = std::make_unique<CpuBackend>(2);
    dir_ = test::temp_dir("kv_tiers_spill");
  }

  KvTierConfig tiers(uint64_t budget_pairs, const char* policy = "importance") const {
    KvTierConfig t;
    t.ram_budget = budget_pairs * kPairBytes;
    t.spill_dir = dir_;
    t.policy = policy;
    t.sink_tokens = 32;
    t.window_tokens = 64;
    return t;
  }

  std::unique_ptr<Session> session(const KvTierConfig& t, int64_t max_chunk = 64) {
    SessionConfig c;
    c.n_ctx = 1024;
    c.max_chunk = max_chunk;
    c.kv_tiers = t;
    auto s = Session::create(*model_, *be_, c);
    EXPECT_TRUE(s.ok()) << s.message();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  static std::vector<int32_t> prompt(size_t n) {
    std::vector<int32_t> p;
    std::mt19937 rng(5);
    for (size_t i = 0; i < n; ++i)
      p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(model_->hp.n_vocab)));
    return p;
  }

  // Greedy tokens after the prompt; `on_piece` is called after every piece.
  static std::vector<int32_t> greedy(Session& s, const std::vector<int32_t>& p, int n,
                                     GenerateStats* stats = nullptr,
                                     const std::function<void(int)>& each = {}) {
    GenerateParams gp;
    gp.sampling.temperature = 0;
    gp.max_tokens = n;
    gp.stop_at_eog = false;
    int i = 0;
    auto r = s.generate(p, gp, [&](std::string_view) {
      if (each) each(i++);
      return true;
    });
    EXPECT_TRUE(r.ok()) << r.message();
    if (r.ok() && stats) *stats = *r;
    return std::vector<int32_t>(s.tokens().begin() + static_cast<ptrdiff_t>(p.size()),
                                s.tokens().end());
  }

  // Every record of the spill file in `dir_`: calls f(path, record_bytes, n_records).
  void for_spill_file(const std::function<void(const std::string&, size_t, size_t)>& f) {
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().extension() != ".spill") continue;
      const size_t rec = (kPairBytes + 64 + 4095) / 4096 * 4096;
      f(e.path().string(), rec, static_cast<size_t>(fs::file_size(e.path()) / rec));
    }
  }

  // The cache alone (2 layers, 2 KV heads of 64, F16), with random K/V rows
  // ([layer][token][kv_head*64], V = K) for n tokens, its blocks spilled
  // beyond a budget of 8 pairs as `spill_type`. Null on a failure (reported).
  std::unique_ptr<KvCache> spilled_cache(const char* spill_type, uint32_t seed, int64_t n,
                                         std::vector<float>* rows) const {
    auto kv = KvCache::create(KvCacheConfig{2, 2, 64, 1024, 32, DType::kF16});
    EXPECT_TRUE(kv.ok());
    if (!kv.ok()) return nullptr;
    KvTierConfig t = tiers(8);
    t.spill_type = spill_type;
    Status st = (*kv)->configure_tiers(t);
    if (st.ok()) st = (*kv)->reserve(n);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) return nullptr;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    rows->resize(static_cast<size_t>(2 * n * 2 * 64));
    for (auto& x : *rows) x = nd(rng);
    for (int64_t l = 0; l < 2; ++l) {
      for (int64_t p = 0; p < n; ++p) {
        const float* r = rows->data() + (l * n + p) * 128;
        (*kv)->store(l, p, r, r);
      }
    }
    (*kv)->set_n_tokens(n);
    st = (*kv)->rebalance();
    EXPECT_TRUE(st.ok()) << st.message();
    return st.ok() ? std::move(kv).value() : nullptr;
  }

  static Model* model_;
  static std::string* model_dir_;
  std::unique_ptr<CpuBackend> be_;
  std::string dir_;
};
Model* KvTiersTest::model_ = nullptr;
std::string* KvTiersTest::model_dir_ = nullptr;

TEST_F(KvTiersTest, SpillingKeepsGreedyOutputIdenticalUnderBothPolicies) {
  const auto p = prompt(200);
  auto base = session(KvTierConfig{});
  const auto want = greedy(*base, p, 60);
  ASSERT_EQ(want.size(), 59u);  // the last sampled token is not evaluated yet
  EXPECT_EQ(base->kv().tier_stats().ssd_bytes, 0u);

  for (const bool behind : {false, true}) {
    for (const char* policy : {"lru", "importance"}) {
      SCOPED_TRACE(std::string(policy) + (behind ? ", write-behind" : ""));
      KvTierConfig t = tiers(8, policy);  // 8 of the 18 (layer, block) pairs fit in RAM
      t.write_behind = behind;
      auto s = session(t);
      ASSERT_TRUE(s);
      GenerateStats st;
      EXPECT_EQ(greedy(*s, p, 60, &st), want);
      const KvTierStats ts = s->kv().tier_stats();
      EXPECT_GT(ts.blocks_spilled, 0u);
      EXPECT_GT(ts.ssd_bytes, 0u);
      // Write-behind: the last step's batch (a block of each of the 2 layers)
      // may still be in RAM, on its way.
      EXPECT_LE(ts.ram_bytes, (behind ? 10 : 8) * kPairBytes);
      EXPECT_GT(ts.ssd_read_bytes, 0u);
      EXPECT_EQ(ts.blocks_lost, 0u);
      EXPECT_EQ(st.n_kv_recomputed, 0);
      EXPECT_GT(ts.blocks_read_ahead, 0u);
      // The per-layer view adds up to the totals: every layer has blocks in RAM and on the SSD.
      uint64_t ram = 0, ssd = 0;
      for (const KvLayerTiers& lt : s->kv().layer_tiers()) {
        EXPECT_EQ(lt.device, 0u);
        EXPECT_GT(lt.ram + lt.ssd, 0u);
        ram += lt.ram;
        ssd += lt.ssd;
      }
      EXPECT_LE(ram, ts.ram_bytes);
      EXPECT_GT(ram, 0u);
      EXPECT_EQ(ssd, ts.ssd_bytes);
      // A second turn reuses the cached prefix, spilled blocks and all.
      auto p2 = p;
      p2.insert(p2.end(), want.begin(), want.begin() + 30);
      auto s_base = session(KvTierConfig{});
      greedy(*s_base, p, 60);
      EXPECT_EQ(greedy(*s, p2, 20), greedy(*s_base, p2, 20));
    }
  }
}

TEST_F(KvTiersTest, Q8SpillHalvesTheBytesAndStaysWithinQ8Error) {
  // The cache alone: random K/V rows, most blocks spilled as Q8_0, read back.
  const int64_t n = 300;
  std::vector<float> rows;
  auto kv = spilled_cache("q8_0", 9, n, &rows);
  ASSERT_TRUE(kv);
  const KvTierStats ts = kv->tier_stats();
  ASSERT_GT(ts.ssd_bytes, 0u);
  const uint64_t q8_pair = 2ull * 32 * 2 * (64 / 32 * 34);
  EXPECT_EQ(ts.ssd_bytes % q8_pair, 0u);
  EXPECT_EQ(ts.ssd_bytes / q8_pair, ts.blocks_spilled);
  for (int64_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(kv->fetch_layer(l).ok());
    const cpu::KvView v = kv->view(l);
    double worst = 0;
    for (int64_t p = 0; p < n; ++p) {
      const float* want = rows.data() + (l * n + p) * 128;
      for (int64_t h = 0; h < 2; ++h) {
        const auto* k =
            reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(v.k_blocks[p / 32]) +
                                              h * v.head_stride_bytes + (p % 32) * 64 * 2);
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(want[h * 64 + i]));
        for (int i = 0; i < 32; ++i) {
          const double err = std::fabs(ref::fp16_to_fp32(k[i]) - want[h * 64 + i]);
          worst = std::max(worst, err / amax);
        }
      }
    }
    // Q8_0: half a step of amax/127, plus F16 rounding on both sides.
    EXPECT_LT(worst, 0.5 / 127 + 2e-3) << "layer " << l;
    EXPECT_GT(worst, 0.0) << "nothing went through Q8_0";
  }

  // A session with the Q8 spill generates as it should.
  KvTierConfig t = tiers(8);
  t.spill_type = "q8_0";
  auto s = session(t);
  ASSERT_TRUE(s);
  GenerateStats st;
  const auto got = greedy(*s, prompt(200), 30, &st);
  EXPECT_EQ(got.size(), 29u);
  EXPECT_GT(s->kv().tier_stats().blocks_spilled, 0u);
  EXPECT_EQ(s->kv().tier_stats().blocks_lost, 0u);

  t.spill_type = "q4_0";
  auto bad = KvCache::create(KvCacheConfig{2, 2, 64, 1024, 32, DType::kF16});
  Status e = (*bad)->configure_tiers(t);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("spill precision 'q4_0' is not available"), std::string::npos)
      << e.message();
}

// FP8 (E4M3, a scale per head and block) on the SSD: about half the bytes of
// F16, read back within E4M3's error (3 mantissa bits).
TEST_F(KvTiersTest, Fp8SpillHalvesTheBytesAndStaysWithinE4M3Error) {
  const int64_t n = 300;
  std::vector<float> rows;
  auto kv = spilled_cache("fp8", 21, n, &rows);
  ASSERT_TRUE(kv);
  const KvTierStats ts = kv->tier_stats();
  ASSERT_GT(ts.ssd_bytes, 0u);
  const uint64_t fp8_pair = 2ull * 2 * (4 + 32 * 64);
  EXPECT_EQ(ts.ssd_bytes, ts.blocks_spilled * fp8_pair);
  EXPECT_LT(fp8_pair * 2, kPairBytes + 64);  // about half of F16's
  for (int64_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(kv->fetch_layer(l).ok());
    const cpu::KvView v = kv->view(l);
    double worst = 0;
    for (int64_t p = 0; p < n; ++p) {
      const float* want = rows.data() + (l * n + p) * 128;
      for (int64_t h = 0; h < 2; ++h) {
        const auto* k =
            reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(v.k_blocks[p / 32]) +
                                              h * v.head_stride_bytes + (p % 32) * 64 * 2);
        for (int i = 0; i < 64; ++i) {
          const double w = want[h * 64 + i];
          const double err = std::fabs(ref::fp16_to_fp32(k[i]) - w);
          // Relative 2^-4 for normal E4M3 values, plus the subnormal step of
          // the block's scale (amax <= ~5 for these rows: 5/448 * 2^-9).
          worst = std::max(worst, err / (std::fabs(w) * 0.0625 + 5.0 / 448.0 / 512.0 + 1e-3));
        }
      }
    }
    EXPECT_LE(worst, 1.0) << "layer " << l;
  }
  // Bad names are still errors that list what is available.
  KvTierConfig bad = tiers(8);
  bad.spill_type = "fp4";
  auto kv2 = KvCache::create(KvCacheConfig{2, 2, 64, 1024, 32, DType::kF16});
  ASSERT_TRUE(kv2.ok());
  const Status st = (*kv2)->configure_tiers(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("fp8"), std::string::npos) << st.message();
}

TEST_F(KvTiersTest, TheSpillFileIsDeletedWithItsSession) {
  {
    auto s = session(tiers(8));
    greedy(*s, prompt(200), 8);
    size_t n = 0;
    for_spill_file([&](const std::string&, size_t, size_t) { ++n; });
    EXPECT_EQ(n, 1u);
  }
  size_t n = 0;
  for_spill_file([&](const std::string&, size_t, size_t) { ++n; });
  EXPECT_EQ(n, 0u);
}

struct FaultCase {
  const char* name;
  storage::SpillFaults faults;
  bool flip_on_disk, truncate_on_disk;
  bool write_behind = false;
};

class KvTierFaults : public KvTiersTest, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(KvTierFaults, LostBlocksAreRecomputedAndOutputStaysIdentical) {
  const FaultCase c = GetParam();
  const auto p = prompt(200);
  auto base = session(KvTierConfig{});
  const auto want = greedy(*base, p, 40);

  KvTierConfig t = tiers(8);
  t.faults = c.faults;
  t.write_behind = c.write_behind;
  auto s = session(t);
  GenerateStats st;
  const auto got = greedy(*s, p, 40, &st, [&](int i) {
    if (i != 10) return;
    // Real bytes of the file change under the running session.
    for_spill_file([&](const std::string& path, size_t rec, size_t n) {
      if (c.truncate_on_disk) fs::resize_file(path, rec / 2);
      if (!c.flip_on_disk) return;
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      for (size_t r = 0; r < n; ++r) {
        f.seekg(static_cast<std::streamoff>(r * rec + 64 + 5));
        char b = 0;
        f.read(&b, 1);
        b = static_cast<char>(b ^ 0x40);
        f.seekp(static_cast<std::streamoff>(r * rec + 64 + 5));
        f.write(&b, 1);
      }
    });
  });
  EXPECT_EQ(got, want);
  const KvTierStats ts = s->kv().tier_stats();
  EXPECT_GT(ts.blocks_lost, 0u) << "no fault reached a read";
  EXPECT_GT(st.n_kv_recomputed, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Storage, KvTierFaults,
    ::testing::Values(FaultCase{"io_error", {.fail_read = 7}, false, false},
                      FaultCase{"short_read", {.short_read = 12}, false, false},
                      FaultCase{"flipped_bytes", {}, true, false},
                      FaultCase{"truncated_file", {}, false, true},
                      FaultCase{"io_error_write_behind", {.fail_read = 7}, false, false, true},
                      FaultCase{"flipped_bytes_write_behind", {}, true, false, true}),
    [](const ::testing::TestParamInfo<FaultCase>& p) { return std::string(p.param.name); });

class KvTierDiskFull : public KvTiersTest, public ::testing::WithParamInterface<bool> {};

// Under write-behind the failure shows a token later, when the batch is
// finished; the blocks stayed in RAM, so the context ends at the same token.
TEST_P(KvTierDiskFull, AFullDiskEndsTheContextWithAReason) {
  KvTierConfig t = tiers(8);
  t.faults.no_space_write = 1;  // the first spill finds the disk full
  t.write_behind = GetParam();
  auto s = session(t);
  GenerateStats st;
  greedy(*s, prompt(40), 300, &st);
  EXPECT_EQ(st.reason, StopReason::kContextFull);
  EXPECT_NE(st.note.find("disk is full"), std::string::npos) << st.note;
  EXPECT_TRUE(s->kv().tier_stats().spill_full);
  // The first spill is tried when block 4 of each layer (tokens 128..159) has
  // taken RAM past the budget of 4 blocks; it fails, block 4 stays, and the
  // context ends when block 5 would be needed.
  EXPECT_EQ(s->kv().n_tokens(), 160);
  EXPECT_EQ(s->kv().tier_stats().ram_bytes, 10 * kPairBytes);
  EXPECT_EQ(s->kv().tier_stats().ssd_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Storage, KvTierDiskFull, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return std::string(p.param ? "write_behind" : "waiting");
                         });

TEST_F(KvTiersTest, BadTierSettingsAreClearErrors) {
  SessionConfig c;
  c.n_ctx = 1024;
  c.kv_tiers = tiers(1);  // cannot hold the newest window of both layers
  auto s = Session::create(*model_, *be_, c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("raise --kv-ram"), std::string::npos) << s.message();
  c.kv_tiers = tiers(8, "fifo");
  s = Session::create(*model_, *be_, c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown KV tier policy 'fifo'"), std::string::npos);
  c.kv_tiers = tiers(8);
  c.kv_tiers.spill_dir.clear();
  s = Session::create(*model_, *be_, c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--kv-dir"), std::string::npos);
}

// cpu::attention's block mass against probabilities computed in double.
TEST(AttentionMass, MatchesTheSoftmaxProbabilitiesPerBlock) {
  const int64_t n_kv = 2, hd = 64, n_heads = 4, bs = 32, n_tok = 150, T = 3;
  const int64_t n_blocks = (n_tok + bs - 1) / bs;
  const size_t head_bytes = cpu::kv_head_bytes(DType::kF16, bs, hd);
  std::vector<std::vector<uint8_t>> kb(static_cast<size_t>(n_blocks)),
      vb(static_cast<size_t>(n_blocks));
  std::vector<const void*> kp, vp;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(n_tok * n_kv * hd));
  for (auto& x : keys) x = nd(rng);
  for (int64_t b = 0; b < n_blocks; ++b) {
    kb[static_cast<size_t>(b)].assign(head_bytes * n_kv, 0);
    vb[static_cast<size_t>(b)].assign(head_bytes * n_kv, 0);
    for (int64_t r = 0; r < bs && b * bs + r < n_tok; ++r) {
      const float* k = keys.data() + (b * bs + r) * n_kv * hd;
      cpu::kv_store(DType::kF16, kb[static_cast<size_t>(b)].data(), head_bytes, n_kv, hd, r, k);
      cpu::kv_store(DType::kF16, vb[static_cast<size_t>(b)].data(), head_bytes, n_kv, hd, r, k);
    }
    kp.push_back(kb[static_cast<size_t>(b)].data());
    vp.push_back(vb[static_cast<size_t>(b)].data());
  }
  cpu::KvView view;
  view.k_blocks = kp.data();
  view.v_blocks = vp.data();
  view.block_size = bs;
  view.n_kv_heads = n_kv;
  view.head_dim = hd;
  view.head_stride_bytes = head_bytes;
  view.dtype = DType::kF16;
  std::vector<float> q(static_cast<size_t>(T * n_heads * hd));
  for (auto& x : q) x = nd(rng);
  const int32_t pos[T] = {n_tok - 3, n_tok - 2, n_tok - 1};
  std::vector<float> out(q.size()), scratch(cpu::attention_scratch_floats(view));
  std::vector<float> mass(static_cast<size_t>(n_blocks), 0.0f);
  const float scale = 0.125f;
  cpu::attention(q.data(), T, pos, n_heads, view, scale, out.data(), 0, n_heads, scratch.data(),
                 mass.data());

  std::vector<double> want(static_cast<size_t>(n_blocks), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / (n_heads / n_kv);
      std::vector<double> s(static_cast<size_t>(pos[t] + 1));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= pos[t]; ++j) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) {
          const float k = ref::fp16_to_fp32(
              ref::fp32_to_fp16(keys[static_cast<size_t>((j * n_kv + g) * hd + i)]));
          d += static_cast<double>(q[static_cast<size_t>((t * n_heads + h) * hd + i)]) * k;
        }
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, d * scale);
      }
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j <= pos[t]; ++j)
        want[static_cast<size_t>(j / bs)] += s[static_cast<size_t>(j)] / sum;
    }
  }
  double total = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    EXPECT_NEAR(mass[static_cast<size_t>(b)], want[static_cast<size_t>(b)], 1e-3) << "block " << b;
    total += mass[static_cast<size_t>(b)];
  }
  EXPECT_NEAR(total, static_cast<double>(T * n_heads), 1e-3);
}

}  // namespace
}  // namespace loom
