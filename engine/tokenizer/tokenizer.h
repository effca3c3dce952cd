// Text <-> token ids for SentencePiece-BPE ("llama") and byte-level BPE ("gpt2")
// vocabularies, following llama.cpp's tokenizer so that ids match the reference
// test vectors (llama.cpp's ggml-vocab-*.gguf.inp/.out, made with HF tokenizers).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"
#include "engine/tokenizer/vocab.h"

namespace loom {

class PreTokenizer;

/// An encoder/decoder built from a Vocab. Immutable once created; encode() and
/// decode() may be called from several threads at once.
class Tokenizer {
 public:
  /// Validates `vocab` and prepares lookup tables and, for BPE, the
  /// pre-tokenizer named by vocab.pre(). An unknown pre-tokenizer name is not an
  /// error: the GPT-2 expression is used and warning() says so.
  static Result<Tokenizer> create(Vocab vocab);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Encodes `text` (UTF-8; invalid bytes are encoded too, as byte tokens).
  ///
  /// `add_special`: prepend BOS if vocab().add_bos(), append EOS if
  /// vocab().add_eos() (llama.cpp's add_special). Pass false for no BOS/EOS.
  ///
  /// `parse_special`: control and unknown-type tokens written in the text
  /// ("<|eot_id|>", "<s>") become their ids; without it they are plain text.
  /// User-defined (added) tokens are always matched as whole tokens, as HF
  /// tokenizers and llama.cpp do. Overlapping candidates: leftmost, then longest.
  ///
  /// SPM: a space is prefixed to the text (and to text following a special
  /// token) when vocab().add_space_prefix(); spaces become U+2581.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  /// The bytes a token stands for: SPM "▁" -> " ", `<0xXX>` -> that byte;
  /// byte-level BPE through the inverse GPT-2 byte mapping. Control and
  /// unknown-type tokens give "" unless `render_special`. An out-of-range id
  /// gives "" (use validate_ids() on ids that come from users).
  /// The result may be an incomplete UTF-8 sequence (see StreamingDetokenizer).
  const std::string& token_to_piece(int32_t id, bool render_special = false) const;

  /// Concatenates the pieces of `ids`. No leading space is stripped: an SPM
  /// text encoded with a space prefix decodes with that space.
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  /// Error naming the first id outside 0..n_tokens()-1, with its position.
  Status validate_ids(std::span<const int32_t> ids) const;

  const Vocab& vocab() const { return vocab_; }
  int32_t n_tokens() const { return vocab_.n_tokens(); }
  /// Non-empty when the vocabulary asked for something not supported exactly
  /// (an unknown pre-tokenizer); the caller decides whether to show it.
  const std::string& warning() const { return warning_; }

 private:
  Tokenizer();
  void build_tables();
  /// Appends the ids of `text`, which holds no special token.
  void encode_fragment(std::string_view text, bool prefix_space, std::vector<int32_t>* out) const;
  void encode_spm(std::string_view text, std::vector<int32_t>* out) const;
  /// SPM with merges: `text` merged as one sequence.
  void encode_spm_merged(std::string_view text, std::vector<int32_t>* out) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>* out) const;
  /// Longest special token starting at text[pos] that may be matched, or -1.
  int32_t match_special(std::string_view text, size_t pos, bool parse_special) const;

  Vocab vocab_;
  std::unique_ptr<PreTokenizer> pre_;  ///< BPE only
  std::string warning_;
  /// Special-token candidates (control, unknown, user-defined) by first byte,
  /// longest first.
  std::array<std::vector<int32_t>, 256> special_by_first_byte_;
  std::vector<std::string> pieces_;         ///< token_to_piece with render_special, by id
  std::vector<bool> hidden_;                ///< control/unknown: "" unless render_special
  std::array<int32_t, 256> byte_tokens_{};  ///< SPM <0xXX> ids (-1 when absent)
  std::array<int32_t, 256> byte_chars_{};   ///< BPE ids of the single mapped byte characters
};

/// Turns a stream of token ids into text that is always whole UTF-8 characters:
/// a character split across tokens (emoji, CJK, byte-fallback tokens) comes out
/// once its last byte arrives. Bytes that can never form a character come out
/// as U+FFFD instead of being held. Leading spaces are kept as they are
/// (decode() semantics). Holds a reference to the tokenizer.
class StreamingDetokenizer {
 public:
  /// `escape_invalid`: bytes that do not form UTF-8 come out as the text
  /// \xNN instead of U+FFFD (utf8_sanitize).
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special = false,
                                bool escape_invalid = false)
      : tokenizer_(&tokenizer), render_special_(render_special), escape_(escape_invalid) {}

  /// Adds a token; returns the text that became complete (possibly "").
  std::string push(int32_t id);
  /// Ends the stream: whatever is held back comes out (U+FFFD, or escaped, for
  /// a partial character).
  std::string flush();
  /// Drops anything held back and starts a new stream.
  void reset() { pending_.clear(); }

 private:
  const Tokenizer* tokenizer_;
  bool render_special_;
  bool escape_;
  std::string pending_;  ///< bytes of an incomplete trailing character
};

}  // namespace loom
