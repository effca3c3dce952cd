#include "engine/runtime/quality.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

namespace loom {

Result<int64_t> count_windows(int64_t n_tokens, const WindowOptions& o) {
  if (o.n_ctx < 4) {
    return make_error(ErrorCode::kInvalidArgument,
                      "windows of %" PRId64 " tokens are too short (at least 4)", o.n_ctx);
  }
  const int64_t stride = o.stride > 0 ? o.stride : o.n_ctx;
  if (stride > o.n_ctx) {
    return make_error(ErrorCode::kInvalidArgument,
                      "a stride of %" PRId64 " would skip tokens between windows of %" PRId64,
                      stride, o.n_ctx);
  }
  if (n_tokens < o.n_ctx) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the text has %" PRId64 " tokens, fewer than one window of %" PRId64
                      " (a longer text, or a smaller --ctx)",
                      n_tokens, o.n_ctx);
  }
  int64_t n = (n_tokens - o.n_ctx) / stride + 1;
  if (o.max_windows > 0) n = std::min(n, o.max_windows);
  return n;
}

Status eval_window(Session& s, std::span<const int32_t> tokens, const WindowOptions& o,
                   int64_t index, WindowLogits* out) {
  LOOM_ASSIGN_OR_RETURN(const int64_t n_windows,
                        count_windows(static_cast<int64_t>(tokens.size()), o));
  if (index < 0 || index >= n_windows) {
    return make_error(ErrorCode::kInvalidArgument, "window %" PRId64 " of %" PRId64, index,
                      n_windows);
  }
  if (s.n_ctx() < o.n_ctx) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the session's context (%" PRId64 ") is shorter than a window (%" PRId64 ")",
                      s.n_ctx(), o.n_ctx);
  }
  const int64_t stride = o.stride > 0 ? o.stride : o.n_ctx;
  const int64_t start = index * stride;
  std::vector<int32_t> win(tokens.begin() + start, tokens.begin() + start + o.n_ctx);
  const Vocab& vocab = s.model().tokenizer->vocab();
  if (vocab.add_bos() && vocab.special().bos >= 0) win[0] = vocab.special().bos;

  const int64_t first = first_scored(o);
  const int64_t n_scored = scored_per_window(o);
  const int64_t n_vocab = s.model().hp.n_vocab;
  out->logits.resize(static_cast<size_t>(n_scored * n_vocab));
  out->targets.assign(win.begin() + first + 1, win.end());
  std::vector<float> last(static_cast<size_t>(n_vocab));
  s.reset();
  ForwardPass& f = s.forward();
  // The first half without logits, then the scored rows (the last token is
  // only a target). The cache is causal, so this equals one evaluation.
  Status st = f.eval(std::span<const int32_t>(win.data(), static_cast<size_t>(first)), 0,
                     last.data(), false);
  if (st.ok()) {
    st = f.eval(std::span<const int32_t>(win.data() + first, static_cast<size_t>(n_scored)), first,
                out->logits.data(), true);
  }
  s.reset();
  return st;
}

double token_nll(const float* logits, int64_t n_vocab, int32_t target) {
  float mx = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  return std::log(sum) - static_cast<double>(logits[target] - mx);
}

double kl_divergence(const float* p_logits, const float* q_logits, int64_t n_vocab) {
  float pm = p_logits[0], qm = q_logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) {
    pm = std::max(pm, p_logits[i]);
    qm = std::max(qm, q_logits[i]);
  }
  double ps = 0, qs = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    ps += std::exp(static_cast<double>(p_logits[i] - pm));
    qs += std::exp(static_cast<double>(q_logits[i] - qm));
  }
  const double plse = std::log(ps), qlse = std::log(qs);
  double kl = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const double lp = static_cast<double>(p_logits[i] - pm) - plse;
    const double lq = static_cast<double>(q_logits[i] - qm) - qlse;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for equal rows
}

int32_t argmax(const float* logits, int64_t n_vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < n_vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

double NllStats::ppl() const {
  return std::exp(mean());
}

double NllStats::ppl_stderr() const {
  if (n < 2) return 0.0;
  const double m = mean();
  const double var =
      (sum2 / static_cast<double>(n) - m * m) * static_cast<double>(n) / static_cast<double>(n - 1);
  if (var <= 0) return 0.0;
  return ppl() * std::sqrt(var / static_cast<double>(n));
}

Result<PerplexityResult> perplexity(Session& s, std::span<const int32_t> tokens,
                                    const WindowOptions& o,
                                    const std::function<bool(int64_t, double)>& on_window) {
  LOOM_ASSIGN_OR_RETURN(const int64_t n_windows,
                        count_windows(static_cast<int64_t>(tokens.size()), o));
  PerplexityResult r;
  const int64_t n_vocab = s.model().hp.n_vocab;
  WindowLogits w;
  for (int64_t i = 0; i < n_windows; ++i) {
    LOOM_TRY(eval_window(s, tokens, o, i, &w));
    for (size_t t = 0; t < w.targets.size(); ++t) {
      r.nll.add(
          token_nll(w.logits.data() + t * static_cast<size_t>(n_vocab), n_vocab, w.targets[t]));
    }
    r.n_windows = i + 1;
    r.running_ppl.push_back(r.nll.ppl());
    if (on_window && !on_window(i, r.nll.ppl())) {
      return make_error(ErrorCode::kCancelled, "perplexity cancelled");
    }
  }
  return r;
}

double KlResult::kl_mean() const {
  if (kl.empty()) return 0.0;
  double s = 0;
  for (double x : kl) s += x;
  return s / static_cast<double>(kl.size());
}

double KlResult::kl_mean_stderr() const {
  const auto n = static_cast<double>(kl.size());
  if (kl.size() < 2) return 0.0;
  const double m = kl_mean();
  double v = 0;
  for (double x : kl) v += (x - m) * (x - m);
  return std::sqrt(v / (n - 1) / n);
}

double KlResult::kl_quantile(double q) const {
  if (kl.empty()) return 0.0;
  std::vector<double> v = kl;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

Result<KlResult> kl_compare(Session& base, Session& other, std::span<const int32_t> tokens,
                            const WindowOptions& o,
                            const std::function<bool(int64_t, const KlResult&)>& on_window) {
  const int64_t n_vocab = base.model().hp.n_vocab;
  if (other.model().hp.n_vocab != n_vocab) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the models' vocabularies differ (%" PRId64 " and %" PRId64
                      " tokens): their distributions cannot be compared",
                      n_vocab, other.model().hp.n_vocab);
  }
  LOOM_ASSIGN_OR_RETURN(const int64_t n_windows,
                        count_windows(static_cast<int64_t>(tokens.size()), o));
  KlResult r;
  WindowLogits a, b;
  for (int64_t i = 0; i < n_windows; ++i) {
    LOOM_TRY(eval_window(base, tokens, o, i, &a));
    LOOM_TRY(eval_window(other, tokens, o, i, &b));
    for (size_t t = 0; t < a.targets.size(); ++t) {
      const float* pa = a.logits.data() + t * static_cast<size_t>(n_vocab);
      const float* pb = b.logits.data() + t * static_cast<size_t>(n_vocab);
      r.kl.push_back(kl_divergence(pa, pb, n_vocab));
      if (argmax(pa, n_vocab) == argmax(pb, n_vocab)) ++r.same_top1;
      r.base.add(token_nll(pa, n_vocab, a.targets[t]));
      r.other.add(token_nll(pb, n_vocab, b.targets[t]));
    }
    r.n_windows = i + 1;
    if (on_window && !on_window(i, r)) return make_error(ErrorCode::kCancelled, "kl cancelled");
  }
  return r;
}

}  // namespace loom
