// Sampling: greedy, each filter on its own, penalties, seeded determinism.
#include "engine/runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
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

// Top-p alone sorts only a head of the vocabulary, grown until it holds
// top_p of the mass: every draw is in the set a full sort keeps, for a
// peaked distribution (a head of 64 suffices) and a flat one (the head
// grows to the whole vocabulary).
TEST(Sampler, TopPAloneKeepsWhatAFullSortKeeps) {
  const int64_t n_vocab = 50000;
  for (const float spread : {4000.0f, 0.01f}) {
    SCOPED_TRACE("spread " + std::to_string(spread));
    std::vector<float> l(static_cast<size_t>(n_vocab));
    uint64_t x = 12345;
    for (float& v : l) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      v = spread * static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0);
    }
    // The full sort's keep set.
    std::vector<int32_t> order(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)] ||
             (l[static_cast<size_t>(a)] == l[static_cast<size_t>(b)] && a < b);
    });
    const double mx = l[static_cast<size_t>(order[0])];
    double total = 0;
    for (float v : l) total += std::exp(static_cast<double>(v) - mx);
    std::vector<bool> kept(static_cast<size_t>(n_vocab), false);
    double cum = 0;
    size_t n_kept = 0;
    for (int32_t id : order) {
      kept[static_cast<size_t>(id)] = true;
      ++n_kept;
      cum += std::exp(static_cast<double>(l[static_cast<size_t>(id)]) - mx) / total;
      if (cum >= 0.9) break;
    }
    SamplerParams p;
    p.top_k = 0;
    p.top_p = 0.9f;
    p.min_p = 0.0f;
    p.temperature = 1.0f;
    Sampler s(p, n_vocab);
    std::map<int32_t, int> h;
    const int draws = spread < 1.0f ? 60 : 500;
    for (int i = 0; i < draws; ++i) {
      const int32_t t = s.sample(l.data(), {});
      ASSERT_TRUE(t >= 0 && t < n_vocab && kept[static_cast<size_t>(t)]) << t;
      ++h[t];
    }
    if (spread < 1.0f)
      EXPECT_GT(n_kept, 40000u);  // the flat case keeps most tokens
    else
      EXPECT_LT(n_kept, 5000u);
    EXPECT_GT(h.size(), 10u);
  }
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
