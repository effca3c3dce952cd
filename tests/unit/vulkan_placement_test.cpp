// Mixed CPU + GPU placements on a real Vulkan driver (lavapipe in CI): every
// strategy gives the CPU-only greedy tokens, on a synthetic model and on
// stories260K; switching placement between two tokens keeps them; the
// profiler sees every layer and op group. Skips without a Vulkan device.
#include <gtest/gtest.h>

#include <functional>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/vulkan/vulkan_backend.h"
#include "engine/model/synth.h"
#include "engine/placement/adaptive.h"
#include "engine/placement/strategy.h"
#include "engine/profile/profiler.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"
#include "tests/unit/vulkan_test_util.h"

namespace loom {
namespace {

#ifdef LOOM_HAVE_VULKAN

// F32 weights: the CPU and the GPU then differ only by float rounding (with
// Q8_0 the CPU quantizes activations and the GPU does not, ~1e-3 apart, and a
// random model has near-ties that such a difference flips).
std::unique_ptr<Model> synth_f32(int64_t n_layer) {
  SynthSpec s;
  s.n_layer = n_layer;
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ctx = 128;
  s.weight_type = "f32";
  s.seed = 7;
  return test::synth_model(s, "vk_place");
}

struct GenRun {
  std::vector<int32_t> tokens;
  std::vector<std::string> notes;
};

// Greedy tokens under placement `p` (session on the GPU, CPU as the other unit);
// `at_token(s, i)` runs after the i-th generated piece.
GenRun greedy(const Model& m, VulkanBackend& gpu, CpuBackend& cpu, const Placement& p,
              const std::vector<int32_t>& prompt, int64_t n,
              const std::function<void(Session&, int64_t)>& at_token = {},
              Profiler* prof = nullptr) {
  SessionConfig sc;
  sc.n_ctx = 128;
  auto s = Session::create(m, gpu, sc);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return {};
  (*s)->forward().set_fallback(&cpu);
  EXPECT_TRUE((*s)->forward().set_placement(p).ok());
  const Status prep = (*s)->forward().prepare();
  EXPECT_TRUE(prep.ok()) << prep.message();
  if (prof) (*s)->set_profiler(prof);
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = n;
  gp.stop_at_eog = false;
  int64_t i = 0;
  auto r = (*s)->generate(prompt, gp, [&](std::string_view) {
    if (at_token) at_token(**s, i);
    ++i;
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.message();
  GenRun out{(*s)->tokens(), (*s)->forward().notes()};
  (*s)->set_profiler(nullptr);
  return out;
}

std::vector<Placement> strategies(const Model& m) {
  std::vector<Placement> ps;
  StrategyOptions o;
  o.n_ctx = 128;
  o.max_chunk = 256;
  const CostModel cost = CostModel::defaults();
  const uint64_t kv_layer = kv_bytes_per_layer(m, 128, DType::kF16);
  const uint64_t half =
      placement_bytes(m, Placement::uniform(m.hp.n_layer, Unit::kCpu), kv_layer).on(Unit::kCpu) / 2;
  for (const char* s : {"gpu", "cpu", "layers:1", "attn-gpu", "auto"}) {
    o.strategy = s;
    o.vram_budget = std::string(s) == "attn-gpu" || std::string(s) == "auto"
                        ? half + gpu_overhead_bytes(m, 256)
                        : 0;
    auto p = make_placement(m, o, cost);
    EXPECT_TRUE(p.ok()) << s << ": " << p.message();
    if (p.ok()) ps.push_back(*p);
  }
  // A deliberately mixed custom one: every kind of boundary.
  Placement c = Placement::uniform(m.hp.n_layer, Unit::kCpu);
  c.strategy = "custom";
  c.embed.unit = Unit::kGpu;
  c.layers[0][OpGroup::kAttnW].unit = Unit::kGpu;
  c.layers[0][OpGroup::kFfn].unit = Unit::kGpu;
  c.layers[1][OpGroup::kAttn].unit = Unit::kGpu;
  c.layers[1][OpGroup::kNorm].unit = Unit::kGpu;
  c.layers[2][OpGroup::kFfn].unit = Unit::kGpu;
  c.output.unit = Unit::kGpu;
  ps.push_back(c);
  return ps;
}

TEST(VulkanPlacement, EveryStrategyGivesTheCpuTokens) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = synth_f32(3);
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  const GenRun ref = greedy(*m, *be, cpu, Placement::uniform(3, Unit::kCpu), prompt, 24);
  ASSERT_EQ(ref.tokens.size(), 28u);  // the last sampled token is not evaluated
  for (const Placement& p : strategies(*m)) {
    const GenRun r = greedy(*m, *be, cpu, p, prompt, 24);
    EXPECT_EQ(r.tokens, ref.tokens) << p.strategy;
    EXPECT_TRUE(r.notes.empty()) << p.strategy << ": " << r.notes.front();
  }
  be->release_weights();
}

TEST(VulkanPlacement, SwitchingMidGenerationKeepsTheTokens) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = synth_f32(3);
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  const GenRun ref = greedy(*m, *be, cpu, Placement::uniform(3, Unit::kCpu), prompt, 30);
  const std::vector<Placement> ps = strategies(*m);
  std::vector<std::string> failures;
  // cpu -> each placement in turn, one switch every 4 tokens (weights and KV move each time).
  const GenRun r = greedy(
      *m, *be, cpu, Placement::uniform(3, Unit::kCpu), prompt, 30, [&](Session& s, int64_t i) {
        if (i % 4 == 3 && static_cast<size_t>(i / 4) < ps.size()) {
          s.request_placement(ps[static_cast<size_t>(i / 4)], [&](const Status& st) {
            if (!st.ok()) failures.push_back(st.message());
          });
        }
      });
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(r.tokens, ref.tokens);
  be->release_weights();
}

// The adaptive auto switches placements between tokens on its own (short
// windows, so that it tries several in 40 tokens): the tokens stay the CPU's.
TEST(VulkanPlacement, AdaptiveAutoKeepsTheTokens) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = synth_f32(3);
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  const GenRun ref = greedy(*m, *be, cpu, Placement::uniform(3, Unit::kCpu), prompt, 40);
  StrategyOptions o;
  o.strategy = "auto";
  o.n_ctx = 128;
  const uint64_t all = placement_bytes(*m, Placement::uniform(3, Unit::kGpu),
                                       kv_bytes_per_layer(*m, o.n_ctx, o.kv_dtype))
                           .on(Unit::kGpu);
  o.vram_budget = gpu_overhead_bytes(*m, o.max_chunk) + all * 2 / 3;
  const CostModel cost = CostModel::defaults();
  auto start = make_placement(*m, o, cost);
  ASSERT_TRUE(start.ok()) << start.message();
  AdaptiveOptions ao;
  ao.window_tokens = 3;
  ao.max_candidates = 5;
  ao.recheck_tokens = 4;
  ao.max_extra_tries = 3;
  AdaptiveController c(*m, o, cost, ao);
  c.start(*start);
  Profiler prof(3);
  const GenRun r = greedy(
      *m, *be, cpu, *start, prompt, 40,
      [&](Session& s, int64_t i) {
        if (i == 0) s.set_adaptive(&c);
      },
      &prof);
  EXPECT_EQ(r.tokens, ref.tokens);
  int tries = 0, keeps = 0;
  for (const AdaptiveEvent& e : c.events()) {
    tries += e.kind == AdaptiveEvent::Kind::kTry;
    keeps += e.kind == AdaptiveEvent::Kind::kKeep;
    EXPECT_NE(e.kind, AdaptiveEvent::Kind::kFailed) << e.label << ": " << e.why;
  }
  EXPECT_GE(tries, 2);
  EXPECT_GE(keeps, 1);
  be->release_weights();
}

TEST(VulkanPlacement, ProfilerTimesEveryGroupOnItsUnit) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = synth_f32(3);
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  Profiler prof(3);
  const Placement p = strategies(*m).back();  // the mixed one
  greedy(*m, *be, cpu, p, {0, 77, 301}, 12, {}, &prof);
  const auto snap = prof.snapshot();
  for (int64_t l = 0; l < 3; ++l) {
    for (int g = 0; g < kNumOpGroups; ++g) {
      EXPECT_GT(snap.layers[static_cast<size_t>(l)][static_cast<size_t>(g)].count, 0u)
          << "layer " << l << " group " << g;
    }
    EXPECT_GT(snap.layers[static_cast<size_t>(l)][Profiler::kLayerTotal].p50_ms, 0.0);
  }
  EXPECT_GT(snap.layers[0][Profiler::kXfer].count, 0u);  // layer 0 crosses units
  EXPECT_GT(snap.ttft.count, 0u);
  EXPECT_GE(snap.itl.count, 10u);
  EXPECT_GE(snap.step.count, 11u);
  // With the GPU in the placement, groups are timed on one step in 8; every
  // step when asked.
  const uint64_t every8 =
      (snap.step.count + Profiler::kGpuSampleEvery - 1) / Profiler::kGpuSampleEvery;
  EXPECT_EQ(snap.layers[1][Profiler::kLayerTotal].count, every8);
  Profiler all(3);
  all.set_sample_every(1);
  greedy(*m, *be, cpu, p, {0, 77, 301}, 12, {}, &all);
  const auto snap1 = all.snapshot();
  EXPECT_EQ(snap1.layers[1][Profiler::kLayerTotal].count, snap1.step.count);
  be->release_weights();
}

TEST(VulkanPlacement, Stories260KEveryStrategyEqualsCpu) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  CpuBackend cpu(2);
  const std::vector<int32_t> prompt = (*m)->tokenizer->encode("Once upon a time", true, false);
  const GenRun ref =
      greedy(**m, *be, cpu, Placement::uniform((*m)->hp.n_layer, Unit::kCpu), prompt, 100);
  for (const Placement& p : strategies(**m)) {
    EXPECT_EQ(greedy(**m, *be, cpu, p, prompt, 100).tokens, ref.tokens) << p.strategy;
  }
  be->release_weights();
}

// Every pair (from, to) of the strategies' placements: switched after the
// fifth token, the tokens stay the CPU's.
TEST(VulkanPlacement, EveryPairSwitchesCleanly) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = synth_f32(3);
  CpuBackend cpu(2);
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  const GenRun ref = greedy(*m, *be, cpu, Placement::uniform(3, Unit::kCpu), prompt, 30);
  const std::vector<Placement> ps = strategies(*m);
  for (const Placement& from : ps) {
    for (const Placement& to : ps) {
      const GenRun r = greedy(*m, *be, cpu, from, prompt, 30, [&](Session& s, int64_t i) {
        if (i == 5) s.request_placement(to);
      });
      EXPECT_EQ(r.tokens, ref.tokens) << from.strategy << " -> " << to.strategy;
    }
  }
}
#endif  // LOOM_HAVE_VULKAN

}  // namespace
}  // namespace loom
