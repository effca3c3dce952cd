// `loom kl`: how far OTHER's next-token distributions are from BASE's on a
// text (KL divergence per scored token: mean, median, P99; top-1 agreement;
// the perplexity of each). OTHER defaults to BASE, so `--dtype q4_0` alone
// compares a model with itself requantized at load.
#include <cstdio>
#include <optional>
#include <vector>

#include "engine/runtime/quality.h"
#include "tools/loom/engine_setup.h"
#include "tools/loom/eval_text.h"

namespace loom::cli {

int cmd_kl(const KlOptions& o) {
  const char* who = "loom kl";
  EngineOptions base_o = o.engine;
  if (base_o.ctx <= 0) base_o.ctx = 512;
  EngineOptions other_o = base_o;
  if (!o.model2.empty()) other_o.model = o.model2;
  if (!o.dtype2.empty()) {
    other_o.cpu_dtype = o.dtype2;
    other_o.gpu_dtype = o.dtype2;
  }
  if (!o.placement2.empty()) {
    other_o.placement = o.placement2;
    // On the CPU backend no GPU is probed (a failed probe would drop the file).
    other_o.strategy = other_o.backend == "cpu" ? "cpu" : "custom";
  }
  auto base = open_engine(base_o, who);
  if (!base) return 1;
  auto other = open_engine(other_o, who);
  if (!other) return 1;
  const std::optional<EvalText> text =
      read_eval_text(o.file, *base->model, base_o.ctx, o.stride, o.chunks, who);
  if (!text) return 1;
  const std::vector<int32_t>& tokens = text->tokens;
  const WindowOptions& wo = text->windows;
  std::fprintf(stderr, "%s: base  %s\n%s: other %s%s%s\n", who, base->model->describe().c_str(),
               who, other->model->describe().c_str(), o.dtype2.empty() ? "" : ", requantized to ",
               o.dtype2.c_str());
  std::fprintf(stderr,
               "%s: %zu tokens, %lld windows of %lld tokens, scoring the last %lld of each\n", who,
               tokens.size(), static_cast<long long>(text->n_windows),
               static_cast<long long>(wo.n_ctx), static_cast<long long>(scored_per_window(wo)));
  auto r =
      kl_compare(*base->session, *other->session, tokens, wo, [](int64_t i, const KlResult& k) {
        std::printf("[%lld] KL %.6f top-1 %.2f%%\n", static_cast<long long>(i + 1), k.kl_mean(),
                    100.0 * k.top1_agreement());
        std::fflush(stdout);
        return true;
      });
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, r.message().c_str());
    return 1;
  }
  std::printf("tokens scored    %lld\n", static_cast<long long>(r->kl.size()));
  std::printf("PPL base         %.4f +/- %.5f\n", r->base.ppl(), r->base.ppl_stderr());
  std::printf("PPL other        %.4f +/- %.5f\n", r->other.ppl(), r->other.ppl_stderr());
  std::printf("KL mean          %.6f +/- %.6f\n", r->kl_mean(), r->kl_mean_stderr());
  std::printf("KL median        %.6f\n", r->kl_quantile(0.5));
  std::printf("KL P99           %.6f\n", r->kl_quantile(0.99));
  std::printf("KL max           %.6f\n", r->kl_quantile(1.0));
  std::printf("top-1 agreement  %.2f%%\n", 100.0 * r->top1_agreement());
  return 0;
}

}  // namespace loom::cli
