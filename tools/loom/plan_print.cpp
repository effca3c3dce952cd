#include "tools/loom/plan_print.h"

#include <algorithm>
#include <string>

namespace loom::cli {

namespace {
std::string cell(const GroupPlace& g, DType file_dtype) {
  char buf[48];
  const std::string_view d = dtype_name(g.dtype.value_or(file_dtype));
  std::snprintf(buf, sizeof(buf), "%s %.*s", unit_name(g.unit), static_cast<int>(d.size()),
                d.data());
  return buf;
}
double mib(uint64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024.0);
}
}  // namespace

void print_plan(const Engine& e, const Profiler::Snapshot* measured, FILE* f) {
  const Model& m = *e.model;
  const Placement& p = e.planned;
  const StrategyOptions& so = e.strategy;
  const uint64_t kv_layer = kv_bytes_per_layer(m, so.n_ctx, so.kv_dtype);
  const PlacementBytes b = placement_bytes(m, p, kv_layer);
  const int64_t n_past = std::max<int64_t>(1, so.n_ctx / 2);
  const CostModel::Prediction pr = e.cost.predict(m, p, n_past, so.kv_dtype);

  std::fprintf(f, "model:     %s\n", m.describe().c_str());
  std::fprintf(f, "strategy:  %s", p.strategy.c_str());
  if (so.vram_budget) std::fprintf(f, ", VRAM budget %.0f MiB", mib(so.vram_budget));
  std::fprintf(f, "\n");
  if (so.vram_budget && so.has_gpu) {
    // The most whole layers the budget holds, which layers:N does not check.
    int64_t most = -1;
    for (const PlacementCandidate& c : candidate_placements(m, so, e.cost))
      most = std::max(most, c.layers_n);
    if (most >= 0)
      std::fprintf(f, "fits:      layers:%lld at most within the VRAM budget\n",
                   static_cast<long long>(most));
    else
      std::fprintf(f, "fits:      no layer within the VRAM budget\n");
  }
  std::fprintf(f, "cost:      %s\n", e.cost.describe().c_str());
  std::fprintf(f, "%-6s %-12s %-10s %-12s %-6s %10s %10s %9s", "layer", "attn_w", "attn(KV)", "ffn",
               "norm", "GPU MiB", "CPU MiB", "pred ms");
  if (measured) std::fprintf(f, " %9s %9s", "P50 ms", "P99 ms");
  std::fprintf(f, "\n");
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerPlace& lp = p.layers[l];
    const LayerWeights& w = m.layers[l];
    uint64_t on[2] = {0, 0};
    for (int g = 0; g < kNumOpGroups; ++g)
      on[static_cast<size_t>(lp.g[static_cast<size_t>(g)].unit)] +=
          b.layer[l][static_cast<size_t>(g)];
    std::fprintf(f, "%-6zu %-12s %-10s %-12s %-6s %10.1f %10.1f %9.3f", l,
                 cell(lp[OpGroup::kAttnW], w.wq.dtype).c_str(),
                 cell(GroupPlace{lp[OpGroup::kAttn].unit, so.kv_dtype}, so.kv_dtype).c_str(),
                 cell(lp[OpGroup::kFfn], w.w_gate.dtype).c_str(),
                 unit_name(lp[OpGroup::kNorm].unit), mib(on[1]), mib(on[0]),
                 l < pr.layer_ms.size() ? pr.layer_ms[l] : 0.0);
    if (measured && l < measured->layers.size()) {
      const ProfileStat& s = measured->layers[l][Profiler::kLayerTotal];
      std::fprintf(f, " %9.3f %9.3f", s.p50_ms, s.p99_ms);
    }
    std::fprintf(f, "\n");
  }
  std::fprintf(f, "embed:     %s (%.1f MiB)\n", cell(p.embed, m.tok_embd.dtype).c_str(),
               mib(b.embed));
  std::fprintf(f, "output:    %s (%.1f MiB), predicted %.3f ms",
               cell(p.output, m.output.dtype).c_str(), mib(b.output), pr.output_ms);
  if (measured) std::fprintf(f, ", measured P50 %.3f ms", measured->output.p50_ms);
  std::fprintf(f, "\n");
  std::fprintf(f,
               "GPU:       %.1f MiB weights + %.1f MiB KV (+ %.1f MiB activations and scratch for "
               "prompt chunks of %lld)\n",
               mib(b.weights[1]), mib(b.kv[1]),
               p.uses(Unit::kGpu) ? mib(gpu_overhead_bytes(m, so.max_chunk)) : 0.0,
               static_cast<long long>(so.max_chunk));
  std::fprintf(f, "CPU:       %.1f MiB weights + %.1f MiB KV\n", mib(b.weights[0]), mib(b.kv[0]));
  if (e.kv_tiers.ram_budget > 0 || e.kv_tiers.device_budget > 0) {
    // GPU layers' blocks beyond the device budget join the host's in RAM,
    // and what RAM's budget does not hold goes to the SSD.
    const double gpu = e.kv_tiers.device_budget > 0
                           ? std::min(mib(b.kv[1]), mib(e.kv_tiers.device_budget))
                           : mib(b.kv[1]);
    const double host = mib(b.kv[0]) + mib(b.kv[1]) - gpu;
    const double ram =
        e.kv_tiers.ram_budget > 0 ? std::min(host, mib(e.kv_tiers.ram_budget)) : host;
    std::fprintf(f,
                 "KV tiers:  GPU %.1f MiB, RAM %.1f MiB, SSD %.1f MiB at full context (%s, %s)\n",
                 gpu, ram, host - ram, e.kv_tiers.policy.c_str(),
                 e.kv_tiers.ram_budget > 0 ? e.kv_tiers.spill_dir.c_str() : "no spill file");
  }
  std::fprintf(f,
               "predicted: %.3f ms per decode step (%.1f tokens/s) at %lld tokens of context, %lld "
               "transfers (%.3f ms)\n",
               pr.step_ms, pr.step_ms > 0 ? 1000.0 / pr.step_ms : 0.0,
               static_cast<long long>(n_past), static_cast<long long>(pr.transfers), pr.xfer_ms);
  if (measured && measured->step.count) {
    std::fprintf(f,
                 "measured:  decode step P50 %.3f ms, P99 %.3f ms (%llu steps); transfers outside "
                 "layers P50 %.3f ms\n",
                 measured->step.p50_ms, measured->step.p99_ms,
                 static_cast<unsigned long long>(measured->step.count),
                 measured->xfer_other.p50_ms);
  }
}

}  // namespace loom::cli
