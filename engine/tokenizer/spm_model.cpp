#include "engine/tokenizer/spm_model.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "engine/tokenizer/tokenizer_json.h"

namespace loom {
namespace {

// Protobuf wire format (the facts of the encoding: varints, tags of field
// number << 3 | wire type). Every read is bounds-checked; an error names the
// message, the field and the byte offset in the file.
class Wire {
 public:
  Wire(const uint8_t* begin, const uint8_t* end, const uint8_t* file_begin, const std::string& name)
      : p_(begin), end_(end), base_(file_begin), name_(name) {}

  bool done() const { return p_ >= end_; }
  uint64_t offset() const { return static_cast<uint64_t>(p_ - base_); }

  Status varint(uint64_t* v, const char* what) {
    const uint64_t at = offset();
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return fail(at, what, "ends inside a varint");
      const uint8_t b = *p_++;
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return {};
    }
    return fail(at, what, "varint longer than 10 bytes");
  }
  Status fixed32(uint32_t* v, const char* what) {
    if (end_ - p_ < 4) return fail(offset(), what, "ends inside a 32-bit field");
    std::memcpy(v, p_, 4);  // little-endian, as the hosts Loom runs on
    p_ += 4;
    return {};
  }
  // A length-delimited field's bytes.
  Status bytes(const uint8_t** b, const uint8_t** e, const char* what) {
    uint64_t n = 0;
    LOOM_TRY(varint(&n, what));
    if (n > static_cast<uint64_t>(end_ - p_))
      return fail(offset(), what, "length runs past the end of its message");
    *b = p_;
    *e = p_ + n;
    p_ += n;
    return {};
  }
  // Skips a field of wire type `wt` that is not read.
  Status skip(uint32_t wt, const char* what) {
    uint64_t v = 0;
    const uint8_t *b = nullptr, *e = nullptr;
    switch (wt) {
      case 0: return varint(&v, what);
      case 1:
        if (end_ - p_ < 8) return fail(offset(), what, "ends inside a 64-bit field");
        p_ += 8;
        return {};
      case 2: return bytes(&b, &e, what);
      case 5: {
        uint32_t u = 0;
        return fixed32(&u, what);
      }
      default: return fail(offset(), what, "unsupported protobuf wire type");
    }
  }
  Status fail(uint64_t at, const char* what, const char* why) const {
    return make_error(ErrorCode::kFormat, "%s: not a SentencePiece model: %s at byte %llu (%s)",
                      name_.c_str(), why, static_cast<unsigned long long>(at), what);
  }
  // The next field's number and wire type.
  Status tag(uint32_t* field, uint32_t* wt, const char* what) {
    uint64_t k = 0;
    LOOM_TRY(varint(&k, what));
    *field = static_cast<uint32_t>(k >> 3);
    *wt = static_cast<uint32_t>(k & 7);
    if (*field == 0) return fail(offset(), what, "field number 0");
    return {};
  }
  const uint8_t* base() const { return base_; }
  const std::string& name() const { return name_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* base_;
  const std::string& name_;
};

// A field read as its expected wire type, or an error naming it.
Status expect(const Wire& w, uint32_t wt, uint32_t want, const char* what) {
  if (wt == want) return {};
  return w.fail(w.offset(), what, "field of the wrong wire type");
}

// ModelProto's parts that Loom uses (field numbers of sentencepiece_model.proto).
struct Piece {
  std::string text;
  float score = 0.0f;
  uint32_t type = 1;  // NORMAL
};
struct Spec {
  uint32_t model_type = 1;  // UNIGRAM (the proto's default)
  int32_t unk = 0, bos = 1, eos = 2, pad = -1;
  std::string normalizer = "nmt_nfkc";  // the proto's default name
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

Status read_piece(Wire w, Piece* out) {
  while (!w.done()) {
    uint32_t f = 0, wt = 0;
    LOOM_TRY(w.tag(&f, &wt, "piece"));
    if (f == 1) {
      LOOM_TRY(expect(w, wt, 2, "piece text"));
      const uint8_t *b = nullptr, *e = nullptr;
      LOOM_TRY(w.bytes(&b, &e, "piece text"));
      out->text.assign(reinterpret_cast<const char*>(b), static_cast<size_t>(e - b));
    } else if (f == 2) {
      LOOM_TRY(expect(w, wt, 5, "piece score"));
      uint32_t u = 0;
      LOOM_TRY(w.fixed32(&u, "piece score"));
      std::memcpy(&out->score, &u, 4);
    } else if (f == 3) {
      LOOM_TRY(expect(w, wt, 0, "piece type"));
      uint64_t v = 0;
      LOOM_TRY(w.varint(&v, "piece type"));
      if (v < 1 || v > 6) return w.fail(w.offset(), "piece type", "unknown piece type");
      out->type = static_cast<uint32_t>(v);
    } else {
      LOOM_TRY(w.skip(wt, "piece"));
    }
  }
  return {};
}

Status read_trainer(Wire w, Spec* s) {
  while (!w.done()) {
    uint32_t f = 0, wt = 0;
    LOOM_TRY(w.tag(&f, &wt, "trainer_spec"));
    int32_t* id = f == 40   ? &s->unk
                  : f == 41 ? &s->bos
                  : f == 42 ? &s->eos
                  : f == 43 ? &s->pad
                            : nullptr;
    if (f == 3 || id) {
      LOOM_TRY(expect(w, wt, 0, "trainer_spec"));
      uint64_t v = 0;
      LOOM_TRY(w.varint(&v, "trainer_spec"));
      if (id) {
        *id = static_cast<int32_t>(static_cast<uint32_t>(v));  // int32: negatives are 10 bytes
      } else {
        s->model_type = static_cast<uint32_t>(v);
      }
    } else {
      LOOM_TRY(w.skip(wt, "trainer_spec"));
    }
  }
  return {};
}

Status read_normalizer(Wire w, Spec* s) {
  while (!w.done()) {
    uint32_t f = 0, wt = 0;
    LOOM_TRY(w.tag(&f, &wt, "normalizer_spec"));
    if (f == 1) {
      LOOM_TRY(expect(w, wt, 2, "normalizer name"));
      const uint8_t *b = nullptr, *e = nullptr;
      LOOM_TRY(w.bytes(&b, &e, "normalizer name"));
      s->normalizer.assign(reinterpret_cast<const char*>(b), static_cast<size_t>(e - b));
    } else if (f == 3 || f == 4) {
      LOOM_TRY(expect(w, wt, 0, "normalizer_spec"));
      uint64_t v = 0;
      LOOM_TRY(w.varint(&v, "normalizer_spec"));
      (f == 3 ? s->add_dummy_prefix : s->remove_extra_whitespaces) = v != 0;
    } else {
      LOOM_TRY(w.skip(wt, "normalizer_spec"));
    }
  }
  return {};
}

}  // namespace

Result<Vocab> parse_spm_model(std::span<const uint8_t> bytes, const std::string& name,
                              const HfTokenizerConfig* config) {
  const uint8_t* begin = bytes.data();
  Wire w(begin, begin + bytes.size(), begin, name);
  std::vector<Piece> pieces;
  Spec spec;
  while (!w.done()) {
    uint32_t f = 0, wt = 0;
    LOOM_TRY(w.tag(&f, &wt, "model"));
    if (f >= 1 && f <= 3) {
      static const char* const kWhat[] = {"", "pieces", "trainer_spec", "normalizer_spec"};
      LOOM_TRY(expect(w, wt, 2, kWhat[f]));
      const uint8_t *b = nullptr, *e = nullptr;
      LOOM_TRY(w.bytes(&b, &e, kWhat[f]));
      const Wire sub(b, e, begin, name);
      if (f == 1) {
        pieces.emplace_back();
        LOOM_TRY(read_piece(sub, &pieces.back()));
      } else if (f == 2) {
        LOOM_TRY(read_trainer(sub, &spec));
      } else {
        LOOM_TRY(read_normalizer(sub, &spec));
      }
    } else {
      LOOM_TRY(w.skip(wt, "model"));
    }
  }
  if (pieces.empty())
    return make_error(ErrorCode::kFormat, "%s: not a SentencePiece model: no pieces", name.c_str());
  if (spec.model_type != 2) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: SentencePiece model type %u is not supported (only BPE, type 2, as "
                      "Llama 2 and Mistral use; 1 is unigram)",
                      name.c_str(), spec.model_type);
  }
  if (spec.normalizer != "identity" || spec.remove_extra_whitespaces) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: SentencePiece normalizer '%s'%s is not supported (only 'identity' "
                      "without removing extra whitespace)",
                      name.c_str(), spec.normalizer.c_str(),
                      spec.remove_extra_whitespaces ? " removing extra whitespace" : "");
  }
  Vocab vocab(TokenizerModel::kSpm);
  for (Piece& p : pieces)
    vocab.add_token(std::move(p.text), p.score, static_cast<TokenType>(p.type));
  SpecialTokens& sp = vocab.special();
  const int32_t n = vocab.n_tokens();
  auto id_or_none = [n](int32_t id) { return id >= 0 && id < n ? id : -1; };
  sp.unk = id_or_none(spec.unk);
  sp.bos = id_or_none(spec.bos);
  sp.eos = id_or_none(spec.eos);
  sp.pad = id_or_none(spec.pad);
  vocab.set_add_bos(sp.bos >= 0);
  vocab.set_add_space_prefix(spec.add_dummy_prefix);
  LOOM_TRY(apply_hf_tokenizer_config(vocab, config, name.c_str()));
  LOOM_TRY(vocab.validate());
  return vocab;
}

Result<Vocab> load_spm_model(const std::string& path, const HfTokenizerConfig* config) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(ErrorCode::kIo, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  if (in.bad()) return make_error(ErrorCode::kIo, "%s: read failed", path.c_str());
  return parse_spm_model(bytes, path, config);
}

}  // namespace loom
