// Perplexity and KL divergence (engine/runtime/quality.h): the window layout,
// the per-token formulas, perplexity against the double-precision reference
// forward, and KL of a model against itself and against its Q4_0 copy.
#include "engine/runtime/quality.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/ref_forward.h"
#include "tests/test_util.h"

namespace loom {
namespace {

const char* kText =
    "Once upon a time there was a little girl who lived in a village near the forest. "
    "Whenever she went out, the little girl wore a red riding cloak, so everyone in the "
    "village called her Little Red Riding Hood. One morning she asked her mother if she "
    "could go to visit her grandmother, as it had been a while since they had seen each other.";

std::unique_ptr<Model> synth_model(const std::string& name, const std::string& dtype = "f32") {
  SynthSpec s;
  s.n_layer = 2;
  s.n_embd = 64;
  s.n_ff = 128;
  s.n_ctx = 128;
  s.weight_type = dtype;
  s.seed = 11;
  const std::string path = test::temp_dir("quality_" + name) + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  auto m = load_model(path);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<Session> session(const Model& m, Backend& be, int64_t n_ctx) {
  SessionConfig sc;
  sc.n_ctx = n_ctx;
  sc.max_chunk = 8;  // windows span several forward steps
  auto s = Session::create(m, be, sc);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(QualityWindows, CountAndErrors) {
  WindowOptions o;
  o.n_ctx = 16;
  EXPECT_EQ(*count_windows(16, o), 1);
  EXPECT_EQ(*count_windows(47, o), 2);
  EXPECT_EQ(*count_windows(48, o), 3);
  o.stride = 8;
  EXPECT_EQ(*count_windows(48, o), 5);
  o.max_windows = 2;
  EXPECT_EQ(*count_windows(48, o), 2);
  EXPECT_EQ(first_scored(o), 8);
  EXPECT_EQ(scored_per_window(o), 7);

  auto short_text = count_windows(10, WindowOptions{16, 0, 0});
  ASSERT_FALSE(short_text.ok());
  EXPECT_NE(short_text.message().find("10 tokens"), std::string::npos) << short_text.message();
  EXPECT_FALSE(count_windows(100, WindowOptions{2, 0, 0}).ok());
  auto gap = count_windows(100, WindowOptions{16, 20, 0});
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.message().find("skip"), std::string::npos) << gap.message();
}

TEST(QualityFormulas, NllKlArgmax) {
  const std::vector<float> flat(10, 0.5f);
  EXPECT_NEAR(token_nll(flat.data(), 10, 3), std::log(10.0), 1e-12);
  EXPECT_EQ(kl_divergence(flat.data(), flat.data(), 10), 0.0);
  // Two tokens: P = (1/2, 1/2), Q = softmax(0, ln 3) = (1/4, 3/4).
  const float p[2] = {1.0f, 1.0f};
  const float q[2] = {0.0f, static_cast<float>(std::log(3.0))};
  const double want = 0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75);
  EXPECT_NEAR(kl_divergence(p, q, 2), want, 1e-7);
  EXPECT_GT(kl_divergence(q, p, 2), 0.0);
  const float r[4] = {1, 3, 3, 2};
  EXPECT_EQ(argmax(r, 4), 1);

  NllStats st;
  for (double x : {1.0, 2.0, 3.0}) st.add(x);
  EXPECT_NEAR(st.ppl(), std::exp(2.0), 1e-12);
  EXPECT_NEAR(st.ppl_stderr(), std::exp(2.0) * std::sqrt(1.0 / 3.0), 1e-9);

  KlResult k;
  k.kl = {0.0, 4.0, 1.0, 3.0, 2.0};
  EXPECT_DOUBLE_EQ(k.kl_mean(), 2.0);
  EXPECT_DOUBLE_EQ(k.kl_quantile(0.5), 2.0);
  EXPECT_DOUBLE_EQ(k.kl_quantile(1.0), 4.0);
  EXPECT_NEAR(k.kl_quantile(0.99), 3.96, 1e-12);
}

// The engine's perplexity equals one computed from the double reference's
// logits of the same windows (BOS first, second half scored).
TEST(QualityPerplexity, MatchesReferenceForward) {
  auto m = synth_model("ppl");
  ASSERT_TRUE(m);
  const std::vector<int32_t> tokens = m->tokenizer->encode(kText, false, false);
  WindowOptions o;
  o.n_ctx = 24;
  ASSERT_GE(tokens.size(), 48u);
  CpuBackend be(2);
  auto s = session(*m, be, 32);
  ASSERT_TRUE(s);
  std::vector<double> running;
  auto r = perplexity(*s, tokens, o, [&](int64_t, double p) {
    running.push_back(p);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.message();
  const int64_t n_win = static_cast<int64_t>(tokens.size()) / 24;
  EXPECT_EQ(r->n_windows, n_win);
  EXPECT_EQ(r->nll.n, n_win * 11);
  EXPECT_EQ(running, r->running_ppl);

  NllStats want;
  const int32_t bos = m->tokenizer->vocab().special().bos;
  for (int64_t w = 0; w < n_win; ++w) {
    std::vector<int32_t> win(tokens.begin() + w * 24, tokens.begin() + (w + 1) * 24);
    if (m->tokenizer->vocab().add_bos() && bos >= 0) win[0] = bos;
    const auto ref = test::reference_logits(*m, win);
    for (int64_t j = 12; j < 23; ++j) {
      std::vector<float> row(ref[static_cast<size_t>(j)].begin(),
                             ref[static_cast<size_t>(j)].end());
      want.add(token_nll(row.data(), m->hp.n_vocab, win[static_cast<size_t>(j + 1)]));
    }
  }
  EXPECT_NEAR(r->nll.ppl(), want.ppl(), 2e-3 * want.ppl());
  EXPECT_GT(r->nll.ppl(), 1.0);
  EXPECT_GT(r->nll.ppl_stderr(), 0.0);
  EXPECT_TRUE(std::isfinite(r->nll.ppl_stderr()));
  // The session is left empty.
  EXPECT_EQ(s->kv().n_tokens(), 0);

  // A window longer than the session's context is an error, not a crash.
  WindowOptions too_long;
  too_long.n_ctx = 40;
  auto e = perplexity(*s, tokens, too_long);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("context"), std::string::npos) << e.message();
}

TEST(QualityKl, ModelAgainstItselfIsZero) {
  auto m = synth_model("kl_self");
  ASSERT_TRUE(m);
  const std::vector<int32_t> tokens = m->tokenizer->encode(kText, false, false);
  CpuBackend be(2);
  auto a = session(*m, be, 32), b = session(*m, be, 32);
  ASSERT_TRUE(a && b);
  WindowOptions o;
  o.n_ctx = 32;
  auto r = kl_compare(*a, *b, tokens, o);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_FALSE(r->kl.empty());
  EXPECT_EQ(r->kl_mean(), 0.0);
  EXPECT_EQ(r->kl_quantile(0.99), 0.0);
  EXPECT_EQ(r->top1_agreement(), 1.0);
  EXPECT_DOUBLE_EQ(r->base.ppl(), r->other.ppl());
}

// F32 against its own Q4_0 copy (requantized at load through the placement):
// the distributions move, and the perplexities differ.
TEST(QualityKl, F32AgainstQ4_0IsPositive) {
  auto m = synth_model("kl_q4");
  ASSERT_TRUE(m);
  const std::vector<int32_t> tokens = m->tokenizer->encode(kText, false, false);
  CpuBackend be(2);
  auto a = session(*m, be, 32), b = session(*m, be, 32);
  ASSERT_TRUE(a && b);
  Placement p = Placement::uniform(m->hp.n_layer, Unit::kCpu);
  p.embed.dtype = p.output.dtype = DType::kQ4_0;
  for (auto& l : p.layers) {
    for (auto& g : l.g) g.dtype = DType::kQ4_0;
  }
  ASSERT_TRUE(b->forward().set_placement(p).ok());
  ASSERT_TRUE(b->forward().prepare().ok());
  EXPECT_GT(b->forward().requant_bytes(), 0u);
  WindowOptions o;
  o.n_ctx = 32;
  auto r = kl_compare(*a, *b, tokens, o);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_GT(r->kl_mean(), 0.0);
  EXPECT_GT(r->kl_quantile(0.99), r->kl_quantile(0.5));
  EXPECT_NE(r->base.ppl(), r->other.ppl());
  EXPECT_LE(r->top1_agreement(), 1.0);
}

TEST(QualityKl, VocabulariesMustMatch) {
  auto m = synth_model("kl_vocab_a");
  ASSERT_TRUE(m);
  SynthSpec s;
  s.n_layer = 1;
  s.n_vocab = m->hp.n_vocab + 32;
  const std::string path = test::temp_dir("quality_kl_vocab_b") + "/m.gguf";
  ASSERT_TRUE(write_synthetic_model(s, path).ok());
  auto m2 = load_model(path);
  ASSERT_TRUE(m2.ok()) << m2.message();
  CpuBackend be(2);
  auto a = session(*m, be, 32), b = session(**m2, be, 32);
  const std::vector<int32_t> tokens = m->tokenizer->encode(kText, false, false);
  auto r = kl_compare(*a, *b, tokens, WindowOptions{32, 0, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("vocabularies differ"), std::string::npos) << r.message();
}

}  // namespace
}  // namespace loom
