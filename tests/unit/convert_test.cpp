// loom convert (engine/model/convert.h): a Hugging Face folder converted to
// GGUF gives the same greedy tokens as the folder; GGUF to GGUF in another
// precision; per-group precisions from a placement; bad input and a failing
// output give errors that name the file and leave nothing behind; memory
// stays far below the model's size.
#include "engine/model/convert.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_export.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/placement/placement.h"
#include "engine/runtime/session.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_json.h"
#include "engine/tokenizer/vocab.h"
#include "engine/tokenizer/vocab_writer.h"
#include "tests/test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string synth_gguf(const std::string& dir, const std::string& arch, const std::string& dtype,
                       int64_t n_ff = 128, int64_t n_embd = 64, int64_t n_layer = 2) {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = n_layer;
  s.n_embd = n_embd;
  s.n_ff = n_ff;
  s.n_head_kv = arch == "phi3" ? 4 : 2;
  s.weight_type = dtype;
  s.seed = 5;
  const std::string path = dir + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  return path;
}

std::vector<int32_t> greedy(const Model& m, int n) {
  CpuBackend be(2);
  SessionConfig sc;
  sc.n_ctx = 128;
  auto s = Session::create(m, be, sc);
  EXPECT_TRUE(s.ok()) << s.message();
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = n;
  gp.stop_at_eog = false;
  std::vector<int32_t> out;
  gp.on_token = [&](int32_t id) { out.push_back(id); };
  auto r = (*s)->generate((*s)->tokenize_raw("Once upon a time"), gp,
                          [](std::string_view) { return true; });
  EXPECT_TRUE(r.ok()) << r.message();
  return out;
}

std::map<std::string, DType> dtypes_of(const std::string& path) {
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.message();
  std::map<std::string, DType> out;
  if (f.ok()) {
    for (const auto& t : (*f)->tensors()) out[t.name] = t.dtype;
  }
  return out;
}

// Texts for comparing two tokenizers: ASCII, accents, emoji, digits, runs of
// spaces, tabs and newlines.
const char* const kTokenizerTexts[] = {
    "Hello world, once upon a time.",
    "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\xBC\xC3\xB1\xC3\xAE",
    "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 ok \xE2\x9D\xA4\xEF\xB8\x8F",
    "digits 1234567 and 3.14, 42!",
    "  two  spaces   three    four ",
    "tab\tand\nnewline\n\nend",
    "The the THE tHe",
};

// The tokenizer that load_vocab() reads from the GGUF's tokenizer.ggml.* keys
// alone (the embedded tokenizer.json is not looked at).
Result<Tokenizer> ggml_tokenizer(const std::string& gguf) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::open(gguf));
  LOOM_ASSIGN_OR_RETURN(Vocab v, load_vocab(*f));
  return Tokenizer::create(std::move(v));
}

// The tokenizer Loom reads from a folder's tokenizer.json + tokenizer_config.json.
Result<Tokenizer> folder_tokenizer(const std::string& dir) {
  LOOM_ASSIGN_OR_RETURN(HfTokenizerConfig c,
                        load_hf_tokenizer_config(dir + "/tokenizer_config.json"));
  LOOM_ASSIGN_OR_RETURN(HfVocab v, load_tokenizer_json(dir + "/tokenizer.json", &c));
  return Tokenizer::create(std::move(v.vocab));
}

// The GGUF's tokenizer.ggml.* keys give the folder's tokens for every text,
// the same specials and flags, and its chat template.
void expect_ggml_tokenizer_matches_folder(const std::string& folder, const std::string& gguf,
                                          const std::string& model, const std::string& pre) {
  auto a = folder_tokenizer(folder);
  ASSERT_TRUE(a.ok()) << a.message();
  auto b = ggml_tokenizer(gguf);
  ASSERT_TRUE(b.ok()) << b.message();
  for (const char* text : kTokenizerTexts) {
    EXPECT_EQ(a->encode(text, true, false), b->encode(text, true, false)) << text;
    EXPECT_EQ(a->encode(text, false, true), b->encode(text, false, true)) << text;
  }
  const Vocab &va = a->vocab(), &vb = b->vocab();
  EXPECT_EQ(va.n_tokens(), vb.n_tokens());
  EXPECT_EQ(va.special().bos, vb.special().bos);
  EXPECT_EQ(va.special().eos, vb.special().eos);
  EXPECT_EQ(va.special().unk, vb.special().unk);
  EXPECT_EQ(va.add_bos(), vb.add_bos());
  EXPECT_EQ(va.add_eos(), vb.add_eos());
  for (int32_t id = 0; id < va.n_tokens(); ++id) {
    EXPECT_EQ(va.text(id), vb.text(id)) << id;
    EXPECT_EQ(static_cast<int>(va.type(id)), static_cast<int>(vb.type(id))) << id;
  }

  auto f = GgufFile::open(gguf);
  ASSERT_TRUE(f.ok()) << f.message();
  auto str = [&](const char* key) {
    auto v = (*f)->get_string(key);
    return v.ok() && *v ? **v : std::string("(none)");
  };
  EXPECT_EQ(str("tokenizer.ggml.model"), model);
  if (!pre.empty()) {
    EXPECT_EQ(str("tokenizer.ggml.pre"), pre);
  }
  auto c = load_hf_tokenizer_config(folder + "/tokenizer_config.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_FALSE(c->chat_template.empty());
  EXPECT_EQ(str("tokenizer.chat_template"), c->chat_template);
  // The embedded files stay, for Loom.
  EXPECT_TRUE((*f)->has(kHfTokenizerJsonKey));
  EXPECT_TRUE((*f)->has(kHfTokenizerConfigKey));
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct FolderCase {
  const char* arch;
  const char* dtype;
};

class ConvertFolder : public ::testing::TestWithParam<FolderCase> {};

TEST_P(ConvertFolder, GivesTheFoldersGreedyTokens) {
  const FolderCase c = GetParam();
  const std::string dir = test::temp_dir(std::string("convert_hf_") + c.arch + "_" + c.dtype);
  const std::string gguf = synth_gguf(dir, c.arch, c.dtype);
  ASSERT_TRUE(write_hf_folder(gguf, dir + "/hf").ok());
  ConvertOptions o;
  o.input = dir + "/hf";
  o.output = dir + "/out.gguf";
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_GT(r->n_tensors, 0);

  auto folder = load_model(dir + "/hf");
  ASSERT_TRUE(folder.ok()) << folder.message();
  auto converted = load_model(dir + "/out.gguf");
  ASSERT_TRUE(converted.ok()) << converted.message();
  // The tokenizer and template came along.
  const char* text = "Hello world, once upon a time.";
  EXPECT_EQ((*folder)->tokenizer->encode(text, true, false),
            (*converted)->tokenizer->encode(text, true, false));
  EXPECT_EQ((*folder)->tokenizer->vocab().n_tokens(), (*converted)->tokenizer->vocab().n_tokens());
  EXPECT_EQ((*folder)->chat_template.family(), (*converted)->chat_template.family());
  // The standard keys say the same (the synthetic vocabulary's pre-tokenizer is GPT-2's).
  expect_ggml_tokenizer_matches_folder(dir + "/hf", dir + "/out.gguf", "gpt2", "gpt-2");
  // Matrices kept their precision (F16 stays F16), vectors are F32.
  for (const auto& [name, d] : dtypes_of(dir + "/out.gguf")) {
    if (name.find("norm") != std::string::npos)
      EXPECT_EQ(d, DType::kF32) << name;
    else
      EXPECT_EQ(std::string(dtype_name(d)), std::string(dtype_name(*dtype_from_name(c.dtype))))
          << name;
  }
  const auto a = greedy(**folder, 24), b = greedy(**converted, 24);
  EXPECT_EQ(a.size(), 24u);
  EXPECT_EQ(a, b);
  // The original GGUF too (the folder was exported from it).
  auto orig = load_model(gguf);
  ASSERT_TRUE(orig.ok());
  EXPECT_EQ(greedy(**orig, 24), b);
}

INSTANTIATE_TEST_SUITE_P(Archs, ConvertFolder,
                         ::testing::Values(FolderCase{"llama", "f32"}, FolderCase{"llama", "f16"},
                                           FolderCase{"qwen2", "f32"}, FolderCase{"phi3", "f16"},
                                           FolderCase{"qwen3", "f32"}, FolderCase{"gemma2", "f16"}),
                         [](const auto& i) {
                           return std::string(i.param.arch) + "_" + i.param.dtype;
                         });

// A SentencePiece-style tokenizer.json (as Phi-3's, Llama 2's and Mistral's:
// Prepend + Replace "▁", byte fallback, <unk> <s> </s>, chat markers as added
// tokens) and its tokenizer_config.json, written over a folder's own. Merges are
// made as Hugging Face's converter makes them from a SentencePiece model: every
// split of a piece into two pieces, in the pieces' order.
void write_spm_tokenizer(const std::string& dir) {
  std::vector<std::string> vocab = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab.push_back(name);
  }
  const std::string sp = "\xE2\x96\x81";  // "▁"
  vocab.push_back(sp);
  for (char c = 'a'; c <= 'z'; ++c) vocab.push_back(std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) vocab.push_back(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) vocab.push_back(std::string(1, c));
  for (const char* c : {",", ".", "!", "?", "'", "\xC3\xA9"}) vocab.push_back(c);
  const size_t n_chars = vocab.size();
  for (const std::string& piece :
       std::vector<std::string>{sp + "t",     "he",          sp + "the",
                                sp + "a",     "in",          "er",
                                sp + "w",     "or",          sp + "wor",
                                "ld",         sp + "world",  sp + "H",
                                "el",         "lo",          "ll",
                                "llo",        sp + "He",     sp + "Hel",
                                sp + "Hello", "on",          "ce",
                                sp + "on",    sp + "once",   "up",
                                sp + "up",    sp + "upon",   sp + "ti",
                                "me",         sp + "time",   "ca",
                                "f\xC3\xA9",  sp + "ca",     sp + "caf\xC3\xA9",
                                "12",         "34",          sp + "1",
                                sp + sp,      sp + sp + sp,  "di",
                                "it",         "its",         "dig",
                                sp + "dig",   sp + "digits", "es",
                                "at"}) {
    vocab.push_back(piece);
  }
  auto id_of = [&](const std::string& t) {
    return std::find(vocab.begin(), vocab.end(), t) - vocab.begin();
  };
  std::string merges;
  for (size_t i = n_chars; i < vocab.size(); ++i) {
    const std::string& p = vocab[i];
    for (size_t cut = 1; cut < p.size(); ++cut) {
      if ((static_cast<unsigned char>(p[cut]) & 0xC0) == 0x80) continue;  // inside a character
      const std::string l = p.substr(0, cut), r = p.substr(cut);
      if (static_cast<size_t>(id_of(l)) < i && static_cast<size_t>(id_of(r)) < i) {
        merges.append(merges.empty() ? "[\"" : ",[\"")
            .append(l)
            .append("\",\"")
            .append(r)
            .append("\"]");
      }
    }
  }
  const std::vector<std::string> added = {"<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"};
  std::string vocab_json, added_json;
  for (size_t i = 0; i < vocab.size(); ++i) {
    vocab_json.append(i ? ",\"" : "\"").append(vocab[i]).append("\":").append(std::to_string(i));
  }
  auto added_token = [](size_t id, const std::string& text) {
    return "{\"id\":" + std::to_string(id) + ",\"content\":\"" + text +
           "\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
           "\"special\":true}";
  };
  for (size_t i = 0; i < 3; ++i) added_json.append(i ? "," : "").append(added_token(i, vocab[i]));
  for (size_t i = 0; i < added.size(); ++i) {
    added_json.append(",").append(added_token(vocab.size() + i, added[i]));
  }
  const std::string tok =
      "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[" + added_json +
      "],\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
      "\"prepend\":\"" +
      sp + "\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"" + sp +
      "\"}]},\"pre_tokenizer\":null,\"post_processor\":{\"type\":\"TemplateProcessing\","
      "\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":"
      "\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{}},\"decoder\":{\"type\":"
      "\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"
      "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":"
      "true,\"byte_fallback\":true,\"vocab\":{" +
      vocab_json + "},\"merges\":[" + merges + "]}}";
  std::ofstream(dir + "/tokenizer.json", std::ios::binary) << tok;
  std::ofstream(dir + "/tokenizer_config.json", std::ios::binary)
      << "{\"add_bos_token\":true,\"add_eos_token\":false,\"bos_token\":\"<s>\","
         "\"eos_token\":\"<|endoftext|>\",\"chat_template\":\"{% for message in messages %}"
         "{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}\"}";
}

// The standard keys of a SentencePiece-style folder: model "llama", scores
// from the merge ranks, byte tokens, and the same tokens as tokenizer.json.
TEST(Convert, SentencePieceFolderWritesGgmlTokenizer) {
  const std::string dir = test::temp_dir("convert_hf_spm");
  const std::string gguf = synth_gguf(dir, "phi3", "f16");
  ASSERT_TRUE(write_hf_folder(gguf, dir + "/hf").ok());
  write_spm_tokenizer(dir + "/hf");
  ConvertOptions o;
  o.input = dir + "/hf";
  o.output = dir + "/out.gguf";
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  expect_ggml_tokenizer_matches_folder(dir + "/hf", o.output, "llama", "");

  auto f = GgufFile::open(o.output);
  ASSERT_TRUE(f.ok()) << f.message();
  auto types = (*f)->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok() && *types);
  auto scores = (*f)->get_float_array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores.ok() && *scores);
  ASSERT_GT((*types)->size(), 263u);
  EXPECT_EQ((**types)[0], 2);        // <unk>: unknown
  EXPECT_EQ((**types)[1], 3);        // <s>: control
  EXPECT_EQ((**types)[3], 6);        // <0x00>: byte
  EXPECT_EQ((**types)[258], 6);      // <0xFF>
  EXPECT_EQ((**types)[259], 1);      // "▁": normal
  EXPECT_EQ((**types).back(), 3);    // <|end|>: control (special added token)
  EXPECT_EQ((**scores)[259], -1e9);  // made by no merge
  auto bos = (*f)->get_int("tokenizer.ggml.bos_token_id");
  auto eos = (*f)->get_int("tokenizer.ggml.eos_token_id");
  auto add_bos = (*f)->get_bool("tokenizer.ggml.add_bos_token");
  ASSERT_TRUE(bos.ok() && *bos && eos.ok() && *eos && add_bos.ok() && *add_bos);
  EXPECT_EQ(**bos, 1);
  EXPECT_EQ(**eos, static_cast<int64_t>((*types)->size()) - 4);  // <|endoftext|>
  EXPECT_TRUE(**add_bos);
  EXPECT_FALSE((*f)->has("tokenizer.ggml.merges"));
  // Accents, emoji and tabs fall back to bytes, and the two paths agree on them.
  auto t = ggml_tokenizer(o.output);
  ASSERT_TRUE(t.ok());
  const auto ids = t->encode("\xF0\x9F\x98\x80", false, false);
  ASSERT_EQ(ids.size(), 5u);  // "▁" and the emoji's four bytes
  EXPECT_EQ(ids[1], 3 + 0xF0);

  // Loom still reads the embedded tokenizer.json first, as before.
  auto m = load_model(o.output);
  ASSERT_TRUE(m.ok()) << m.message();
  auto folder = folder_tokenizer(dir + "/hf");
  ASSERT_TRUE(folder.ok());
  for (const char* text : kTokenizerTexts) {
    EXPECT_EQ((*m)->tokenizer->encode(text, true, false), folder->encode(text, true, false));
  }
}

TEST(Convert, PreTokenizerNamesAreLlamaCpps) {
  auto with = [](const char* name, bool ignore_merges) {
    Vocab v(TokenizerModel::kBpe);
    std::vector<std::string> regexes;
    for (const char* r : find_pre_tokenizer_spec(name)->regexes) regexes.push_back(r);
    v.set_pre_regexes(std::move(regexes), ignore_merges);
    return gguf_pre_tokenizer_name(v);
  };
  EXPECT_EQ(with("llama3", true), "llama-bpe");
  EXPECT_EQ(with("qwen2", false), "qwen2");
  EXPECT_EQ(with("gpt-2", false), "gpt-2");
  // Meta's and Qwen's tokenizer.json spell the contractions as (?i:...).
  const std::string hf_llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  Vocab meta(TokenizerModel::kBpe);
  meta.set_pre_regexes({hf_llama3}, true);
  EXPECT_EQ(gguf_pre_tokenizer_name(meta), "llama-bpe");
  Vocab qwen(TokenizerModel::kBpe);
  std::string hf_qwen2 = hf_llama3;
  hf_qwen2.replace(hf_qwen2.find("\\p{N}{1,3}"), 10, "\\p{N}");
  qwen.set_pre_regexes({hf_qwen2}, false);
  EXPECT_EQ(gguf_pre_tokenizer_name(qwen), "qwen2");
  Vocab odd(TokenizerModel::kBpe);
  odd.set_pre_regexes({"\\w+"}, false);
  EXPECT_EQ(gguf_pre_tokenizer_name(odd), "default");
  Vocab named(TokenizerModel::kBpe);
  named.set_pre("llama3");
  EXPECT_EQ(gguf_pre_tokenizer_name(named), "llama-bpe");
}

TEST(Convert, GgufToQ8_0AndPlan) {
  const std::string dir = test::temp_dir("convert_q8");
  const std::string gguf = synth_gguf(dir, "llama", "f32");
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/q8.gguf";
  o.dtype = DType::kQ8_0;
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  for (const auto& [name, d] : dtypes_of(o.output)) {
    EXPECT_EQ(d, name.find("norm") != std::string::npos ? DType::kF32 : DType::kQ8_0) << name;
  }
  auto a = load_model(gguf), b = load_model(o.output);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->tokenizer->encode("a cat", true, false),
            (*b)->tokenizer->encode("a cat", true, false));
  EXPECT_EQ(greedy(**b, 8).size(), 8u);

  // A plan: layer 0's FFN in Q4_0, the output matrix in Q8_0, the rest F16.
  Placement p = Placement::uniform(2, Unit::kCpu);
  p.layers[0][OpGroup::kFfn].dtype = DType::kQ4_0;
  p.output.dtype = DType::kQ8_0;
  ConvertOptions po;
  po.input = gguf;
  po.output = dir + "/plan.gguf";
  po.dtype = DType::kF16;
  po.dtype_for = [&p](const std::string& name) { return placement_dtype_for_tensor(p, name); };
  ASSERT_TRUE(convert_model(po).ok());
  auto t = dtypes_of(po.output);
  EXPECT_EQ(t["blk.0.ffn_down.weight"], DType::kQ4_0);
  EXPECT_EQ(t["blk.0.ffn_up.weight"], DType::kQ4_0);
  EXPECT_EQ(t["blk.1.ffn_down.weight"], DType::kF16);
  EXPECT_EQ(t["blk.0.attn_q.weight"], DType::kF16);
  EXPECT_EQ(t["output.weight"], DType::kQ8_0);
  EXPECT_EQ(t["token_embd.weight"], DType::kF16);
  EXPECT_EQ(t["blk.0.ffn_norm.weight"], DType::kF32);
  EXPECT_TRUE(load_model(po.output).ok());
}

TEST(Convert, RowsThatFitNoBlockKeepTheirType) {
  const std::string dir = test::temp_dir("convert_fallback");
  const std::string gguf = synth_gguf(dir, "llama", "f32", /*n_ff=*/172);
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/q4.gguf";
  o.dtype = DType::kQ4_0;
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_FALSE(r->notes.empty());
  EXPECT_NE(r->notes[0].find("ffn_down"), std::string::npos) << r->notes[0];
  auto t = dtypes_of(o.output);
  EXPECT_EQ(t["blk.0.ffn_down.weight"], DType::kF32);
  EXPECT_EQ(t["blk.0.ffn_up.weight"], DType::kQ4_0);
  EXPECT_TRUE(load_model(o.output).ok());
}

TEST(Convert, BadInputNamesTheFileAndWritesNothing) {
  const std::string dir = test::temp_dir("convert_bad_in");
  const std::string gguf = synth_gguf(dir, "llama", "f32");
  auto bytes = test::read_file(gguf);
  bytes.resize(bytes.size() / 2);
  test::write_file(dir + "/cut.gguf", bytes);
  ConvertOptions o;
  o.input = dir + "/cut.gguf";
  o.output = dir + "/out.gguf";
  auto r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("cut.gguf"), std::string::npos) << r.message();
  EXPECT_FALSE(fs::exists(o.output));

  // A folder whose shard is cut short.
  ASSERT_TRUE(write_hf_folder(gguf, dir + "/hf").ok());
  auto shard = test::read_file(dir + "/hf/model.safetensors");
  shard.resize(shard.size() - 100);
  test::write_file(dir + "/hf/model.safetensors", shard);
  o.input = dir + "/hf";
  r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("model.safetensors"), std::string::npos) << r.message();
  EXPECT_FALSE(fs::exists(o.output));

  o.input = dir + "/missing.gguf";
  r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("missing.gguf"), std::string::npos) << r.message();
  // The input as the output.
  o.input = gguf;
  o.output = gguf;
  r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("overwrite the input"), std::string::npos) << r.message();
}

TEST(Convert, FailingOutputLeavesNoFile) {
  const std::string dir = test::temp_dir("convert_bad_out");
  const std::string gguf = synth_gguf(dir, "llama", "f32");
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/no/such/folder/out.gguf";
  auto r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find(o.output), std::string::npos) << r.message();

  // A disk that fills up: the file size limit makes writes fail (EFBIG) past 64 KiB.
  o.output = dir + "/full.gguf";
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  r = convert_model(o);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, prev);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("full.gguf"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("nothing was kept"), std::string::npos) << r.message();
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"m.gguf"});
}

uint64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key)));
  }
  return 0;
}

// Peak resident memory while converting a 72 MiB F32 model to Q8_0 stays a
// small fraction of it (VmHWM reset through /proc/self/clear_refs).
TEST(Convert, MemoryStaysFarBelowTheModel) {
  const std::string dir = test::temp_dir("convert_rss");
  const std::string gguf = synth_gguf(dir, "llama", "f32", /*n_ff=*/2048, /*n_embd=*/768,
                                      /*n_layer=*/4);
  const uint64_t model_bytes = fs::file_size(gguf);
  ASSERT_GT(model_bytes, 60ull << 20);
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    if (!clear.good()) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
  }
  const uint64_t rss0 = status_kib("VmRSS:") << 10;
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/q8.gguf";
  o.dtype = DType::kQ8_0;
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  const uint64_t peak = status_kib("VmHWM:") << 10;
  const uint64_t grew = peak > rss0 ? peak - rss0 : 0;
  std::printf("convert %.1f MiB F32 -> Q8_0: peak RSS grew by %.1f MiB\n",
              static_cast<double>(model_bytes) / 1048576.0, static_cast<double>(grew) / 1048576.0);
  EXPECT_LT(grew, model_bytes / 4);
}

}  // namespace
}  // namespace loom
