// `loom run`: one-shot generation, streamed to stdout; timings to stderr.
#include <cstdio>

#include "tools/loom/engine_setup.h"

namespace loom::cli {

int cmd_run(const RunOptions& o) {
  auto e = open_engine(o.engine, "loom run");
  if (!e) return 1;
  Session& s = *e->session;

  std::vector<int32_t> prompt;
  if (o.raw) {
    prompt = s.tokenize_raw(o.prompt);
  } else {
    // The model's warnings are about its chat template: only chat mode uses it.
    for (const auto& w : e->model->warnings)
      std::fprintf(stderr, "loom run: warning: %s\n", w.c_str());
    std::vector<ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.prompt});
    auto p = s.tokenize_chat(msgs);
    if (!p.ok()) {
      std::fprintf(stderr, "loom run: %s\n", p.message().c_str());
      return 1;
    }
    prompt = std::move(p).value();
  }

  GenerateParams gp;
  gp.sampling.temperature = o.temp;
  gp.sampling.top_k = o.top_k;
  gp.sampling.top_p = o.top_p;
  gp.sampling.min_p = o.min_p;
  gp.sampling.repeat_penalty = o.repeat_penalty;
  gp.sampling.seed = o.seed;
  gp.max_tokens = o.n_predict;
  gp.context_shift = o.context_shift;
  gp.stop_at_eog = !o.ignore_eos;

  if (o.raw) {  // echo the prompt, as a completion does
    std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
    std::fflush(stdout);
  }
  auto r = s.generate(prompt, gp, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  if (!r.ok()) {
    std::fprintf(stderr, "loom run: %s\n", r.message().c_str());
    return 1;
  }
  const GenerateStats& st = *r;
  std::fprintf(stderr, "\nloom run: %s | %s\n", e->model->describe().c_str(),
               e->backend_name().c_str());
  std::fprintf(stderr, "loom run: prompt %lld tokens in %.1f ms (%.1f tokens/s)%s\n",
               static_cast<long long>(st.n_prompt), st.prefill_ms,
               st.prefill_ms > 0 ? 1000.0 * static_cast<double>(st.n_prompt) / st.prefill_ms : 0.0,
               st.n_reused ? " (cache reused)" : "");
  const double gen_tps =
      st.decode_ms > 0 ? 1000.0 * static_cast<double>(st.n_generated) / st.decode_ms : 0.0;
  std::fprintf(stderr, "loom run: generated %lld tokens in %.1f ms (%.1f tokens/s), stopped: %s\n",
               static_cast<long long>(st.n_generated), st.decode_ms, gen_tps,
               stop_reason_text(st.reason));
  return 0;
}

}  // namespace loom::cli
