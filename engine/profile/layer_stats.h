// Per-layer timing of decode steps: one LatencyHistogram per transformer
// layer, recorded by the thread that runs the forward pass
// (ForwardPass::set_layer_stats) and read from any thread (the GUI draws
// per-layer P50/P99 bars from snapshots on a timer; nothing locks).
//
// Only steps of one token are kept: a prefill chunk's time per layer is a
// different quantity (many tokens at once) and would blur the decode figures.
// On backends that queue work (Vulkan, CUDA) the time is the host's view of
// the layer (enqueue plus any waits), not the device's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/profile/latency_histogram.h"

namespace loom {

class LayerStats {
 public:
  explicit LayerStats(int64_t n_layer);
  int64_t n_layer() const { return n_layer_; }

  /// One evaluation of `layer` over `n_tokens` tokens took `ns` (ignored unless n_tokens == 1).
  void record(int64_t layer, uint64_t ns, int64_t n_tokens) {
    if (n_tokens == 1 && layer >= 0 && layer < n_layer_)
      layers_[static_cast<size_t>(layer)].record_ns(ns);
  }

  struct Layer {
    uint64_t count = 0;  ///< decode steps seen
    double p50_ms = 0, p99_ms = 0, mean_ms = 0;
  };
  /// Every layer's figures now. O(n_layer * buckets); fine at GUI refresh rates.
  std::vector<Layer> snapshot() const;
  /// Forgets everything (e.g. after a placement change). Any thread.
  void reset();

 private:
  int64_t n_layer_;
  std::unique_ptr<LatencyHistogram[]> layers_;  ///< atomics do not move: a fixed array
};

/// Records the time from construction to destruction into `stats` (when non-null).
class LayerTimer {
 public:
  LayerTimer(LayerStats* stats, int64_t layer, int64_t n_tokens)
      : stats_(stats), layer_(layer), n_tokens_(n_tokens) {
    if (stats_ && n_tokens_ == 1) t0_ = std::chrono::steady_clock::now();
  }
  ~LayerTimer() {
    if (!stats_ || n_tokens_ != 1) return;
    const auto d = std::chrono::steady_clock::now() - t0_;
    stats_->record(
        layer_,
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()),
        n_tokens_);
  }
  LayerTimer(const LayerTimer&) = delete;
  LayerTimer& operator=(const LayerTimer&) = delete;

 private:
  LayerStats* stats_;
  int64_t layer_;
  int64_t n_tokens_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace loom
