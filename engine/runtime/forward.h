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
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/profile/layer_stats.h"
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

  /// Readies the backend: allocates activations, attaches the backend's K/V
  /// storage to the cache, uploads every weight once, and decides which
  /// weights run on the fallback backend (dtype unsupported, or out of device
  /// memory). eval() calls it the first time; call it earlier to see errors
  /// at load. Errors: no backend can run a weight, or memory runs out.
  Status prepare();
  /// What the forward pass does differently from "everything on the backend"
  /// (weights placed on the fallback and why), for the user to read.
  const std::vector<std::string>& notes() const { return notes_; }
  /// Backend that runs the matmuls and embedding lookups the main backend
  /// cannot (host memory, normally a CpuBackend). Without one, prepare()
  /// creates a CpuBackend when it needs it. Call before prepare().
  void set_fallback(Backend* fallback) { fallback_ = fallback; }

  /// Attach per-op timing (nullptr to detach).
  void set_stats(OpStats* stats) { stats_ = stats; }
  /// Attach per-layer decode timing, read by other threads (nullptr to detach).
  void set_layer_stats(LayerStats* stats) { layer_stats_ = stats; }
  const cpu::RopeParams& rope_params() const { return rope_; }

 private:
  Status eval_chunk(const int32_t* tokens, int64_t T, int64_t pos0, float* logits, bool all_logits);
  void layer(int64_t l, int64_t T);
  Act act(const std::unique_ptr<ActBuffer>& buf, int64_t T, int64_t cols) { return buf->view(T, cols); }
  Status place_weight(const Weight& w, OpKind op);
  bool on_fallback(const Weight& w) const { return !fallback_weights_.empty() && fallback_weights_.count(w.data); }
  // be_.matmul / be_.get_rows, or the fallback with transfers when `w` is placed there.
  void matmul(const Weight& w, Act x, Act out, const Weight* bias);
  void get_rows(const Weight& w, const int32_t* ids, Act out);

  const Model& m_;
  Backend& be_;
  KvCache& kv_;
  int64_t max_chunk_;
  cpu::RopeParams rope_;
  OpStats* stats_ = nullptr;
  LayerStats* layer_stats_ = nullptr;
  std::vector<int32_t> pos_;
  // Activations [max_chunk, ...] in the backend's memory (see the header comment for shapes).
  std::unique_ptr<ActBuffer> x_, xb_, q_, k_, v_, att_, hb_, hb2_;
  std::unique_ptr<ActBuffer> logits_;  ///< device backends: logits before download [rows, n_vocab]
  bool prepared_ = false;
  // Fallback for weights the backend cannot hold (empty set: none; the CPU path never looks further).
  Backend* fallback_ = nullptr;
  std::unique_ptr<Backend> own_fallback_;
  std::unordered_set<const void*> fallback_weights_;  ///< Weight::data of weights run on fallback_
  std::vector<float> fb_in_, fb_out_;                 ///< host copies around a fallback op
  Status fb_status_;                                  ///< first transfer error of a fallback op
  std::vector<std::string> notes_;
};

}  // namespace loom
