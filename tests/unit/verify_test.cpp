// loom verify (engine/runtime/verify.h): per layer and op group, the error of
// a layer's output against the double reference. F32 on the CPU is close to
// it everywhere; a Q4_0 FFN in one layer shows in that layer's ffn column
// and nowhere else; ForwardPass::eval_layer's checks.
#include "engine/runtime/verify.h"

#include <gtest/gtest.h>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/reference.h"
#include "tests/ref_forward.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::unique_ptr<Model> synth_model(const std::string& name, const std::string& arch = "llama") {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 3;
  s.n_embd = 128;
  s.n_ff = 256;
  s.n_head_kv = arch == "phi3" ? 4 : 2;
  s.seed = 9;
  s.sliding_window = 4;
  const std::string path = test::temp_dir("verify_" + name) + "/m.gguf";
  EXPECT_TRUE(write_synthetic_model(s, path).ok());
  auto m = load_model(path);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

const std::vector<int32_t> kTokens = {0, 77, 301, 5, 122, 9, 260, 33, 12, 250, 40, 41};

TEST(Verify, F32OnTheCpuIsCloseEverywhere) {
  for (const char* arch : {"llama", "qwen2", "phi3", "qwen3", "gemma2"}) {
    auto m = synth_model(std::string("f32_") + arch, arch);
    ASSERT_TRUE(m);
    CpuBackend cpu(2);
    auto r = verify_placement(*m, cpu, nullptr, Placement::uniform(3, Unit::kCpu), kTokens);
    ASSERT_TRUE(r.ok()) << r.message();
    ASSERT_EQ(r->rows.size(), 3u);
    for (const VerifyRow& row : r->rows) {
      for (double e : row.group) EXPECT_LT(e, 1e-3) << arch << " layer " << row.layer;
      EXPECT_LT(row.all, 1e-3) << arch;
      EXPECT_LT(row.all_delta, 1e-2) << arch;
      EXPECT_GT(row.all, 0.0);
    }
  }
}

// The reference chain, through the output matrix, gives the tests' own
// reference logits: both read the architecture the same way.
TEST(Verify, ReferenceMatchesTheTestsReference) {
  auto m = synth_model("ref");
  ASSERT_TRUE(m);
  auto x = reference_embed(*m, kTokens);
  ASSERT_TRUE(x.ok());
  std::vector<double> h = *x;
  for (int64_t l = 0; l < 3; ++l) {
    auto y = reference_layer(*m, l, h, static_cast<int64_t>(kTokens.size()));
    ASSERT_TRUE(y.ok()) << y.message();
    h = *y;
  }
  // The last token's logits from the final hidden state.
  const int64_t n = m->hp.n_embd, T = static_cast<int64_t>(kTokens.size());
  std::vector<float> last(h.begin() + (T - 1) * n, h.end());
  CpuBackend cpu(1);
  std::vector<float> xb(static_cast<size_t>(n)), logits(static_cast<size_t>(m->hp.n_vocab));
  cpu.rms_norm(Act{last.data(), 1, n}, m->output_norm, m->hp.rms_eps, Act{xb.data(), 1, n});
  cpu.matmul(m->output, Act{xb.data(), 1, n}, Act{logits.data(), 1, m->hp.n_vocab}, nullptr);
  const auto ref = test::reference_logits(*m, kTokens);
  EXPECT_LT(test::normalized_error(logits, ref.back()), 1e-5);
}

TEST(Verify, AQuantizedGroupShowsInItsColumn) {
  auto m = synth_model("q4");
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  Placement p = Placement::uniform(3, Unit::kCpu);
  p.layers[1][OpGroup::kFfn].dtype = DType::kQ4_0;
  p.strategy = "custom";
  auto r = verify_placement(*m, cpu, nullptr, p, kTokens);
  ASSERT_TRUE(r.ok()) << r.message();
  const auto ffn = static_cast<size_t>(OpGroup::kFfn),
             attn_w = static_cast<size_t>(OpGroup::kAttnW);
  EXPECT_GT(r->rows[1].group[ffn], 10 * r->rows[0].group[ffn]);
  EXPECT_GT(r->rows[1].group[ffn], 10 * r->rows[2].group[ffn]);
  EXPECT_LT(r->rows[1].group[attn_w], 1e-3);
  EXPECT_GT(r->rows[1].all, 10 * r->rows[0].all);
  EXPECT_EQ(r->placement.layers[1][OpGroup::kFfn].dtype, DType::kQ4_0);
}

TEST(Verify, BadArguments) {
  auto m = synth_model("bad");
  ASSERT_TRUE(m);
  CpuBackend cpu(1);
  EXPECT_FALSE(verify_placement(*m, cpu, nullptr, Placement::uniform(3, Unit::kCpu), {}).ok());
  auto wrong = verify_placement(*m, cpu, nullptr, Placement::uniform(5, Unit::kCpu), kTokens);
  EXPECT_FALSE(wrong.ok());
  KvCacheConfig kc{3, m->hp.n_head_kv, m->hp.head_dim, 64, 16, DType::kF16};
  auto kv = KvCache::create(kc);
  ASSERT_TRUE(kv.ok());
  ForwardPass f(*m, cpu, **kv, 8);
  std::vector<float> x(static_cast<size_t>(16 * m->hp.n_embd)), y(x.size());
  EXPECT_FALSE(f.eval_layer(3, x.data(), 4, y.data()).ok());
  EXPECT_FALSE(f.eval_layer(0, x.data(), 16, y.data()).ok());  // over max_chunk
  EXPECT_TRUE(f.eval_layer(0, x.data(), 8, y.data()).ok());
  EXPECT_EQ((*kv)->n_tokens(), 0);
}

}  // namespace
}  // namespace loom
