// A latency histogram that one thread records into and any thread reads,
// without locks: log-spaced buckets of relaxed atomic counters. Recording is a
// log2 and two atomic adds, cheap next to anything worth timing (a layer, a
// token); a snapshot copies the counters and answers percentiles.
//
// Buckets: 4 per octave (each ~19% wide) from 250 ns up, 96 of them (to ~4 s);
// times outside land in the first or last bucket. Percentiles are the
// geometric middle of their bucket, so within ~9% of the true value.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace loom {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 96;
  static constexpr int kPerOctave = 4;
  static constexpr double kMinNs = 250.0;  ///< lower edge of bucket 0

  /// Lower edge of bucket `b` in nanoseconds (b == kBuckets: the top edge).
  static double bucket_lower_ns(int b);
  /// Bucket that `ns` falls in.
  static int bucket_of(uint64_t ns);

  void record_ns(uint64_t ns) {
    counts_[static_cast<size_t>(bucket_of(ns))].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(ns, std::memory_order_relaxed);
    uint64_t m = max_ns_.load(std::memory_order_relaxed);
    if (ns > m) max_ns_.store(ns, std::memory_order_relaxed);  // one writer: no CAS loop needed
  }

  /// The counters at one moment (each read atomically; a record racing the
  /// copy may be seen in the sum but not the bucket, which is harmless here).
  struct Snapshot {
    std::array<uint64_t, kBuckets> counts{};
    uint64_t count = 0;  ///< sum of counts
    uint64_t sum_ns = 0;
    uint64_t max_ns = 0;
    /// The q-quantile (q in [0, 1]) in milliseconds; 0 when empty.
    double percentile_ms(double q) const;
    double mean_ms() const {
      return count ? static_cast<double>(sum_ns) / static_cast<double>(count) * 1e-6 : 0.0;
    }
  };
  Snapshot snapshot() const;

  /// Forgets everything. Safe from any thread; records racing it may survive.
  void reset();

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
  std::atomic<uint64_t> max_ns_{0};
};

}  // namespace loom
