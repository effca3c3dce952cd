#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/utf8.h"

namespace loom {

namespace {

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

// "<0x0A>" -> 10; -1 when `text` is not of that form.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos).append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

bool is_special_type(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined;
}

}  // namespace

Tokenizer::Tokenizer() : vocab_(TokenizerModel::kSpm) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::create(Vocab vocab) {
  LOOM_TRY(vocab.validate());
  Tokenizer t;
  t.vocab_ = std::move(vocab);
  if (t.vocab_.model() == TokenizerModel::kBpe) {
    LOOM_ASSIGN_OR_RETURN(
        PreTokenizer pre,
        t.vocab_.has_pre_regexes()
            ? PreTokenizer::from_regexes(t.vocab_.pre_regexes(), t.vocab_.pre_ignore_merges())
            : PreTokenizer::create(t.vocab_.pre()));
    t.warning_ = pre.warning();
    t.pre_ = std::make_unique<PreTokenizer>(std::move(pre));
  }
  t.build_tables();
  return t;
}

void Tokenizer::build_tables() {
  const int32_t n = vocab_.n_tokens();
  const bool spm = vocab_.model() == TokenizerModel::kSpm;

  // Special tokens by first byte, longest first, so the first hit is the longest.
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = vocab_.text(id);
    if (is_special_type(vocab_.type(id)) && !text.empty()) {
      special_by_first_byte_[static_cast<uint8_t>(text[0])].push_back(id);
    }
  }
  for (auto& bucket : special_by_first_byte_) {
    std::sort(bucket.begin(), bucket.end(), [this](int32_t a, int32_t b) {
      const size_t la = vocab_.text(a).size(), lb = vocab_.text(b).size();
      return la != lb ? la > lb : a < b;
    });
  }

  byte_tokens_.fill(-1);
  byte_chars_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (spm) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      int32_t id = vocab_.find(name);
      if (id < 0) id = vocab_.find(std::string(1, static_cast<char>(b)));
      byte_tokens_[static_cast<size_t>(b)] = id;
    } else {
      std::string ch;
      append_utf8(&ch, byte_level_encode(static_cast<uint8_t>(b)));
      byte_chars_[static_cast<size_t>(b)] = vocab_.find(ch);
    }
  }

  pieces_.resize(static_cast<size_t>(n));
  hidden_.assign(static_cast<size_t>(n), false);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = vocab_.text(id);
    std::string& piece = pieces_[static_cast<size_t>(id)];
    switch (vocab_.type(id)) {
      case TokenType::kControl:
      case TokenType::kUnknown:
        piece = text;
        hidden_[static_cast<size_t>(id)] = true;
        break;
      case TokenType::kUserDefined:
        piece = text;  // added tokens are stored as the raw text they match
        break;
      case TokenType::kByte:
        if (spm) {
          const int byte = parse_byte_token(text);
          piece = byte >= 0 ? std::string(1, static_cast<char>(byte)) : text;
        } else {
          byte_level_decode_text(text, &piece);
        }
        break;
      case TokenType::kNormal:
        if (spm) {
          piece = text;
          replace_all(&piece, kSpmSpace, " ");
        } else {
          byte_level_decode_text(text, &piece);
        }
        break;
      case TokenType::kUnused:
      case TokenType::kUndefined: break;  // never text
    }
  }
}

namespace {
// Whitespace as lstrip / rstrip take it (ASCII; what chat templates put around tokens).
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
}  // namespace

int32_t Tokenizer::match_special(std::string_view text, size_t pos, bool parse_special) const {
  for (int32_t id : special_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    if (!parse_special && vocab_.type(id) != TokenType::kUserDefined) continue;
    const std::string& s = vocab_.text(id);
    if (s.size() <= text.size() - pos && std::memcmp(text.data() + pos, s.data(), s.size()) == 0) {
      return id;
    }
  }
  return -1;
}

void Tokenizer::encode_fragment(std::string_view text, bool prefix_space,
                                std::vector<int32_t>* out) const {
  if (vocab_.model() == TokenizerModel::kBpe) {
    encode_bpe(text, out);
    return;
  }
  std::string escaped;
  escaped.reserve(text.size() + 16);
  if (prefix_space && vocab_.add_space_prefix()) escaped.append(kSpmSpace);
  for (char c : text) {
    if (c == ' ') {
      escaped.append(kSpmSpace);
    } else {
      escaped.push_back(c);
    }
  }
  encode_spm(escaped, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && vocab_.add_bos()) out.push_back(vocab_.special().bos);

  // Split on special tokens first; the text between them is tokenized on its
  // own. SPM puts a space before the text that follows the start or a special
  // token (llama.cpp does the same).
  bool after_special = true;
  size_t fragment_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const int32_t id = match_special(text, pos, parse_special);
    if (id < 0) {
      ++pos;
      continue;
    }
    // lstrip / rstrip (tokenizer.json's added tokens): the token takes the
    // whitespace beside it.
    const uint8_t strip = vocab_.strip(id);
    size_t end = pos;
    if (strip & Vocab::kLstrip) {
      while (end > fragment_start && is_space(text[end - 1])) --end;
    }
    if (end > fragment_start) {
      encode_fragment(text.substr(fragment_start, end - fragment_start), after_special, &out);
    }
    out.push_back(id);
    pos += vocab_.text(id).size();
    if (strip & Vocab::kRstrip) {
      while (pos < text.size() && is_space(text[pos])) ++pos;
    }
    fragment_start = pos;
    after_special = true;
  }
  if (fragment_start < text.size()) {
    encode_fragment(text.substr(fragment_start), after_special, &out);
  }

  if (add_special && vocab_.add_eos()) out.push_back(vocab_.special().eos);
  return out;
}

const std::string& Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  if (!vocab_.is_valid_id(id)) return empty_string();
  const auto i = static_cast<size_t>(id);
  if (hidden_[i] && !render_special) return empty_string();
  return pieces_[i];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, render_special);
  return out;
}

Status Tokenizer::validate_ids(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!vocab_.is_valid_id(ids[i])) {
      return make_error(ErrorCode::kOutOfRange,
                        "token id %d at position %zu is outside the vocabulary (0..%d)", ids[i], i,
                        vocab_.n_tokens() - 1);
    }
  }
  return Status();
}

std::string StreamingDetokenizer::push(int32_t id) {
  pending_ += tokenizer_->token_to_piece(id, render_special_);
  std::string out;
  const size_t consumed = utf8_sanitize(pending_, /*final=*/false, &out, escape_);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  utf8_sanitize(pending_, /*final=*/true, &out, escape_);
  pending_.clear();
  return out;
}

}  // namespace loom
