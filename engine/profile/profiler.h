// The profiler: how long each op group of each layer, and each transfer
// between units, takes in decode steps, on the clock of the unit that ran it
// (Vulkan timestamp queries on the GPU, steady_clock on the CPU); plus the
// whole step, time to first token and inter-token latency.
//
// Op groups and transfers are timed on one decode step in sample_every() (by
// default every step when only the CPU runs, one in kGpuSampleEvery when the
// GPU does: each GPU group boundary is a timestamp that drains the queue, and
// each timed transfer waits for the device first); the step itself, TTFT and
// ITL on every step.
//
// The thread running the forward pass records (ForwardPass::set_profiler);
// any thread takes snapshots (the app's charts, `loom bench`) without locks:
// every figure is a LatencyHistogram of relaxed atomics.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/placement/placement.h"
#include "engine/profile/latency_histogram.h"

namespace loom {

/// Figures of one histogram.
struct ProfileStat {
  uint64_t count = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0, mean_ms = 0;
};

class Profiler {
 public:
  /// What a layer's histograms time: the four op groups, the transfers the
  /// layer needed, and the whole layer (sum of the others, per step).
  static constexpr int kGroups = kNumOpGroups;
  static constexpr int kXfer = kNumOpGroups;
  static constexpr int kLayerTotal = kNumOpGroups + 1;
  static constexpr int kPerLayer = kNumOpGroups + 2;

  explicit Profiler(int64_t n_layer);
  int64_t n_layer() const { return n_layer_; }

  /// Decode steps per step with group timing when the GPU runs part of the model.
  static constexpr int kGpuSampleEvery = 8;
  /// Groups are timed on one decode step in n (1: every step); 0: the default above.
  void set_sample_every(int n) { sample_every_ = n < 0 ? 0 : n; }
  /// The setting for a placement that does (`gpu`) or does not use the GPU.
  int sample_every(bool gpu) const {
    return sample_every_ ? sample_every_ : gpu ? kGpuSampleEvery : 1;
  }

  /// Scope ids as the ForwardPass hands them to backends (Backend::begin_scope).
  int32_t scope(int64_t layer, OpGroup g) const {
    return static_cast<int32_t>(layer * kNumOpGroups + static_cast<int>(g));
  }
  int32_t embed_scope() const { return static_cast<int32_t>(n_layer_ * kNumOpGroups); }
  int32_t output_scope() const { return embed_scope() + 1; }

  /// @name Recording (one thread).
  /// @{
  void record_scope(int32_t scope, uint64_t ns);  ///< a group, the embedding or the output
  void record_xfer(int64_t layer, uint64_t ns);   ///< layer -1: outside layers (embedding, output)
  void record_layer(int64_t layer, uint64_t ns);  ///< the layer's whole time in one step
  void record_step(uint64_t ns) { step_.record_ns(ns); }
  void record_ttft(uint64_t ns) { ttft_.record_ns(ns); }
  void record_itl(uint64_t ns) { itl_.record_ns(ns); }
  /// @}

  struct Snapshot {
    /// [layer][kind]: kind < kGroups an OpGroup, kXfer, kLayerTotal.
    std::vector<std::array<ProfileStat, kPerLayer>> layers;
    ProfileStat embed, output, xfer_other, step, ttft, itl;
  };
  Snapshot snapshot() const;
  /// Forgets everything (after a placement change). Any thread.
  void reset();

 private:
  static ProfileStat stat(const LatencyHistogram& h);
  LatencyHistogram& at(int64_t layer, int kind) {
    return hist_[static_cast<size_t>(layer * kPerLayer + kind)];
  }

  int64_t n_layer_;
  int sample_every_ = 0;
  std::unique_ptr<LatencyHistogram[]> hist_;  ///< [n_layer * kPerLayer]
  LatencyHistogram embed_, output_, xfer_other_, step_, ttft_, itl_;
};

}  // namespace loom
