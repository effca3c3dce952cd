// The adaptive `auto` (engine/placement/adaptive.h) against a simulated
// machine: decode steps take what a "true" cost model says, the controller
// starts from a calibrated model that is wrong about it, and must find the
// fastest placement within 64 tokens. Runs on a real switch of placements:
// vulkan_placement_test.cpp (AdaptiveAutoKeepsTheTokens).
#include "engine/placement/adaptive.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/placement/strategy.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::unique_ptr<Model> synth_f32(int64_t n_layer, int64_t n_ctx = 128, int64_t n_head_kv = 2) {
  SynthSpec s;
  s.n_layer = n_layer;
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = n_head_kv;
  s.n_ctx = n_ctx;
  s.weight_type = "f32";
  s.seed = 3;
  return test::synth_model(s, "adaptive" + std::to_string(n_layer) + "_" + std::to_string(n_ctx) +
                                  "_" + std::to_string(n_head_kv));
}

// What the calibration believes: the GPU fast and a switch back to the host free.
CostModel belief() {
  CostModel c = CostModel::defaults();
  c.unit[static_cast<size_t>(Unit::kCpu)] = {20e9, 5e-6};
  c.unit[static_cast<size_t>(Unit::kGpu)] = {800e9, 3e-6};
  c.xfer_latency_s = 20e-6;
  c.switch_s = 0;
  c.measured = true;
  return c;
}

// The machine: the GPU slower in short bursts, each switch back to the host
// paying a fence wait and an idle GPU.
CostModel truth() {
  CostModel c = belief();
  c.unit[static_cast<size_t>(Unit::kGpu)] = {400e9, 6e-6};
  c.switch_s = 300e-6;
  return c;
}

StrategyOptions half_budget(const Model& m) {
  StrategyOptions o;
  o.strategy = "auto";
  o.n_ctx = 128;
  const uint64_t all = placement_bytes(m, Placement::uniform(m.hp.n_layer, Unit::kGpu),
                                       kv_bytes_per_layer(m, o.n_ctx, o.kv_dtype))
                           .on(Unit::kGpu);
  o.vram_budget = gpu_overhead_bytes(m, o.max_chunk) + all / 2;
  return o;
}

// One decode step on the simulated machine: the profiler gets the true time
// of each unit's work per layer (on a group of that unit), as the forward
// pass would record it; returns the step's time, with a little noise.
double simulate_step(const Model& m, const CostModel& t, const Placement& p, int64_t n_past,
                     Profiler* prof, uint32_t* rng) {
  Unit x_on = p.embed.unit;
  for (int64_t l = 0; l < m.hp.n_layer; ++l) {
    const LayerPlace& lp = p.layers[static_cast<size_t>(l)];
    std::array<double, kNumUnits> us{};
    t.layer_s(m, l, lp, x_on, n_past, DType::kF16, nullptr, nullptr, nullptr, &us);
    for (size_t u = 0; u < us.size(); ++u) {
      for (int g = 0; g < kNumOpGroups; ++g) {
        if (us[u] > 0 && lp.g[static_cast<size_t>(g)].unit == static_cast<Unit>(u)) {
          prof->record_scope(prof->scope(l, static_cast<OpGroup>(g)),
                             static_cast<uint64_t>(us[u] * 1e9));
          break;
        }
      }
    }
    x_on = lp[OpGroup::kNorm].unit;
  }
  const CostModel::Prediction pr = t.predict(m, p, n_past, DType::kF16);
  prof->record_scope(prof->embed_scope(), static_cast<uint64_t>(pr.embed_ms * 1e6));
  const UnitCost& uo = t.unit[static_cast<size_t>(p.output.unit)];
  const double out_s =
      static_cast<double>(weight_bytes_as(m.output, p.output.dtype)) / uo.bytes_per_s + 2 * uo.op_s;
  prof->record_scope(prof->output_scope(), static_cast<uint64_t>(out_s * 1e9));
  *rng = *rng * 1664525u + 1013904223u;
  const double noise = 1.0 + 0.1 * (static_cast<double>(*rng >> 8) / 16777216.0 - 0.5);
  return pr.step_ms * noise;
}

struct RunResult {
  Placement final_p;
  std::vector<AdaptiveEvent> events;
  int switches = 0;
};

RunResult run(const Model& m, const StrategyOptions& o, const CostModel& believed,
              const CostModel& real, int64_t n_tokens, AdaptiveOptions ao = {},
              double move_ms = 0) {
  auto start = make_placement(m, o, believed);
  EXPECT_TRUE(start.ok()) << start.message();
  AdaptiveController c(m, o, believed, ao);
  c.start(*start);
  Profiler prof(m.hp.n_layer);
  Placement running = *start;
  uint32_t rng = 12345;
  RunResult r;
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t n_past = 16 + i;
    const double ms = simulate_step(m, real, running, n_past, &prof, &rng);
    if (auto p = c.on_step(ms, n_past, &prof)) {
      running = *p;
      ++r.switches;
      c.applied({}, move_ms);
    }
  }
  EXPECT_TRUE(c.current().same_as(running));
  r.final_p = running;
  r.events = c.events();
  return r;
}

double true_ms(const Model& m, const CostModel& t, const Placement& p) {
  return t.predict(m, p, 64, DType::kF16).step_ms;
}

double best_layers_n(const Model& m, const StrategyOptions& o, const CostModel& t) {
  double best = std::numeric_limits<double>::infinity();
  for (int64_t n = 0; n <= m.hp.n_layer; ++n) {
    StrategyOptions on = o;
    on.strategy = "layers:" + std::to_string(n);
    auto p = make_placement(m, on, t);
    if (!p.ok()) continue;
    const PlacementBytes b = placement_bytes(m, *p, kv_bytes_per_layer(m, o.n_ctx, o.kv_dtype));
    if (b.on(Unit::kGpu) + gpu_overhead_bytes(m, o.max_chunk) > o.vram_budget) continue;
    best = std::min(best, true_ms(m, t, *p));
  }
  return best;
}

TEST(AdaptiveCost, CorrectionMeetsWhatWasMeasured) {
  auto m = synth_f32(4);
  ASSERT_TRUE(m);
  const StrategyOptions o = half_budget(*m);
  StrategyOptions o2 = o;
  o2.strategy = "layers:2";
  auto p = make_placement(*m, o2, belief());
  ASSERT_TRUE(p.ok()) << p.message();
  Profiler prof(m->hp.n_layer);
  uint32_t rng = 1;
  double step = 0;
  for (int i = 0; i < 9; ++i) step = simulate_step(*m, truth(), *p, 64, &prof, &rng);
  step = true_ms(*m, truth(), *p);
  const CostModel c = correct_cost_model(belief(), *m, *p, 64, DType::kF16, prof.snapshot(), step);
  // Per unit, the corrected compute is what the profiler saw (its buckets
  // are log-spaced: within a few percent) ...
  const auto want = truth().predict(*m, *p, 64, DType::kF16);
  const auto got = c.predict(*m, *p, 64, DType::kF16);
  for (size_t u = 0; u < want.unit_ms.size(); ++u)
    EXPECT_NEAR(got.unit_ms[u], want.unit_ms[u], 0.08 * want.unit_ms[u]) << u;
  // ... and the whole step is what was measured: the switch cost took the rest.
  EXPECT_EQ(got.switches, 1);
  EXPECT_NEAR(got.step_ms, step, 1e-6);
  EXPECT_GT(c.switch_s, 0.0);
  // Nothing measured: nothing changes.
  const CostModel same =
      correct_cost_model(belief(), *m, *p, 64, DType::kF16, Profiler(4).snapshot(), 0);
  EXPECT_EQ(same.unit[1].bytes_per_s, belief().unit[1].bytes_per_s);
  EXPECT_EQ(same.switch_s, belief().switch_s);
}

TEST(Adaptive, CandidatesFitTheBudgetOnceEach) {
  auto m = synth_f32(6);
  ASSERT_TRUE(m);
  const StrategyOptions o = half_budget(*m);
  const std::vector<PlacementCandidate> c = candidate_placements(*m, o, belief());
  ASSERT_GE(c.size(), 3u);
  EXPECT_EQ(c[0].p.strategy.rfind("auto", 0), 0u) << c[0].p.strategy;
  const uint64_t kv = kv_bytes_per_layer(*m, o.n_ctx, o.kv_dtype);
  bool has_layers = false;
  for (size_t i = 0; i < c.size(); ++i) {
    const Placement& p = c[i].p;
    EXPECT_LE(placement_bytes(*m, p, kv).on(Unit::kGpu) + gpu_overhead_bytes(*m, o.max_chunk),
              o.vram_budget)
        << p.strategy;
    for (size_t j = 0; j < i; ++j) EXPECT_FALSE(p.same_as(c[j].p)) << p.strategy;
    has_layers |= p.strategy.rfind("layers:", 0) == 0;
    // layers_n names the layers:N a candidate equals, whatever its label.
    if (c[i].layers_n >= 0) {
      EXPECT_NE(p.strategy.find("layers:" + std::to_string(c[i].layers_n)), std::string::npos)
          << p.strategy;
      for (int64_t l = 0; l < m->hp.n_layer; ++l)
        EXPECT_EQ(p.layers[static_cast<size_t>(l)][OpGroup::kAttnW].unit,
                  l < c[i].layers_n ? Unit::kGpu : Unit::kCpu)
            << p.strategy << " layer " << l;
    } else {
      EXPECT_EQ(p.strategy.find("layers:"), std::string::npos) << p.strategy;
    }
  }
  EXPECT_TRUE(has_layers);
  StrategyOptions no_gpu = o;
  no_gpu.has_gpu = false;
  EXPECT_TRUE(candidate_placements(*m, no_gpu, belief()).empty());
}

TEST(Adaptive, FindsTheFastestWithin64TokensWhenTheModelIsWrong) {
  auto m = synth_f32(6);
  ASSERT_TRUE(m);
  const StrategyOptions o = half_budget(*m);
  auto start = make_placement(*m, o, belief());
  ASSERT_TRUE(start.ok());
  const double best_n = best_layers_n(*m, o, truth());
  // The premise: the calibrated model's pick loses on this machine.
  ASSERT_GT(true_ms(*m, truth(), *start), best_n / 0.97) << start->to_json();

  const RunResult r = run(*m, o, belief(), truth(), 64);
  EXPECT_LE(true_ms(*m, truth(), r.final_p), best_n / 0.97)
      << "kept " << r.final_p.strategy << " " << true_ms(*m, truth(), r.final_p) << " ms";
  int tries = 0, keeps = 0;
  for (const AdaptiveEvent& e : r.events) {
    tries += e.kind == AdaptiveEvent::Kind::kTry;
    keeps += e.kind == AdaptiveEvent::Kind::kKeep;
  }
  EXPECT_GE(tries, 1);
  EXPECT_LE(tries, AdaptiveOptions{}.max_candidates - 1);
  EXPECT_EQ(keeps, 1);
  EXPECT_EQ(r.events.back().kind, AdaptiveEvent::Kind::kKeep);
  EXPECT_GT(r.events.back().measured_ms, 0);
  // Settled: the next tokens run where it is (no recheck before 256 tokens).
  EXPECT_LE(r.switches, AdaptiveOptions{}.max_candidates);
}

// Windows measured at different context lengths are compared at one: the
// starting placement (measured at the shortest context) is 3% slower
// than the others at equal length, and the context grows fast enough that
// its window alone would read fastest.
TEST(Adaptive, ComparesWindowsAtOneContextLength) {
  auto m = synth_f32(6, 16384, 4);
  ASSERT_TRUE(m);
  StrategyOptions o = half_budget(*m);
  o.n_ctx = 16384;
  o.vram_budget = gpu_overhead_bytes(*m, o.max_chunk) +
                  placement_bytes(*m, Placement::uniform(m->hp.n_layer, Unit::kGpu),
                                  kv_bytes_per_layer(*m, o.n_ctx, o.kv_dtype))
                          .on(Unit::kGpu) /
                      2;
  const CostModel c = belief();
  auto start = make_placement(*m, o, c);
  ASSERT_TRUE(start.ok()) << start.message();
  AdaptiveController ctl(*m, o, c);
  ctl.start(*start);
  Placement running = ctl.current();
  const std::string first_tried = running.strategy;  // measured first, at the shortest context
  // The step: the model's prediction (exact here); the first arm measured takes
  // 3% more than the best of the others at the same context.
  const std::vector<PlacementCandidate> cands = candidate_placements(*m, o, c);
  auto step_ms = [&](const Placement& p, int64_t n_past) {
    if (p.strategy != first_tried) return c.predict(*m, p, n_past, o.kv_dtype).step_ms;
    double best = 0;
    for (const PlacementCandidate& q : cands) {
      if (q.p.strategy == first_tried) continue;
      const double ms = c.predict(*m, q.p, n_past, o.kv_dtype).step_ms;
      if (best == 0 || ms < best) best = ms;
    }
    return best * 1.03;
  };
  int64_t n_past = 16;
  for (int i = 0; i < 64 && ctl.exploring(); ++i, n_past += 200) {
    if (auto p = ctl.on_step(step_ms(running, n_past), n_past, nullptr)) {
      running = *p;
      ctl.applied({});
    }
  }
  ASSERT_FALSE(ctl.exploring());
  ASSERT_FALSE(first_tried.empty());
  // The premise: without bringing the windows to one length, the first arm reads fastest.
  double first_ms = 0, other_best = 0;
  for (const AdaptiveEvent& e : ctl.events()) {
    if (e.kind != AdaptiveEvent::Kind::kMeasured) continue;
    if (e.label == first_tried)
      first_ms = e.measured_ms;
    else if (other_best == 0 || e.measured_ms < other_best)
      other_best = e.measured_ms;
  }
  ASSERT_GT(first_ms, 0);
  ASSERT_GT(other_best, 0);
  ASSERT_LT(first_ms, other_best) << "the context did not grow enough to matter";
  EXPECT_NE(ctl.current().strategy, first_tried);
}

TEST(Adaptive, KeepsAutosChoiceWhenTheModelIsRight) {
  auto m = synth_f32(6);
  ASSERT_TRUE(m);
  const StrategyOptions o = half_budget(*m);
  auto start = make_placement(*m, o, belief());
  ASSERT_TRUE(start.ok());
  const RunResult r = run(*m, o, belief(), belief(), 64);
  EXPECT_LE(true_ms(*m, belief(), r.final_p), true_ms(*m, belief(), *start) * 1.02)
      << r.final_p.strategy;
}

TEST(Adaptive, RechecksOnlyWithinItsBudget) {
  auto m = synth_f32(6);
  ASSERT_TRUE(m);
  const StrategyOptions o = half_budget(*m);
  AdaptiveOptions ao;
  ao.recheck_tokens = 32;
  ao.max_extra_tries = 2;
  const RunResult r = run(*m, o, belief(), truth(), 600, ao);
  int tries = 0;
  for (const AdaptiveEvent& e : r.events) tries += e.kind == AdaptiveEvent::Kind::kTry;
  EXPECT_LE(tries, ao.max_candidates - 1 + ao.max_extra_tries);
  EXPECT_LE(true_ms(*m, truth(), r.final_p), best_layers_n(*m, o, truth()) / 0.97);
}

// A recheck's try must repay two moves before the next recheck: with moves
// of a second (weights over PCIe) and rechecks every 32 tokens of a few
// milliseconds, none is worth it once a move was measured.
TEST(Adaptive, RechecksTryOnlyWhatRepaysTheMoves) {
  auto m = synth_f32(6);
  ASSERT_TRUE(m);
  const StrategyOptions o = half_budget(*m);
  AdaptiveOptions ao;
  ao.max_candidates = 1;  // no first exploration: the rechecks do it
  ao.recheck_tokens = 32;
  ao.max_extra_tries = 4;
  ao.min_gain = 0;
  auto extra_tries = [&](double move_ms) {
    const RunResult r = run(*m, o, belief(), truth(), 600, ao, move_ms);
    int n = 0;
    bool settled = false;
    for (const AdaptiveEvent& e : r.events) {
      settled |= e.kind == AdaptiveEvent::Kind::kKeep;
      n += settled && e.kind == AdaptiveEvent::Kind::kTry;
    }
    return n;
  };
  const int free_moves = extra_tries(0.0), slow_moves = extra_tries(1000.0);
  std::printf("extra tries: %d with free moves, %d with slow ones\n", free_moves, slow_moves);
  EXPECT_GE(free_moves, 2) << "the premise: free moves make rechecks try";
  // The first try goes by the copy bandwidth's estimate; the move it measures
  // then stops the rest.
  EXPECT_LE(slow_moves, 1);
}

TEST(Adaptive, AFailedCandidateIsNotTriedAgain) {
  auto m = synth_f32(6);
  ASSERT_TRUE(m);
  const StrategyOptions o = half_budget(*m);
  auto start = make_placement(*m, o, belief());
  ASSERT_TRUE(start.ok());
  AdaptiveController c(*m, o, belief());
  c.start(*start);
  Profiler prof(m->hp.n_layer);
  uint32_t rng = 7;
  Placement running = *start;
  std::optional<Placement> failed;
  for (int64_t i = 0; i < 64; ++i) {
    const double ms = simulate_step(*m, truth(), running, 16 + i, &prof, &rng);
    auto p = c.on_step(ms, 16 + i, &prof);
    if (!p) continue;
    if (failed) {
      EXPECT_FALSE(p->same_as(*failed)) << "tried again: " << p->strategy;
    } else {
      failed = *p;
      c.applied(make_error(ErrorCode::kOutOfMemory, "the GPU is out of memory"));
      EXPECT_TRUE(c.current().same_as(running));
      continue;
    }
    running = *p;
    c.applied({});
  }
  ASSERT_TRUE(failed);
  bool seen = false;
  for (const AdaptiveEvent& e : c.events()) {
    if (e.kind == AdaptiveEvent::Kind::kFailed) {
      seen = true;
      EXPECT_NE(e.why.find("out of memory"), std::string::npos) << e.why;
      EXPECT_TRUE(e.placement.same_as(*failed));
    }
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace loom
