// Tokenizers on small vocabularies built in the test: SentencePiece merging by
// score, byte fallback, special tokens, byte-level BPE merge order, the
// pre-tokenizer expressions, streaming detokenization and vocabulary errors
// (through GGUF files written here).
#include "engine/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/model/gguf_writer.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/utf8.h"
#include "engine/tokenizer/vocab.h"
#include "tests/test_util.h"

namespace loom {
namespace {

using Ids = std::vector<int32_t>;

const std::string kSp = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// ---- SentencePiece ----------------------------------------------------------

struct SpmFixture {
  Vocab vocab{TokenizerModel::kSpm};
  int32_t byte0 = -1;  // id of <0x00>
  int32_t id(const std::string& text) const { return vocab.find(text); }
};

// <unk> <s> </s>, optionally the 256 byte tokens, then scored pieces.
SpmFixture make_spm(bool with_bytes = true) {
  SpmFixture f;
  Vocab& v = f.vocab;
  v.add_token("<unk>", 0, TokenType::kUnknown);
  v.add_token("<s>", 0, TokenType::kControl);
  v.add_token("</s>", 0, TokenType::kControl);
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      const int32_t id = v.add_token(name, 0, TokenType::kByte);
      if (b == 0) f.byte0 = id;
    }
  }
  const std::pair<std::string, float> pieces[] = {
      {kSp, -1.0f},  {"a", -2.0f},  {"b", -2.0f},        {"c", -2.0f},
      {"ab", -3.0f}, {"bc", -1.5f}, {kSp + "a", -0.5f},  {"h", -2.0f},
      {"i", -2.0f},  {"hi", -1.0f}, {kSp + "hi", -0.8f}, {"\xE4\xBD\xA0", -2.0f},  // 你
      {"<", -4.0f},  {">", -4.0f},  {"s", -4.0f},
  };
  for (const auto& [text, score] : pieces) v.add_token(text, score);
  v.add_token("<tool>", 0, TokenType::kUserDefined);
  v.add_token("<|x|>", 0, TokenType::kControl);
  v.add_token("<|x|>y", 0, TokenType::kControl);
  v.special().unk = 0;
  v.special().bos = 1;
  v.special().eos = 2;
  return f;
}

Tokenizer make_tokenizer(Vocab v) {
  auto t = Tokenizer::create(std::move(v));
  EXPECT_TRUE(t.ok()) << t.message();
  return std::move(t).value();
}

TEST(SpmTokenizer, MergesHighestScoreFirst) {
  SpmFixture f = make_spm();
  Tokenizer tok = make_tokenizer(f.vocab);
  // "▁abc": "▁a" (-0.5) beats "bc" (-1.5) and "ab" (-3); then "bc"; "▁abc" is no token.
  EXPECT_EQ(tok.encode("abc", false, false), (Ids{f.id(kSp + "a"), f.id("bc")}));
  // Without "▁a" winning (no space prefix): "bc" (-1.5) beats "ab" (-3).
  SpmFixture g = make_spm();
  g.vocab.set_add_space_prefix(false);
  Tokenizer tok2 = make_tokenizer(g.vocab);
  EXPECT_EQ(tok2.encode("abc", false, false), (Ids{g.id("a"), g.id("bc")}));
  EXPECT_EQ(tok.encode("hi hi", false, false), (Ids{f.id(kSp + "hi"), f.id(kSp + "hi")}));
  EXPECT_EQ(tok.encode("", false, false), Ids{});
  EXPECT_EQ(tok.encode("", true, false), Ids{1});
}

TEST(SpmTokenizer, ByteFallbackAndUnknown) {
  SpmFixture f = make_spm();
  Tokenizer tok = make_tokenizer(f.vocab);
  // é (C3 A9) is no token: its bytes are. 你 is a token.
  EXPECT_EQ(tok.encode("a\xC3\xA9\xE4\xBD\xA0", false, false),
            (Ids{f.id(kSp + "a"), f.byte0 + 0xC3, f.byte0 + 0xA9, f.id("\xE4\xBD\xA0")}));
  EXPECT_EQ(tok.decode(tok.encode("a\xC3\xA9\xE4\xBD\xA0", false, false)),
            " a\xC3\xA9\xE4\xBD\xA0");
  // Invalid UTF-8 still encodes (bytes) and decodes to the same bytes.
  const std::string bad = "a\xFF\xC3";
  EXPECT_EQ(tok.decode(tok.encode(bad, false, false)), " " + bad);

  SpmFixture g = make_spm(/*with_bytes=*/false);
  Tokenizer no_bytes = make_tokenizer(g.vocab);
  EXPECT_EQ(no_bytes.encode("a\xC3\xA9", false, false), (Ids{g.id(kSp + "a"), 0}));
}

TEST(SpmTokenizer, SpecialTokens) {
  SpmFixture f = make_spm();
  Tokenizer tok = make_tokenizer(f.vocab);
  const int32_t lt = f.id("<"), gt = f.id(">"), s = f.id("s");
  // parse_special: "<s>" is BOS; the text after a special token gets its own space prefix.
  EXPECT_EQ(tok.encode("a<s>hi", false, true), (Ids{f.id(kSp + "a"), 1, f.id(kSp + "hi")}));
  // Without it, "<s>" is text.
  EXPECT_EQ(tok.encode("<s>", false, false), (Ids{f.id(kSp), lt, s, gt}));
  // User-defined tokens are matched either way.
  const int32_t tool = f.id("<tool>");
  EXPECT_EQ(tok.encode("<tool>", false, false), (Ids{tool}));
  EXPECT_EQ(tok.encode("<tool>", false, true), (Ids{tool}));
  // Longest candidate wins at a position.
  EXPECT_EQ(tok.encode("<|x|>y", false, true), (Ids{f.id("<|x|>y")}));
  EXPECT_EQ(tok.encode("<|x|>h", false, true), (Ids{f.id("<|x|>"), f.id(kSp), f.id("h")}));
  // add_special: BOS (and EOS when the vocabulary asks for it).
  EXPECT_EQ(tok.encode("a", true, false), (Ids{1, f.id(kSp + "a")}));
  SpmFixture g = make_spm();
  g.vocab.set_add_eos(true);
  Tokenizer with_eos = make_tokenizer(g.vocab);
  EXPECT_EQ(with_eos.encode("a", true, false), (Ids{1, g.id(kSp + "a"), 2}));
  EXPECT_EQ(with_eos.encode("a", false, false), (Ids{g.id(kSp + "a")}));
}

TEST(SpmTokenizer, Pieces) {
  SpmFixture f = make_spm();
  Tokenizer tok = make_tokenizer(f.vocab);
  EXPECT_EQ(tok.token_to_piece(f.id(kSp + "hi")), " hi");
  EXPECT_EQ(tok.token_to_piece(f.byte0 + 0x0A), "\n");
  EXPECT_EQ(tok.token_to_piece(1), "");
  EXPECT_EQ(tok.token_to_piece(1, /*render_special=*/true), "<s>");
  EXPECT_EQ(tok.token_to_piece(0), "");
  EXPECT_EQ(tok.token_to_piece(f.id("<tool>")), "<tool>");
  EXPECT_EQ(tok.token_to_piece(-1), "");
  EXPECT_EQ(tok.token_to_piece(tok.n_tokens()), "");
  const Ids ids = {1, f.id(kSp + "a"), f.id("bc")};
  EXPECT_EQ(tok.decode(ids), " abc");
  EXPECT_EQ(tok.decode(ids, true), "<s> abc");
  EXPECT_TRUE(tok.validate_ids(ids).ok());
  const Ids bad = {1, 2, tok.n_tokens()};
  Status s = tok.validate_ids(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(s.message().find("position 2"), std::string::npos) << s.message();
}

// ---- byte-level BPE ---------------------------------------------------------

std::string mapped(std::string_view bytes) {
  std::string out;
  for (char c : bytes) append_utf8(&out, byte_level_encode(static_cast<uint8_t>(c)));
  return out;
}

// The 256 byte characters (id = byte value), then the merges given (texts in
// raw bytes), each adding its result as a token.
Vocab make_bpe(const std::vector<std::pair<std::string, std::string>>& merges,
               const std::string& pre = "gpt-2") {
  Vocab v(TokenizerModel::kBpe);
  for (int b = 0; b < 256; ++b) v.add_token(mapped(std::string(1, static_cast<char>(b))));
  for (const auto& [left, right] : merges) {
    if (v.find(mapped(left + right)) < 0) v.add_token(mapped(left + right));
    Status s = v.add_merge(mapped(left), mapped(right));
    EXPECT_TRUE(s.ok()) << s.message();
  }
  v.set_pre(pre);
  return v;
}

TEST(BpeTokenizer, ByteMappingIsGpt2s) {
  EXPECT_EQ(byte_level_encode('!'), 0x21u);
  EXPECT_EQ(byte_level_encode(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_level_encode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_level_encode(0xAD), 0x143u);  // the soft hyphen is remapped (last one)
  EXPECT_EQ(byte_level_encode(0xFF), 0xFFu);
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ(byte_level_decode(byte_level_encode(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(byte_level_decode(0x144), -1);
}

TEST(BpeTokenizer, MergeOrderFollowsRank) {
  Vocab bc_first = make_bpe({{"b", "c"}, {"a", "b"}});
  Tokenizer t1 = make_tokenizer(bc_first);
  EXPECT_EQ(t1.encode("abc", false, false), (Ids{'a', bc_first.find(mapped("bc"))}));
  Vocab ab_first = make_bpe({{"a", "b"}, {"b", "c"}});
  Tokenizer t2 = make_tokenizer(ab_first);
  EXPECT_EQ(t2.encode("abc", false, false), (Ids{ab_first.find(mapped("ab")), 'c'}));
  // Equal ranks: leftmost first; merged symbols merge again.
  Vocab aa = make_bpe({{"a", "a"}, {"aa", "aa"}});
  Tokenizer t3 = make_tokenizer(aa);
  EXPECT_EQ(t3.encode("aaa", false, false), (Ids{aa.find(mapped("aa")), 'a'}));
  EXPECT_EQ(t3.encode("aaaa", false, false), (Ids{aa.find(mapped("aaaa"))}));
  EXPECT_EQ(t3.encode("aaaaa", false, false), (Ids{aa.find(mapped("aaaa")), 'a'}));
}

TEST(BpeTokenizer, WordsDoNotMergeAcrossPreTokens) {
  Vocab v = make_bpe({{"h", "i"}, {" ", "hi"}, {"i", " "}});
  Tokenizer tok = make_tokenizer(v);
  // "i " would merge, but the gpt-2 expression splits "hi hi" into "hi", " hi".
  EXPECT_EQ(tok.encode("hi hi", false, false), (Ids{v.find(mapped("hi")), v.find(mapped(" hi"))}));
  EXPECT_EQ(tok.decode(tok.encode("hi hi", false, false)), "hi hi");
  // Every byte string round-trips, invalid UTF-8 included.
  const std::string bytes = "x\xFF\xC3(\xE4\xBD\xA0\n\t \x01";
  EXPECT_EQ(tok.decode(tok.encode(bytes, false, false)), bytes);
  EXPECT_EQ(tok.token_to_piece(' '), " ");
}

TEST(BpeTokenizer, IgnoreMergesEmitsWholeWordTokens) {
  // "abc" is a token but no merge leads to it.
  Vocab v = make_bpe({});
  const int32_t abc = v.add_token(mapped("abc"));
  Vocab llama3 = v;
  llama3.set_pre("llama3");
  EXPECT_EQ(make_tokenizer(v).encode("abc", false, false), (Ids{'a', 'b', 'c'}));
  EXPECT_EQ(make_tokenizer(llama3).encode("abc", false, false), (Ids{abc}));
}

TEST(BpeTokenizer, SpecialTokensAndUnknownPre) {
  Vocab v = make_bpe({{"h", "i"}});
  const int32_t eot = v.add_token("<|eot|>", 0, TokenType::kControl);
  const int32_t added = v.add_token("  ", 0, TokenType::kUserDefined);  // raw text, like MPT's
  v.special().eos = eot;
  Tokenizer tok = make_tokenizer(v);
  EXPECT_EQ(tok.warning(), "");
  const int32_t hi = v.find(mapped("hi"));
  EXPECT_EQ(tok.encode("hi<|eot|>", false, true), (Ids{hi, eot}));
  const Ids plain = tok.encode("hi<|eot|>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(tok.decode(plain), "hi<|eot|>");
  EXPECT_EQ(tok.encode("hi  hi", false, false), (Ids{hi, added, hi}));
  EXPECT_EQ(tok.token_to_piece(added), "  ");
  EXPECT_TRUE(tok.vocab().is_end_of_generation(eot));

  v.set_pre("no-such-pre");
  Tokenizer fallback = make_tokenizer(v);
  EXPECT_NE(fallback.warning().find("no-such-pre"), std::string::npos);
  EXPECT_EQ(fallback.encode("hi", false, false), (Ids{hi}));
}

// Any byte string comes back from decode(encode()) unchanged (SPM: after the
// space prefix), whatever the pre-tokenizer does with invalid UTF-8.
TEST(Tokenizer, RandomTextRoundTrips) {
  const char* pieces[] = {"a",
                          "b",
                          "c",
                          "h",
                          "i",
                          " ",
                          "  ",
                          "\n",
                          "\t",
                          "1",
                          "42",
                          "'s",
                          "'M",
                          "\xC3\xA9",
                          "\xE4\xBD\xA0",
                          "\xF0\x9F\x98\x80",
                          "\xFF",
                          "\x80",
                          "\xE4\xBD",
                          "!?",
                          "\xE2\x84\xAA"};
  std::vector<Tokenizer> bpe;
  for (const char* pre : {"gpt-2", "llama3", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
                          "starcoder", "tekken", "bloom"}) {
    bpe.push_back(
        make_tokenizer(make_bpe({{"h", "i"}, {" ", "hi"}, {"a", "b"}, {"ab", "c"}}, pre)));
  }
  Tokenizer spm = make_tokenizer(make_spm().vocab);
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) text += pieces[rng() % std::size(pieces)];
    for (const Tokenizer& t : bpe) {
      EXPECT_EQ(t.decode(t.encode(text, false, false)), text) << t.vocab().pre();
    }
    EXPECT_EQ(spm.decode(spm.encode(text, false, false)), text.empty() ? "" : " " + text);
  }
}

// ---- pre-tokenizers ---------------------------------------------------------

std::vector<std::string> split(const char* pre, const std::string& text) {
  auto p = PreTokenizer::create(pre);
  EXPECT_TRUE(p.ok()) << p.message();
  std::vector<std::string_view> words;
  p->split(text, &words);
  std::string joined;
  std::vector<std::string> out;
  for (std::string_view w : words) {
    joined += w;
    out.emplace_back(w);
  }
  EXPECT_EQ(joined, text) << pre;  // the pieces cover the text exactly
  return out;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(split("gpt-2", "Hello world's  123"), (Words{"Hello", " world", "'s", " ", " 123"}));
  EXPECT_EQ(split("gpt-2", "I'M"), (Words{"I", "'", "M"}));
  EXPECT_EQ(split("gpt-2", "a \n"), (Words{"a", " \n"}));
  // Invalid UTF-8 never matches: it stays between matches.
  EXPECT_EQ(split("gpt-2",
                  "ab\xFF"
                  "cd"),
            (Words{"ab", "\xFF", "cd"}));
  EXPECT_EQ(split("gpt-2", ""), Words{});
}

TEST(PreTokenizer, Llama3AndQwen2Digits) {
  EXPECT_EQ(split("llama-bpe", "12345"), (Words{"123", "45"}));
  EXPECT_EQ(split("qwen2", "12345"), (Words{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("llama3", "I'M here"), (Words{"I", "'M", " here"}));
  EXPECT_EQ(split("qwen2", "I'M here"), (Words{"I", "'M", " here"}));
  EXPECT_EQ(split("llama3", "x\n\n  y"), (Words{"x", "\n\n", " ", " y"}));
  EXPECT_EQ(split("llama3", "(hello)"), (Words{"(hello", ")"}));
}

TEST(PreTokenizer, OthersCompileAndSplit) {
  EXPECT_EQ(split("starcoder", "ab12"), (Words{"ab", "1", "2"}));
  EXPECT_EQ(split("deepseek-coder", "ab\n12"), (Words{"ab", "\n", "1", "2"}));
  EXPECT_EQ(split("falcon", "1234567"), (Words{"123", "456", "7"}));
  // DeepSeek LLM's letter class includes U+2126 OHM SIGN and U+212A KELVIN SIGN.
  EXPECT_EQ(split("deepseek-llm", "\xE2\x84\xA6\xE2\x84\xAA x"),
            (Words{"\xE2\x84\xA6\xE2\x84\xAA", " x"}));
  for (const char* name : {"default", "mpt", "refact", "command-r", "deepseek-v3", "chatglm-bpe",
                           "bloom", "viking", "tekken", "stablelm2", "smaug-bpe"}) {
    auto p = PreTokenizer::create(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.message();
    EXPECT_EQ(p->warning(), "") << name;
  }
  auto unknown = PreTokenizer::create("nope");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->name(), "gpt-2");
  EXPECT_FALSE(unknown->warning().empty());
  auto broken = PreTokenizer::from_regexes({"(unclosed"});
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.message().find("(unclosed"), std::string::npos);
}

// ---- streaming detokenizer --------------------------------------------------

TEST(StreamingDetokenizer, HoldsPartialCharacters) {
  Tokenizer tok = make_tokenizer(make_bpe({}));  // one token per byte, id = byte
  StreamingDetokenizer s(tok);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push(0x98), "");
  EXPECT_EQ(s.push(0x80), emoji);
  EXPECT_EQ(s.push(0xE4), "");  // 你 = E4 BD A0
  EXPECT_EQ(s.push(0xBD), "");
  EXPECT_EQ(s.push(0xA0), "\xE4\xBD\xA0");
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.flush(), "");
}

TEST(StreamingDetokenizer, InvalidBytesBecomeReplacementCharacters) {
  Tokenizer tok = make_tokenizer(make_bpe({}));
  const std::string rep(kUtf8Replacement);
  StreamingDetokenizer s(tok);
  EXPECT_EQ(s.push(0xFF), rep);       // never valid: not held back
  EXPECT_EQ(s.push(0xE4), "");        // could start a character
  EXPECT_EQ(s.push('a'), rep + "a");  // it did not
  EXPECT_EQ(s.push(0x80), rep);       // stray continuation byte
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.flush(), rep);  // the stream ended inside a character
  EXPECT_EQ(s.push('b'), "b");
}

TEST(StreamingDetokenizer, SpmByteFallbackTokens) {
  SpmFixture f = make_spm();
  Tokenizer tok = make_tokenizer(f.vocab);
  const Ids ids = tok.encode("a\xF0\x9F\x98\x80!", true, false);  // bytes for the emoji and '!'
  StreamingDetokenizer s(tok);
  std::string out;
  std::vector<std::string> chunks;
  for (int32_t id : ids) {
    chunks.push_back(s.push(id));
    out += chunks.back();
  }
  out += s.flush();
  EXPECT_EQ(out, " a\xF0\x9F\x98\x80!");
  for (const std::string& c : chunks) EXPECT_TRUE(utf8_is_valid(c));
}

TEST(Utf8, MaximalSubparts) {
  const std::string rep(kUtf8Replacement);
  auto sanitize = [](const std::string& in) {
    std::string out;
    EXPECT_EQ(utf8_sanitize(in, true, &out), in.size());
    return out;
  };
  EXPECT_EQ(sanitize("\xED\xA0\x80"), rep + rep + rep);            // a surrogate
  EXPECT_EQ(sanitize("\xC0\x80"), rep + rep);                      // overlong NUL
  EXPECT_EQ(sanitize("\xF4\x90\x80\x80"), rep + rep + rep + rep);  // above U+10FFFF
  EXPECT_EQ(sanitize("\xE4\xBD"), rep);                            // truncated: one subpart
  EXPECT_EQ(sanitize("ok\xC3\xA9"), "ok\xC3\xA9");
  std::string out;
  EXPECT_EQ(utf8_sanitize("a\xE4\xBD", false, &out), 1u);
  EXPECT_EQ(out, "a");
  // Escaped: every invalid byte shows as \xNN; valid text is untouched.
  auto escaped = [](const std::string& in) {
    std::string o;
    EXPECT_EQ(utf8_sanitize(in, true, &o, /*escape=*/true), in.size());
    return o;
  };
  EXPECT_EQ(escaped("\xED\xA0\x80"), "\\xED\\xA0\\x80");
  EXPECT_EQ(escaped("a\xE4\xBD"
                    "b\xC3\xA9"),
            "a\\xE4\\xBDb\xC3\xA9");
  EXPECT_EQ(escaped("\xFF"), "\\xFF");
  EXPECT_TRUE(utf8_is_valid(escaped("\x80\xBF\xFE")));
}

// ---- vocabulary validation --------------------------------------------------

TEST(Vocab, ValidateCatchesBadIds) {
  SpmFixture f = make_spm();
  f.vocab.special().bos = 100000;
  Status s = f.vocab.validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(s.message().find("bos"), std::string::npos) << s.message();
  EXPECT_FALSE(Tokenizer::create(f.vocab).ok());

  Vocab dup(TokenizerModel::kSpm);
  dup.add_token("x");
  dup.add_token("x");
  dup.set_add_bos(false);
  EXPECT_FALSE(dup.validate().ok());

  Vocab bpe = make_bpe({});
  Status m = bpe.add_merge("zz", mapped("a"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("'zz' is not a token"), std::string::npos) << m.message();
  Status r = bpe.add_merge(mapped("a"), mapped("b"));  // "ab" is no token
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("merged text"), std::string::npos) << r.message();
}

// A small SPM vocabulary written as GGUF, with `edit` changing keys first.
template <typename Edit>
Result<Vocab> load_written(const std::string& name, Edit edit) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", kSp, "a", kSp + "a"});
  w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -0.5f});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1});
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
  edit(w);
  const std::string path = test::temp_dir("tokenizer_" + name) + "/vocab.gguf";
  Status s = w.open(path);
  if (!s.ok()) return s.error();
  LOOM_TRY(w.close());
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  return load_vocab(*file);
}

TEST(Vocab, LoadsFromGguf) {
  auto v = load_written("ok", [](GgufWriter&) {});
  ASSERT_TRUE(v.ok()) << v.message();
  EXPECT_EQ(v->model(), TokenizerModel::kSpm);
  EXPECT_EQ(v->n_tokens(), 6);
  EXPECT_EQ(v->special().bos, 1);
  EXPECT_EQ(v->special().unk, 0);   // SentencePiece default
  EXPECT_EQ(v->special().pad, -1);  // 0xFFFFFFFF means none
  EXPECT_TRUE(v->add_bos());
  EXPECT_TRUE(v->add_space_prefix());
  EXPECT_EQ(v->type(1), TokenType::kControl);
  EXPECT_FLOAT_EQ(v->score(5), -0.5f);
  Tokenizer tok = make_tokenizer(std::move(v).value());
  EXPECT_EQ(tok.encode("a", true, false), (Ids{1, 5}));

  auto flags = load_written("flags", [](GgufWriter& w) {
    w.set_bool("tokenizer.ggml.add_bos_token", false);
    w.set_bool("tokenizer.ggml.add_space_prefix", false);
  });
  ASSERT_TRUE(flags.ok()) << flags.message();
  EXPECT_FALSE(flags->add_bos());
  EXPECT_FALSE(flags->add_space_prefix());
}

TEST(Vocab, GgufErrorsNameTheKey) {
  struct Case {
    const char* name;
    void (*edit)(GgufWriter&);
    ErrorCode code;
    const char* needle;
  };
  const Case cases[] = {
      {"scores",
       [](GgufWriter& w) {
         w.set_f32_array("tokenizer.ggml.scores", {0, 0});
       },
       ErrorCode::kFormat, "tokenizer.ggml.scores has 2 entries"},
      {"types",
       [](GgufWriter& w) {
         w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1});
       },
       ErrorCode::kFormat, "tokenizer.ggml.token_type has 3 entries"},
      {"type_value",
       [](GgufWriter& w) {
         w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 9, 1});
       },
       ErrorCode::kFormat, "tokenizer.ggml.token_type[4] is 9"},
      {"bos", [](GgufWriter& w) { w.set_u32("tokenizer.ggml.bos_token_id", 6); },
       ErrorCode::kOutOfRange, "tokenizer.ggml.bos_token_id is 6"},
      {"eot", [](GgufWriter& w) { w.set_i32("tokenizer.ggml.eot_token_id", -7); },
       ErrorCode::kOutOfRange, "tokenizer.ggml.eot_token_id is -7"},
      {"model", [](GgufWriter& w) { w.set_string("tokenizer.ggml.model", "t5"); },
       ErrorCode::kUnsupported, "'t5'"},
      {"tokens_type",
       [](GgufWriter& w) {
         w.set_i32_array("tokenizer.ggml.tokens", {1, 2});
       },
       ErrorCode::kFormat, "tokenizer.ggml.tokens"},
      {"no_merges", [](GgufWriter& w) { w.set_string("tokenizer.ggml.model", "gpt2"); },
       ErrorCode::kFormat, "tokenizer.ggml.merges is missing"},
      {"bad_merge",
       [](GgufWriter& w) {
         w.set_string("tokenizer.ggml.model", "gpt2");
         w.set_string_array("tokenizer.ggml.merges", {"a b"});
       },
       ErrorCode::kFormat, "tokenizer.ggml.merges[0]"},
      {"dup",
       [](GgufWriter& w) {
         w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "a", "b"});
       },
       ErrorCode::kFormat, "same text"},
  };
  for (const Case& c : cases) {
    auto v = load_written(c.name, c.edit);
    ASSERT_FALSE(v.ok()) << c.name;
    EXPECT_EQ(v.error().code(), c.code) << c.name << ": " << v.message();
    EXPECT_NE(v.message().find(c.needle), std::string::npos) << c.name << ": " << v.message();
    EXPECT_NE(v.message().find("vocab.gguf"), std::string::npos) << c.name << ": " << v.message();
  }
}

}  // namespace
}  // namespace loom
