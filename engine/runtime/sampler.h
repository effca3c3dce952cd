// Token sampling: repetition penalty, then top-k, top-p, min-p, temperature
// and a seeded draw (llama.cpp's default order). Temperature <= 0 is greedy.
// Deterministic for a given seed and history.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace loom {

struct SamplerParams {
  float temperature = 0.8f;     ///< <= 0: greedy (argmax)
  int32_t top_k = 40;           ///< <= 0: off
  float top_p = 0.95f;          ///< >= 1: off
  float min_p = 0.05f;          ///< <= 0: off
  float repeat_penalty = 1.0f;  ///< 1: off; > 1 penalises tokens seen in the last repeat_last_n
  int32_t repeat_last_n = 64;
  uint64_t seed = 0xC0FFEE;
};

class Sampler {
 public:
  Sampler(const SamplerParams& p, int64_t n_vocab);
  const SamplerParams& params() const { return p_; }
  /// Picks the next token from logits [n_vocab]; `history` is every token so
  /// far (prompt and generated), for the repetition penalty.
  int32_t sample(const float* logits, std::span<const int32_t> history);
  /// Restarts the random sequence.
  void reseed(uint64_t seed) { rng_.seed(seed); }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  SamplerParams p_;
  int64_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<Candidate> cand_;
  std::vector<float> logits_;
  std::vector<double> weights_;  ///< the unranked draw's weights, by token id
};

}  // namespace loom
