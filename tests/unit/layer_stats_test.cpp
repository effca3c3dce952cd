// The lock-free latency histogram and per-layer stats the GUI reads: bucket
// edges, percentiles within a bucket's width, decode-only recording, reset.
#include "engine/profile/layer_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

namespace loom {
namespace {

TEST(LatencyHistogram, BucketsAreLogSpaced) {
  EXPECT_EQ(LatencyHistogram::bucket_of(0), 0);
  EXPECT_EQ(LatencyHistogram::bucket_of(250), 0);
  EXPECT_EQ(LatencyHistogram::bucket_of(500), LatencyHistogram::kPerOctave);
  EXPECT_EQ(LatencyHistogram::bucket_of(uint64_t{1} << 62), LatencyHistogram::kBuckets - 1);
  for (int b = 1; b < LatencyHistogram::kBuckets; ++b) {
    const double lo = LatencyHistogram::bucket_lower_ns(b);
    EXPECT_EQ(LatencyHistogram::bucket_of(static_cast<uint64_t>(std::ceil(lo * 1.0001))), b) << b;
  }
}

TEST(LatencyHistogram, PercentilesWithinABucket) {
  LatencyHistogram h;
  EXPECT_EQ(h.snapshot().percentile_ms(0.5), 0.0);
  // 98 samples at 1 ms, 2 at 50 ms: P50 ~1 ms, P99 ~50 ms.
  for (int i = 0; i < 98; ++i) h.record_ns(1'000'000);
  for (int i = 0; i < 2; ++i) h.record_ns(50'000'000);
  auto s = h.snapshot();
  EXPECT_EQ(s.count, 100u);
  EXPECT_NEAR(s.percentile_ms(0.50), 1.0, 0.1);
  EXPECT_NEAR(s.percentile_ms(0.99), 50.0, 5.0);
  EXPECT_LE(s.percentile_ms(1.0), 50.0);  // never above the maximum seen
  EXPECT_NEAR(s.mean_ms(), 1.98, 1e-9);
  h.reset();
  EXPECT_EQ(h.snapshot().count, 0u);
}

TEST(LayerStats, KeepsDecodeStepsOnlyAndReadsFromAnotherThread) {
  LayerStats ls(3);
  std::thread writer([&] {
    for (int i = 0; i < 1000; ++i) {
      ls.record(0, 10'000, 1);
      ls.record(2, 40'000, 1);
      ls.record(1, 5'000'000, 64);  // a prefill chunk: ignored
      ls.record(7, 1, 1);           // no such layer: ignored
    }
  });
  for (int i = 0; i < 100; ++i) (void)ls.snapshot();  // concurrent reads are fine
  writer.join();
  auto s = ls.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].count, 1000u);
  EXPECT_EQ(s[1].count, 0u);
  EXPECT_NEAR(s[2].p50_ms, 0.040, 0.004);
  EXPECT_NEAR(s[2].p99_ms, 0.040, 0.004);
  ls.reset();
  EXPECT_EQ(ls.snapshot()[2].count, 0u);
}

}  // namespace
}  // namespace loom
