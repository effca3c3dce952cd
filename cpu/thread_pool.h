// A thread pool for the short parallel sections of a decode step (one matmul
// takes tens of microseconds): persistent workers that spin briefly on a
// generation counter before sleeping, and the calling thread takes part as
// thread 0. No thread is created per operation.
//
// Two kinds of job. run() needs every thread (each runs fn once with its own
// index), so it waits for all of them. parallel_for() hands out pieces of the
// range from a shared counter and needs no particular thread: the caller
// starts at once, workers join as they wake, and once every piece is taken
// the job closes, so a worker that wakes late (asleep after the GPU's part of
// a hybrid step, or preempted by another program) neither holds up the op
// nor keeps a share of it.
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
  /// and returns when all have finished. Not reentrant: one job at a time.
  void run(const std::function<void(int ith, int nth)>& fn);

  /// Runs fn(begin, end, ith) over ranges covering [0, n), each a multiple of
  /// `align` (but the last) and of about 1/kPiecesPerThread of an even share,
  /// taken from a shared counter by whichever threads are running (a thread
  /// may get several pieces, or none); ith < size() tells the threads apart.
  void parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t, int)>& fn);

  static constexpr int kPiecesPerThread = 4;

  /// Microseconds a worker spins before it sleeps (default 200).
  void set_spin_us(int us) { spin_us_.store(us, std::memory_order_relaxed); }

 private:
  void worker(int ith);
  void publish(bool shared);  // starts the job set up in the members below
  void take_pieces(int ith);  // parallel_for's loop over the shared counter

  int n_threads_;
  std::atomic<int> spin_us_{200};
  std::vector<std::thread> workers_;
  // The job's generation; its low bit is the job's kind (1: parallel_for).
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  // run(): the function, and the workers still to finish it.
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<int> pending_{0};
  // parallel_for(): the job's generation while it is open (0: closed), the
  // workers inside it, and its range.
  std::atomic<uint32_t> open_{0};
  std::atomic<int> active_{0};
  const std::function<void(int64_t, int64_t, int)>* range_fn_ = nullptr;
  int64_t n_ = 0, align_ = 1, chunks_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace loom::cpu
