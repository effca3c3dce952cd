// The forward pass of llama-style decoders (llama, qwen2, phi3), written once
// against the Backend ops. Architectures differ only in what they bind
// (biases, fused projections split into row ranges, RoPE ordering).
//
// One layer, for T tokens (shapes [T, ...]):
//   xb = rms_norm(x) * attn_norm
//   q, k, v = Wq xb (+bq), Wk xb (+bk), Wv xb (+bv); rope(q), rope(k); store k, v
//   x += Wo attention(q, cache)
//   xb = rms_norm(x) * ffn_norm
//   x += W_down (silu(W_gate xb) * (W_up xb))
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/profile/op_stats.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

class ForwardPass {
 public:
  /// `max_chunk`: most tokens evaluated in one step (longer inputs are split).
  ForwardPass(const Model& model, Backend& backend, KvCache& kv, int64_t max_chunk = 256);

  /// Runs `tokens` at positions [pos0, pos0 + T), storing their K/V, and writes
  /// the logits of the last token into `logits` [n_vocab] (of every token,
  /// [T, n_vocab], when `all_logits`). The cache must hold exactly pos0 tokens.
  Status eval(std::span<const int32_t> tokens, int64_t pos0, float* logits, bool all_logits = false);

  /// Attach per-op timing (nullptr to detach).
  void set_stats(OpStats* stats) { stats_ = stats; }
  const cpu::RopeParams& rope_params() const { return rope_; }

 private:
  void eval_chunk(const int32_t* tokens, int64_t T, int64_t pos0, float* logits, bool all_logits);
  void layer(int64_t l, int64_t T);
  Act act(std::vector<float>& buf, int64_t T, int64_t cols) { return Act{buf.data(), T, cols}; }

  const Model& m_;
  Backend& be_;
  KvCache& kv_;
  int64_t max_chunk_;
  cpu::RopeParams rope_;
  OpStats* stats_ = nullptr;
  std::vector<int32_t> pos_;
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_;
};

}  // namespace loom
