// What a precision costs, in numbers a user can compare: perplexity of a text,
// and the KL divergence of one model's next-token distributions from
// another's (`loom perplexity`, `loom kl`).
//
// Windows follow llama.cpp's perplexity tool: the text's tokens are cut into
// non-overlapping windows of n_ctx tokens (a stride below n_ctx makes them
// overlap); each window is evaluated from an empty cache, its first token
// replaced by BOS where the vocabulary adds one, and only the logits of its
// second half are scored: position j (n_ctx/2 <= j < n_ctx - 1) predicts token
// j + 1, so every scored token has at least n_ctx/2 tokens of context. The
// first half is evaluated without logits; only the scored rows are kept
// ([n_ctx - 1 - n_ctx/2, n_vocab] floats per window and model).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/runtime/session.h"

namespace loom {

struct WindowOptions {
  int64_t n_ctx = 512;      ///< tokens per window (at least 4)
  int64_t stride = 0;       ///< first tokens of consecutive windows this far apart; 0: n_ctx
  int64_t max_windows = 0;  ///< stop after this many windows; 0: all that fit in the text
};

/// Windows that fit in `n_tokens` tokens; an error says how many tokens are
/// needed when not even one fits, or when the options are out of range.
Result<int64_t> count_windows(int64_t n_tokens, const WindowOptions& o);
/// Index of the first scored position of a window (n_ctx / 2).
inline int64_t first_scored(const WindowOptions& o) {
  return o.n_ctx / 2;
}
/// Scored tokens per window.
inline int64_t scored_per_window(const WindowOptions& o) {
  return o.n_ctx - 1 - o.n_ctx / 2;
}

/// One window's scored logits: `logits` [n_scored, n_vocab], row i predicting `targets[i]`.
struct WindowLogits {
  std::vector<float> logits;
  std::vector<int32_t> targets;
};
/// Evaluates window `index` of `tokens` on `s` (its cache is reset before and after).
Status eval_window(Session& s, std::span<const int32_t> tokens, const WindowOptions& o,
                   int64_t index, WindowLogits* out);

/// -log p(target) under softmax(logits), in double.
double token_nll(const float* logits, int64_t n_vocab, int32_t target);
/// KL(P || Q) = sum_i p_i (log p_i - log q_i), P = softmax(p_logits), Q =
/// softmax(q_logits), in nats (0 when the two rows are equal).
double kl_divergence(const float* p_logits, const float* q_logits, int64_t n_vocab);
/// Index of the largest logit (the lowest index among equals).
int32_t argmax(const float* logits, int64_t n_vocab);

/// Negative log-likelihoods of scored tokens: PPL = exp(mean), and its
/// standard error from the NLLs' standard error (as llama.cpp reports it).
struct NllStats {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void add(double nll) {
    sum += nll;
    sum2 += nll * nll;
    ++n;
  }
  double mean() const { return n ? sum / static_cast<double>(n) : 0.0; }
  double ppl() const;
  /// Standard error of ppl() (first-order: ppl * standard error of the mean NLL).
  double ppl_stderr() const;
};

struct PerplexityResult {
  int64_t n_windows = 0;
  NllStats nll;
  std::vector<double> running_ppl;  ///< after each window
};
/// Perplexity of `tokens` on `s` (a context of at least o.n_ctx).
/// `on_window(i, running_ppl)` after each window; returning false stops (kCancelled).
Result<PerplexityResult> perplexity(Session& s, std::span<const int32_t> tokens,
                                    const WindowOptions& o,
                                    const std::function<bool(int64_t, double)>& on_window = {});

struct KlResult {
  int64_t n_windows = 0;
  std::vector<double> kl;  ///< per scored token, in order
  int64_t same_top1 = 0;   ///< tokens where both models' argmax agree
  NllStats base, other;
  double kl_mean() const;
  double kl_mean_stderr() const;
  /// Quantile q (0..1) of the per-token KL (linear interpolation between ranks).
  double kl_quantile(double q) const;
  double top1_agreement() const {
    return kl.empty() ? 0.0 : static_cast<double>(same_top1) / static_cast<double>(kl.size());
  }
};
/// KL divergence of `other`'s distributions from `base`'s over the same windows.
/// The two models must share the vocabulary size. `on_window(i, result so far)`.
Result<KlResult> kl_compare(Session& base, Session& other, std::span<const int32_t> tokens,
                            const WindowOptions& o,
                            const std::function<bool(int64_t, const KlResult&)>& on_window = {});

}  // namespace loom
