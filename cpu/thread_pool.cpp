#include "cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_CPU_RELAX() _mm_pause()
#else
#define LOOM_CPU_RELAX() ((void)0)
#endif

namespace loom::cpu {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int ith) {
  uint32_t seen = 0;
  for (;;) {
    // Spin a little: the next op of a decode step usually follows within microseconds.
    uint32_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      const auto t0 = std::chrono::steady_clock::now();
      int k = 0;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        LOOM_CPU_RELAX();
        if ((++k & 255) == 0 &&
            std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(spin_us_)) {
          generation_.wait(seen, std::memory_order_acquire);
        }
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(ith, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  // Spin while the workers finish; yield after a while, so that when more
  // threads than cores are busy (other programs) a descheduled worker gets
  // the core back instead of us burning it.
  for (int k = 0; pending_.load(std::memory_order_acquire) != 0; ++k) {
    if (k < 4096) {
      LOOM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t align,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  const int64_t chunks = (n + align - 1) / align;
  if (chunks <= n_threads_) {
    run([&](int ith, int nth) {
      int64_t b, e;
      split_range(n, align, ith, nth, &b, &e);
      if (b < e) fn(b, e, ith);
    });
    return;
  }
  // Threads take pieces of about a quarter of an even share from a shared
  // counter: a thread the OS preempts (a driver's thread, another program)
  // or one that starts late leaves its pieces to the others instead of
  // holding up the op by a whole share.
  const int64_t grain = std::max<int64_t>(1, chunks / (int64_t{kPiecesPerThread} * n_threads_));
  std::atomic<int64_t> next{0};
  run([&](int ith, int) {
    for (;;) {
      const int64_t c = next.fetch_add(grain, std::memory_order_relaxed);
      if (c >= chunks) return;
      fn(c * align, std::min(n, (c + grain) * align), ith);
    }
  });
}

}  // namespace loom::cpu
