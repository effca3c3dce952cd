// Perplexity and KL on the real stories260K model: its own greedy text
// (tests/data/stories260k_greedy_*.txt, llama.cpp's output) is far more
// likely to it than the same words shuffled, and its Q8_0 copy (attention and
// output matrices) stays closer to it than its Q4_0 copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/runtime/quality.h"
#include "engine/runtime/session.h"
#include "engine/runtime/verify.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::string greedy_texts() {
  std::string all;
  for (int i = 1; i <= 4; ++i) {
    std::ifstream f(std::string(LOOM_SOURCE_DIR) + "/tests/data/stories260k_greedy_" +
                        std::to_string(i) + ".txt",
                    std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    all += ss.str();
  }
  return all;
}

std::unique_ptr<Session> session(const Model& m, Backend& be) {
  SessionConfig sc;
  sc.n_ctx = 256;
  auto s = Session::create(m, be, sc);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(Stories260KQuality, PerplexityOfItsOwnTextIsLow) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const std::string text = greedy_texts();
  ASSERT_GT(text.size(), 2000u);
  std::vector<std::string> words;
  std::istringstream is(text);
  for (std::string w; is >> w;) words.push_back(w);
  std::shuffle(words.begin(), words.end(), std::mt19937(5));
  std::string shuffled;
  for (const auto& w : words) shuffled += w + " ";

  CpuBackend be(2);
  auto s = session(**m, be);
  ASSERT_TRUE(s);
  WindowOptions o;
  o.n_ctx = 128;
  auto own = perplexity(*s, (*m)->tokenizer->encode(text, false, false), o);
  ASSERT_TRUE(own.ok()) << own.message();
  auto mixed = perplexity(*s, (*m)->tokenizer->encode(shuffled, false, false), o);
  ASSERT_TRUE(mixed.ok()) << mixed.message();
  std::printf("stories260K: PPL of its greedy text %.4f +/- %.4f (%lld windows), shuffled %.4f\n",
              own->nll.ppl(), own->nll.ppl_stderr(), static_cast<long long>(own->n_windows),
              mixed->nll.ppl());
  EXPECT_GE(own->n_windows, 4);
  EXPECT_GT(own->nll.ppl(), 1.0);
  EXPECT_LT(own->nll.ppl(), 3.0);
  EXPECT_GT(mixed->nll.ppl(), 5 * own->nll.ppl());
}

TEST(Stories260KQuality, KlGrowsAsPrecisionDrops) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const std::vector<int32_t> tokens = (*m)->tokenizer->encode(greedy_texts(), false, false);
  CpuBackend be(2);
  WindowOptions o;
  o.n_ctx = 128;
  auto base = session(**m, be);
  ASSERT_TRUE(base);
  double kl[2];
  int i = 0;
  for (DType d : {DType::kQ8_0, DType::kQ4_0}) {
    auto other = session(**m, be);
    ASSERT_TRUE(other);
    Placement p = Placement::uniform((*m)->hp.n_layer, Unit::kCpu);
    // stories260K's FFN rows (172 values) fit no 32-value block: attention and output only.
    for (auto& l : p.layers) l[OpGroup::kAttnW].dtype = d;
    p.output.dtype = d;
    Status st = other->forward().set_placement(p);
    ASSERT_TRUE(st.ok()) << st.message();
    auto r = kl_compare(*base, *other, tokens, o);
    ASSERT_TRUE(r.ok()) << r.message();
    std::printf(
        "stories260K vs %s: KL mean %.6f median %.6f P99 %.6f, top-1 %.2f%%, PPL %.4f -> "
        "%.4f\n",
        std::string(dtype_name(d)).c_str(), r->kl_mean(), r->kl_quantile(0.5), r->kl_quantile(0.99),
        100 * r->top1_agreement(), r->base.ppl(), r->other.ppl());
    EXPECT_GT(r->kl_mean(), 0.0);
    EXPECT_GT(r->top1_agreement(), 0.8);
    kl[i++] = r->kl_mean();
  }
  EXPECT_LT(kl[0], kl[1]);
}

// loom verify on the real model: as stored (F32) every cell is close to the
// double reference; Q4_0 attention matrices show in every layer's attn_w cell.
TEST(Stories260KQuality, VerifyShowsTheQuantizedGroup) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const Model& model = **m;
  const std::vector<int32_t> tokens = model.tokenizer->encode(
      "Once upon a time, there was a little girl named Lily. She", true, false);
  CpuBackend cpu(2);
  const int64_t L = model.hp.n_layer;
  auto base = verify_placement(model, cpu, nullptr, Placement::uniform(L, Unit::kCpu), tokens);
  ASSERT_TRUE(base.ok()) << base.message();
  Placement q = Placement::uniform(L, Unit::kCpu);
  for (auto& l : q.layers) l[OpGroup::kAttnW].dtype = DType::kQ4_0;
  auto r = verify_placement(model, cpu, nullptr, q, tokens);
  ASSERT_TRUE(r.ok()) << r.message();
  const auto aw = static_cast<size_t>(OpGroup::kAttnW), ffn = static_cast<size_t>(OpGroup::kFfn);
  for (int64_t l = 0; l < L; ++l) {
    const VerifyRow& b = base->rows[static_cast<size_t>(l)];
    const VerifyRow& v = r->rows[static_cast<size_t>(l)];
    std::printf("layer %lld: attn_w F32 %.2e Q4_0 %.2e, layer %.2e -> %.2e\n",
                static_cast<long long>(l), b.group[aw], v.group[aw], b.all, v.all);
    for (double e : b.group) EXPECT_LT(e, 1e-3) << "layer " << l;
    EXPECT_GT(v.group[aw], 5 * b.group[aw]) << "layer " << l;
    EXPECT_DOUBLE_EQ(v.group[ffn], b.group[ffn]) << "layer " << l;
  }
}

}  // namespace
}  // namespace loom
