// Hugging Face tokenizer files: tokenizer.json (the `tokenizers` library's
// format) and tokenizer_config.json (special tokens, BOS/EOS flags, the chat
// template), read into the same Vocab the GGUF path builds, so one Tokenizer
// serves both.
//
// Supported: model type BPE, either byte-level (a ByteLevel pre-tokenizer or
// decoder: GPT-2, Llama 3, Qwen2; Split regexes run through PCRE2 with UTF
// and UCP) or SentencePiece-style (Metaspace, or the Prepend + Replace "▁"
// normalizers, byte_fallback <0xNN> tokens: Llama 2, Mistral, Phi-3), with
// added tokens (special ones become control tokens, the others user-defined,
// matched before splitting). Anything else (Unigram, WordPiece, a normalizer
// or pre-tokenizer these families do not use) is an error naming it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"
#include "engine/tokenizer/vocab.h"

namespace loom {

/// What tokenizer_config.json says; empty fields where it is silent.
struct HfTokenizerConfig {
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  std::string bos_token;
  std::string eos_token;
  std::string chat_template;  ///< the "default" one when the file lists several
};

/// Reads tokenizer_config.json. Errors name the file and the field.
Result<HfTokenizerConfig> load_hf_tokenizer_config(const std::string& path);
/// The same from text already in memory; `name` is used in error messages.
Result<HfTokenizerConfig> parse_hf_tokenizer_config(std::string_view text, const std::string& name);

/// Sets BOS/EOS (and whether encoding adds them) from tokenizer_config.json
/// (`config`, may be null), then the end-of-turn and end-of-message ids from
/// the token texts. `file` names the tokenizer in errors (a token the config
/// names that the vocabulary lacks).
Status apply_hf_tokenizer_config(Vocab& vocab, const HfTokenizerConfig* config, const char* file);

/// A vocabulary from tokenizer.json, with notes on what is approximated
/// (e.g. an NFC normalizer, which Loom does not apply).
struct HfVocab {
  Vocab vocab;
  std::vector<std::string> notes;
};

/// Reads tokenizer.json; `config` (when given) sets BOS/EOS and their flags.
Result<HfVocab> load_tokenizer_json(const std::string& path,
                                    const HfTokenizerConfig* config = nullptr);
/// The same from text already in memory; `name` is used in error messages.
Result<HfVocab> parse_tokenizer_json(std::string_view text, const std::string& name,
                                     const HfTokenizerConfig* config = nullptr);

}  // namespace loom
