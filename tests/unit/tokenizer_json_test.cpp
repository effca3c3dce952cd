// tokenizer.json / tokenizer_config.json: small files written here, both BPE
// kinds, and the errors for what is not supported or not well formed.
#include "engine/tokenizer/tokenizer_json.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/model/gguf.h"
#include "engine/model/gguf_writer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/vocab_writer.h"
#include "tests/test_util.h"

namespace loom {
namespace {

// A byte-level BPE over "a", "b", "ab", "Ġ" (space) and "Ġab", one added special token.
std::string byte_level_json(const std::string& model_type = "BPE") {
  return R"({"version": "1.0",
    "added_tokens": [{"id": 5, "content": "<|end|>", "special": true},
                     {"id": 6, "content": "<tool>", "special": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": ")" +
         model_type + R"(", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4},
              "merges": ["a b", ["\u0120", "ab"]]}})";
}

TEST(TokenizerJson, ByteLevel) {
  auto hf = parse_tokenizer_json(byte_level_json(), "t.json");
  ASSERT_TRUE(hf.ok()) << hf.message();
  auto tok = Tokenizer::create(std::move(hf->vocab));
  ASSERT_TRUE(tok.ok()) << tok.message();
  EXPECT_EQ(tok->vocab().model(), TokenizerModel::kBpe);
  EXPECT_EQ(tok->encode("ab ab<|end|>", false, true), (std::vector<int32_t>{2, 4, 5}));
  // The special token is text unless parsed; the user-defined one always matches.
  EXPECT_EQ(tok->encode("ab<tool>", false, false), (std::vector<int32_t>{2, 6}));
  EXPECT_EQ(tok->decode(tok->encode("ab ab", false, false)), "ab ab");
  EXPECT_EQ(tok->vocab().special().eot, 5);
}

TEST(TokenizerJson, SentencePieceStyleWithByteFallback) {
  // "▁" + "a" merge first (rank 0), then "▁a" + "b"; "é" is no token: bytes.
  const std::string text = R"({"added_tokens": [{"id": 0, "content": "<unk>", "special": true},
                                  {"id": 1, "content": "<s>", "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
      "vocab": {"<unk>": 0, "<s>": 1, "<0xC3>": 2, "<0xA9>": 3, "\u2581": 4, "a": 5, "b": 6,
                "\u2581a": 7, "\u2581ab": 8, "ab": 9},
      "merges": ["\u2581 a", "\u2581a b", "a b"]}})";
  HfTokenizerConfig config;
  config.add_bos = true;
  auto hf = parse_tokenizer_json(text, "spm.json", &config);
  ASSERT_TRUE(hf.ok()) << hf.message();
  auto tok = Tokenizer::create(std::move(hf->vocab));
  ASSERT_TRUE(tok.ok()) << tok.message();
  EXPECT_EQ(tok->vocab().model(), TokenizerModel::kSpm);
  EXPECT_EQ(tok->vocab().type(2), TokenType::kByte);
  EXPECT_EQ(tok->vocab().special().unk, 0);
  // "ab ab é" -> ▁ab ▁ab ▁ <0xC3> <0xA9>, BOS first.
  EXPECT_EQ(tok->encode("ab ab \xC3\xA9", true, false), (std::vector<int32_t>{1, 8, 8, 4, 2, 3}));
  EXPECT_EQ(tok->decode(tok->encode("ab ab \xC3\xA9", false, false)), " ab ab \xC3\xA9");
}

// Added tokens with lstrip / rstrip take the whitespace beside them.
TEST(TokenizerJson, AddedTokensStripWhitespace) {
  std::string text = byte_level_json();
  const std::string plain = R"({"id": 5, "content": "<|end|>", "special": true})";
  text.replace(text.find(plain), plain.size(),
               R"({"id": 5, "content": "<|end|>", "special": true, "lstrip": true,
                   "rstrip": true})");
  auto hf = parse_tokenizer_json(text, "t.json");
  ASSERT_TRUE(hf.ok()) << hf.message();
  EXPECT_EQ(hf->vocab.strip(5), Vocab::kLstrip | Vocab::kRstrip);
  EXPECT_EQ(hf->vocab.strip(6), 0);
  auto tok = Tokenizer::create(std::move(hf->vocab));
  ASSERT_TRUE(tok.ok()) << tok.message();
  const std::vector<int32_t> want = {2, 5, 2};
  EXPECT_EQ(tok->encode("ab<|end|>ab", false, true), want);
  EXPECT_EQ(tok->encode("ab  \n<|end|> \t ab", false, true), want);
  // Without the flags the spaces are text: "Ġ" before the second "ab" makes "Ġab".
  auto plain_tok =
      Tokenizer::create(std::move(parse_tokenizer_json(byte_level_json(), "t.json")->vocab));
  ASSERT_TRUE(plain_tok.ok());
  EXPECT_EQ(plain_tok->encode("ab<|end|> ab", false, true), (std::vector<int32_t>{2, 5, 4}));
}

// `loom convert` keeps the flags: Loom's two GGUF arrays carry them, and
// a file whose arrays disagree is an error that names them.
TEST(TokenizerJson, StripFlagsSurviveAGguf) {
  std::string text = byte_level_json();
  const std::string plain = R"({"id": 5, "content": "<|end|>", "special": true})";
  text.replace(text.find(plain), plain.size(),
               R"({"id": 5, "content": "<|end|>", "special": true, "rstrip": true})");
  auto hf = parse_tokenizer_json(text, "t.json");
  ASSERT_TRUE(hf.ok()) << hf.message();
  const std::string dir = test::temp_dir("strip_gguf");
  auto write = [&](const std::string& name, const std::vector<int32_t>* bad_flags) {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    write_vocab_metadata(hf->vocab, &w);
    if (bad_flags) w.set_i32_array("tokenizer.loom.strip_flags", *bad_flags);
    const std::string path = dir + "/" + name;
    EXPECT_TRUE(w.open(path).ok());
    EXPECT_TRUE(w.close().ok());
    return path;
  };
  auto f = GgufFile::open(write("ok.gguf", nullptr));
  ASSERT_TRUE(f.ok()) << f.message();
  auto back = load_vocab(**f);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(back->strip(5), Vocab::kRstrip);
  EXPECT_EQ(back->strip(6), 0);
  auto tok = Tokenizer::create(std::move(back).value());
  ASSERT_TRUE(tok.ok()) << tok.message();
  EXPECT_EQ(tok->encode("ab<|end|> ab", false, true), (std::vector<int32_t>{2, 5, 2}));
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{2, 2}, std::vector<int32_t>{4}}) {
    auto g = GgufFile::open(write("bad.gguf", &bad));
    ASSERT_TRUE(g.ok()) << g.message();
    auto v = load_vocab(**g);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.error().code(), ErrorCode::kFormat);
    EXPECT_NE(v.message().find("tokenizer.loom.strip_"), std::string::npos) << v.message();
  }
}

// Metaspace with split (Hugging Face's default): each word is merged on its
// own, so a merge across "▁" never happens; split false merges the whole text.
TEST(TokenizerJson, MetaspaceSplitsWords) {
  auto json_with = [](const std::string& split) {
    return R"({"added_tokens": [{"id": 0, "content": "<unk>", "special": true}],
      "normalizer": null,
      "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always")" +
           split + R"(},
      "model": {"type": "BPE", "byte_fallback": false, "unk_token": "<unk>",
        "vocab": {"<unk>": 0, "\u2581": 1, "a": 2, "a\u2581": 3},
        "merges": ["a \u2581"]}})";
  };
  auto hf = parse_tokenizer_json(json_with(""), "split.json");
  ASSERT_TRUE(hf.ok()) << hf.message();
  EXPECT_TRUE(hf->vocab.spm_split_words());
  auto tok = Tokenizer::create(std::move(hf->vocab));
  ASSERT_TRUE(tok.ok()) << tok.message();
  // "a a" -> "▁a▁a": words "▁a", "▁a".
  EXPECT_EQ(tok->encode("a a", false, false), (std::vector<int32_t>{1, 2, 1, 2}));
  auto whole = parse_tokenizer_json(json_with(R"(, "split": false)"), "nosplit.json");
  ASSERT_TRUE(whole.ok()) << whole.message();
  EXPECT_FALSE(whole->vocab.spm_split_words());
  auto tok2 = Tokenizer::create(std::move(whole->vocab));
  ASSERT_TRUE(tok2.ok());
  EXPECT_EQ(tok2->encode("a a", false, false), (std::vector<int32_t>{1, 3, 2}));
}

TEST(TokenizerJson, Errors) {
  auto expect_error = [](const std::string& text, ErrorCode code, const std::string& part) {
    auto hf = parse_tokenizer_json(text, "bad/tokenizer.json");
    ASSERT_FALSE(hf.ok()) << part;
    EXPECT_EQ(hf.error().code(), code) << hf.message();
    EXPECT_NE(hf.message().find("bad/tokenizer.json"), std::string::npos) << hf.message();
    EXPECT_NE(hf.message().find(part), std::string::npos) << hf.message();
  };
  expect_error(byte_level_json("Unigram"), ErrorCode::kUnsupported, "model type 'Unigram'");
  expect_error(byte_level_json("WordPiece"), ErrorCode::kUnsupported, "'WordPiece'");
  expect_error("{\"model\": ", ErrorCode::kFormat, "does not parse");
  expect_error("[]", ErrorCode::kFormat, "not a JSON object");
  std::string s = byte_level_json();
  s.replace(s.find("\"a b\""), 5, "\"a c\"");
  expect_error(s, ErrorCode::kFormat, "merges[0]");
  s = byte_level_json();
  s.replace(s.find("\"id\": 6"), 7, "\"id\": 9");
  expect_error(s, ErrorCode::kFormat, "id");
  s = byte_level_json();
  s.replace(s.find("\"id\": 6"), 7, "\"id\": 2");
  expect_error(s, ErrorCode::kFormat, "both 'ab' and '<tool>'");
  s = byte_level_json();
  const std::string pre = R"("type": "ByteLevel", "add_prefix_space": false, "use_regex": true)";
  s.replace(s.find(pre), pre.size(), R"("type": "Whitespace")");
  // Still byte-level through the decoder; the pre-tokenizer is refused by name.
  expect_error(s, ErrorCode::kUnsupported, "'Whitespace'");
}

TEST(TokenizerJson, Config) {
  auto c = parse_hf_tokenizer_config(
      R"({"add_bos_token": false, "bos_token": {"content": "<s>", "lstrip": false},
          "eos_token": "</s>", "chat_template": [{"name": "tool_use", "template": "x"},
                                                {"name": "default", "template": "{{ y }}"}]})",
      "tokenizer_config.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->add_bos, false);
  EXPECT_FALSE(c->add_eos.has_value());
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
  EXPECT_EQ(c->chat_template, "{{ y }}");
  auto bad = parse_hf_tokenizer_config("{", "cfg.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("cfg.json"), std::string::npos);
}

}  // namespace
}  // namespace loom
