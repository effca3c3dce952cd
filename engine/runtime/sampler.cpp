#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace loom {

Sampler::Sampler(const SamplerParams& p, int64_t n_vocab)
    : p_(p), n_vocab_(n_vocab), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits_in, std::span<const int32_t> history) {
  logits_.assign(logits_in, logits_in + n_vocab_);
  // Repetition penalty (CTRL-style, as llama.cpp): positive logits are divided,
  // negative ones multiplied, once per distinct recent token.
  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0) {
    const size_t n = p_.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(p_.repeat_last_n));
    std::vector<int32_t> recent(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    std::sort(recent.begin(), recent.end());
    recent.erase(std::unique(recent.begin(), recent.end()), recent.end());
    for (int32_t id : recent) {
      if (id < 0 || id >= n_vocab_) continue;
      float& l = logits_[static_cast<size_t>(id)];
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
  }
  if (p_.temperature <= 0.0f) {
    // Greedy: the first maximum, as argmax does.
    return static_cast<int32_t>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
  }

  // Nothing to cut by rank (no top-k, no top-p: OpenAI's defaults): draw
  // over the whole vocabulary in its own order, with min-p as a floor on the
  // probability, without sorting it (a full sort of 32k+ logits per token
  // is milliseconds on the thread that runs every sequence's steps).
  const bool ranked = (p_.top_k > 0 && p_.top_k < n_vocab_) || p_.top_p < 1.0f;
  if (!ranked) {
    const float max_l = *std::max_element(logits_.begin(), logits_.end());
    // min-p: p_i >= min_p * p_max, i.e. logit_i >= max_l + log(min_p).
    const double floor_l =
        p_.min_p > 0.0f ? static_cast<double>(max_l) + std::log(static_cast<double>(p_.min_p))
                        : -INFINITY;
    weights_.resize(static_cast<size_t>(n_vocab_));
    double wsum = 0;
    for (int64_t i = 0; i < n_vocab_; ++i) {
      const double l = logits_[static_cast<size_t>(i)];
      const double w = l >= floor_l ? std::exp((l - max_l) / p_.temperature) : 0.0;
      weights_[static_cast<size_t>(i)] = w;
      wsum += w;
    }
    std::uniform_real_distribution<double> u(0.0, wsum);
    double r = u(rng_);
    int32_t last = 0;
    for (int64_t i = 0; i < n_vocab_; ++i) {
      const double w = weights_[static_cast<size_t>(i)];
      if (w <= 0) continue;
      last = static_cast<int32_t>(i);
      r -= w;
      if (r < 0) return last;
    }
    return last;
  }

  cand_.resize(static_cast<size_t>(n_vocab_));
  for (int64_t i = 0; i < n_vocab_; ++i)
    cand_[static_cast<size_t>(i)] = {static_cast<int32_t>(i), logits_[static_cast<size_t>(i)]};
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = cand_.size();
  double total = -1;  // top-p alone: the whole vocabulary's sum of exp(logit - max)
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    // Top-p alone: only the head that reaches top_p is needed in order.
    // Sort a head of 64 candidates, then 1,024, then all, until its
    // probability mass (against the whole vocabulary's) reaches top_p; a
    // full sort of 32k+ logits per token costs milliseconds.
    const float max_l =
        std::max_element(cand_.begin(), cand_.end(), [](const auto& a, const auto& b) {
          return a.logit < b.logit;
        })->logit;
    total = 0;
    for (const Candidate& c : cand_) total += std::exp(static_cast<double>(c.logit) - max_l);
    size_t head = std::min<size_t>(64, n);
    for (;;) {
      std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(head),
                        cand_.end(), by_logit);
      double mass = 0;
      for (size_t i = 0; i < head; ++i)
        mass += std::exp(static_cast<double>(cand_[i].logit) - max_l);
      // A margin for the sums' rounding: the cut below is made on the
      // sorted head's own sums.
      if (head == n || mass >= (static_cast<double>(p_.top_p) + 1e-9) * total) break;
      head = std::min(n, head * 16);
    }
    n = head;
  }
  // Probabilities of the survivors (sorted, descending).
  std::vector<double> prob(n);
  const double max_l = cand_[0].logit;
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    sum += prob[i] = std::exp(static_cast<double>(cand_[i].logit) - max_l);
  if (total > 0) sum = total;  // the head's probabilities against every token's
  for (double& p : prob) p /= sum;
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<size_t>(1, keep);
  }
  if (p_.min_p > 0.0f) {
    const double floor = prob[0] * p_.min_p;
    size_t keep = 1;
    while (keep < n && prob[keep] >= floor) ++keep;
    n = keep;
  }
  // Temperature on what is left, then draw.
  std::vector<double> w(n);
  double wsum = 0;
  for (size_t i = 0; i < n; ++i) {
    wsum += w[i] = std::exp((static_cast<double>(cand_[i].logit) - max_l) / p_.temperature);
  }
  std::uniform_real_distribution<double> u(0.0, wsum);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= w[i];
    if (r < 0) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

}  // namespace loom
