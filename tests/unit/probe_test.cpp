// loom probe (engine/runtime/probe.h): activation statistics per layer. The
// statistics themselves on known values; on a synthetic model they equal the
// statistics of the double reference's hidden states (and of the norms
// computed by the CPU backend from them); an embedding row scaled up shows
// in the outlier share; stories260K when the fixtures are there.
#include "engine/runtime/probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/reference.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::unique_ptr<Model> synth_model(const std::string& name, const std::string& arch = "llama") {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 3;
  s.n_embd = 128;
  s.n_ff = 256;
  s.n_head_kv = 2;
  s.seed = 11;
  const std::string path = test::temp_dir("probe_" + name) + "/m.gguf";
  EXPECT_TRUE(write_synthetic_model(s, path).ok());
  auto m = load_model(path);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

const std::vector<int32_t> kTokens = {0, 77, 301, 5, 122, 9, 260, 33, 12, 250, 40, 41};

// |a - b| within `tol` of the larger magnitude (and of 1e-6 absolute).
void expect_close(const ActStats& a, const ActStats& b, double tol, const std::string& what) {
  auto near = [&](double x, double y, const char* f) {
    EXPECT_LE(std::abs(x - y), tol * std::max({std::abs(x), std::abs(y), 1e-6}))
        << what << " " << f << ": " << x << " vs " << y;
  };
  near(a.min, b.min, "min");
  near(a.max, b.max, "max");
  near(a.mean, b.mean, "mean");
  near(a.std, b.std, "std");
  EXPECT_NEAR(a.outlier_share, b.outlier_share, 1.0 / static_cast<double>(a.n)) << what;
  EXPECT_EQ(a.n, b.n) << what;
}

ActStats stats_of(const std::vector<float>& f) {
  std::vector<double> d(f.begin(), f.end());
  return activation_stats(d);
}

TEST(Probe, StatsOfKnownValues) {
  const std::vector<double> x = {1, 2, 3, 4};
  const ActStats s = activation_stats(x);
  EXPECT_EQ(s.n, 4);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.std, std::sqrt(1.25));
  EXPECT_EQ(s.outlier_share, 0);

  // 999 values of +-1 and one of 1000: std ~31.6, so 1000 is beyond 6 std, the others are not.
  std::vector<double> y(1000);
  for (size_t i = 0; i < y.size(); ++i) y[i] = i % 2 ? 1.0 : -1.0;
  y[500] = 1000;
  EXPECT_DOUBLE_EQ(activation_stats(y).outlier_share, 1.0 / 1000);
  EXPECT_EQ(activation_stats(std::vector<double>{}).n, 0);
}

TEST(Probe, EqualsTheReferencesHiddenStates) {
  for (const char* arch : {"llama", "qwen2", "gemma2"}) {
    auto m = synth_model(std::string("ref_") + arch, arch);
    ASSERT_TRUE(m);
    const HParams& hp = m->hp;
    const auto T = static_cast<int64_t>(kTokens.size());
    int64_t seen = -1;
    auto r = probe_model(*m, kTokens, [&](int64_t l) {
      seen = l;
      return true;
    });
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(seen, hp.n_layer - 1);
    ASSERT_EQ(static_cast<int64_t>(r->rows.size()), hp.n_layer);
    EXPECT_EQ(r->n_tokens, T);

    // The reference chain without taps; the norms by the CPU backend in float.
    CpuBackend cpu(1);
    auto norm = [&](const std::vector<double>& x, const Weight& w) {
      std::vector<float> xf(x.begin(), x.end()), y(xf.size());
      cpu.rms_norm(Act{xf.data(), T, hp.n_embd}, w, hp.rms_eps, Act{y.data(), T, hp.n_embd});
      return y;
    };
    auto x = reference_embed(*m, kTokens);
    ASSERT_TRUE(x.ok());
    std::vector<double> h = *x;
    expect_close(r->embd, activation_stats(h), 1e-12, std::string(arch) + " embd");
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      const std::string at = std::string(arch) + " layer " + std::to_string(l);
      const ProbeRow& row = r->rows[static_cast<size_t>(l)];
      EXPECT_EQ(row.layer, l);
      expect_close(row.attn_in, stats_of(norm(h, m->layers[static_cast<size_t>(l)].attn_norm)),
                   1e-4, at + " attn_in");
      auto y = reference_layer(*m, l, h, T);
      ASSERT_TRUE(y.ok()) << y.message();
      h = *y;
      expect_close(row.out, activation_stats(h), 1e-12, at + " out");
      // ffn_in: normalized rows, scaled by ffn_norm: a spread of the order of the norm's weights.
      EXPECT_EQ(row.ffn_in.n, T * hp.n_embd) << at;
      EXPECT_GT(row.ffn_in.std, 0) << at;
      EXPECT_TRUE(std::isfinite(row.ffn_in.max)) << at;
    }
    expect_close(r->final_norm, stats_of(norm(h, m->output_norm)), 1e-4,
                 std::string(arch) + " final");
  }
}

TEST(Probe, APlantedOutlierShowsInTheOutlierShare) {
  auto m = synth_model("outlier");
  ASSERT_TRUE(m);
  auto before = probe_model(*m, kTokens);
  ASSERT_TRUE(before.ok()) << before.message();

  // Token 122's embedding row x1000, in a copy of the table.
  ASSERT_EQ(m->tok_embd.dtype, DType::kF32);
  const size_t n = static_cast<size_t>(m->hp.n_embd);
  std::vector<float> table(static_cast<size_t>(m->tok_embd.n_out) * n);
  std::memcpy(table.data(), m->tok_embd.data, table.size() * sizeof(float));
  for (size_t i = 0; i < n; ++i) table[122 * n + i] *= 1000.0f;
  m->tok_embd.data = table.data();
  auto after = probe_model(*m, kTokens);
  ASSERT_TRUE(after.ok()) << after.message();

  EXPECT_EQ(before->embd.outlier_share, 0);
  EXPECT_GT(after->embd.outlier_share, 0);
  EXPECT_LE(after->embd.outlier_share, 1.0 / static_cast<double>(kTokens.size()));
  EXPECT_GT(after->embd.max, 100 * before->embd.max);
  // The residual stream carries it on; the norms take it out of the matmuls' inputs.
  EXPECT_GT(after->rows[0].out.outlier_share, before->rows[0].out.outlier_share);
  EXPECT_LT(after->rows[0].attn_in.max, 2 * before->rows[0].attn_in.max + 1);
}

TEST(Probe, RejectsBadTokenCounts) {
  auto m = synth_model("bad");
  ASSERT_TRUE(m);
  EXPECT_FALSE(probe_model(*m, std::vector<int32_t>{}).ok());
  EXPECT_FALSE(probe_model(*m, std::vector<int32_t>(257, 1)).ok());
  auto c = probe_model(*m, kTokens, [](int64_t) { return false; });
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), ErrorCode::kCancelled);
}

TEST(Probe, Stories260K) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const std::vector<int32_t> tokens =
      (*m)->tokenizer->encode("Once upon a time, there was a little girl named Lily.", true, false);
  auto r = probe_model(**m, tokens);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_EQ(r->rows.size(), 5u);
  // The reference's own hidden states, layer by layer.
  auto x = reference_embed(**m, tokens);
  ASSERT_TRUE(x.ok());
  std::vector<double> h = *x;
  for (const ProbeRow& row : r->rows) {
    auto y = reference_layer(**m, row.layer, h, static_cast<int64_t>(tokens.size()));
    ASSERT_TRUE(y.ok());
    h = *y;
    expect_close(row.out, activation_stats(h), 1e-12, "layer " + std::to_string(row.layer));
    for (const ActStats* s : {&row.attn_in, &row.ffn_in, &row.out}) {
      EXPECT_LT(s->min, s->max);
      EXPECT_GT(s->std, 0);
      EXPECT_GE(s->outlier_share, 0);
      EXPECT_LT(s->outlier_share, 0.05);
    }
  }
  EXPECT_GT(r->final_norm.std, 0);
}

}  // namespace
}  // namespace loom
