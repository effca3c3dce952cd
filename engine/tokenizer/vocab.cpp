#include "engine/tokenizer/vocab.h"

#include <algorithm>
#include <cinttypes>
#include <optional>

#include "engine/model/gguf.h"
#include "engine/tokenizer/pretokenize.h"

namespace loom {

const char* tokenizer_model_name(TokenizerModel model) {
  switch (model) {
    case TokenizerModel::kSpm: return "llama";
    case TokenizerModel::kBpe: return "gpt2";
  }
  return "?";
}

Vocab::Vocab(TokenizerModel model) : model_(model) {
  // SentencePiece vocabularies start with a space and a BOS unless the file says otherwise.
  add_bos_ = model == TokenizerModel::kSpm;
  add_space_prefix_ = model == TokenizerModel::kSpm;
}

int32_t Vocab::add_token(std::string text, float score, TokenType type) {
  const auto id = static_cast<int32_t>(texts_.size());
  auto [it, inserted] = ids_.try_emplace(text, id);
  (void)it;
  if (!inserted && first_duplicate_ < 0) first_duplicate_ = id;
  texts_.push_back(std::move(text));
  scores_.push_back(score);
  types_.push_back(type);
  return id;
}

int32_t Vocab::find(std::string_view text) const {
  auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

Status Vocab::add_merge(std::string_view left, std::string_view right) {
  const auto rank = static_cast<int32_t>(merges_.size());
  BpeMerge m;
  m.left = find(left);
  m.right = find(right);
  if (m.left < 0 || m.right < 0) {
    return make_error(ErrorCode::kFormat, "merge %d '%.*s %.*s': '%.*s' is not a token", rank,
                      static_cast<int>(left.size()), left.data(), static_cast<int>(right.size()),
                      right.data(), static_cast<int>(m.left < 0 ? left.size() : right.size()),
                      m.left < 0 ? left.data() : right.data());
  }
  std::string merged;
  merged.reserve(left.size() + right.size());
  merged.append(left).append(right);
  m.result = find(merged);
  if (m.result < 0) {
    return make_error(ErrorCode::kFormat,
                      "merge %d '%.*s %.*s': the merged text '%s' is not a token", rank,
                      static_cast<int>(left.size()), left.data(), static_cast<int>(right.size()),
                      right.data(), merged.c_str());
  }
  // A pair listed twice keeps its first (lowest) rank, as in HF tokenizers.
  merge_ranks_.try_emplace(pair_key(m.left, m.right), rank);
  merges_.push_back(m);
  return Status();
}

int32_t Vocab::merge_rank(int32_t left, int32_t right) const {
  auto it = merge_ranks_.find(pair_key(left, right));
  return it == merge_ranks_.end() ? -1 : it->second;
}

std::vector<std::pair<int32_t, uint8_t>> Vocab::strips() const {
  std::vector<std::pair<int32_t, uint8_t>> out(strip_.begin(), strip_.end());
  std::sort(out.begin(), out.end());
  return out;
}

bool Vocab::is_end_of_generation(int32_t id) const {
  return id >= 0 && (id == special_.eos || id == special_.eot || id == special_.eom);
}

Status Vocab::validate() const {
  if (texts_.empty()) return make_error(ErrorCode::kFormat, "the vocabulary has no tokens");
  if (first_duplicate_ >= 0) {
    const std::string& t = texts_[static_cast<size_t>(first_duplicate_)];
    return make_error(ErrorCode::kFormat, "token %d '%s' has the same text as token %d",
                      first_duplicate_, t.c_str(), find(t));
  }
  const std::pair<const char*, int32_t> ids[] = {
      {"bos", special_.bos}, {"eos", special_.eos}, {"eot", special_.eot}, {"eom", special_.eom},
      {"unk", special_.unk}, {"pad", special_.pad}, {"sep", special_.sep},
  };
  for (const auto& [name, id] : ids) {
    if (id != -1 && !is_valid_id(id)) {
      return make_error(ErrorCode::kOutOfRange, "%s token id %d is outside the vocabulary (0..%d)",
                        name, id, n_tokens() - 1);
    }
  }
  if (add_bos_ && special_.bos < 0) {
    return make_error(ErrorCode::kFormat, "add_bos is set but the vocabulary has no BOS token");
  }
  if (add_eos_ && special_.eos < 0) {
    return make_error(ErrorCode::kFormat, "add_eos is set but the vocabulary has no EOS token");
  }
  return Status();
}

// ---- GGUF -------------------------------------------------------------------

namespace {

constexpr const char* kKeyModel = "tokenizer.ggml.model";
constexpr const char* kKeyPre = "tokenizer.ggml.pre";
constexpr const char* kKeyTokens = "tokenizer.ggml.tokens";
constexpr const char* kKeyScores = "tokenizer.ggml.scores";
constexpr const char* kKeyTypes = "tokenizer.ggml.token_type";
// Loom's keys for added tokens' lstrip / rstrip (vocab_writer.cpp writes them).
constexpr const char* kKeyStripIds = Vocab::kStripIdsKey;
constexpr const char* kKeyStripFlags = Vocab::kStripFlagsKey;
constexpr const char* kKeyMerges = "tokenizer.ggml.merges";

// Reads an optional special token id. Absent keys and the "none" markers that
// converters write (-1, or 0xFFFFFFFF in a u32) leave `id` as it is / set -1.
Status read_special_id(const GgufFile& gguf, const char* key, int32_t n_tokens, int32_t* id) {
  auto v = gguf.get_int(key);
  if (!v.ok()) return v.error();
  if (!v->has_value()) return Status();
  const int64_t value = **v;
  if (value == -1 || value == 0xFFFFFFFFll) {
    *id = -1;
    return Status();
  }
  if (value < 0 || value >= n_tokens) {
    return make_error(ErrorCode::kOutOfRange,
                      "%s: %s is %" PRId64 " but the vocabulary has %d tokens (0..%d)",
                      gguf.path().c_str(), key, value, n_tokens, n_tokens - 1);
  }
  *id = static_cast<int32_t>(value);
  return Status();
}

Status read_flag(const GgufFile& gguf, const char* key, bool* flag) {
  auto v = gguf.get_bool(key);
  if (!v.ok()) return v.error();
  if (v->has_value()) *flag = **v;
  return Status();
}

// Chat models often lack an explicit eot id; these texts mark one (as llama.cpp does).
int32_t find_eot_text_id(const Vocab& vocab) {
  for (const char* text :
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
        "<\xEF\xBD\x9C"
        "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"}) {
    const int32_t id = vocab.find(text);
    if (id >= 0 &&
        (vocab.type(id) == TokenType::kControl || vocab.type(id) == TokenType::kUserDefined)) {
      return id;
    }
  }
  return -1;
}

}  // namespace

Result<Vocab> load_vocab(const GgufFile& gguf) {
  const char* path = gguf.path().c_str();
  // The model name is read as a plain string: GCC 12 warns (falsely) about
  // comparing a std::optional<std::string> in place.
  std::string model_name;
  {
    LOOM_ASSIGN_OR_RETURN(std::optional<std::string> value, gguf.get_string(kKeyModel));
    if (!value) {
      return make_error(ErrorCode::kFormat, "%s: no tokenizer in this file (%s is missing)", path,
                        kKeyModel);
    }
    model_name.swap(*value);
  }
  TokenizerModel model;
  if (model_name == "llama") {
    model = TokenizerModel::kSpm;
  } else if (model_name == "gpt2") {
    model = TokenizerModel::kBpe;
  } else {
    return make_error(ErrorCode::kUnsupported,
                      "%s: tokenizer model '%s' (%s) is not supported; supported: 'llama' "
                      "(SentencePiece BPE), 'gpt2' (byte-level BPE)",
                      path, model_name.c_str(), kKeyModel);
  }
  Vocab vocab(model);

  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> pre, gguf.get_string(kKeyPre));
  if (pre && !pre->empty()) vocab.set_pre(*pre);

  LOOM_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens, gguf.get_string_array(kKeyTokens));
  if (!tokens) return make_error(ErrorCode::kFormat, "%s: %s is missing", path, kKeyTokens);
  if (tokens->empty()) return make_error(ErrorCode::kFormat, "%s: %s is empty", path, kKeyTokens);
  if (tokens->size() > static_cast<size_t>(INT32_MAX)) {
    return make_error(ErrorCode::kOutOfRange, "%s: %s has %zu tokens, more than ids can hold", path,
                      kKeyTokens, tokens->size());
  }
  const size_t n = tokens->size();

  LOOM_ASSIGN_OR_RETURN(const std::vector<double>* scores, gguf.get_float_array(kKeyScores));
  if (scores && scores->size() != n) {
    return make_error(ErrorCode::kFormat, "%s: %s has %zu entries but %s has %zu", path, kKeyScores,
                      scores->size(), kKeyTokens, n);
  }
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t>* types, gguf.get_int_array(kKeyTypes));
  if (types && types->size() != n) {
    return make_error(ErrorCode::kFormat, "%s: %s has %zu entries but %s has %zu", path, kKeyTypes,
                      types->size(), kKeyTokens, n);
  }

  for (size_t i = 0; i < n; ++i) {
    TokenType type = TokenType::kNormal;
    if (types) {
      const int64_t t = (*types)[i];
      if (t < 0 || t > static_cast<int64_t>(TokenType::kByte)) {
        return make_error(ErrorCode::kFormat, "%s: %s[%zu] is %" PRId64 ", not a token type (0..6)",
                          path, kKeyTypes, i, t);
      }
      type = static_cast<TokenType>(t);
    }
    std::string text = (*tokens)[i];
    // An empty text could never be matched or merged; give it a unique placeholder.
    if (text.empty()) text = "[EMPTY_" + std::to_string(i) + "]";
    vocab.add_token(std::move(text), scores ? static_cast<float>((*scores)[i]) : 0.0f, type);
  }
  const auto n_tokens = static_cast<int32_t>(n);

  if (model == TokenizerModel::kBpe) {
    LOOM_ASSIGN_OR_RETURN(const std::vector<std::string>* merges,
                          gguf.get_string_array(kKeyMerges));
    if (!merges) {
      return make_error(ErrorCode::kFormat, "%s: %s is missing (needed by a 'gpt2' tokenizer)",
                        path, kKeyMerges);
    }
    for (size_t i = 0; i < merges->size(); ++i) {
      const std::string& line = (*merges)[i];
      // Search from 1 so that a merge whose left part is a space itself still splits right.
      const size_t space = line.find(' ', 1);
      if (space == std::string::npos) {
        return make_error(ErrorCode::kFormat,
                          "%s: %s[%zu] '%s' is not two tokens separated by a space", path,
                          kKeyMerges, i, line.c_str());
      }
      Status s = vocab.add_merge(std::string_view(line).substr(0, space),
                                 std::string_view(line).substr(space + 1));
      if (!s.ok()) {
        return make_error(s.error().code(), "%s: %s[%zu]: %s", path, kKeyMerges, i,
                          s.message().c_str());
      }
    }
  }

  SpecialTokens& sp = vocab.special();
  if (model == TokenizerModel::kSpm && n_tokens > 2) {
    // SentencePiece's fixed layout, used by old files that do not name them.
    sp.unk = 0;
    sp.bos = 1;
    sp.eos = 2;
  }
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.bos_token_id", n_tokens, &sp.bos));
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.eos_token_id", n_tokens, &sp.eos));
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.eot_token_id", n_tokens, &sp.eot));
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.eom_token_id", n_tokens, &sp.eom));
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.unknown_token_id", n_tokens, &sp.unk));
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.padding_token_id", n_tokens, &sp.pad));
  // llama.cpp's converters spell it "seperator"; accept the correct spelling too.
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.seperator_token_id", n_tokens, &sp.sep));
  LOOM_TRY(read_special_id(gguf, "tokenizer.ggml.separator_token_id", n_tokens, &sp.sep));
  if (sp.eot < 0 && !gguf.has("tokenizer.ggml.eot_token_id")) sp.eot = find_eot_text_id(vocab);

  // Flag defaults: SPM adds BOS; Llama 3 style BPE too; the file has the last word.
  bool add_bos = vocab.add_bos();
  bool add_eos = false;
  bool add_space_prefix = vocab.add_space_prefix();
  if (model == TokenizerModel::kBpe) {
    const PreTokenizerSpec* spec = find_pre_tokenizer_spec(vocab.pre());
    add_bos = spec && spec->add_bos;
  }
  LOOM_TRY(read_flag(gguf, "tokenizer.ggml.add_bos_token", &add_bos));
  LOOM_TRY(read_flag(gguf, "tokenizer.ggml.add_eos_token", &add_eos));
  LOOM_TRY(read_flag(gguf, "tokenizer.ggml.add_space_prefix", &add_space_prefix));
  vocab.set_add_bos(add_bos && sp.bos >= 0);
  vocab.set_add_eos(add_eos && sp.eos >= 0);
  vocab.set_add_space_prefix(add_space_prefix);

  // Added tokens' lstrip / rstrip (tokenizer.json), which GGUF has no key
  // for: Loom's own pair of arrays where `loom convert` wrote them; else
  // Phi-3's from the architecture, as llama.cpp does, so that a GGUF and its
  // tokenizer.json give the same ids.
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t>* strip_ids, gguf.get_int_array(kKeyStripIds));
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t>* strip_flags,
                        gguf.get_int_array(kKeyStripFlags));
  if (strip_ids || strip_flags) {
    if (!strip_ids || !strip_flags || strip_ids->size() != strip_flags->size()) {
      return make_error(ErrorCode::kFormat, "%s: %s and %s must both be there, of one length", path,
                        kKeyStripIds, kKeyStripFlags);
    }
    for (size_t i = 0; i < strip_ids->size(); ++i) {
      const int64_t id = (*strip_ids)[i], f = (*strip_flags)[i];
      if (id < 0 || id >= vocab.n_tokens() || f < 0 || f > (Vocab::kLstrip | Vocab::kRstrip)) {
        return make_error(ErrorCode::kFormat,
                          "%s: %s[%zu] = %" PRId64 " with flags %" PRId64
                          ": not a token id (0..%d) with flags 0..3",
                          path, kKeyStripIds, i, id, f, vocab.n_tokens() - 1);
      }
      vocab.set_strip(static_cast<int32_t>(id), static_cast<uint8_t>(f));
    }
  }
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> arch, gguf.get_string("general.architecture"));
  if (!strip_ids && arch && *arch == "phi3") {
    for (int32_t id = 0; id < vocab.n_tokens(); ++id) {
      const TokenType t = vocab.type(id);
      const std::string& text = vocab.text(id);
      const bool keep = text == "<unk>" || text == "<s>" || text == "<|endoftext|>";
      if ((t == TokenType::kControl || t == TokenType::kUserDefined || text == "</s>") && !keep)
        vocab.set_strip(id, Vocab::kRstrip);
    }
  }

  Status valid = vocab.validate();
  if (!valid.ok()) {
    return make_error(valid.error().code(), "%s: %s", path, valid.message().c_str());
  }
  return vocab;
}

}  // namespace loom

namespace loom {

int32_t find_eot_by_text(const Vocab& vocab) {
  return find_eot_text_id(vocab);
}

}  // namespace loom
