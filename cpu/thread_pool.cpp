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

namespace {
// Spin while `busy()`; yield after a while, so that when more threads than
// cores are busy (other programs) a descheduled worker gets the core back
// instead of us burning it.
template <typename F>
void wait_while(F busy) {
  for (int k = 0; busy(); ++k) {
    if (k < 4096) {
      LOOM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.store((generation_.load(std::memory_order_relaxed) & ~1u) + 2,
                    std::memory_order_release);
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
            std::chrono::steady_clock::now() - t0 >
                std::chrono::microseconds(spin_us_.load(std::memory_order_relaxed))) {
          generation_.wait(seen, std::memory_order_acquire);
        }
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    if ((g & 1u) == 0) {  // run(): this generation's job waits for this worker
      (*job_)(ith, n_threads_);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    // A parallel_for: join it if it is still open. With both sides seq_cst,
    // either the caller sees this worker in active_ and waits for it, or the
    // worker sees the job closed and leaves without touching it.
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (open_.load(std::memory_order_seq_cst) == g) take_pieces(ith);
    active_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::publish(bool shared) {
  // The low bit carries the kind, so a worker that wakes late reads the kind
  // of the generation it sees; a parallel_for's generation is never 0.
  const uint32_t g = ((generation_.load(std::memory_order_relaxed) & ~1u) + 2) | (shared ? 1u : 0u);
  if (shared) open_.store(g, std::memory_order_relaxed);
  generation_.store(g, std::memory_order_release);  // publishes the job's fields
  generation_.notify_all();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  publish(false);
  fn(0, n_threads_);
  wait_while([&] { return pending_.load(std::memory_order_acquire) != 0; });
}

void ThreadPool::take_pieces(int ith) {
  for (;;) {
    const int64_t c = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (c >= chunks_) return;
    (*range_fn_)(c * align_, std::min(n_, (c + grain_) * align_), ith);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t align,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  const int64_t chunks = (n + align - 1) / align;
  if (n_threads_ == 1 || chunks == 1) {
    fn(0, n, 0);
    return;
  }
  range_fn_ = &fn;
  n_ = n;
  align_ = align;
  chunks_ = chunks;
  grain_ = std::max<int64_t>(1, chunks / (int64_t{kPiecesPerThread} * n_threads_));
  next_.store(0, std::memory_order_relaxed);
  publish(true);
  take_pieces(0);
  // Every piece is taken: close the job, then wait for the workers inside it.
  open_.store(0, std::memory_order_seq_cst);
  wait_while([&] { return active_.load(std::memory_order_seq_cst) != 0; });
}

}  // namespace loom::cpu
