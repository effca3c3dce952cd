// The thread pool: every thread runs each job once, ranges tile [0, n), and
// back-to-back runs (as in a decode step) neither lose nor repeat work.
#include "cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace loom::cpu {
namespace {

TEST(ThreadPool, EveryThreadRunsOncePerJob) {
  for (int n : {1, 2, 3, 8}) {
    ThreadPool pool(n);
    for (int rep = 0; rep < 200; ++rep) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.run([&](int ith, int nth) {
        EXPECT_EQ(nth, n);
        hits[static_cast<size_t>(ith)].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, ParallelForTilesTheRangeInAlignedChunks) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 15, 16, 17, 100, 1000}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    pool.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
      EXPECT_EQ(b % 16, 0);
      EXPECT_TRUE(e % 16 == 0 || e == n);
      for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1) << "n=" << n;
  }
}

// A thread stalled inside its first piece (preempted, say) does not keep the
// rest of its share: the other thread takes every remaining piece.
TEST(ThreadPool, ParallelForGivesAStalledThreadsShareToTheOthers) {
  ThreadPool pool(2);
  const int64_t n = 64 * 16;  // 64 chunks of 16: pieces of 8 chunks
  std::atomic<int> done{0};
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  int pieces[2] = {0, 0};
  pool.parallel_for(n, 16, [&](int64_t b, int64_t e, int ith) {
    if (ith == 1 && pieces[1] == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      while (done.load() < 7 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
        std::this_thread::yield();
    }
    ++pieces[ith];
    for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
    done.fetch_add(1);
  });
  for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  EXPECT_EQ(pieces[0] + pieces[1], 8);
  EXPECT_LE(pieces[1], 1);  // the stalled thread's one piece, or none if it started late
}

// run() and parallel_for() back to back, with workers that fall asleep in
// between and wake late: every run() reaches each thread once, every
// parallel_for() covers its range once, whichever threads take part.
TEST(ThreadPool, MixedJobsWithLateWorkers) {
  ThreadPool pool(4);
  pool.set_spin_us(1);
  for (int rep = 0; rep < 300; ++rep) {
    if (rep % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
    std::vector<std::atomic<int>> hits(4);
    pool.run([&](int ith, int) { hits[static_cast<size_t>(ith)].fetch_add(1); });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "rep " << rep;
    const int64_t n = 1 + rep % 97 * 13;
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    pool.parallel_for(n, 4, [&](int64_t b, int64_t e, int ith) {
      ASSERT_GE(ith, 0);
      ASSERT_LT(ith, 4);
      for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& v : seen) ASSERT_EQ(v.load(), 1) << "rep " << rep << " n " << n;
  }
}

TEST(ThreadPool, SleepingWorkersWakeUp) {
  ThreadPool pool(2);
  pool.set_spin_us(1);
  std::atomic<int> sum{0};
  for (int rep = 0; rep < 20; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers go to sleep
    pool.run([&](int ith, int) { sum += ith + 1; });
  }
  EXPECT_EQ(sum.load(), 20 * 3);
}

}  // namespace
}  // namespace loom::cpu
