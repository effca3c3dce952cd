// A Vocab written as the standard GGUF tokenizer metadata (`tokenizer.ggml.*`),
// the keys llama.cpp and the programs built on it (LM Studio, Ollama) read, so
// that a GGUF converted from a Hugging Face folder carries a tokenizer that
// every GGUF reader understands, not only Loom's embedded tokenizer.json.
#pragma once

#include <string>
#include <vector>

#include "engine/tokenizer/vocab.h"

namespace loom {

class GgufWriter;

/// The `tokenizer.ggml.pre` value for a byte-level BPE vocabulary: for one
/// read from tokenizer.json (its Split expressions), the llama.cpp name of the
/// known pre-tokenizer with exactly these expressions (Hugging Face's
/// `(?i:'s|...)` contractions taken as Loom's spelled-out cases) and `ignore_merges`
/// ("llama-bpe" for Llama 3, "qwen2", "gpt-2", ...), "default" when none has
/// them; for a named one, that name (Loom's "llama3" as llama.cpp's "llama-bpe").
std::string gguf_pre_tokenizer_name(const Vocab& vocab);

/// SentencePiece scores (`tokenizer.ggml.scores`, higher merges first) for a
/// SentencePiece-style vocabulary. With merges (a tokenizer.json), a token made
/// by the merge of rank r scores -r, so score-driven merging follows the
/// ranks; tokens no merge makes score -1e9, last. Without merges: the
/// vocabulary's own scores.
std::vector<float> spm_scores(const Vocab& vocab);

/// Sets `tokenizer.ggml.model` ("llama" / "gpt2"), `pre` (BPE), `tokens`,
/// `token_type`, `scores` (SentencePiece) or `merges` (BPE), the special ids
/// the vocabulary has (bos, eos, eot, eom, unknown, padding, separator),
/// `add_bos_token`, `add_eos_token` and (SentencePiece) `add_space_prefix`.
/// load_vocab() reads them back into a vocabulary that encodes alike.
void write_vocab_metadata(const Vocab& vocab, GgufWriter* w);

}  // namespace loom
