#include "engine/profile/latency_histogram.h"

#include <algorithm>
#include <cmath>

namespace loom {

double LatencyHistogram::bucket_lower_ns(int b) {
  return kMinNs * std::exp2(static_cast<double>(b) / kPerOctave);
}

int LatencyHistogram::bucket_of(uint64_t ns) {
  const double x = static_cast<double>(ns);
  if (x < kMinNs * std::exp2(1.0 / kPerOctave)) return 0;
  const int b = static_cast<int>(std::floor(std::log2(x / kMinNs) * kPerOctave));
  return std::clamp(b, 0, kBuckets - 1);
}

LatencyHistogram::Snapshot LatencyHistogram::snapshot() const {
  Snapshot s;
  for (int b = 0; b < kBuckets; ++b) {
    s.counts[static_cast<size_t>(b)] =
        counts_[static_cast<size_t>(b)].load(std::memory_order_relaxed);
    s.count += s.counts[static_cast<size_t>(b)];
  }
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  s.max_ns = max_ns_.load(std::memory_order_relaxed);
  return s;
}

double LatencyHistogram::Snapshot::percentile_ms(double q) const {
  if (count == 0) return 0.0;
  // The rank-th sample (1-based), as nearest-rank percentiles define it.
  const auto rank = static_cast<uint64_t>(
      std::max(1.0, std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(count))));
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts[static_cast<size_t>(b)];
    if (seen >= rank) {
      const double mid = std::sqrt(bucket_lower_ns(b) * bucket_lower_ns(b + 1));
      // Never report more than the largest time seen (the top bucket is open-ended).
      const double v = max_ns ? std::min(mid, static_cast<double>(max_ns)) : mid;
      return v * 1e-6;
    }
  }
  return static_cast<double>(max_ns) * 1e-6;
}

void LatencyHistogram::reset() {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
  sum_ns_.store(0, std::memory_order_relaxed);
  max_ns_.store(0, std::memory_order_relaxed);
}

}  // namespace loom
