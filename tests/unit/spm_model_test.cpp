// SentencePiece tokenizer.model files (engine/tokenizer/spm_model.h): a
// ModelProto written here field by field (protobuf wire format), its pieces,
// scores, types, special ids and flags, what is refused (unigram, other
// normalizers), and every truncation and some corruptions of its bytes. The
// real file (Llama 2's, with llama.cpp's vectors) is in
// tests/model/tokenizer_vectors_test.cpp.
#include "engine/tokenizer/spm_model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_json.h"

namespace loom {
namespace {

using Bytes = std::vector<uint8_t>;

void varint(Bytes* b, uint64_t v) {
  while (v >= 0x80) {
    b->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  b->push_back(static_cast<uint8_t>(v));
}
void tag(Bytes* b, uint32_t field, uint32_t wt) {
  varint(b, (uint64_t{field} << 3) | wt);
}
void len_field(Bytes* b, uint32_t field, const Bytes& body) {
  tag(b, field, 2);
  varint(b, body.size());
  b->insert(b->end(), body.begin(), body.end());
}
void str_field(Bytes* b, uint32_t field, const std::string& s) {
  len_field(b, field, Bytes(s.begin(), s.end()));
}
void int_field(Bytes* b, uint32_t field, int64_t v) {
  tag(b, field, 0);
  varint(b, static_cast<uint64_t>(v));
}

Bytes piece(const std::string& text, float score, int type) {
  Bytes p;
  str_field(&p, 1, text);
  tag(&p, 2, 5);
  uint32_t u = 0;
  std::memcpy(&u, &score, 4);
  for (int i = 0; i < 4; ++i) p.push_back(static_cast<uint8_t>(u >> (8 * i)));
  if (type != 1) int_field(&p, 3, type);
  return p;
}

const char* const kSp = "\xE2\x96\x81";  // U+2581

// A small BPE model: <unk> <s> </s>, byte pieces for 'a'..'c', then pieces.
Bytes model(int model_type = 2, const std::string& normalizer = "identity",
            bool remove_ws = false) {
  Bytes m;
  len_field(&m, 1, piece("<unk>", 0, 2));
  len_field(&m, 1, piece("<s>", 0, 3));
  len_field(&m, 1, piece("</s>", 0, 3));
  for (const char* b : {"<0x61>", "<0x62>", "<0x63>"}) len_field(&m, 1, piece(b, 0, 6));
  len_field(&m, 1, piece(kSp, -1, 1));
  len_field(&m, 1, piece("a", -2, 1));
  len_field(&m, 1, piece("b", -3, 1));
  len_field(&m, 1, piece(std::string(kSp) + "a", -4, 1));
  len_field(&m, 1, piece("ab", -5, 1));
  len_field(&m, 1, piece(std::string(kSp) + "ab", -6, 1));
  len_field(&m, 1, piece("<extra>", 0, 4));
  Bytes trainer;
  int_field(&trainer, 3, model_type);
  int_field(&trainer, 35, 1);  // byte_fallback
  int_field(&trainer, 40, 0);
  int_field(&trainer, 41, 1);
  int_field(&trainer, 42, 2);
  int_field(&trainer, 43, -1);  // a negative int32: ten bytes
  str_field(&trainer, 1, "ignored.txt");
  len_field(&m, 2, trainer);
  int_field(&m, 99, 7);  // an unknown field is skipped
  Bytes norm;
  str_field(&norm, 1, normalizer);
  int_field(&norm, 3, 1);
  int_field(&norm, 4, remove_ws ? 1 : 0);
  len_field(&m, 3, norm);
  return m;
}

TEST(SpmModel, PiecesScoresTypesAndSpecials) {
  auto v = parse_spm_model(model(), "t.model");
  ASSERT_TRUE(v.ok()) << v.message();
  EXPECT_EQ(v->model(), TokenizerModel::kSpm);
  ASSERT_EQ(v->n_tokens(), 13);
  EXPECT_EQ(v->text(7), "a");
  EXPECT_FLOAT_EQ(v->score(7), -2.0f);
  EXPECT_EQ(v->type(0), TokenType::kUnknown);
  EXPECT_EQ(v->type(1), TokenType::kControl);
  EXPECT_EQ(v->type(3), TokenType::kByte);
  EXPECT_EQ(v->type(6), TokenType::kNormal);
  EXPECT_EQ(v->type(12), TokenType::kUserDefined);
  EXPECT_EQ(v->special().unk, 0);
  EXPECT_EQ(v->special().bos, 1);
  EXPECT_EQ(v->special().eos, 2);
  EXPECT_EQ(v->special().pad, -1);
  EXPECT_TRUE(v->add_bos());
  EXPECT_TRUE(v->add_space_prefix());
  // Scores decide the merges: "▁ab" is one piece; 'c' falls back to its byte.
  auto tok = Tokenizer::create(std::move(*v));
  ASSERT_TRUE(tok.ok()) << tok.message();
  EXPECT_EQ(tok->encode("ab", /*add_special=*/true, false), (std::vector<int32_t>{1, 11}));
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{11, 5}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{11, 5}), " abc");
}

TEST(SpmModel, ConfigSetsBosFlags) {
  HfTokenizerConfig c;
  c.add_bos = false;
  auto v = parse_spm_model(model(), "t.model", &c);
  ASSERT_TRUE(v.ok()) << v.message();
  EXPECT_FALSE(v->add_bos());
  c.bos_token = "<nope>";
  auto bad = parse_spm_model(model(), "t.model", &c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("<nope>"), std::string::npos) << bad.message();
}

TEST(SpmModel, RefusesWhatLoomDoesNotTokenize) {
  auto u = parse_spm_model(model(1), "u.model");
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.message().find("model type 1"), std::string::npos) << u.message();
  auto n = parse_spm_model(model(2, "nmt_nfkc"), "n.model");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.message().find("normalizer 'nmt_nfkc'"), std::string::npos) << n.message();
  auto w = parse_spm_model(model(2, "identity", true), "w.model");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.message().find("extra whitespace"), std::string::npos) << w.message();
}

// Every proper prefix of the file is refused (cut inside a field, or whole
// fields missing: then the defaults, a unigram model or the nmt_nfkc
// normalizer).
TEST(SpmModel, EveryTruncationIsAnError) {
  const Bytes m = model();
  for (size_t n = 0; n < m.size(); ++n) {
    auto v = parse_spm_model(std::span<const uint8_t>(m.data(), n), "cut.model");
    EXPECT_FALSE(v.ok()) << "prefix of " << n << " bytes parsed";
    if (!v.ok()) {
      EXPECT_NE(v.message().find("cut.model"), std::string::npos) << v.message();
    }
  }
}

TEST(SpmModel, CorruptBytesNameTheFault) {
  {
    Bytes m = model();
    m[1] = 0xFF;  // the first piece's length (16383) now runs past the end
    m.insert(m.begin() + 2, 0x7F);
    auto v = parse_spm_model(m, "len.model");
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.message().find("runs past the end"), std::string::npos) << v.message();
    EXPECT_NE(v.message().find("at byte"), std::string::npos) << v.message();
  }
  {
    Bytes m = model();
    m[0] = (1 << 3) | 3;  // wire type 3 (groups)
    auto v = parse_spm_model(m, "wt.model");
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.message().find("wire type"), std::string::npos) << v.message();
  }
  {
    const Bytes m(12, 0xFF);  // a varint that never ends
    auto v = parse_spm_model(m, "var.model");
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.message().find("varint"), std::string::npos) << v.message();
  }
  auto missing = load_spm_model("/nonexistent/tokenizer.model");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("/nonexistent/tokenizer.model"), std::string::npos);
}

}  // namespace
}  // namespace loom
