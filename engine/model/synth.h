// Synthetic models: random (seeded) weights in the exact tensor layout of a
// real architecture, written as GGUF with a usable tokenizer. Tests and
// benchmarks use them; nothing downloads a model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace loom {

/// Shape and format of a synthetic model.
struct SynthSpec {
  std::string arch = "llama";  ///< llama | qwen2 | phi3 | qwen3 | gemma2
  std::string name = "loom-synthetic";
  int64_t n_layer = 2;
  int64_t n_embd = 64;
  int64_t n_ff = 172;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 0;        ///< 0: n_embd / n_head (qwen3 and gemma2 presets set their own)
  int64_t sliding_window = 0;  ///< gemma2: window of the even layers; 0: 4096
  int64_t n_vocab = 0;         ///< 0: the tokenizer's size; larger: padded with unused tokens
  int64_t n_ctx = 512;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_output = false;  ///< no output.weight; the embedding is reused
  /// Weight format: a dtype name (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
  /// q2_k..q6_k) or a mixture: q4_k_m, q5_k_m (attn_v, ffn_down of some layers and
  /// output in Q6_K, as llama.cpp's _M mixtures do).
  std::string weight_type = "f32";
  uint64_t seed = 1;
  std::string vocab_from;  ///< GGUF to copy tokenizer.* keys from; empty: built-in vocabulary
};

/// Fills `spec` with a named preset's shape: stories-like, tinyllama-1.1b,
/// qwen2-0.5b, phi3-mini, llama3-8b, qwen3-0.6b, gemma2-2b.
Status apply_synth_preset(const std::string& preset, SynthSpec* spec);

/// What write_synthetic_model wrote.
struct SynthReport {
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;  ///< tensor data bytes
  uint64_t file_bytes = 0;
  int64_t n_vocab = 0;
  std::vector<std::string> notes;  ///< e.g. tensors kept in another dtype, and why
};

/// Writes the model to `path`, streaming: memory use stays far below the file
/// size. `progress(done_bytes, total_bytes)` is called now and then (may be empty).
Result<SynthReport> write_synthetic_model(
    const SynthSpec& spec, const std::string& path,
    const std::function<void(uint64_t, uint64_t)>& progress = {});

/// The built-in byte-level BPE tokenizer used when no vocabulary is given:
/// specials <s>, </s>, <|im_start|>, <|im_end|>, the 256 bytes, then merges
/// learnt from a small built-in English text; padded to `n_vocab` with unused
/// tokens when that is larger.
struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;
  int32_t bos = 0, eos = 1, eot = 3;
};
SynthVocab builtin_synth_vocab(int64_t n_vocab);

}  // namespace loom
