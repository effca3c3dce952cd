// Hugging Face model folders as a model source: config.json, *.safetensors
// (one file or shards with model.safetensors.index.json), tokenizer.json and
// tokenizer_config.json.
//
// The folder is presented as what a GGUF file gives: metadata under GGUF keys
// (`llama.block_count` from num_hidden_layers, ...) and tensors under GGUF
// names (`blk.0.attn_q.weight` from model.layers.0.self_attn.q_proj.weight),
// their data still in the safetensors' memory maps. So load_model() runs the
// same architecture code (engine/model/arch/) for both sources; nothing below
// the model knows where the weights came from.
//
// One difference cannot be renamed away: HF's llama-family q/k rows are in the
// rotate_half order (RoPE rotates dims (i, i + d/2)), which GGUF converters
// permute into adjacent pairs. Instead of permuting rows (a copy), a folder of
// such an architecture says `rope_neox_layout`, and load_model runs its RoPE
// in the NeoX order, which rotates exactly those pairs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/vocab.h"

namespace loom {

/// An opened Hugging Face folder.
struct HfFolder {
  std::unique_ptr<GgufFile> file;  ///< metadata + tensors, GGUF names; data in the shards' maps
  Vocab vocab;                     ///< from tokenizer.json (+ tokenizer_config.json)
  std::string chat_template;       ///< tokenizer_config.json's, "" when none
  bool rope_neox_layout = false;   ///< q/k rows in HF's rotate_half order (llama family)
  std::vector<std::string> notes;  ///< approximations the user may want to know about
};

/// True when `path` is a directory holding a config.json.
bool is_hf_folder(const std::string& path);

/// Opens a Hugging Face folder. Errors name the file and the cause: a
/// config.json without a supported architecture ("unknown architecture
/// 'Gemma2ForCausalLM'"), a missing field, bad or missing weights (see
/// SafetensorsSet), a tensor in a dtype Loom does not compute in, a missing
/// or unsupported tokenizer.json.
/// `need_tokenizer` false: a folder without tokenizer.json opens (the caller
/// brings a tokenizer; `vocab` stays empty).
Result<HfFolder> open_hf_folder(const std::string& dir, bool need_tokenizer = true);

/// Architectures a folder may have: "llama, mistral, qwen2, phi3".
std::string hf_supported_architectures();

}  // namespace loom
