// `loom perplexity`: perplexity of a text, window by window (llama.cpp's
// layout: engine/runtime/quality.h). Running values to stdout as
// "[1]12.3456,[2]..." and the final "PPL = x +/- e".
#include <cstdio>
#include <optional>
#include <vector>

#include "engine/runtime/quality.h"
#include "tools/loom/engine_setup.h"
#include "tools/loom/eval_text.h"

namespace loom::cli {

int cmd_perplexity(const PerplexityOptions& o) {
  const char* who = "loom perplexity";
  EngineOptions eo = o.engine;
  if (eo.ctx <= 0) eo.ctx = 512;
  auto e = open_engine(eo, who);
  if (!e) return 1;
  const std::optional<EvalText> text =
      read_eval_text(o.file, *e->model, eo.ctx, o.stride, o.chunks, who);
  if (!text) return 1;
  const std::vector<int32_t>& tokens = text->tokens;
  const WindowOptions& wo = text->windows;
  std::fprintf(stderr,
               "%s: %s | %s\n%s: %zu tokens, %lld windows of %lld tokens (stride %lld), scoring "
               "the last %lld of each\n",
               who, e->model->describe().c_str(), e->backend_name().c_str(), who, tokens.size(),
               static_cast<long long>(text->n_windows), static_cast<long long>(wo.n_ctx),
               static_cast<long long>(wo.stride > 0 ? wo.stride : wo.n_ctx),
               static_cast<long long>(scored_per_window(wo)));
  auto r = perplexity(*e->session, tokens, wo, [](int64_t i, double ppl) {
    std::printf("%s[%lld]%.4f", i ? "," : "", static_cast<long long>(i + 1), ppl);
    std::fflush(stdout);
    return true;
  });
  std::printf("\n");
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, r.message().c_str());
    return 1;
  }
  std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored)\n", r->nll.ppl(),
              r->nll.ppl_stderr(), static_cast<long long>(r->nll.n));
  return 0;
}

}  // namespace loom::cli
