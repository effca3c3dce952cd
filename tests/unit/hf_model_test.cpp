// Hugging Face folders: one synthetic model written both as GGUF and as an HF
// folder (engine/model/hf_export.h) must load to the same model and give the
// same logits and greedy text; bad folders give errors that name the cause.
#include "engine/model/hf_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/hf_export.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/session.h"
#include "tests/ref_forward.h"
#include "tests/test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* arch;
  const char* dtype;
  uint64_t shard_bytes;  ///< 0: one model.safetensors
  bool tied;
};

// Writes the synthetic model as GGUF and as an HF folder; returns {gguf, folder}.
std::pair<std::string, std::string> write_both(const Case& c, const std::string& name) {
  SynthSpec s;
  s.arch = c.arch;
  s.n_head_kv = c.arch == std::string("phi3") ? 4 : 2;
  s.weight_type = c.dtype;
  s.tied_output = c.tied;
  s.seed = 11;
  s.sliding_window = 4;  // gemma2: the window matters within the tests' prompts
  const std::string dir = test::temp_dir("hf_" + name);
  const std::string gguf = dir + "/m.gguf", folder = dir + "/hf";
  auto r = write_synthetic_model(s, gguf);
  EXPECT_TRUE(r.ok()) << r.message();
  HfExportOptions o;
  o.shard_bytes = c.shard_bytes;
  Status st = write_hf_folder(gguf, folder, o);
  EXPECT_TRUE(st.ok()) << st.message();
  return {gguf, folder};
}

std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& tokens) {
  CpuBackend be(2);
  auto kv = KvCache::create({m.hp.n_layer, m.hp.n_head_kv, m.hp.head_dim, 64, 16, DType::kF16});
  EXPECT_TRUE(kv.ok());
  ForwardPass fwd(m, be, **kv, /*max_chunk=*/4);
  const int64_t V = m.hp.n_vocab;
  std::vector<float> logits(tokens.size() * static_cast<size_t>(V));
  Status s = fwd.eval(std::span<const int32_t>(tokens), 0, logits.data(), true);
  EXPECT_TRUE(s.ok()) << s.message();
  return logits;
}

std::string greedy(const Model& m, const std::string& prompt) {
  CpuBackend be(2);
  SessionConfig c;
  c.n_ctx = 128;
  auto s = Session::create(m, be, c);
  EXPECT_TRUE(s.ok()) << s.message();
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = 24;
  gp.stop_at_eog = false;
  std::string text;
  auto r = (*s)->generate((*s)->tokenize_raw(prompt), gp, [&](std::string_view p) {
    text += p;
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.message();
  return text;
}

class GgufAndHfFolder : public ::testing::TestWithParam<Case> {};

TEST_P(GgufAndHfFolder, SameModelSameOutput) {
  const Case c = GetParam();
  const auto [gguf, folder] = write_both(c, std::string(c.arch) + "_" + c.dtype);
  EXPECT_TRUE(is_hf_folder(folder));
  EXPECT_EQ(fs::exists(folder + "/model.safetensors.index.json"), c.shard_bytes > 0);
  auto a = load_model(gguf);
  ASSERT_TRUE(a.ok()) << a.message();
  auto b = load_model(folder);
  ASSERT_TRUE(b.ok()) << b.message();
  const Model& ma = **a;
  const Model& mb = **b;
  EXPECT_EQ(mb.hp.arch, ma.hp.arch);
  EXPECT_EQ(mb.hp.n_layer, ma.hp.n_layer);
  EXPECT_EQ(mb.hp.n_embd, ma.hp.n_embd);
  EXPECT_EQ(mb.hp.n_ff, ma.hp.n_ff);
  EXPECT_EQ(mb.hp.n_head_kv, ma.hp.n_head_kv);
  EXPECT_EQ(mb.hp.n_vocab, ma.hp.n_vocab);
  EXPECT_EQ(mb.hp.rope_freq_base, ma.hp.rope_freq_base);
  // The llama family's q/k rows are in HF's rotate_half order: NeoX RoPE there.
  EXPECT_EQ(mb.hp.rope_neox, ma.hp.rope_neox || c.arch == std::string("llama"));
  EXPECT_EQ(mb.layers[0].wq.dtype, ma.layers[0].wq.dtype);
  EXPECT_EQ(mb.output.data == mb.tok_embd.data, c.tied);
  if (ma.layers[0].w_down.dtype != DType::kF32) {
    // Weights used in place: the HF model's down projection lies in a shard's map.
    EXPECT_NE(mb.layers[0].w_down.tensor->origin.find("mlp.down_proj.weight"), std::string::npos);
  }

  // Same tokenizer.
  const std::string text = "Once upon a time, <|im_start|>the robot said: 12345 \xC3\xA9t\xC3\xA9!";
  EXPECT_EQ(mb.tokenizer->n_tokens(), ma.tokenizer->n_tokens());
  EXPECT_EQ(mb.tokenizer->encode(text, true, true), ma.tokenizer->encode(text, true, true));
  EXPECT_EQ(mb.tokenizer->vocab().special().eos, ma.tokenizer->vocab().special().eos);
  EXPECT_EQ(mb.tokenizer->vocab().special().eot, ma.tokenizer->vocab().special().eot);

  // Same logits (up to float summation order), and both near the double reference.
  const std::vector<int32_t> tokens = {0, 77, 301, 5, 122, 9, 260, 33};
  const std::vector<float> la = logits_of(ma, tokens), lb = logits_of(mb, tokens);
  ASSERT_EQ(la.size(), lb.size());
  const auto ref = test::reference_logits(mb, tokens);
  const size_t V = static_cast<size_t>(ma.hp.n_vocab);
  for (size_t t = 0; t < tokens.size(); ++t) {
    std::vector<float> ra(la.begin() + t * V, la.begin() + (t + 1) * V);
    std::vector<float> rb(lb.begin() + t * V, lb.begin() + (t + 1) * V);
    std::vector<double> rad(ra.begin(), ra.end());
    EXPECT_LT(test::normalized_error(rb, rad), 1e-4) << "position " << t;
    EXPECT_LT(test::normalized_error(rb, ref[t]), 1e-2) << "position " << t;
  }
  const std::string ga = greedy(ma, "The robot"), gb = greedy(mb, "The robot");
  EXPECT_FALSE(ga.empty());
  EXPECT_EQ(ga, gb);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, GgufAndHfFolder,
    ::testing::Values(Case{"llama", "f32", 0, false}, Case{"llama", "bf16", 200000, false},
                      Case{"qwen2", "f32", 0, true}, Case{"qwen2", "f16", 150000, false},
                      Case{"phi3", "f32", 0, false}, Case{"phi3", "bf16", 0, false},
                      Case{"qwen3", "f32", 0, true}, Case{"qwen3", "bf16", 100000, false},
                      Case{"gemma2", "f32", 0, true}, Case{"gemma2", "f16", 0, true}),
    [](const auto& p) {
      return std::string(p.param.arch) + "_" + p.param.dtype +
             (p.param.shard_bytes ? "_sharded" : "");
    });

// The chat template comes from tokenizer_config.json, through the same
// recognition as a GGUF's tokenizer.chat_template.
TEST(HfFolder, ChatTemplateFromTokenizerConfig) {
  const auto [gguf, folder] = write_both(Case{"qwen2", "f32", 0, false}, "chat");
  auto a = load_model(gguf);
  auto b = load_model(folder);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*b)->chat_template.family(), (*a)->chat_template.family());
  EXPECT_EQ((*b)->chat_template.family(), ChatFamily::kChatML);
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi"}};
  auto ra = (*a)->chat_template.apply(chat, true);
  auto rb = (*b)->chat_template.apply(chat, true);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(*rb, *ra);
}

// --tokenizer: another file's tokenizer, for a folder that has none.
TEST(HfFolder, TokenizerFromAnotherFile) {
  const auto [gguf, folder] = write_both(Case{"llama", "f16", 0, false}, "tok_override");
  const std::string saved = folder + "/../tokenizer.json";
  fs::rename(folder + "/tokenizer.json", saved);
  fs::remove(folder + "/tokenizer_config.json");
  {
    auto m = load_model(folder);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.message().find("no tokenizer.json"), std::string::npos) << m.message();
  }
  auto ref = load_model(gguf);
  ASSERT_TRUE(ref.ok()) << ref.message();
  for (const std::string& tok : {gguf, saved}) {
    LoadOptions o;
    o.tokenizer = tok;
    auto m = load_model(folder, o);
    ASSERT_TRUE(m.ok()) << tok << ": " << m.message();
    EXPECT_EQ((*m)->tokenizer->n_tokens(), (*ref)->tokenizer->n_tokens());
    EXPECT_EQ(greedy(**m, "The robot"), greedy(**ref, "The robot")) << tok;
  }
  LoadOptions bad;
  bad.tokenizer = folder + "/missing.json";
  auto m = load_model(folder, bad);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("missing.json"), std::string::npos) << m.message();
}

// ---- errors ------------------------------------------------------------------

std::string read_text(const std::string& path) {
  const std::vector<uint8_t> b = test::read_file(path);
  return std::string(b.begin(), b.end());
}
void write_text(const std::string& path, const std::string& s) {
  test::write_file(path, std::vector<uint8_t>(s.begin(), s.end()));
}
void replace(std::string* s, const std::string& from, const std::string& to) {
  const size_t pos = s->find(from);
  ASSERT_NE(pos, std::string::npos) << from;
  s->replace(pos, from.size(), to);
}

void expect_load_error(const std::string& path, const std::vector<std::string>& parts) {
  auto m = load_model(path);
  ASSERT_FALSE(m.ok());
  for (const std::string& p : parts) {
    EXPECT_NE(m.message().find(p), std::string::npos) << "'" << p << "' not in: " << m.message();
  }
}

class HfFolderErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = write_both(Case{"qwen2", "f32", 60000, false}, "errors").second;
  }
  // The shard files, sorted.
  std::vector<std::string> shards() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(folder_)) {
      if (e.path().extension() == ".safetensors") v.push_back(e.path().string());
    }
    std::sort(v.begin(), v.end());
    EXPECT_GE(v.size(), 3u);
    return v;
  }
  static std::string base(const std::string& p) { return fs::path(p).filename().string(); }
  std::string folder_;
};

TEST_F(HfFolderErrors, UnknownArchitecture) {
  std::string config = read_text(folder_ + "/config.json");
  replace(&config, "\"qwen2\"", "\"mamba\"");
  replace(&config, "Qwen2ForCausalLM", "MambaForCausalLM");
  write_text(folder_ + "/config.json", config);
  expect_load_error(folder_, {"config.json", "unknown architecture 'MambaForCausalLM'", "mamba",
                              "llama, mistral, qwen2, phi3, qwen3, gemma2"});
}

TEST_F(HfFolderErrors, ConfigFields) {
  std::string config = read_text(folder_ + "/config.json");
  std::string no_layers = config;
  replace(&no_layers, "\"num_hidden_layers\"", "\"n_layers\"");
  write_text(folder_ + "/config.json", no_layers);
  expect_load_error(folder_, {"config.json", "num_hidden_layers"});
  std::string wrong = config;
  replace(&wrong, "\"hidden_size\": 64", "\"hidden_size\": \"64\"");
  write_text(folder_ + "/config.json", wrong);
  expect_load_error(folder_, {"config.json", "hidden_size"});
  std::string longrope = config;
  replace(&longrope, "\"rope_theta\"",
          "\"rope_scaling\": {\"type\": \"longrope\", \"factor\": 4}, \"rope_theta\"");
  write_text(folder_ + "/config.json", longrope);
  expect_load_error(folder_, {"config.json", "rope_scaling type 'longrope'"});
  write_text(folder_ + "/config.json", "{\"model_type\": ");
  expect_load_error(folder_, {"config.json", "does not parse"});
}

TEST_F(HfFolderErrors, MissingShard) {
  const std::string shard = shards()[1];
  fs::remove(shard);
  expect_load_error(folder_, {base(shard), "missing"});
}

TEST_F(HfFolderErrors, TruncatedShard) {
  const std::string shard = shards().back();
  fs::resize_file(shard, fs::file_size(shard) - 100);
  expect_load_error(folder_, {base(shard), "truncated"});
}

TEST_F(HfFolderErrors, HeaderThatLies) {
  // A real shard whose header says one tensor is larger than its bytes.
  const std::string shard = shards()[0];
  std::vector<uint8_t> b = test::read_file(shard);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  std::string header(b.begin() + 8, b.begin() + 8 + static_cast<ptrdiff_t>(n));
  const size_t pos = header.find("\"shape\":[");
  ASSERT_NE(pos, std::string::npos);
  header[pos + 9] = header[pos + 9] == '9' ? '8' : '9';  // first dimension's first digit
  std::copy(header.begin(), header.end(), b.begin() + 8);
  test::write_file(shard, b);
  expect_load_error(folder_, {base(shard), "bytes"});
}

TEST_F(HfFolderErrors, WrongShapeNamesTheHfTensor) {
  // A consistent header with a tensor of the wrong shape for the config.
  std::string config = read_text(folder_ + "/config.json");
  replace(&config, "\"intermediate_size\": 172", "\"intermediate_size\": 170");
  write_text(folder_ + "/config.json", config);
  expect_load_error(folder_, {"blk.0.ffn_down.weight", "mlp.down_proj.weight", "expected"});
}

TEST_F(HfFolderErrors, Tokenizer) {
  std::string tok = read_text(folder_ + "/tokenizer.json");
  std::string unigram = tok;
  replace(&unigram, "\"type\": \"BPE\"", "\"type\": \"Unigram\"");
  write_text(folder_ + "/tokenizer.json", unigram);
  expect_load_error(folder_, {"tokenizer.json", "model type 'Unigram'"});
  fs::remove(folder_ + "/tokenizer.json");
  expect_load_error(folder_, {"no tokenizer.json"});
}

TEST_F(HfFolderErrors, NotAModelFolder) {
  fs::remove(folder_ + "/config.json");
  expect_load_error(folder_, {"without config.json"});
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// transformers 5 writes "rope_parameters" (rope_theta and the scaling in one
// object, or one per layer type) where older versions wrote "rope_theta" and
// "rope_scaling": both forms give the same model.
TEST(HfFolder, RopeParametersOfTransformersFive) {
  const std::string folder = write_both(Case{"llama", "f32", 0, false}, "rope_params").second;
  const std::string original = read_text(folder + "/config.json");
  const nlohmann::json scaling = {{"factor", 8.0},
                                  {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 64}};
  auto load_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = nlohmann::json::parse(original);
    edit(c);
    write_text(folder + "/config.json", c.dump(2));
    auto m = load_model(folder);
    EXPECT_TRUE(m.ok()) << m.message();
    return m;
  };
  auto old_form = load_with([&](nlohmann::json& c) {
    c["rope_theta"] = 500000.0;
    c["rope_scaling"] = scaling;
    c["rope_scaling"]["rope_type"] = "llama3";
  });
  nlohmann::json params = scaling;
  params["rope_type"] = "llama3";
  params["rope_theta"] = 500000.0;
  auto new_form = load_with([&](nlohmann::json& c) {
    c.erase("rope_theta");
    c["rope_parameters"] = params;
  });
  auto per_type = load_with([&](nlohmann::json& c) {
    c.erase("rope_theta");
    c["rope_parameters"] = {{"full_attention", params}, {"sliding_attention", params}};
  });
  ASSERT_TRUE(old_form.ok() && new_form.ok() && per_type.ok());
  const std::vector<int32_t> tokens = {0, 77, 301, 5, 122, 9};
  const std::vector<float> want = logits_of(**old_form, tokens);
  for (const auto* m : {&new_form, &per_type}) {
    EXPECT_EQ((**m)->hp.rope_freq_base, 500000.0f);
    EXPECT_EQ(logits_of(***m, tokens), want);
  }
  auto plain = load_with([&](nlohmann::json& c) {
    c.erase("rope_theta");
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000.0}};
  });
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->hp.rope_freq_base, 1000.0f);
  write_text(folder + "/config.json", std::string(original).insert(1, "\"rope_parameters\": 3,"));
  expect_load_error(folder, {"config.json", "rope_parameters"});
}

}  // namespace
}  // namespace loom
