// What /metrics reports, in Prometheus' text format (version 0.0.4):
// requests by route and status, tokens, queue depth, time to first token and
// inter-token latency histograms, KV bytes per tier, batched steps. Thread-safe: the HTTP
// threads and the scheduler's thread record, any thread renders.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "engine/runtime/kv_cache.h"

namespace loom::serve {

/// A cumulative histogram with fixed bounds in seconds, as Prometheus wants it.
class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  void record(double seconds);
  /// Lines `name_bucket{le=...}`, `name_sum`, `name_count`.
  void render(const std::string& name, std::string* out) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};  ///< last: +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

class Metrics {
 public:
  /// One finished HTTP request (route as matched, status code).
  void count_request(const std::string& route, int status);
  void add_prompt_tokens(int64_t n) { prompt_tokens_ += static_cast<uint64_t>(n); }
  void add_generated_tokens(int64_t n) { generated_tokens_ += static_cast<uint64_t>(n); }
  void count_cancelled() { ++cancelled_; }
  /// One forward step of the scheduler: its sequences and token rows.
  void count_step(int64_t seqs, int64_t rows) {
    ++steps_;
    step_seqs_ += static_cast<uint64_t>(seqs);
    step_rows_ += static_cast<uint64_t>(rows);
  }
  void add_shared_prefix_tokens(int64_t n) { shared_prefix_ += static_cast<uint64_t>(n); }
  uint64_t shared_prefix_tokens() const { return shared_prefix_.load(); }
  uint64_t steps() const { return steps_.load(); }
  uint64_t step_seqs() const { return step_seqs_.load(); }
  void set_queue_depth(int64_t n) { queue_depth_ = n; }
  void set_active(int64_t n) { active_ = n; }
  void set_slots(int64_t n) { slots_ = n; }
  /// KV use summed over every slot (the scheduler publishes it after each round).
  void set_kv(const KvTierStats& s);
  Histogram& ttft() { return ttft_; }
  Histogram& itl() { return itl_; }
  /// A step's forward pass (Session::append_batch), and the scheduler's own
  /// time around it (admission, sampling, text): the GPU idles through the latter.
  Histogram& step_forward() { return step_forward_; }
  Histogram& step_host() { return step_host_; }
  uint64_t cancelled() const { return cancelled_.load(); }
  int64_t queue_depth() const { return queue_depth_.load(); }
  int64_t active() const { return active_.load(); }

  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  ///< (route, status) -> count
  KvTierStats kv_;
  std::atomic<uint64_t> prompt_tokens_{0}, generated_tokens_{0}, cancelled_{0};
  std::atomic<uint64_t> steps_{0}, step_seqs_{0}, step_rows_{0}, shared_prefix_{0};
  std::atomic<int64_t> queue_depth_{0}, active_{0}, slots_{0};
  Histogram ttft_, itl_, step_forward_, step_host_;
};

}  // namespace loom::serve
