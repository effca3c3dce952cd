// `loom verify`: per layer and op group, the relative error of the layer's
// output with that group as the placement puts it, against the
// double-precision reference on the same input (engine/runtime/verify.h).
#include <cstdio>
#include <string>

#include "engine/runtime/verify.h"
#include "tools/loom/engine_setup.h"

namespace loom::cli {

namespace {
std::string group_label(const GroupPlace& g) {
  return std::string(unit_name(g.unit)) + " " +
         (g.dtype ? std::string(dtype_name(*g.dtype)) : std::string("file"));
}
}  // namespace

int cmd_verify(const VerifyOptions& o) {
  const char* who = "loom verify";
  EngineOptions eo = o.engine;
  // A placement file on the CPU backend: no GPU to probe (open_engine would
  // drop the file when the probe fails); the file's groups are used as they are.
  if (eo.strategy.empty() && eo.backend == "cpu") eo.strategy = "cpu";
  auto e = open_engine(eo, who, /*calibrate=*/false, /*session=*/false);
  if (!e) return 1;
  const Model& m = *e->model;
  std::vector<int32_t> tokens = m.tokenizer->encode(o.prompt, /*add_special=*/true, false);
  if (static_cast<int64_t>(tokens.size()) > o.n_tokens)
    tokens.resize(static_cast<size_t>(o.n_tokens));
  if (tokens.empty()) {
    std::fprintf(stderr, "%s: the prompt gives no tokens\n", who);
    return 1;
  }
  auto r = verify_placement(m, *e->cpu, e->gpu.get(), e->planned, tokens, [&](int64_t l) {
    if (o.progress) std::fprintf(stderr, "%s: layer %lld done\n", who, static_cast<long long>(l));
    return true;
  });
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, r.message().c_str());
    return 1;
  }
  for (const auto& n : r->notes) std::fprintf(stderr, "%s: note: %s\n", who, n.c_str());
  if (o.json) {
    std::printf("{\"tokens\": %lld, \"layers\": [", static_cast<long long>(r->n_tokens));
    for (size_t i = 0; i < r->rows.size(); ++i) {
      const VerifyRow& row = r->rows[i];
      std::printf("%s\n  {\"layer\": %lld", i ? "," : "", static_cast<long long>(row.layer));
      for (int g = 0; g < kNumOpGroups; ++g) {
        std::printf(", \"%s\": %.6e", op_group_name(static_cast<OpGroup>(g)),
                    row.group[static_cast<size_t>(g)]);
      }
      std::printf(", \"layer\": %.6e, \"layer_vs_update\": %.6e}", row.all, row.all_delta);
    }
    std::printf("\n]}\n");
    return 0;
  }
  std::printf("%s | %s, %lld tokens\n", m.describe().c_str(), r->placement.strategy.c_str(),
              static_cast<long long>(r->n_tokens));
  std::printf(
      "relative error of each layer's output against the double-precision reference on the same "
      "input:\none op group as placed (the others on the CPU in the file's precision), then the "
      "whole layer as placed, and that error relative to the layer's update (output - input)\n\n");
  std::printf("%5s", "layer");
  for (int g = 0; g < kNumOpGroups; ++g)
    std::printf("  %-20s", op_group_name(static_cast<OpGroup>(g)));
  std::printf("  %-9s  %-9s\n", "layer", "vs update");
  for (const VerifyRow& row : r->rows) {
    std::printf("%5lld", static_cast<long long>(row.layer));
    const LayerPlace& lp = r->placement.layers[static_cast<size_t>(row.layer)];
    for (int g = 0; g < kNumOpGroups; ++g) {
      std::printf("  %-11s %8.2e", group_label(lp.g[static_cast<size_t>(g)]).c_str(),
                  row.group[static_cast<size_t>(g)]);
    }
    std::printf("  %9.2e  %9.2e\n", row.all, row.all_delta);
  }
  return 0;
}

}  // namespace loom::cli
