// SentencePiece model files (tokenizer.model: a ModelProto protobuf), as
// Hugging Face folders without a tokenizer.json carry them (Llama 2,
// Mistral). The pieces, scores and types become a Vocab in id order, with
// the unk/bos/eos/pad ids of the trainer spec and add_space_prefix from the
// normalizer's add_dummy_prefix. Loom's SentencePiece tokenizer is the BPE
// one (scores decide merges) without normalization rules, so a unigram
// model, a normalizer other than "identity" or one that removes extra
// whitespace is refused with an error that says so.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/core/status.h"
#include "engine/tokenizer/vocab.h"

namespace loom {

struct HfTokenizerConfig;

/// Reads tokenizer.model; `config` (tokenizer_config.json, may be null) sets
/// BOS/EOS and their flags as for tokenizer.json. Errors name the file, the
/// field and the byte offset.
Result<Vocab> load_spm_model(const std::string& path, const HfTokenizerConfig* config = nullptr);
/// The same from bytes in memory; `name` is used in error messages.
Result<Vocab> parse_spm_model(std::span<const uint8_t> bytes, const std::string& name,
                              const HfTokenizerConfig* config = nullptr);

}  // namespace loom
