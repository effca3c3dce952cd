// Tokenizer vocabulary: token texts, scores, types, BPE merges, special ids and
// the flags that say how a text is turned into tokens. Loaded from GGUF
// metadata (`tokenizer.ggml.*`), from GPT-2 style `encoder.json` + `vocab.bpe`
// files, or built in code (tests, synthetic models).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace loom {

class GgufFile;

/// Kind of a token; the values are those of `tokenizer.ggml.token_type`.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,      ///< the unk token
  kControl = 3,      ///< bos/eos/chat markers: never produced from plain text
  kUserDefined = 4,  ///< added tokens, always matched as a whole in the text
  kUnused = 5,
  kByte = 6,  ///< SentencePiece byte fallback `<0xXX>`
};

/// The tokenization algorithm (`tokenizer.ggml.model`).
enum class TokenizerModel {
  kSpm,  ///< "llama": SentencePiece BPE over UTF-8 characters, scores decide merges
  kBpe,  ///< "gpt2": byte-level BPE, merge ranks decide merges
};

/// Name used in GGUF for a model ("llama" / "gpt2").
const char* tokenizer_model_name(TokenizerModel model);

/// Special token ids; -1 where the vocabulary has none.
struct SpecialTokens {
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t eot = -1;  ///< end of turn (chat models), e.g. <|eot_id|>, <|im_end|>, <|end|>
  int32_t eom = -1;  ///< end of message (Llama 3.1 tool calls)
  int32_t unk = -1;
  int32_t pad = -1;
  int32_t sep = -1;
};

/// One BPE merge: `left` + `right` -> `result`, all token ids; lower rank merges first.
struct BpeMerge {
  int32_t left = -1;
  int32_t right = -1;
  int32_t result = -1;
};

/// A tokenizer vocabulary. Ids are dense, 0..n_tokens()-1.
///
/// Building one by hand: construct with the model, add_token() in id order,
/// add_merge() in rank order (BPE), set specials and flags, then validate()
/// (Tokenizer::create validates too).
class Vocab {
 public:
  explicit Vocab(TokenizerModel model = TokenizerModel::kSpm);

  TokenizerModel model() const { return model_; }

  /// Pre-tokenizer name (`tokenizer.ggml.pre`), "default" when the file has none.
  const std::string& pre() const { return pre_; }
  void set_pre(std::string pre) { pre_ = std::move(pre); }
  /// Pre-tokenizer expressions given as they are (tokenizer.json's Split
  /// patterns); once set, they are used instead of the named pre().
  bool has_pre_regexes() const { return has_pre_regexes_; }
  const std::vector<std::string>& pre_regexes() const { return pre_regexes_; }
  bool pre_ignore_merges() const { return pre_ignore_merges_; }
  void set_pre_regexes(std::vector<std::string> regexes, bool ignore_merges) {
    pre_regexes_ = std::move(regexes);
    pre_ignore_merges_ = ignore_merges;
    has_pre_regexes_ = true;
  }

  /// Appends a token and returns its id. A text already present keeps mapping to
  /// its first id; validate() reports the duplicate.
  int32_t add_token(std::string text, float score = 0.0f, TokenType type = TokenType::kNormal);

  /// Appends a merge (rank = number of merges added before it). Both parts and
  /// their concatenation must already be tokens.
  Status add_merge(std::string_view left, std::string_view right);

  int32_t n_tokens() const { return static_cast<int32_t>(texts_.size()); }
  bool is_valid_id(int32_t id) const { return id >= 0 && id < n_tokens(); }
  /// Accessors take a valid id (programmer error otherwise).
  const std::string& text(int32_t id) const { return texts_[static_cast<size_t>(id)]; }
  float score(int32_t id) const { return scores_[static_cast<size_t>(id)]; }
  TokenType type(int32_t id) const { return types_[static_cast<size_t>(id)]; }
  void set_type(int32_t id, TokenType type) { types_[static_cast<size_t>(id)] = type; }

  /// Id of the token whose text is exactly `text`, or -1.
  int32_t find(std::string_view text) const;

  /// Rank of the merge (left, right), or -1 when they do not merge.
  int32_t merge_rank(int32_t left, int32_t right) const;
  /// The merge of rank `rank` (0 <= rank < n_merges()).
  const BpeMerge& merge(int32_t rank) const { return merges_[static_cast<size_t>(rank)]; }
  int32_t n_merges() const { return static_cast<int32_t>(merges_.size()); }

  const SpecialTokens& special() const { return special_; }
  SpecialTokens& special() { return special_; }

  /// Whether encoding with add_special prepends BOS / appends EOS.
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  void set_add_bos(bool v) { add_bos_ = v; }
  void set_add_eos(bool v) { add_eos_ = v; }
  /// SPM: prefix the text with a space ("▁") before tokenizing, as SentencePiece does.
  bool add_space_prefix() const { return add_space_prefix_; }
  void set_add_space_prefix(bool v) { add_space_prefix_ = v; }

  /// SPM with merges (tokenizer.json's Metaspace with split): each word, from
  /// one "▁" to the next, is merged on its own.
  bool spm_split_words() const { return spm_split_words_; }
  void set_spm_split_words(bool v) { spm_split_words_ = v; }

  /// Added tokens that take the whitespace beside them when they match
  /// (tokenizer.json's lstrip / rstrip): bit 0 left, bit 1 right.
  static constexpr uint8_t kLstrip = 1, kRstrip = 2;
  /// Loom's GGUF keys for them (GGUF has none): token ids, and their flags.
  static constexpr const char* kStripIdsKey = "tokenizer.loom.strip_token_ids";
  static constexpr const char* kStripFlagsKey = "tokenizer.loom.strip_flags";
  uint8_t strip(int32_t id) const {
    auto it = strip_.find(id);
    return it == strip_.end() ? 0 : it->second;
  }
  void set_strip(int32_t id, uint8_t flags) {
    if (flags)
      strip_[id] = flags;
    else
      strip_.erase(id);
  }
  /// The tokens with strip flags, by id (for writing them out).
  std::vector<std::pair<int32_t, uint8_t>> strips() const;

  /// True for the ids that end generation: eos, eot, eom.
  bool is_end_of_generation(int32_t id) const;

  /// Checks the whole vocabulary: non-empty, no duplicate texts, special ids in
  /// range. The error names the offending id or text.
  Status validate() const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  TokenizerModel model_;
  std::string pre_ = "default";
  std::vector<std::string> pre_regexes_;
  bool pre_ignore_merges_ = false;
  bool has_pre_regexes_ = false;
  std::vector<std::string> texts_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  int32_t first_duplicate_ = -1;  ///< id of the first token whose text was already present
  std::vector<BpeMerge> merges_;
  std::unordered_map<uint64_t, int32_t> merge_ranks_;  ///< pair_key(left, right) -> rank
  SpecialTokens special_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  bool spm_split_words_ = false;
  std::unordered_map<int32_t, uint8_t> strip_;  ///< the few tokens with lstrip / rstrip
};

/// The id of a control or user-defined token whose text marks an end of turn
/// (<|eot_id|>, <|im_end|>, <|end|>, ...), or -1: for vocabularies that do not say.
int32_t find_eot_by_text(const Vocab& vocab);

/// Reads the vocabulary from a GGUF file's `tokenizer.ggml.*` metadata and validates it.
/// Errors name the file and the key; an unknown `tokenizer.ggml.model` is kUnsupported.
Result<Vocab> load_vocab(const GgufFile& gguf);

/// Reads a GPT-2 style byte-level BPE vocabulary: `encoder.json` (token text ->
/// id, texts in the GPT-2 byte-to-unicode alphabet) and `vocab.bpe` (one merge
/// "A B" per line in rank order; an optional leading "#version" line is skipped).
/// Ids must be dense from 0. All tokens are normal; the caller adds special
/// tokens (add_token with TokenType::kControl), sets specials, flags and pre().
Result<Vocab> load_vocab_gpt2_files(const std::string& encoder_json_path,
                                    const std::string& vocab_bpe_path);

}  // namespace loom
