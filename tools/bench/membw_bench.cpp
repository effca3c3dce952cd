// Host memory read bandwidth with N threads: the bound on decode speed for the
// weights a placement leaves on the CPU (each decode step streams them once).
// Usage: loom_membw_bench [threads...] (default: 1, 2, 4, ... up to all cores)
// The threads (created once, the calling one among them) start together at a
// flag and sum 4 MiB chunks of a buffer (4 GiB, or less when memory is short)
// taken from a shared counter, so a thread the OS or the hypervisor holds
// back does not hold up the pass (Loom's own kernels share work the same
// way); the best of several passes counts, timed from the flag to the last
// chunk.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

__attribute__((target("avx2"))) uint64_t sum_avx2(const uint8_t* p, size_t n) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  for (size_t i = 0; i + 64 <= n; i += 64) {
    acc0 = _mm256_add_epi64(acc0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    acc1 = _mm256_add_epi64(acc1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
  }
  acc0 = _mm256_add_epi64(acc0, acc1);
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), acc0);
  return v[0] + v[1] + v[2] + v[3];
}

double read_gbps(const uint8_t* buf, size_t bytes, unsigned threads) {
  constexpr size_t kChunk = size_t{4} << 20;
  const size_t chunks = bytes / kChunk;
  std::atomic<int> go{-1};  // the pass being run; -1: none yet, -2: quit
  std::atomic<size_t> next{0};
  std::atomic<unsigned> done{0};
  std::vector<uint64_t> sink(threads);
  std::vector<std::thread> pool;
  // Threads 1.. wait for each pass; thread 0 is this one (no core spins idle).
  for (unsigned t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int seen = -1;;) {
        int pass;
        while ((pass = go.load(std::memory_order_acquire)) == seen) {
        }
        if (pass == -2) return;
        seen = pass;
        for (size_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;)
          sink[t] += sum_avx2(buf + c * kChunk, kChunk);
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  }
  double best = 0;
  for (int pass = 0; pass < 8; ++pass) {
    next.store(0);
    done.store(0);
    const auto t0 = std::chrono::steady_clock::now();
    go.store(pass, std::memory_order_release);
    for (size_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;)
      sink[0] += sum_avx2(buf + c * kChunk, kChunk);
    while (done.load(std::memory_order_acquire) < threads - 1) {
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(chunks * kChunk) / s / 1e9);
  }
  go.store(-2, std::memory_order_release);
  for (auto& th : pool) th.join();
  uint64_t x = 0;
  for (uint64_t v : sink) x += v;
  if (x == 42) std::printf(" ");  // keep the sums alive
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::vector<unsigned> counts;
  for (int i = 1; i < argc; ++i)
    counts.push_back(static_cast<unsigned>(std::max(1, std::atoi(argv[i]))));
  if (counts.empty()) {
    for (unsigned t = 1; t < hw; t *= 2) counts.push_back(t);
    counts.push_back(hw);
  }
  size_t bytes = size_t{4} << 30;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(nullptr, &std::free);
  while (bytes >= (size_t{64} << 20)) {
    buf.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)));
    if (buf) break;
    bytes /= 2;
  }
  if (!buf) {
    std::fprintf(stderr, "loom_membw_bench: cannot allocate a buffer\n");
    return 1;
  }
  std::memset(buf.get(), 1, bytes);  // touch every page
  std::printf("buffer %.1f GiB, %u hardware threads\n", static_cast<double>(bytes) / (1u << 30),
              hw);
  for (unsigned t : counts)
    std::printf("threads %3u: read %7.1f GB/s\n", t, read_gbps(buf.get(), bytes, t));
  return 0;
}
