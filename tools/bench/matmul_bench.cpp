// loom_matmul_bench: speed of the quantized matmuls (cpu/matmul.h) on
// TinyLlama-1.1B shapes, per dtype, ISA level and thread count.
//
//   GEMV (T = 1, decode): microseconds per matmul and GB/s of weights read.
//     Weights stream from memory: each call uses the next copy of the matrix
//     in a pool larger than the caches (--pool-mb), as decode does when it
//     walks a model's layers.
//   GEMM (T = --tokens, prefill): milliseconds per matmul and GFLOP/s
//     (2 * rows * n * T), same matrix every call.
//
// Threads split the rows in contiguous ranges (multiples of 16); the caller
// is thread 0 and the others spin between calls, as a decode loop would.
//
// Usage: loom_matmul_bench [--dtypes q4_0,q8_0,...] [--isa scalar,avx2,avx512]
//          [--threads 1,2] [--tokens 128] [--pool-mb 1024] [--seconds 0.3]
//          [--no-gemm] [--no-gemv] [--shapes 2048x2048,...]   (rows x n)
//          [--clock wall|cpu] [--no-vbmi] [--model [--batch 1,2,4,8]]
//
// --model instead walks the matmuls of a whole TinyLlama-1.1B decode step
// (22 layers of q, k, v, o, gate, up, down, then the 32000-row output), each
// weight at its own address as in a loaded model: milliseconds per token of
// matmul work and GB/s, to set against llama-bench's tg figure. With
// --batch 1,4,8 the step carries that many token rows (continuous batching:
// one decode token of each of B sequences), timed per step and per token.
//
// --clock cpu times each call by the largest per-thread CPU time instead of
// the wall clock: on a machine shared with other work, this leaves out the
// time a thread spent descheduled (but not the memory bandwidth others use).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"
#include "cpu/ref/quants.h"
#include "engine/core/dtype.h"

namespace {

using loom::DType;
using loom::cpu::Isa;
using Clock = std::chrono::steady_clock;

struct Shape {
  int64_t rows;  // output features
  int64_t n;     // input features
  const char* what;
};

struct Options {
  std::vector<DType> dtypes = {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                               DType::kQ6_K, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                               DType::kQ2_K, DType::kQ3_K};
  std::vector<Isa> isas;
  bool no_vbmi = false;
  std::vector<int> threads = {1, 2};
  std::vector<Shape> shapes = {{2048, 2048, "attn q/o"},
                               {5632, 2048, "ffn gate/up"},
                               {2048, 5632, "ffn down"},
                               {32000, 2048, "lm_head"}};
  int64_t tokens = 128;
  size_t pool_bytes = size_t{1024} << 20;
  double seconds = 0.3;
  bool gemm = true;
  bool gemv = true;
  bool cpu_clock = false;
  bool model = false;
  std::vector<int64_t> batch = {1};  ///< --model: token rows per decode step
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::optional<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    auto value = [&]() { return std::string(argv[++i]); };
    if (a == "--dtypes" && has_value) {
      o.dtypes.clear();
      for (const auto& name : split(value())) {
        const auto t = loom::dtype_from_name(name);
        if (!t || !loom::cpu::matmul_supported(*t)) {
          std::fprintf(stderr, "unknown or unsupported dtype '%s'\n", name.c_str());
          return std::nullopt;
        }
        o.dtypes.push_back(*t);
      }
    } else if (a == "--isa" && has_value) {
      for (const auto& name : split(value())) {
        if (name == "scalar")
          o.isas.push_back(Isa::kScalar);
        else if (name == "avx2")
          o.isas.push_back(Isa::kAvx2);
        else if (name == "avx512")
          o.isas.push_back(Isa::kAvx512);
        else {
          std::fprintf(stderr, "unknown ISA '%s'\n", name.c_str());
          return std::nullopt;
        }
      }
    } else if (a == "--threads" && has_value) {
      o.threads.clear();
      for (const auto& v : split(value())) o.threads.push_back(std::max(1, std::atoi(v.c_str())));
    } else if (a == "--shapes" && has_value) {
      o.shapes.clear();
      for (const auto& v : split(value())) {
        const size_t x = v.find('x');
        if (x == std::string::npos) {
          std::fprintf(stderr, "shape '%s' is not ROWSxN\n", v.c_str());
          return std::nullopt;
        }
        o.shapes.push_back(
            {std::atoll(v.substr(0, x).c_str()), std::atoll(v.substr(x + 1).c_str()), ""});
      }
    } else if (a == "--tokens" && has_value) {
      o.tokens = std::max<int64_t>(2, std::atoll(value().c_str()));
    } else if (a == "--pool-mb" && has_value) {
      o.pool_bytes = static_cast<size_t>(std::max(1, std::atoi(value().c_str()))) << 20;
    } else if (a == "--seconds" && has_value) {
      o.seconds = std::atof(value().c_str());
    } else if (a == "--clock" && has_value) {
      const std::string v = value();
      if (v != "wall" && v != "cpu") {
        std::fprintf(stderr, "--clock is wall or cpu\n");
        return std::nullopt;
      }
      o.cpu_clock = v == "cpu";
    } else if (a == "--model") {
      o.model = true;
    } else if (a == "--batch" && has_value) {
      o.batch.clear();
      for (const auto& v : split(value()))
        o.batch.push_back(std::max<int64_t>(1, std::atoll(v.c_str())));
    } else if (a == "--no-vbmi") {
      o.no_vbmi = true;
    } else if (a == "--no-gemm") {
      o.gemm = false;
    } else if (a == "--no-gemv") {
      o.gemv = false;
    } else {
      std::fprintf(stderr,
                   "usage: loom_matmul_bench [--dtypes q4_0,...] [--isa scalar,avx2,avx512] "
                   "[--threads 1,2]\n"
                   "         [--tokens T] [--pool-mb MB] [--seconds S] [--no-gemm] [--no-gemv]\n"
                   "         [--shapes ROWSxN,...] [--clock wall|cpu] [--no-vbmi] [--model]\n"
                   "         [--batch B,...]\n");
      return std::nullopt;
    }
  }
  if (o.isas.empty()) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (isa <= loom::cpu::detected_isa()) o.isas.push_back(isa);
    }
  }
  return o;
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The caller plus n - 1 spinning workers; run(fn) calls fn(i, n) on each.
// last_cpu_seconds(): the largest CPU time one thread spent in fn last run.
class SpinTeam {
 public:
  explicit SpinTeam(int n) : n_(n), cpu_(static_cast<size_t>(n), 0.0) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~SpinTeam() {
    stop_.store(true);
    generation_.fetch_add(1);
    for (auto& w : workers_) w.join();
  }
  void run(const std::function<void(int, int)>& fn) {
    job_ = &fn;
    pending_.store(n_ - 1);
    generation_.fetch_add(1, std::memory_order_release);
    timed(0);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins > 2000) std::this_thread::yield();  // oversubscribed machine: let the worker run
    }
  }

  void loop(int i) {
    uint32_t seen = 0;
    for (;;) {
      uint32_t g;
      for (int spins = 0; (g = generation_.load(std::memory_order_acquire)) == seen; ++spins) {
        if (spins > 2000) std::this_thread::yield();
      }
      seen = g;
      if (stop_.load()) return;
      timed(i);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  double last_cpu_seconds() const { return *std::max_element(cpu_.begin(), cpu_.end()); }

 private:
  void timed(int i) {
    const double t0 = thread_cpu_seconds();
    (*job_)(i, n_);
    cpu_[static_cast<size_t>(i)] = thread_cpu_seconds() - t0;
  }
  int n_;
  std::vector<double> cpu_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

void row_range(int64_t rows, int i, int n, int64_t* r0, int64_t* r1) {
  const int64_t chunks = (rows + 15) / 16;
  *r0 = std::min(rows, chunks * i / n * 16);
  *r1 = std::min(rows, chunks * (i + 1) / n * 16);
}

// A 64-byte aligned byte buffer.
struct Buffer {
  explicit Buffer(size_t bytes)
      : size(bytes), data(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {}
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  size_t size;
  uint8_t* data;
};

// `rows_total` rows of n elements quantized to t: 64 distinct random rows, repeated.
void fill_weights(DType t, int64_t n, uint8_t* dst, int64_t rows_total) {
  const size_t rb = *loom::dtype_row_bytes(t, static_cast<uint64_t>(n));
  constexpr int kDistinct = 64;
  std::vector<uint8_t> pool(rb * kDistinct);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> row(static_cast<size_t>(n));
  for (int r = 0; r < kDistinct; ++r) {
    for (auto& v : row) v = normal(rng);
    if (!loom::ref::quantize_row(t, row.data(), pool.data() + r * rb, n).ok()) std::abort();
  }
  for (int64_t r = 0; r < rows_total; ++r)
    std::memcpy(dst + r * rb, pool.data() + (r % kDistinct) * rb, rb);
}

// Runs body() repeatedly for about `seconds` (at least 5 times after one
// warm-up). Returns the best and the median seconds per call: on a shared
// machine the best is the figure of an undisturbed run.
struct Timing {
  double best;
  double median;
};
Timing time_calls(double seconds, const SpinTeam& team, bool cpu_clock,
                  const std::function<void()>& body) {
  body();
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 5 ||
         (std::chrono::duration<double>(Clock::now() - start).count() < seconds &&
          times.size() < 100000)) {
    const auto t0 = Clock::now();
    body();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    times.push_back(cpu_clock ? team.last_cpu_seconds() : wall);
  }
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2]};
}

// One TinyLlama-1.1B decode step's matmuls (weights of dtype t), T = each of o.batch.
void run_model(const Options& o, DType t) {
  struct Mat {
    int64_t rows, n;
  };
  std::vector<Mat> mats;
  for (int l = 0; l < 22; ++l) {
    for (const Mat m : {Mat{2048, 2048}, Mat{256, 2048}, Mat{256, 2048}, Mat{2048, 2048},
                        Mat{5632, 2048}, Mat{5632, 2048}, Mat{2048, 5632}}) {
      mats.push_back(m);
    }
  }
  mats.push_back({32000, 2048});
  std::vector<size_t> offset;
  size_t total = 0;
  for (const Mat& m : mats) {
    offset.push_back(total);
    total +=
        (*loom::dtype_row_bytes(t, static_cast<uint64_t>(m.n)) * static_cast<size_t>(m.rows) + 63) /
        64 * 64;
  }
  Buffer weights(total);
  for (size_t i = 0; i < mats.size(); ++i)
    fill_weights(t, mats[i].n, weights.data + offset[i], mats[i].rows);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t max_t = *std::max_element(o.batch.begin(), o.batch.end());
  std::vector<float> x(static_cast<size_t>(5632 * max_t));
  for (auto& v : x) v = normal(rng);
  Buffer act(loom::cpu::activation_row_bytes(t, 5632) * static_cast<size_t>(max_t));
  std::vector<float> y(static_cast<size_t>(32000 * max_t));
  for (const Isa isa : o.isas) {
    if (!loom::cpu::set_isa(isa)) continue;
    for (const int64_t T : o.batch)
      for (const int nt : o.threads) {
        SpinTeam team(nt);
        const Timing tm = time_calls(std::max(o.seconds, 2.0), team, o.cpu_clock, [&] {
          // Conversion of the activations is part of each step (by the caller,
          // once per input: x is reused here for every matrix).
          for (size_t i = 0; i < mats.size(); ++i) {
            const Mat& m = mats[i];
            const size_t rb = *loom::dtype_row_bytes(t, static_cast<uint64_t>(m.n));
            const size_t arb = loom::cpu::activation_row_bytes(t, m.n);
            if (i == 0 || m.n != mats[i - 1].n) {
              for (int64_t r = 0; r < T; ++r)
                loom::cpu::convert_activation(t, x.data() + r * 5632, act.data + r * arb, m.n);
            }
            team.run([&](int ith, int n_threads) {
              int64_t r0, r1;
              row_range(m.rows, ith, n_threads, &r0, &r1);
              loom::cpu::matmul_rows(t, weights.data + offset[i], rb, act.data, arb, T, y.data(),
                                     m.rows, m.n, r0, r1);
            });
          }
        });
        std::printf(
            "%-5s %-6s %3d TinyLlama decode step, %2lld rows: %7.2f ms (%6.2f median), %6.2f GB/s "
            "of weights (%6.2f), %7.1f tokens/s\n",
            std::string(loom::dtype_name(t)).c_str(), loom::cpu::isa_name(isa), nt,
            static_cast<long long>(T), tm.best * 1e3, tm.median * 1e3,
            static_cast<double>(total) / tm.best * 1e-9,
            static_cast<double>(total) / tm.median * 1e-9, static_cast<double>(T) / tm.median);
        std::fflush(stdout);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const auto opts = parse(argc, argv);
  if (!opts) return 2;
  const Options& o = *opts;
  if (o.no_vbmi) (void)loom::cpu::avx512::set_vbmi(false);
  if (o.model) {
    for (const DType t : o.dtypes) run_model(o, t);
    loom::cpu::set_isa(loom::cpu::detected_isa());
    return 0;
  }
  std::printf("detected ISA: %s; pool %zu MiB; GEMM tokens %lld\n",
              loom::cpu::isa_name(loom::cpu::detected_isa()), o.pool_bytes >> 20,
              static_cast<long long>(o.tokens));
  std::printf("best of many runs (median in parentheses), %s clock\n",
              o.cpu_clock ? "per-thread CPU" : "wall");
  std::printf("%-5s %-6s %3s %-12s %9s %8s %8s %9s %9s %9s\n", "dtype", "isa", "thr", "rows x n",
              "GEMV us", "GB/s", "(GB/s)", "GEMM ms", "GFLOP/s", "(GFLOP/s)");

  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  for (const DType t : o.dtypes) {
    for (const Shape& s : o.shapes) {
      const size_t rb = *loom::dtype_row_bytes(t, static_cast<uint64_t>(s.n));
      const size_t matrix_bytes = rb * static_cast<size_t>(s.rows);
      const size_t copies = std::max<size_t>(1, o.pool_bytes / matrix_bytes);
      Buffer pool(copies * matrix_bytes);
      fill_weights(t, s.n, pool.data, static_cast<int64_t>(copies * static_cast<size_t>(s.rows)));

      const int64_t T = o.tokens;
      std::vector<float> x(static_cast<size_t>(s.n * T));
      for (auto& v : x) v = normal(rng);
      const size_t x_rb = loom::cpu::activation_row_bytes(t, s.n);
      Buffer act(x_rb * static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i)
        loom::cpu::convert_activation(t, x.data() + i * s.n, act.data + i * x_rb, s.n);
      std::vector<float> y(static_cast<size_t>(s.rows * T));

      for (const Isa isa : o.isas) {
        if (!loom::cpu::set_isa(isa)) continue;
        for (const int nt : o.threads) {
          SpinTeam team(nt);
          double gemv_us = 0.0;
          double gbs = 0.0;
          double gbs_median = 0.0;
          if (o.gemv) {
            size_t copy = 0;
            const Timing tm = time_calls(o.seconds, team, o.cpu_clock, [&] {
              const uint8_t* w = pool.data + (copy++ % copies) * matrix_bytes;
              team.run([&](int i, int n_threads) {
                int64_t r0, r1;
                row_range(s.rows, i, n_threads, &r0, &r1);
                loom::cpu::matmul_rows(t, w, rb, act.data, x_rb, 1, y.data(), s.rows, s.n, r0, r1);
              });
            });
            gemv_us = tm.best * 1e6;
            gbs = static_cast<double>(matrix_bytes) / tm.best * 1e-9;
            gbs_median = static_cast<double>(matrix_bytes) / tm.median * 1e-9;
          }
          double gemm_ms = 0.0;
          double gflops = 0.0;
          double gflops_median = 0.0;
          if (o.gemm) {
            const Timing tm = time_calls(o.seconds, team, o.cpu_clock, [&] {
              team.run([&](int i, int n_threads) {
                int64_t r0, r1;
                row_range(s.rows, i, n_threads, &r0, &r1);
                loom::cpu::matmul_rows(t, pool.data, rb, act.data, x_rb, T, y.data(), s.rows, s.n,
                                       r0, r1);
              });
            });
            const double flop = 2.0 * static_cast<double>(s.rows) * static_cast<double>(s.n) *
                                static_cast<double>(T);
            gemm_ms = tm.best * 1e3;
            gflops = flop / tm.best * 1e-9;
            gflops_median = flop / tm.median * 1e-9;
          }
          char shape[32];
          std::snprintf(shape, sizeof(shape), "%lldx%lld", static_cast<long long>(s.rows),
                        static_cast<long long>(s.n));
          std::printf("%-5s %-6s %3d %-12s %9.1f %8.2f %8.2f %9.2f %9.1f %9.1f\n",
                      std::string(loom::dtype_name(t)).c_str(), loom::cpu::isa_name(isa), nt, shape,
                      gemv_us, gbs, gbs_median, gemm_ms, gflops, gflops_median);
          std::fflush(stdout);
        }
      }
    }
  }
  loom::cpu::set_isa(loom::cpu::detected_isa());
  return 0;
}
