// The architecture registry. Each engine/model/arch/<arch>.cpp knows its
// metadata quirks and tensor names, binds the weights into a Model, and says
// which forward pass runs it. Nothing outside this folder knows an
// architecture's quirks.
#pragma once

#include <string>

#include "engine/core/status.h"
#include "engine/model/gguf.h"
#include "engine/model/model.h"

namespace loom {

struct Architecture {
  const char* name;
  /// Reads architecture-specific hyper-parameters (common ones are already in
  /// model->hp) and binds every weight, checking its shape.
  Status (*bind)(const GgufFile& f, Model* model);
};

/// nullptr when `name` is not supported.
const Architecture* find_architecture(const std::string& name);
/// "llama, qwen2, phi3, qwen3, gemma2".
std::string supported_architectures();

// Defined in the per-architecture files.
extern const Architecture kArchLlama;
extern const Architecture kArchQwen2;
extern const Architecture kArchPhi3;
extern const Architecture kArchQwen3;
extern const Architecture kArchGemma2;

namespace detail {
/// Binds what llama-style decoders share: embedding, output norm, output
/// (tied to the embedding when absent) and the norms of every layer.
Status bind_decoder_common(const GgufFile& f, Model* m);
}  // namespace detail

}  // namespace loom
