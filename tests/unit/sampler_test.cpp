// Sampling: greedy, each filter on its own, penalties, seeded determinism.
#include "engine/runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace loom {
namespace {

std::vector<float> logits5() {
  return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f};
}

TEST(Sampler, GreedyPicksTheMaximum) {
  SamplerParams p;
  p.temperature = 0;
  Sampler s(p, 5);
  auto l = logits5();
  EXPECT_EQ(s.sample(l.data(), {}), 1);
}

TEST(Sampler, RepetitionPenaltyChangesTheGreedyChoice) {
  SamplerParams p;
  p.temperature = 0;
  p.repeat_penalty = 1.5f;
  Sampler s(p, 5);
  auto l = logits5();
  std::vector<int32_t> hist = {1};
  EXPECT_EQ(s.sample(l.data(), hist), 4);  // 3.0 / 1.5 = 2.0 < 2.9
}

std::map<int32_t, int> histogram(SamplerParams p, int n) {
  Sampler s(p, 5);
  auto l = logits5();
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.sample(l.data(), {})];
  return h;
}

TEST(Sampler, TopKKeepsOnlyKCandidates) {
  SamplerParams p;
  p.top_k = 2;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.temperature = 1.0f;
  auto h = histogram(p, 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(1) && h.count(4));
}

TEST(Sampler, TopPCutsTheTail) {
  SamplerParams p;
  p.top_k = 0;
  p.top_p = 0.5f;
  p.min_p = 0.0f;
  p.temperature = 1.0f;
  auto h = histogram(p, 2000);
  // softmax: 3.0 -> 0.37, 2.9 -> 0.33: the first two reach 0.5.
  EXPECT_EQ(h.size(), 2u);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplerParams p;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keep p >= 0.5 * p_max: logits >= 3 - ln 2 = 2.31
  p.temperature = 1.0f;
  auto h = histogram(p, 2000);
  EXPECT_EQ(h.size(), 2u);
}

// Without top-k and top-p the draw goes over the vocabulary unsorted: it must
// follow softmax(logits / T) all the same (and the ranked draw, for the same
// figures: top-k of the whole vocabulary cuts nothing).
TEST(Sampler, UnrankedDrawFollowsTheSoftmax) {
  auto l = logits5();
  for (const float temp : {1.0f, 0.7f}) {
    double z = 0;
    std::vector<double> want;
    for (float x : l) want.push_back(std::exp(x / temp)), z += want.back();
    for (double& w : want) w /= z;
    for (const int top_k : {0, 5}) {
      SamplerParams p;
      p.top_k = top_k;  // 5 = the vocabulary: the ranked path, nothing cut
      p.top_p = 1.0f;
      p.min_p = 0.0f;
      p.temperature = temp;
      p.seed = 99;
      constexpr int kN = 20000;
      auto h = histogram(p, kN);
      for (int32_t id = 0; id < 5; ++id) {
        const double got = static_cast<double>(h[id]) / kN;
        // 4.5 standard deviations of a binomial proportion.
        const double sd =
            std::sqrt(want[static_cast<size_t>(id)] * (1 - want[static_cast<size_t>(id)]) / kN);
        EXPECT_NEAR(got, want[static_cast<size_t>(id)], 4.5 * sd)
            << "token " << id << " T " << temp << " top_k " << top_k;
      }
    }
  }
}

TEST(Sampler, LowTemperatureConcentrates) {
  SamplerParams p;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.temperature = 0.05f;
  auto h = histogram(p, 1000);
  EXPECT_GT(h[1], 850);
}

TEST(Sampler, SameSeedSameSequence) {
  SamplerParams p;
  p.top_k = 0;
  p.min_p = 0;
  p.temperature = 1.5f;
  p.seed = 1234;
  Sampler a(p, 5), b(p, 5);
  auto l = logits5();
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.sample(l.data(), {}), b.sample(l.data(), {}));
  p.seed = 1235;
  Sampler c(p, 5);
  Sampler d(SamplerParams{p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                          p.repeat_last_n, 1234},
            5);
  int diff = 0;
  for (int i = 0; i < 100; ++i) diff += c.sample(l.data(), {}) != d.sample(l.data(), {});
  EXPECT_GT(diff, 0);
}

}  // namespace
}  // namespace loom
