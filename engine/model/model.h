// A loaded model: hyper-parameters, the weights bound by name (still in the
// memory-mapped GGUF), the tokenizer and the chat template. What differs
// between architectures lives in engine/model/arch/<arch>.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom {

/// A weight matrix or vector as the ops see it: rows of `n_in` elements in
/// `dtype`, `row_bytes` apart. For a matrix, y = W x maps n_in -> n_out.
struct Weight {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t n_in = 0;   ///< ne[0]: elements per row
  int64_t n_out = 1;  ///< ne[1]: rows
  size_t row_bytes = 0;
  const GgufTensor* tensor = nullptr;  ///< where it came from (name, file offset)

  bool present() const { return data != nullptr; }
  /// First byte of the whole tensor this weight is (a row range of): the key
  /// under which backends and the requantizer keep their copies.
  const void* tensor_begin() const {
    return tensor && tensor->data ? static_cast<const void*>(tensor->data) : data;
  }
  const std::string& name() const;
  /// Rows [r0, r0 + n) as a Weight of their own (fused tensors are split this way).
  Weight rows(int64_t r0, int64_t n) const;
};

enum class RopeScaling { kNone, kLinear, kYarn, kLlama3 };

/// Hyper-parameters, from `<arch>.*` metadata.
struct HParams {
  std::string arch;
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  // RoPE
  int64_t n_rot = 0;
  bool rope_neox = false;
  float rope_freq_base = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scale_factor = 1.0f;  ///< context extension factor (linear, yarn)
  int64_t rope_n_ctx_orig = 0;
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  // gemma2 (zero / false: not used)
  float embd_scale = 0.0f;     ///< the embedding rows are multiplied by this
  float attn_scale = 0.0f;     ///< attention scores times this; 0: 1 / sqrt(head_dim)
  float attn_softcap = 0.0f;   ///< scores become cap * tanh(s / cap) before the softmax
  float final_softcap = 0.0f;  ///< logits likewise
  int64_t sliding_window = 0;  ///< layers l with l % swa_every == 0 see this many positions
  int64_t swa_every = 0;
  bool ffn_gelu = false;  ///< GELU (tanh approximation) instead of SiLU in the gated FFN
};

/// One transformer block's weights. Unused ones stay empty.
struct LayerWeights {
  Weight attn_norm;
  Weight wq, wk, wv;  ///< separate projections, or rows of a fused wqkv
  Weight bq, bk, bv;  ///< qkv biases (qwen2)
  Weight wo;
  Weight ffn_norm;
  Weight w_gate, w_up;  ///< separate, or rows of a fused gate_up (phi3)
  Weight w_down;
  Weight q_norm, k_norm;                 ///< per-head RMS norms of q and k, [head_dim] (qwen3)
  Weight post_attn_norm, post_ffn_norm;  ///< norms of the attention and FFN outputs (gemma2)
};

struct Model {
  std::unique_ptr<GgufFile> file;
  HParams hp;
  Weight tok_embd;
  Weight output_norm;
  Weight output;      ///< == tok_embd when tied
  Weight rope_freqs;  ///< llama3 per-frequency divisors [n_rot / 2], optional
  std::vector<LayerWeights> layers;
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplate chat_template;
  std::vector<std::string> warnings;  ///< things the user should see (template fallback...)

  /// Bytes of all weights.
  uint64_t weight_bytes() const;
  /// General description: "llama, 22 layers, dim 2048, Q4_0".
  std::string describe() const;
  /// Why this model's attention runs on the CPU (gemma2's soft-capped scores
  /// and sliding window: no GPU backend has that attention yet), or "" when the
  /// GPU backends run all of it. Strategies and the forward pass keep that op
  /// group (and a scaled embedding lookup) on the CPU and say this; the rest of
  /// such a layer runs where it is placed (keep_host_ops_on_cpu).
  std::string host_attention_reason() const;
};

/// Loads and validates a model: a GGUF file, or a Hugging Face folder
/// (config.json, *.safetensors, tokenizer.json; see hf_model.h), whose weights
/// are bound by the same architecture code under GGUF names. Errors name the
/// tensor and the expected and found shapes, the unknown architecture, or the
/// bad key.
Result<std::unique_ptr<Model>> load_model(const std::string& path);

/// What load_model may take from elsewhere.
struct LoadOptions {
  /// Another file's tokenizer and chat template (`--tokenizer`): a GGUF, a
  /// tokenizer.json or a model folder; empty: the model's own. A folder
  /// without tokenizer.json loads with one.
  std::string tokenizer;
};
Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& options);

/// A tokenizer with its chat template, read from a GGUF file, a
/// tokenizer.json (with the tokenizer_config.json beside it, if any) or a
/// Hugging Face folder.
struct TokenizerSource {
  Vocab vocab;
  std::string chat_template;  ///< Jinja text, "" when none
  std::vector<std::string> notes;
};
Result<TokenizerSource> load_tokenizer_source(const std::string& path);

namespace detail {
// Shared by the architecture files.
Result<Weight> bind_weight(const GgufFile& f, const std::string& name, std::vector<int64_t> shape,
                           bool required = true);
Status read_common_hparams(const GgufFile& f, HParams* hp);
}  // namespace detail

}  // namespace loom
