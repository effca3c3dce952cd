// `loom bench`: prefill and decode speed, latency percentiles and where a
// decode step's time goes. Figures are printed; nothing is asserted.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/backends/vulkan/vulkan.h"
#include "engine/profile/profiler.h"
#include "tools/loom/engine_setup.h"
#include "tools/loom/plan_print.h"

namespace loom::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct MeanSd {
  double mean = 0, sd = 0;
};
MeanSd mean_sd(const std::vector<double>& v) {
  MeanSd r;
  if (v.empty()) return r;
  for (double x : v) r.mean += x;
  r.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    for (double x : v) r.sd += (x - r.mean) * (x - r.mean);
    r.sd = std::sqrt(r.sd / static_cast<double>(v.size() - 1));
  }
  return r;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(idx));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

}  // namespace

int cmd_bench(const BenchOptions& o) {
  EngineOptions eo = o.engine;
  if (eo.ctx == 0) eo.ctx = o.n_prompt + o.n_gen + 1;
  // Without --batch, a CPU prompt goes in chunks of up to 512 tokens (a GPU
  // takes its default_prefill_chunk).
  eo.cpu_batch = std::max<int64_t>(eo.cpu_batch, std::min<int64_t>(o.n_prompt, 512));
  auto e = open_engine(eo, "loom bench", /*calibrate=*/true);
  if (!e) return 1;
  const Model& m = *e->model;
  ForwardPass& fwd = e->session->forward();
  KvCache& kv = const_cast<KvCache&>(e->session->kv());
  const int64_t n_vocab = m.hp.n_vocab;

  // Deterministic ordinary tokens (ids spread over the vocabulary).
  std::vector<int32_t> prompt(static_cast<size_t>(o.n_prompt));
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(n_vocab));
  std::vector<float> logits(static_cast<size_t>(n_vocab));

  std::vector<double> prefill_tps, decode_tps, ttft, itl;
  KvTierStats ssd0, ssd1;  // around the last rep's decode: SSD bytes per token
  OpStats stats;
  // The profiler runs in every rep unless --no-profiler (compare the two to see its cost).
  Profiler prof(m.hp.n_layer);
  prof.set_sample_every(o.profile_every);
  if (!o.no_profiler) fwd.set_profiler(&prof);
  for (int rep = -1; rep < o.reps; ++rep) {  // rep -1 warms up (page-in of the weights)
    kv.clear();
    const auto t0 = Clock::now();
    Status s = fwd.eval(prompt, 0, logits.data());
    if (!s.ok()) {
      std::fprintf(stderr, "loom bench: %s\n", s.message().c_str());
      return 1;
    }
    int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const auto t1 = Clock::now();
    const double pre_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    if (rep == 0) prof.reset();  // the warm-up's figures go
    if (rep == o.reps - 1) {
      fwd.set_stats(&stats);
      ssd0 = kv.tier_stats();
    }
    auto last = t1;
    for (int64_t i = 0; i < o.n_gen; ++i) {
      const auto step0 = Clock::now();
      s = fwd.eval(std::span<const int32_t>(&next, 1), o.n_prompt + i, logits.data());
      if (!s.ok()) {
        std::fprintf(stderr, "loom bench: %s\n", s.message().c_str());
        return 1;
      }
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      const auto now = Clock::now();
      if (rep >= 0) itl.push_back(std::chrono::duration<double, std::milli>(now - last).count());
      last = now;
      // The adaptive auto's turn between two tokens (a change's cost lands in the next ITL).
      if (e->adaptive) {
        const double ms = std::chrono::duration<double, std::milli>(now - step0).count();
        e->adaptive->step(ms, o.n_prompt + i + 1, o.no_profiler ? nullptr : &prof,
                          [&fwd](const Placement& p) { return fwd.set_placement(p); });
      }
    }
    fwd.set_stats(nullptr);
    if (rep == o.reps - 1) ssd1 = kv.tier_stats();
    const double dec_ms = std::chrono::duration<double, std::milli>(last - t1).count();
    if (rep < 0) continue;
    prefill_tps.push_back(1000.0 * static_cast<double>(o.n_prompt) / pre_ms);
    decode_tps.push_back(1000.0 * static_cast<double>(o.n_gen) / dec_ms);
    ttft.push_back(pre_ms);
  }
  fwd.set_profiler(nullptr);
  e->planned = fwd.placement();  // the adaptive auto may have moved it
  const Profiler::Snapshot snap = prof.snapshot();
  const std::vector<GpuOpTime> gpu_ops =
      e->gpu ? take_vulkan_gpu_times(*e->gpu) : std::vector<GpuOpTime>();
  const MeanSd pp = mean_sd(prefill_tps), tg = mean_sd(decode_tps), tt = mean_sd(ttft);
  const double p50 = percentile(itl, 50), p99 = percentile(itl, 99);
  const uint64_t rss = peak_rss_bytes();

  if (o.json) {
    nlohmann::json j;
    j["model"] = o.engine.model;
    j["description"] = m.describe();
    j["backend"] = e->backend_name();
    j["threads"] = e->cpu->n_threads();
    j["n_prompt"] = o.n_prompt;
    j["prefill_chunk"] = fwd.max_chunk();
    j["n_gen"] = o.n_gen;
    j["reps"] = o.reps;
    j["prefill_tps"] = pp.mean;
    j["prefill_tps_sd"] = pp.sd;
    j["decode_tps"] = tg.mean;
    j["decode_tps_sd"] = tg.sd;
    j["ttft_ms"] = tt.mean;
    j["itl_p50_ms"] = p50;
    j["itl_p99_ms"] = p99;
    j["itl_ms"] = itl;  // every decode step of the timed reps, in order (where P99 comes from)
    j["peak_rss_bytes"] = rss;
    j["weight_bytes"] = m.weight_bytes();
    j["kv_bytes"] = kv.allocated_bytes();
    j["kv_tiers"] = {
        {"device_bytes", ssd1.device_bytes},
        {"ram_bytes", ssd1.ram_bytes},
        {"ssd_bytes", ssd1.ssd_bytes},
        {"ram_budget", kv.tier_config().ram_budget},
        {"device_budget", kv.tier_config().device_budget},
        {"device_used_bytes", ssd1.device_used_bytes},
        {"blocks_to_host", ssd1.blocks_to_host},
        {"blocks_to_device", ssd1.blocks_to_device},
        {"policy", kv.tiered() ? kv.tier_config().policy : std::string()},
        {"ssd_read_bytes_per_token",
         o.n_gen > 0 ? (ssd1.ssd_read_bytes - ssd0.ssd_read_bytes) / o.n_gen : 0},
        {"ssd_written_bytes_per_token",
         o.n_gen > 0 ? (ssd1.ssd_written_bytes - ssd0.ssd_written_bytes) / o.n_gen : 0},
        {"ssd_read_requests_per_token",
         o.n_gen > 0 ? (ssd1.ssd_read_requests - ssd0.ssd_read_requests) / o.n_gen : 0},
        {"blocks_spilled", ssd1.blocks_spilled},
        {"blocks_promoted", ssd1.blocks_promoted}};
    nlohmann::json ops = nlohmann::json::object();
    const double total = static_cast<double>(stats.total_ns());
    for (int i = 0; i < static_cast<int>(OpLabel::kCount); ++i) {
      if (stats.calls[static_cast<size_t>(i)] == 0) continue;
      ops[op_label_name(static_cast<OpLabel>(i))] =
          total > 0 ? static_cast<double>(stats.ns[static_cast<size_t>(i)]) / total : 0.0;
    }
    j["decode_op_share"] = ops;
    j["strategy"] = e->planned.strategy;
    j["profiler"] = !o.no_profiler;
    j["predicted_step_ms"] =
        e->cost.predict(m, e->planned, o.n_prompt + o.n_gen / 2, e->strategy.kv_dtype).step_ms;
    if (!o.no_profiler) {
      nlohmann::json layers = nlohmann::json::array();
      for (const auto& l : snap.layers) {
        layers.push_back({{"p50_ms", l[Profiler::kLayerTotal].p50_ms},
                          {"p99_ms", l[Profiler::kLayerTotal].p99_ms}});
      }
      j["layers"] = layers;
      j["step_p50_ms"] = snap.step.p50_ms;
    }
    if (e->adaptive) {
      nlohmann::json ev = nlohmann::json::array();
      for (const AdaptiveEvent& a : e->adaptive->events()) {
        ev.push_back({{"token", a.token},
                      {"event", adaptive_event_name(a.kind)},
                      {"placement", a.label},
                      {"predicted_ms", a.predicted_ms},
                      {"measured_ms", a.measured_ms},
                      {"why", a.why}});
      }
      j["adaptive"] = {{"events", ev}, {"kept", e->adaptive->current().strategy}};
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model:    %s\n          %s\n", o.engine.model.c_str(), m.describe().c_str());
  std::printf("backend:  %s\n", e->backend_name().c_str());
  std::printf("prefill:  %8.1f ± %.1f tokens/s  (pp%lld, %d reps, chunks of %lld)\n", pp.mean,
              pp.sd, static_cast<long long>(o.n_prompt), o.reps,
              static_cast<long long>(std::min(fwd.max_chunk(), o.n_prompt)));
  std::printf("decode:   %8.1f ± %.1f tokens/s  (tg%lld)\n", tg.mean, tg.sd,
              static_cast<long long>(o.n_gen));
  std::printf("ttft:     %8.2f ms\n", tt.mean);
  std::printf("itl:      P50 %.2f ms, P99 %.2f ms\n", p50, p99);
  std::printf("memory:   peak RSS %.1f MiB (weights %.1f MiB, KV %.1f MiB)\n",
              static_cast<double>(rss) / 1048576.0,
              static_cast<double>(m.weight_bytes()) / 1048576.0,
              static_cast<double>(kv.allocated_bytes()) / 1048576.0);
  std::printf("kv tiers: device %.1f MiB, RAM %.1f MiB, SSD %.1f MiB",
              ssd1.device_bytes / 1048576.0, ssd1.ram_bytes / 1048576.0,
              ssd1.ssd_bytes / 1048576.0);
  if (kv.tier_config().device_budget > 0) {
    std::printf(" (GPU budget %.1f MiB, %.1f MiB in use, blocks to RAM %llu, back %llu)",
                kv.tier_config().device_budget / 1048576.0, ssd1.device_used_bytes / 1048576.0,
                static_cast<unsigned long long>(ssd1.blocks_to_host),
                static_cast<unsigned long long>(ssd1.blocks_to_device));
  }
  if (kv.tier_config().ram_budget > 0) {
    const double n = static_cast<double>(std::max<int64_t>(o.n_gen, 1));
    std::printf(
        " (RAM budget %.1f MiB, policy %s, %s)\n"
        "          SSD per decode token: read %.1f KiB in %.1f requests, written %.1f KiB; "
        "blocks spilled %llu, promoted %llu",
        kv.tier_config().ram_budget / 1048576.0, kv.tier_config().policy.c_str(),
        ssd1.note.empty() ? "no spill yet" : ssd1.note.c_str(),
        static_cast<double>(ssd1.ssd_read_bytes - ssd0.ssd_read_bytes) / n / 1024.0,
        static_cast<double>(ssd1.ssd_read_requests - ssd0.ssd_read_requests) / n,
        static_cast<double>(ssd1.ssd_written_bytes - ssd0.ssd_written_bytes) / n / 1024.0,
        static_cast<unsigned long long>(ssd1.blocks_spilled),
        static_cast<unsigned long long>(ssd1.blocks_promoted));
  }
  std::printf("\n");
  if (!o.no_profiler) {
    std::printf(
        "placement and per-layer decode time (profiler, last %d reps, groups timed on one step in "
        "%d) "
        "against the cost model:\n",
        o.reps, prof.sample_every(e->planned.uses(Unit::kGpu)));
    print_plan(*e, &snap, stdout);
  }
  if (e->adaptive) {
    std::printf(
        "adaptive auto (windows of %d decode tokens, from the warm-up rep on; the cost model "
        "corrected from the profiler):\n",
        o.engine.adapt_window);
    for (const AdaptiveEvent& a : e->adaptive->events())
      std::printf("  %s\n", adaptive_event_text(a).c_str());
    std::printf("  kept: %s\n", e->adaptive->current().strategy.c_str());
  }
  if (!gpu_ops.empty()) {
    double total_ms = 0;
    uint64_t calls = 0;
    for (const auto& g : gpu_ops) total_ms += g.ms, calls += g.calls;
    std::vector<GpuOpTime> sorted = gpu_ops;
    std::sort(sorted.begin(), sorted.end(),
              [](const GpuOpTime& a, const GpuOpTime& b) { return a.ms > b.ms; });
    const double steps = static_cast<double>((o.reps + 1) * (o.n_gen + 1));
    std::printf(
        "GPU shaders (timestamps around every dispatch, all reps; %.0f dispatches per step):\n",
        static_cast<double>(calls) / steps);
    for (const auto& g : sorted) {
      std::printf("  %-28s %5.1f%%  %9.1f us/step  %8llu calls\n", g.name.c_str(),
                  total_ms > 0 ? 100.0 * g.ms / total_ms : 0.0, 1000.0 * g.ms / steps,
                  static_cast<unsigned long long>(g.calls));
    }
    std::printf("  submissions: %llu\n",
                static_cast<unsigned long long>(vulkan_submissions(*e->gpu)));
  }
  std::printf("decode step, share of time per op (last rep):\n");
  const double total = static_cast<double>(stats.total_ns());
  for (int i = 0; i < static_cast<int>(OpLabel::kCount); ++i) {
    const auto k = static_cast<size_t>(i);
    if (stats.calls[k] == 0) continue;
    std::printf("  %-24s %5.1f%%  %8.1f us/token\n", op_label_name(static_cast<OpLabel>(i)),
                total > 0 ? 100.0 * static_cast<double>(stats.ns[k]) / total : 0.0,
                static_cast<double>(stats.ns[k]) / 1000.0 /
                    static_cast<double>(std::max<int64_t>(1, o.n_gen)));
  }
  return 0;
}

}  // namespace loom::cli
