// `loom probe`: per layer, activation statistics of the residual stream and
// of the matmuls' inputs on a text (engine/runtime/probe.h).
#include <cstdio>
#include <string>

#include "engine/runtime/probe.h"
#include "tools/loom/engine_setup.h"

namespace loom::cli {

namespace {

void print_json(const char* name, const ActStats& s) {
  std::printf(
      "\"%s\": {\"min\": %.6e, \"max\": %.6e, \"mean\": %.6e, \"std\": %.6e, "
      "\"outliers\": %.6e}",
      name, s.min, s.max, s.mean, s.std, s.outlier_share);
}

void print_row(const char* where, const char* what, const ActStats& s) {
  std::printf("%-6s %-8s %11.4g %11.4g %11.4g %11.4g %9.5f%%\n", where, what, s.min, s.max, s.mean,
              s.std, 100.0 * s.outlier_share);
}

}  // namespace

int cmd_probe(const ProbeOptions& o) {
  const char* who = "loom probe";
  EngineOptions eo = o.engine;
  if (eo.strategy.empty()) eo.strategy = "cpu";  // only the model is used: no GPU to probe
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
  auto r = probe_model(m, tokens, [&](int64_t l) {
    if (o.progress) std::fprintf(stderr, "%s: layer %lld done\n", who, static_cast<long long>(l));
    return true;
  });
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, r.message().c_str());
    return 1;
  }
  if (o.json) {
    std::printf("{\"tokens\": %lld, \"outlier_sigmas\": %g, ", static_cast<long long>(r->n_tokens),
                kProbeOutlierSigmas);
    print_json("embd", r->embd);
    std::printf(", \"layers\": [");
    for (size_t i = 0; i < r->rows.size(); ++i) {
      const ProbeRow& row = r->rows[i];
      std::printf("%s\n  {\"layer\": %lld, ", i ? "," : "", static_cast<long long>(row.layer));
      print_json("attn_in", row.attn_in);
      std::printf(", ");
      print_json("ffn_in", row.ffn_in);
      std::printf(", ");
      print_json("out", row.out);
      std::printf("}");
    }
    std::printf("\n], ");
    print_json("final_norm", r->final_norm);
    std::printf("}\n");
    return 0;
  }
  std::printf("%s, %lld tokens\n", m.describe().c_str(), static_cast<long long>(r->n_tokens));
  std::printf(
      "activation statistics in double precision: attn_in and ffn_in are the attention and FFN "
      "matmuls' inputs (after the norms), out the residual stream after the layer; outliers: "
      "values with |x - mean| > %g std\n\n",
      kProbeOutlierSigmas);
  std::printf("%-6s %-8s %11s %11s %11s %11s %10s\n", "layer", "tensor", "min", "max", "mean",
              "std", "outliers");
  print_row("embd", "", r->embd);
  for (const ProbeRow& row : r->rows) {
    const std::string l = std::to_string(row.layer);
    print_row(l.c_str(), "attn_in", row.attn_in);
    print_row(l.c_str(), "ffn_in", row.ffn_in);
    print_row(l.c_str(), "out", row.out);
  }
  print_row("final", "norm", r->final_norm);
  return 0;
}

}  // namespace loom::cli
