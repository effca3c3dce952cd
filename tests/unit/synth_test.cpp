// Synthetic models: layout per architecture, dtypes, determinism, errors.
#include "engine/model/synth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "cpu/ref/quants.h"
#include "engine/model/gguf.h"
#include "tests/test_util.h"

namespace loom {
namespace {

SynthSpec small(const std::string& arch, const std::string& dtype) {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ctx = 128;
  s.weight_type = dtype;
  s.seed = 42;
  return s;
}

std::unique_ptr<GgufFile> synth_and_open(const SynthSpec& s, const std::string& name) {
  std::string path = test::temp_dir("synth") + "/" + name + ".gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.message();
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(Synth, LlamaLayoutAndMetadata) {
  auto f = synth_and_open(small("llama", "q4_0"), "llama");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->architecture(), "llama");
  EXPECT_EQ(*f->get_int("llama.block_count").value(), 2);
  EXPECT_EQ(*f->get_int("llama.attention.head_count_kv").value(), 2);
  EXPECT_EQ(*f->get_int("llama.rope.dimension_count").value(), 64);
  EXPECT_EQ(*f->get_int("general.file_type").value(), 2);
  const int64_t n_vocab = *f->get_int("llama.vocab_size").value();
  EXPECT_EQ(static_cast<int64_t>(f->get_string_array("tokenizer.ggml.tokens").value()->size()),
            n_vocab);
  // 1 embedding + 9 per layer + output_norm + output.
  EXPECT_EQ(f->tensors().size(), 1u + 2u * 9u + 2u);
  const GgufTensor* q = f->find_tensor("blk.1.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kQ4_0);
  EXPECT_EQ(q->shape_string(), "[256, 256]");
  EXPECT_EQ(f->find_tensor("blk.1.attn_k.weight")->shape_string(), "[256, 128]");
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->shape_string(), "[512, 256]");
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->dtype, DType::kF32);
  EXPECT_EQ(f->find_tensor("output.weight")->shape_string(),
            "[256, " + std::to_string(n_vocab) + "]");
  ASSERT_TRUE(f->get_string("tokenizer.chat_template").value().has_value());
}

TEST(Synth, Qwen2HasBiasesAndTiedOutput) {
  SynthSpec s = small("qwen2", "q8_0");
  s.tied_output = true;
  auto f = synth_and_open(s, "qwen2");
  ASSERT_TRUE(f);
  EXPECT_NE(f->find_tensor("blk.0.attn_q.bias"), nullptr);
  EXPECT_NE(f->find_tensor("blk.1.attn_v.bias"), nullptr);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.attn_k.bias")->shape_string(), "[128]");
}

TEST(Synth, Phi3HasFusedQkvAndGateUp) {
  auto f = synth_and_open(small("phi3", "f16"), "phi3");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->find_tensor("blk.0.attn_qkv.weight")->shape_string(), "[256, 512]");
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up.weight")->shape_string(), "[256, 1024]");
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight"), nullptr);
}

TEST(Synth, EveryWeightTypeWritesAndDequantizes) {
  for (const char* t : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k",
                        "q3_k", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"}) {
    SynthSpec s = small("llama", t);
    s.n_layer = 1;
    auto f = synth_and_open(s, std::string("w_") + t);
    ASSERT_TRUE(f) << t;
    const GgufTensor* w = f->find_tensor("blk.0.ffn_gate.weight");
    ASSERT_NE(w, nullptr);
    std::vector<float> row(static_cast<size_t>(w->ne[0]));
    ASSERT_TRUE(ref::dequantize_row(w->dtype, w->data, row.data(), w->ne[0]).ok());
    // Values come from U(-a, a), a = sqrt(3 / fan_in): bounded, not all zero.
    const float a = std::sqrt(3.0f / 256.0f);
    double sq = 0;
    for (float v : row) {
      ASSERT_LE(std::fabs(v), 1.5f * a) << t;
      sq += v * v;
    }
    EXPECT_GT(sq, 0.0) << t;
  }
}

TEST(Synth, MixtureGivesSomeLayersMoreBits) {
  SynthSpec s = small("llama", "q4_k_m");
  s.n_layer = 8;
  auto f = synth_and_open(s, "mix");
  ASSERT_TRUE(f);
  EXPECT_EQ(*f->get_int("general.file_type").value(), 15);
  EXPECT_EQ(f->find_tensor("blk.0.attn_v.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ(f->find_tensor("blk.1.attn_v.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ(f->find_tensor("blk.7.ffn_down.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ(f->find_tensor("blk.1.attn_q.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ(f->find_tensor("output.weight")->dtype, DType::kQ6_K);
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherBytes) {
  std::string dir = test::temp_dir("synth_seed");
  SynthSpec s = small("llama", "q4_k");
  ASSERT_TRUE(write_synthetic_model(s, dir + "/a.gguf").ok());
  ASSERT_TRUE(write_synthetic_model(s, dir + "/b.gguf").ok());
  s.seed = 43;
  ASSERT_TRUE(write_synthetic_model(s, dir + "/c.gguf").ok());
  auto a = test::read_file(dir + "/a.gguf");
  EXPECT_EQ(a, test::read_file(dir + "/b.gguf"));
  EXPECT_NE(a, test::read_file(dir + "/c.gguf"));
}

TEST(Synth, RowsThatDoNotFitTheBlockFallBackAndSaySo) {
  SynthSpec s;  // stories-like shapes: ffn 172 is not a multiple of 32
  ASSERT_TRUE(apply_synth_preset("stories-like", &s).ok());
  s.weight_type = "q4_0";
  std::string path = test::temp_dir("synth_fit") + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_FALSE(r->notes.empty());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->find_tensor("blk.0.ffn_down.weight")->dtype, DType::kF16);
  EXPECT_EQ((*f)->find_tensor("blk.0.ffn_gate.weight")->dtype, DType::kQ4_0);
}

TEST(Synth, BadSpecsAreErrors) {
  std::string path = test::temp_dir("synth_bad") + "/m.gguf";
  SynthSpec s = small("gpt5", "q4_0");
  EXPECT_EQ(write_synthetic_model(s, path).error().code(), ErrorCode::kUnsupported);
  s = small("llama", "q9_9");
  EXPECT_NE(write_synthetic_model(s, path).message().find("q9_9"), std::string::npos);
  s = small("llama", "f32");
  s.n_head = 3;
  EXPECT_FALSE(write_synthetic_model(s, path).ok());
  s = small("llama", "f32");
  s.n_head_kv = 3;
  EXPECT_FALSE(write_synthetic_model(s, path).ok());
  EXPECT_FALSE(apply_synth_preset("llama-70b", &s).ok());
  s = small("llama", "f32");
  EXPECT_EQ(write_synthetic_model(s, "/nonexistent-dir/m.gguf").error().code(), ErrorCode::kIo);
}

TEST(Synth, BuiltinVocabularyIsConsistent) {
  SynthVocab v = builtin_synth_vocab(0);
  EXPECT_GT(v.tokens.size(), 300u);
  EXPECT_EQ(v.tokens.size(), v.token_types.size());
  std::set<std::string> uniq(v.tokens.begin(), v.tokens.end());
  EXPECT_EQ(uniq.size(), v.tokens.size()) << "token texts must be unique";
  for (const auto& m : v.merges) {
    auto sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos);
    EXPECT_TRUE(uniq.count(m.substr(0, sp)) && uniq.count(m.substr(sp + 1))) << m;
  }
  SynthVocab big = builtin_synth_vocab(32000);
  EXPECT_EQ(big.tokens.size(), 32000u);
}

}  // namespace
}  // namespace loom
