// A generation session: one model, one backend, one KV cache, one sequence.
// Messages -> chat template -> tokens -> prefill (in chunks) -> decode with a
// sampler -> UTF-8 pieces through a callback. The KV cache of a previous
// turn is reused when the new prompt starts with the same tokens.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/model/model.h"
#include "engine/profile/op_stats.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/sampler.h"

namespace loom {

class AdaptiveController;

struct SessionConfig {
  int64_t n_ctx = 0;             ///< 0: the model's training context, capped at 4096
  DType kv_dtype = DType::kF16;  ///< F16 or Q8_0
  int64_t max_chunk = 256;       ///< prefill chunk (tokens per forward step)
  KvTierConfig kv_tiers;         ///< RAM budget and SSD spill folder (none: all in RAM)
};

struct GenerateParams {
  SamplerParams sampling;
  int64_t max_tokens = 256;    ///< < 0: until the context is full
  bool context_shift = false;  ///< when full: drop the older half of the context and go on
  bool stop_at_eog = true;     ///< stop at an end-of-generation token (EOS, EOT...)
  /// Called for every generated token (the end-of-generation one excepted),
  /// also those whose text is not out yet (part of a UTF-8 character): what
  /// token rates and inter-token intervals count. May be empty.
  std::function<void(int32_t token)> on_token;
  /// Bytes that do not form UTF-8 (random weights, or a model that splits a
  /// character oddly) come out as the text \xNN rather than U+FFFD.
  bool escape_invalid_utf8 = false;
};

enum class StopReason { kEndOfGeneration, kMaxTokens, kContextFull, kCancelled };
const char* stop_reason_text(StopReason r);

/// Timings and counts of one generate() call.
struct GenerateStats {
  StopReason reason = StopReason::kMaxTokens;
  int64_t n_prompt = 0;  ///< prompt tokens evaluated (after reuse of the cache)
  int64_t n_reused = 0;  ///< prompt tokens whose KV came from the cache
  int64_t n_generated = 0;
  double prefill_ms = 0;
  double ttft_ms = 0;          ///< prompt evaluated and first token sampled
  double decode_ms = 0;        ///< all decode steps
  std::vector<double> itl_ms;  ///< time between consecutive generated tokens
  int64_t n_shifts = 0;
  int64_t n_kv_recomputed = 0;  ///< KV blocks recomputed because the SSD could not give them back
  std::string note;             ///< why the context ended early (a full spill disk), if it did
};

class Session {
 public:
  static Result<std::unique_ptr<Session>> create(const Model& model, Backend& backend,
                                                 const SessionConfig& cfg);
  /// Another sequence over `base`'s forward pass (its weights, placement and
  /// units, uploaded once), with a KV cache of its own made from `cfg`
  /// (n_ctx, tiers; the dtype and chunk are base's). Sessions that share a
  /// pass can be stepped together by append_batch; they must run on one
  /// thread, and placement requests go to the shared pass.
  static Result<std::unique_ptr<Session>> create_sharing(Session& base, const SessionConfig& cfg);
  ~Session();

  const Model& model() const { return m_; }
  int64_t n_ctx() const { return kv_->capacity(); }
  const KvCache& kv() const { return *kv_; }
  ForwardPass& forward() { return *fwd_; }

  /// Prompt tokens for a raw text: BOS as the model's metadata says, no template.
  std::vector<int32_t> tokenize_raw(std::string_view text) const;
  /// Prompt tokens of a conversation through the model's chat template.
  Result<std::vector<int32_t>> tokenize_chat(const std::vector<ChatMessage>& messages) const;

  /// Called with each decoded UTF-8 piece (never a partial code point);
  /// returning false stops generation (kCancelled).
  using PieceCallback = std::function<bool(std::string_view piece)>;

  /// Evaluates `prompt` (reusing the cache's common prefix) and generates.
  /// Errors: an empty prompt, or one longer than the context.
  Result<GenerateStats> generate(std::span<const int32_t> prompt, const GenerateParams& params,
                                 const PieceCallback& on_piece,
                                 const std::atomic<bool>* cancel = nullptr);

  /// Step-level use, for a scheduler that interleaves several sessions on one
  /// thread (the server's slots). Keeps the cached tokens that `prompt` starts
  /// with, at most all but its last token (so that one is evaluated and gives
  /// logits), drops the rest, and returns how many were kept; the remainder of
  /// the prompt then goes through append().
  int64_t keep_prefix(std::span<const int32_t> prompt);
  /// Takes over `src`'s first n cached tokens (their KV copied, not
  /// evaluated again: the same system prompt in another slot). On error this
  /// session is left empty and the prompt is evaluated as usual.
  Status take_prefix(Session& src, int64_t n);
  /// Evaluates `tokens` after the cached ones (in one forward step of at most
  /// the session's chunk, or several), writing the last one's logits [n_vocab].
  /// Errors: more tokens than the context has room for, or the forward's.
  Status append(std::span<const int32_t> tokens, float* logits, GenerateStats* st = nullptr);

  /// One session's part of append_batch.
  struct BatchItem {
    Session* session = nullptr;
    std::span<const int32_t> tokens;  ///< at most the pass's chunk in all items together
    float* logits = nullptr;          ///< the last token's logits [n_vocab], or null
    Status status;                    ///< out: the item's outcome
  };
  /// append() for several sessions sharing one forward pass, in one batched
  /// step (ForwardPass::eval_batch). When the step fails (a KV block the SSD
  /// could not give back, say) each item is retried alone through append(),
  /// which recovers what it can, and gets its own status.
  static void append_batch(std::span<BatchItem> items);

  /// Asks for a new placement: applied between two tokens of a running
  /// generate() (or at the start of the next one), moving weights and KV;
  /// generation then continues. `done` is called on the generating thread
  /// with the outcome (on error the old placement stays). Any thread. A
  /// request not applied yet is replaced: its `done` gets kCancelled at once.
  void request_placement(const Placement& p, std::function<void(const Status&)> done = {});
  /// Applies a requested placement now, if any (the thread that runs
  /// generate()). Once applied, it ends the adaptive controller's turn
  /// (set_adaptive(nullptr)): the requester's choice wins.
  Status apply_pending_placement();
  /// The adaptive `auto` (adaptive.h), consulted after each decode step of
  /// generate(), never during a prefill or after a stop; a placement it
  /// returns is applied before the next token. Null: none. Not owned; the
  /// caller start()s it with the placement in force.
  void set_adaptive(AdaptiveController* c) { adapt_ = c; }
  AdaptiveController* adaptive() const { return adapt_; }
  /// Attach the profiler: op groups, transfers, TTFT and ITL (nullptr to detach).
  void set_profiler(Profiler* p) {
    prof_ = p;
    fwd_->set_profiler(p);
  }

  /// Every token in the cache (prompt and generated).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  /// Forgets the conversation.
  void reset();

 private:
  explicit Session(const Model& m) : m_(m) {}
  Status shift_context();
  /// fwd_->eval of tokens at pos0 (tokens_ holds the ones before), recovering
  /// from KV blocks the SSD could not give back: they are recomputed from
  /// their tokens, and the evaluation goes on where it stopped.
  Status eval(std::span<const int32_t> tokens, int64_t pos0, float* logits, GenerateStats* st);
  Status recompute_lost(std::span<const int32_t> pending, int64_t pos0, GenerateStats* st);
  /// A decode step of step_ms ended: the adaptive controller's turn.
  void adapt_step(double step_ms);

  const Model& m_;
  std::unique_ptr<KvCache> kv_;
  std::shared_ptr<ForwardPass> fwd_;  ///< shared by create_sharing's sessions
  std::vector<int32_t> tokens_;       ///< tokens whose KV is in the cache, in order
  std::vector<float> logits_;
  Profiler* prof_ = nullptr;
  AdaptiveController* adapt_ = nullptr;
  std::mutex pending_mu_;
  std::optional<Placement> pending_;
  std::function<void(const Status&)> pending_done_;
  std::atomic<bool> has_pending_{false};
};

}  // namespace loom
