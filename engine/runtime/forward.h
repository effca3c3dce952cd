// The forward pass of llama-style decoders (llama, qwen2, phi3), written once
// against the Backend ops, and the executor of a Placement: each op group of
// each layer runs on the unit the placement names (the CPU, or the GPU
// backend), in the precision it names.
//
// One layer, for T tokens (shapes [T, ...]), op group in brackets:
//   xb = rms_norm(x) * attn_norm                         [norm]
//   q, k, v = Wq xb (+bq), Wk xb (+bk), Wv xb (+bv)      [attn_w]
//   rope(q), rope(k)                                     [norm]
//   store k, v; att = attention(q, cache)                [attn]
//   xb = Wo att                                          [attn_w]
//   x += xb; xb = rms_norm(x) * ffn_norm                 [norm]
//   xb = W_down (silu(W_gate xb) * (W_up xb))            [ffn]
//   x += xb                                              [norm]
//
// Activations: each unit has its own buffers; a bit mask per activation says
// which units hold its current value, and an op reading it on another unit
// first copies it there (the transfers of a mixed placement; none when
// everything sits on one unit). Each layer's KV lives on the unit of its attn
// group (KvCache::move_layer).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/placement/placement.h"
#include "engine/placement/requant.h"
#include "engine/profile/layer_stats.h"
#include "engine/profile/op_stats.h"
#include "engine/profile/profiler.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

class ForwardPass {
 public:
  /// `backend`: a host backend (the CPU) or a device backend (the GPU; a CPU
  /// backend is then created when a placement needs one, see set_fallback).
  /// The placement starts as "everything on `backend`".
  /// `max_chunk`: most tokens evaluated in one step (longer inputs are split).
  ForwardPass(const Model& model, Backend& backend, KvCache& kv, int64_t max_chunk = 256);
  ~ForwardPass();

  /// Runs `tokens` at positions [pos0, pos0 + T), storing their K/V, and writes
  /// the logits of the last token into `logits` [n_vocab] (of every token,
  /// [T, n_vocab], when `all_logits`). The cache must hold exactly pos0 tokens.
  Status eval(std::span<const int32_t> tokens, int64_t pos0, float* logits,
              bool all_logits = false);
  /// The same on another sequence's cache (attached with attach_kv).
  Status eval(KvCache& kv, std::span<const int32_t> tokens, int64_t pos0, float* logits,
              bool all_logits = false);

  /// One sequence's part of a batched step.
  struct SeqStep {
    KvCache* kv = nullptr;            ///< its cache (attached); the tokens go at kv->n_tokens()
    std::span<const int32_t> tokens;  ///< at least one
    float* logits = nullptr;          ///< the last token's logits [n_vocab], or null for none
  };
  /// Continuous batching: one forward step over several sequences, each with
  /// its own cache. Their rows go through every matmul together (one
  /// matrix-matrix product per weight); RoPE, the KV store and attention run
  /// per sequence on its cache. At most max_chunk() tokens in all, and one
  /// step's worth per cache (KvCache::max_step_tokens). Logits are computed
  /// from the first row that wants them to the last: put the sequences that
  /// want none (prompt chunks before their end) first.
  Status eval_batch(std::span<const SeqStep> seqs);
  /// Adds a cache for eval(kv, ...) and eval_batch, its layers put where
  /// their attention runs (a GPU's KV storage made when the placement needs
  /// one); later placements move it with the others. The constructor's cache
  /// is attached already.
  Status attach_kv(KvCache& kv);
  /// Forgets a cache (before it is destroyed).
  void detach_kv(KvCache& kv);
  int64_t max_chunk() const { return max_chunk_; }

  /// Runs layer `l` alone on the hidden states `x` [T, n_embd] (host memory),
  /// as placed, at positions [0, T), and writes its output [T, n_embd] to
  /// `y` (`loom verify`: one layer against the reference on the same input).
  /// The cache must be empty, and is left empty. T <= max_chunk.
  Status eval_layer(int64_t l, const float* x, int64_t T, float* y);

  /// Readies the units for the placement: allocates activations, requantizes
  /// and uploads weights, puts each layer's KV where its attention runs.
  /// Groups the GPU cannot take (no kernel for the dtype, out of device
  /// memory) move to the CPU, with a note. eval() calls it the first time;
  /// call it earlier to see errors at load.
  Status prepare();
  /// Runs `p` from the next eval on. Before the first eval it only records it;
  /// later (between two tokens) it moves weights and KV now, and generation
  /// continues. On error the previous placement stays in force.
  Status set_placement(const Placement& p);
  /// The placement in force (after prepare(): with the moves prepare() made).
  const Placement& placement() const { return placement_; }
  /// What differs from the requested placement, and why (for the user).
  const std::vector<std::string>& notes() const { return notes_; }
  /// The CPU unit when `backend` is a device (defaults to a CpuBackend made
  /// on demand). Call before prepare().
  void set_fallback(Backend* cpu) { units_[0] = cpu; }
  /// The unit's backend, or null when there is none.
  Backend* unit(Unit u) const { return units_[static_cast<size_t>(u)]; }
  /// Called while prepare()/set_placement() move weights, with the fraction
  /// done (0..1); returning false cancels (kCancelled; the previous placement
  /// stays). Any callable; null to remove.
  void set_progress(std::function<bool(double)> cb) { progress_ = std::move(cb); }
  /// Bytes of weight copies held on the host (requantized, and resident
  /// copies of what the CPU runs).
  uint64_t requant_bytes() const { return requant_.bytes(); }
  /// Whether the CPU runs its matmul weights from resident copies on huge
  /// pages (default) or from the file's mapping. Takes effect at the next
  /// prepare() / set_placement().
  void set_resident_weights(bool on) { resident_weights_ = on; }

  /// Attach per-op timing (nullptr to detach).
  void set_stats(OpStats* stats) { stats_ = stats; }
  /// Attach per-layer decode timing, read by other threads (nullptr to detach).
  void set_layer_stats(LayerStats* stats) { layer_stats_ = stats; }
  /// Attach the profiler (per layer and op group, transfers; decode steps only).
  void set_profiler(Profiler* p);
  const cpu::RopeParams& rope_params() const { return rope_; }

 private:
  enum ActId : int { kX, kXb, kQ, kK, kV, kAtt, kHb, kHb2, kNumActs };
  struct UnitActs {
    std::array<std::unique_ptr<ActBuffer>, kNumActs> buf;
    std::unique_ptr<ActBuffer> logits;  ///< device units: logits before download
  };
  // The model's weights as the placement runs them (requantized copies in place of the file's).
  struct Weights {
    std::vector<LayerWeights> layers;
    Weight tok_embd, output, output_norm, rope_freqs;
  };

  Status apply(const Placement& want);
  Status build_weights(const Placement& p, Weights* out);
  Status upload_group(std::vector<const Weight*> ws, OpKind op, const std::string& where);
  /// A layer's matmul weights, the model's and the placement's side by side
  /// (wq, wk, wv, wo, then w_gate, w_up, w_down).
  static std::array<std::pair<const Weight*, Weight*>, 7> matmul_pairs(const LayerWeights& a,
                                                                       LayerWeights& b);
  /// Points the CPU-placed matmul weights of `nw` (and the output matrix
  /// when the CPU runs it) at resident copies on huge pages
  /// (RequantStore::resident), while they fit in half the available memory.
  void make_resident(const Placement& p, Weights* nw);
  Status ensure_unit(Unit u);
  Status alloc_acts(Unit u);
  Status check_tokens(std::span<const int32_t> tokens) const;
  /// Layers of p whose attention runs on the GPU.
  static int64_t gpu_attn_layers(const Placement& p);
  /// Gives kv the GPU's KV storage unless it has some (kUnsupported where
  /// the backend keeps none).
  static Status ensure_kv_storage(Backend& gpu, KvCache& kv);
  /// One step over T rows (tokens at pos_, sequences as in segs_); logits of
  /// rows [first, T) into `logits` [T - first, n_vocab] unless it is null.
  Status eval_rows(const int32_t* tokens, int64_t T, int64_t first, float* logits);
  /// Waits for the units after a step; the profiler's device times.
  Status finish_step();
  void layer(int64_t l, int64_t T);
  Backend& be(Unit u) { return *units_[static_cast<size_t>(u)]; }
  int64_t act_cols(ActId a) const;
  /// Activation `a` [T, cols] on unit u, holding its current value (copied there when needed).
  Act in(ActId a, Unit u, int64_t T);
  /// Activation `a` on unit u, about to be overwritten there (other copies become stale).
  Act out(ActId a, Unit u, int64_t T);
  /// Copies rows*cols floats between two units' memory.
  Status transfer(Act src, Unit from, Act dst, Unit to);
  // Profiling of one op group (or the embedding/output), see forward.cpp.
  void group_begin(int32_t scope, Unit u);
  void group_end();
  void flush_device_times();

  // The rows of one sequence in the step being run.
  struct Seg {
    KvCache* kv;
    int64_t r0, n;
  };

  const Model& m_;
  std::vector<KvCache*> caches_;   ///< attached caches, the constructor's first
  std::vector<Seg> segs_;          ///< the step's sequences
  std::vector<KvCache*> row_kvs_;  ///< eval_batch's segs_' caches (the backends' *_rows ops)
  // The first of the single-row sequences that end the step (decoding
  // sequences come last in a batch); segs_.size() when none.
  size_t row_tail() const {
    size_t i = segs_.size();
    while (i > 0 && segs_[i - 1].n == 1) --i;
    return i;
  }
  std::vector<int32_t> batch_tokens_;
  std::vector<float> batch_logits_;
  int64_t max_chunk_;
  cpu::RopeParams rope_;
  OpStats* stats_ = nullptr;
  LayerStats* layer_stats_ = nullptr;
  Profiler* prof_ = nullptr;
  std::vector<int32_t> pos_;

  std::array<Backend*, kNumUnits> units_{};  ///< [cpu, gpu]
  std::unique_ptr<Backend> own_cpu_;
  std::array<UnitActs, kNumUnits> acts_;
  std::array<uint8_t, kNumActs> valid_{};  ///< bit u: unit u holds the current value
  std::vector<float> staging_;             ///< host copy between two device units

  Placement placement_;
  bool prepared_ = false;
  RequantStore requant_;
  bool resident_weights_ = true;
  Weights w_;
  std::unordered_map<const void*, Weight>
      gpu_tensors_;   ///< tensors uploaded to the GPU, by first byte
  Status op_status_;  ///< first transfer error inside a step
  std::vector<std::string> notes_;
  std::function<bool(double)> progress_;

  // Profiling state of the step being run (decode steps only).
  bool profiling_ = false;     ///< this step's groups and transfers are timed
  uint64_t decode_steps_ = 0;  ///< decode steps seen by the profiler (for its sampling)
  int64_t cur_layer_ = -1;
  int32_t cur_scope_ = -1;
  Unit cur_unit_ = Unit::kCpu;
  uint64_t cur_t0_ = 0, cur_xfer_ns_ = 0;
  std::vector<uint64_t> layer_ns_;  ///< per layer, this step
  std::vector<Backend::ScopeTime> scope_times_;
};

}  // namespace loom
