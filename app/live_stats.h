// What the charts draw, written by the engine worker while it generates and
// read by the GUI on a timer. The worker never waits for the GUI: histograms
// are lock-free (engine/profile), and the short lists behind a mutex are held
// for a push or a copy only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/profile/latency_histogram.h"
#include "engine/profile/profiler.h"

/// Bytes held in one memory tier.
struct TierBytes {
  uint64_t weights = 0;
  uint64_t kv = 0;
};

/// Where one layer's KV cache lies (bytes of the blocks holding its tokens).
struct KvLayerBytes {
  uint64_t gpu = 0, ram = 0, ssd = 0;
  bool operator==(const KvLayerBytes&) const = default;
};

struct LiveSnapshot {
  uint64_t version = 0;                  ///< changes whenever anything below may have changed
  loom::LatencyHistogram::Snapshot itl;  ///< inter-token latency
  /// Per-layer decode time (the profiler's whole-layer figures), the
  /// embedding, the output and the whole step.
  std::vector<loom::ProfileStat> layers;
  loom::ProfileStat embed, output, step;
  /// (seconds spent generating, tokens/s): idle time between replies is left
  /// out, so the line has no long flat gaps.
  std::vector<std::pair<double, double>> tokensPerSecond;
  /// Placement changes on the same time axis: (seconds, what changed), e.g.
  /// "auto: try layers:16". The adaptive auto's, and the user's.
  std::vector<std::pair<double, std::string>> placementMarks;
  TierBytes gpu, ram, ssd;
  bool gpuPresent = false, ssdPresent = false;
  /// Per layer, where its KV lies; empty when the cache has no tiers (each
  /// layer's KV is then wholly where its attention runs).
  std::vector<KvLayerBytes> kvLayers;
  double lastTtftMs = 0;
  double lastTokensPerSecond = 0;
  uint64_t tokensTotal = 0;
  bool generating = false;
};

class LiveStats {
 public:
  LiveStats();

  // ---- worker side ----
  /// A new model (n_layer layers): every figure starts again. Returns the
  /// profiler for the session to record into.
  std::shared_ptr<loom::Profiler> resetForModel(int64_t nLayer);
  /// Forgets timings but keeps the model (after a placement change).
  void resetTimings();
  void generationStarted();
  /// One token arrived `sincePreviousNs` after the previous one (0 for the first).
  void tokenGenerated(uint64_t sincePreviousNs);
  void generationFinished(double ttftMs, double tokensPerSecond);
  /// The placement changed now (a marker on the tokens/s line).
  void placementChanged(std::string what);
  void setMemory(const TierBytes& gpu, const TierBytes& ram, const TierBytes& ssd, bool gpuPresent,
                 bool ssdPresent, std::vector<KvLayerBytes> kvLayers = {});

  // ---- any thread (the GUI's timer) ----
  LiveSnapshot snapshot() const;
  uint64_t version() const { return m_version.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  double generationSeconds(Clock::time_point t) const;  // with m_mutex held
  void bump() { m_version.fetch_add(1, std::memory_order_relaxed); }

  std::atomic<uint64_t> m_version{1};
  loom::LatencyHistogram m_itl;

  mutable std::mutex m_mutex;  // guards everything below
  std::shared_ptr<loom::Profiler> m_profiler;
  std::vector<std::pair<double, double>> m_tps;
  std::vector<std::pair<double, std::string>> m_marks;
  TierBytes m_gpu, m_ram, m_ssd;
  bool m_gpuPresent = false, m_ssdPresent = false;
  std::vector<KvLayerBytes> m_kvLayers;
  double m_lastTtftMs = 0, m_lastTps = 0;
  uint64_t m_tokensTotal = 0;
  bool m_generating = false;
  // Tokens/s window (worker only, but kept under the mutex for simplicity of reads).
  Clock::time_point m_windowStart;
  uint64_t m_windowTokens = 0;
  int m_pointsThisReply = 0;
  Clock::time_point m_generationStart;
  double m_generationBase = 0;  ///< seconds generated before the current reply
};
