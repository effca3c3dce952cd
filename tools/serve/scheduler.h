// The server's scheduler: --parallel N slots, each a Session (its own KV
// cache; sessions made by Session::create_sharing share one forward pass, so
// the weights and placement exist once), run by one engine thread. Continuous
// batching: each step takes one token of every decoding sequence and chunks
// of the prompts waiting (chunked prefill, at most the pass's chunk of rows in
// all, prompts getting at least half when there are any) and runs them as one
// batched forward step (Session::append_batch): every matmul sees all rows at
// once, attention runs per sequence. Requests join and leave between steps.
// A bounded queue holds requests waiting for a slot; a slot whose cached
// tokens share the longest prefix with a request's prompt takes it (the
// prefix is not evaluated again), and when another slot holds a longer start
// of the prompt (the same system prompt), its KV is copied over
// (KvCache::copy_prefix) instead of evaluated.
//
// Requests report through a Request object that the HTTP thread waits on:
// pieces of text (after stop strings are cut), per-token logprobs, and the end.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"
#include "engine/core/status.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/session.h"
#include "tools/serve/metrics.h"
#include "tools/serve/step_cost.h"

namespace loom::serve {

/// One token's log-probability, with the most likely alternatives (OpenAI's logprobs).
struct TokenLogprob {
  std::string token;  ///< the token's text (its bytes may be part of a character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  ///< the `top_logprobs` most likely
};

/// What the HTTP thread gets, in order.
struct Event {
  std::string text;                    ///< may be empty (a token whose text is held back)
  std::vector<TokenLogprob> logprobs;  ///< tokens whose text is in `text` (when asked for)
};

enum class Finish { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_text(Finish f);  ///< "stop", "length", ...

struct Request {
  // ---- filled in by the HTTP thread before submit()
  std::vector<int32_t> prompt;
  SamplerParams sampling;
  int64_t max_tokens = -1;        ///< < 0: until the context is full
  std::vector<std::string> stop;  ///< the text stops before the first of these
  int top_logprobs = -1;          ///< < 0: no logprobs; 0..20: that many alternatives
  bool ignore_eos = false;

  // ---- the request's side: set from any thread
  std::atomic<bool> cancel{false};  ///< the client left: stop at the next step

  // ---- the scheduler's side, under mu
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;
  Finish finish = Finish::kNone;
  std::string error;  ///< with Finish::kError
  int64_t n_prompt = 0, n_reused = 0, n_generated = 0;
  double queue_ms = 0;  ///< arrival to a slot
  double ttft_ms = 0;   ///< arrival to the first token (queue wait included)
  std::vector<double> itl_ms;

  std::chrono::steady_clock::time_point t_arrival = std::chrono::steady_clock::now();

  /// Waits until an event or the end is there (or `timeout` passed); moves the
  /// events out. Returns false once the request finished and nothing is left.
  bool wait_events(std::vector<Event>* out, std::chrono::milliseconds timeout);
  bool finished() {
    std::lock_guard<std::mutex> lock(mu);
    return finish != Finish::kNone;
  }
};

struct SchedulerOptions {
  int n_slots = 1;            ///< sequences run at once
  int64_t queue_max = 64;     ///< requests waiting for a slot beyond this get 429
  int64_t prefill_chunk = 0;  ///< tokens per prefill step; 0: the sessions' own chunk
  /// While sequences decode, a step carries at most the prompt tokens that
  /// keep it within this many times a step of their rows alone (StepCost,
  /// learned from the steps run; at least kMinPromptRows). At most 1: prompts
  /// take the whole step budget, however long the decoding sequences wait.
  double itl_factor = 1.5;
  /// Threads that sample a step's sequences (and their logprobs) at once;
  /// each draw walks the whole vocabulary, so 64 sequences of a 128k vocab
  /// are tens of milliseconds on one thread, with the GPU idle.
  int sample_threads = 1;
};

class Scheduler {
 public:
  /// Takes the sessions (one per slot; at least one), all over the same model.
  Scheduler(std::vector<std::unique_ptr<Session>> slots, const SchedulerOptions& o,
            Metrics* metrics);
  ~Scheduler();  ///< stops the engine thread; unfinished requests end as cancelled

  int64_t n_ctx() const { return n_ctx_; }
  int n_slots() const { return static_cast<int>(slots_.size()); }
  const Model& model() const { return slots_[0]->session->model(); }

  /// Queues a request. Errors: kOutOfRange when the queue is full (HTTP 429).
  Status submit(std::shared_ptr<Request> r);
  /// Requests waiting for a slot.
  int64_t queue_depth();
  /// Requests holding a slot.
  int64_t active();
  /// While paused the engine thread admits and runs nothing (tests; a drain).
  void set_paused(bool paused);

 private:
  struct Slot {
    std::unique_ptr<Session> session;
    std::shared_ptr<Request> req;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<StreamingDetokenizer> detok;
    int64_t prefill_pos = 0;  ///< prompt tokens in the cache
    int32_t next = -1;        ///< sampled token still to be evaluated (decode)
    std::string held;         ///< text held back: it may be the start of a stop string
    std::vector<TokenLogprob> held_lp;
    std::chrono::steady_clock::time_point t_last;
    std::vector<float> logits;  ///< [n_vocab] after the slot's latest step
    int32_t drawn = -1;         ///< sample_all's token from `logits`
    std::optional<TokenLogprob> drawn_lp;
  };

  void run();
  void admit();
  /// Copies the longest start of the slot's new prompt that another slot's
  /// cache holds, when it beats the `kept` tokens of the slot's own by at
  /// least kMinSharedPrefix; returns the tokens now cached.
  int64_t take_shared_prefix(Slot& s, int64_t kept);
  static constexpr int64_t kMinSharedPrefix = 16;
  /// Prompt tokens a step carries beside decoding rows, however costly.
  static constexpr int64_t kMinPromptRows = 4;
  /// One batched forward step over the active slots; ends requests that are
  /// done. Returns the forward pass's milliseconds (0: nothing ran).
  double step_all();
  /// Draws every slot's next token (and its logprobs, when asked) from its
  /// logits, on the sampling threads: slots are independent.
  void sample_all(std::span<Slot* const> slots);
  /// Handles the token sample_all drew for the slot.
  void on_logits(Slot& s);
  /// Ends the slot's request; `flush`: what the detokenizer and the stop check
  /// hold back is part of the answer (not after a stop string, an error or a cancel).
  void finish(Slot& s, Finish f, const std::string& error = {}, bool flush = true);
  /// Adds text to what is held, releases what cannot start a stop string;
  /// returns true when a stop string was found (the text ends before it).
  bool emit_text(Slot& s, const std::string& piece, std::optional<TokenLogprob> lp);
  void publish_kv();

  std::vector<std::unique_ptr<Slot>> slots_;
  SchedulerOptions opt_;
  Metrics* metrics_;
  int64_t n_ctx_ = 0;
  int64_t chunk_ = 0;   ///< most prompt tokens of one slot in a step
  int64_t budget_ = 0;  ///< most rows in a step (the forward pass's chunk)
  size_t rr_ = 0;       ///< the slot the next step starts from
  StepCost cost_;       ///< what the steps run so far cost (the prompt budget)
  std::unique_ptr<cpu::ThreadPool> sample_pool_;          ///< with sample_threads > 1
  std::chrono::steady_clock::time_point kv_published_{};  ///< publish_kv's last sums

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  int64_t n_active_ = 0;
  bool stop_ = false;
  bool paused_ = false;
  std::thread thread_;
};

}  // namespace loom::serve
