// Subcommands of the `loom` CLI. main.cpp parses arguments (CLI11) into these
// plain structs; each command lives in its own cmd_*.cpp and returns the exit status.
#pragma once

#include <cstdint>
#include <string>

namespace loom::cli {

struct InfoOptions {
  std::string model;      ///< GGUF file
  bool list_tensors = false;
  bool list_metadata = false;
};
int cmd_info(const InfoOptions& o);

struct TokenizeOptions {
  std::string model;      ///< GGUF file with tokenizer metadata
  std::string prompt;
  bool no_bos = false;
  bool parse_special = false;
  bool pieces = false;    ///< print "id 'piece'" pairs instead of ids only
};
int cmd_tokenize(const TokenizeOptions& o);

struct SynthOptions {
  std::string out;
  std::string preset;     ///< stories-like | tinyllama-1.1b | qwen2-0.5b | phi3-mini | llama3-8b
  std::string arch = "llama";
  int64_t layers = 2;
  int64_t dim = 64;
  int64_t ffn = 172;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t vocab = 0;      ///< 0: size of the tokenizer used
  int64_t ctx = 512;
  std::string dtype = "f32";
  uint64_t seed = 1;
  std::string vocab_from; ///< GGUF to copy the tokenizer from; empty: built-in byte-level vocab
  // Which of the above were given explicitly (they override a preset).
  bool set_arch = false, set_layers = false, set_dim = false, set_ffn = false, set_heads = false,
       set_kv_heads = false, set_vocab = false, set_ctx = false;
};
int cmd_synth(const SynthOptions& o);

}  // namespace loom::cli
