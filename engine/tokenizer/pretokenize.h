// Regex pre-tokenizers for byte-level BPE: split a text into words before merging.
//
// Each pre-tokenizer (`tokenizer.ggml.pre`) is a list of PCRE2 expressions
// applied in turn, the way Hugging Face's Sequence of Split(Isolated)
// pre-tokenizers and llama.cpp work: every expression splits each piece from
// the previous step into its matches and the text between them, both kept.
// Matching runs on each piece on its own, so `$` and `(?!\S)` see the piece's end.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace loom {

/// What a pre-tokenizer name stands for.
struct PreTokenizerSpec {
  const char* name;                  ///< canonical name
  std::vector<const char*> aliases;  ///< other `tokenizer.ggml.pre` values meaning the same
  std::vector<const char*> regexes;  ///< applied in order
  bool ignore_merges = false;        ///< a word that is a whole token is emitted as is (Llama 3)
  bool add_bos = false;              ///< default for add_bos when the file does not say
};

/// The spec for `name` (canonical or alias), or nullptr when unknown.
const PreTokenizerSpec* find_pre_tokenizer_spec(std::string_view name);

/// A compiled pre-tokenizer. Thread-safe for concurrent split() calls.
class PreTokenizer {
 public:
  /// Compiles the expressions of `name`. An unknown name falls back to "gpt-2"
  /// and sets warning(); only a PCRE2 failure (a bug) is an error.
  static Result<PreTokenizer> create(std::string_view name);
  /// Compiles arbitrary expressions (tests, tokenizer.json pre-tokenizers).
  /// `ignore_merges`: a word that is a whole token is emitted as is (Llama 3).
  static Result<PreTokenizer> from_regexes(const std::vector<std::string>& regexes,
                                           bool ignore_merges = false);

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  /// Splits `text` into words (views into `text`), in order, covering all of it.
  /// Invalid UTF-8 never matches an expression, so it ends up in the gaps.
  void split(std::string_view text, std::vector<std::string_view>* words) const;

  /// Canonical name of the expressions in use ("gpt-2" after a fallback).
  const std::string& name() const { return name_; }
  bool ignore_merges() const { return ignore_merges_; }
  /// Non-empty when the requested name was unknown and "gpt-2" is used instead.
  const std::string& warning() const { return warning_; }

 private:
  struct Regex;
  PreTokenizer();

  std::vector<std::unique_ptr<Regex>> regexes_;
  std::string name_;
  std::string warning_;
  bool ignore_merges_ = false;
};

}  // namespace loom
