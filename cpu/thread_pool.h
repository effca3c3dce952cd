// A thread pool for the short parallel sections of a decode step (one matmul
// takes tens of microseconds): persistent workers that spin briefly on a
// generation counter before sleeping, and the calling thread takes part as
// thread 0. No thread is created per operation.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace loom::cpu {

class ThreadPool {
 public:
  /// `n_threads` >= 1 counts the caller; n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  /// Runs fn(ith, nth) on every thread (ith = 0 is the caller, nth = size())
  /// and returns when all have finished. Not reentrant: one run at a time.
  void run(const std::function<void(int ith, int nth)>& fn);

  /// Runs fn(begin, end, ith) over ranges covering [0, n), each a multiple of
  /// `align` (but the last). With no more align-chunks than threads, one range
  /// per thread; otherwise threads take ranges of about 1/kPiecesPerThread of
  /// an even share from a shared counter (a thread may get several, or none).
  void parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t, int)>& fn);

  static constexpr int kPiecesPerThread = 4;

  /// Microseconds a worker spins before it sleeps (default 200).
  void set_spin_us(int us) { spin_us_ = us; }

 private:
  void worker(int ith);

  int n_threads_;
  int spin_us_ = 200;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

/// Splits [0, n) for thread ith of nth, in chunks that are multiples of align.
inline void split_range(int64_t n, int64_t align, int ith, int nth, int64_t* begin, int64_t* end) {
  const int64_t chunks = (n + align - 1) / align;
  const int64_t per = chunks / nth, extra = chunks % nth;
  const int64_t c0 = ith * per + (ith < extra ? ith : extra);
  const int64_t c1 = c0 + per + (ith < extra ? 1 : 0);
  *begin = c0 * align < n ? c0 * align : n;
  *end = c1 * align < n ? c1 * align : n;
}

}  // namespace loom::cpu
