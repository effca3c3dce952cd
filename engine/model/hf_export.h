// Writes a GGUF model (llama, qwen2, phi3 in F32/F16/BF16, with a byte-level
// BPE tokenizer) as a Hugging Face folder: config.json, model.safetensors (or
// shards with model.safetensors.index.json), tokenizer.json and
// tokenizer_config.json. `loom synth --format safetensors` and the tests use
// it to have one model in both formats; it is the inverse of hf_model.h.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace loom {

struct HfExportOptions {
  uint64_t shard_bytes = 0;  ///< > 0: start a new shard once one holds this many bytes
};

/// Writes the model at `gguf_path` into the folder `dir` (created if needed).
/// Llama's q/k rows are permuted back to HF's rotate_half order.
Status write_hf_folder(const std::string& gguf_path, const std::string& dir,
                       const HfExportOptions& options = {});

}  // namespace loom
