// loom_dense_bench: dense (F32/F16/BF16) matmuls, our tiled kernel against
// oneDNN, on TinyLlama's projection shapes.
//
//   Y[T, rows] = X[T, n] · W[rows, n]^T
//   shapes (n x rows): 2048 x 2048 (q, o), 2048 x 5632 (gate, up), 5632 x 2048 (down)
//   T = 1, 16, 128, 512; 1 and 2 threads
//
// GEMV (T = 1) is reported in GB/s of weights read, T > 1 in GFLOP/s
// (2 T n rows flops). Weights rotate through copies filling >= 1 GiB, so
// every call reads them from memory, as a decode step of a real model does.
// Each figure is the median (--best: the fastest) of repeated calls after two
// warm-up calls (the first oneDNN call of a shape also creates its primitive).
//
// Usage: loom_dense_bench [--dtype f32|f16|bf16] [--threads N] [--T N]
//                         [--isa scalar|avx2|avx512] [--min-ms MS] [--w-offset BYTES] [--best]
//                         [--switch]
// --switch adds a line per case timing our kernel when each call follows a
// oneDNN call: oneDNN's OpenMP workers still spin then (libgomp's default
// wait policy) and compete with ThreadPool's workers for the cores.
// Prints one line per case; the choice table in cpu/gemm_onednn.cpp quotes
// these figures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm_onednn.h"
#include "cpu/matmul.h"
#include "cpu/ref/fp16.h"
#include "cpu/thread_pool.h"

namespace {

using loom::DType;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<DType> dtypes{DType::kF32, DType::kF16, DType::kBF16};
  std::vector<int> threads{1, 2};
  std::vector<int64_t> tokens{1, 16, 128, 512};
  double min_ms = 300.0;
  bool best = false;         // report the fastest call instead of the median
  bool switch_cost = false;  // also time our kernel right after each oneDNN call
  size_t w_offset = 0;  // bytes past a 64-byte boundary where weights start (GGUF aligns to 32)
};

// A 64-byte aligned byte buffer, `offset` bytes into its first line.
class Buffer {
 public:
  Buffer(size_t bytes, size_t offset) : raw_(bytes + 128) {
    const auto base = reinterpret_cast<uintptr_t>(raw_.data());
    data_ = raw_.data() + ((64 - base % 64) % 64) + offset;
  }
  uint8_t* data() { return data_; }

 private:
  std::vector<uint8_t> raw_;
  uint8_t* data_;
};

size_t elem_bytes(DType w) {
  return w == DType::kF32 ? 4 : 2;
}

// Fills n elements of dtype w with uniform values in [-1, 1).
void fill_random(DType w, void* dst, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  if (w == DType::kF32) {
    auto* p = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) p[i] = u(rng);
  } else {
    auto* p = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) {
      p[i] = w == DType::kF16 ? loom::ref::fp32_to_fp16(u(rng)) : loom::ref::fp32_to_bf16(u(rng));
    }
  }
}

// Times fn(c) (one matmul using weight copy c): median (or best) milliseconds.
template <typename Fn>
double time_ms(double min_ms, bool best, int copies, Fn&& fn) {
  fn(0);
  fn(1 % copies);
  std::vector<double> ms;
  double total = 0.0;
  for (int i = 0; total < min_ms || ms.size() < 5; ++i) {
    const auto t0 = Clock::now();
    fn((i + 2) % copies);
    const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    ms.push_back(dt);
    total += dt;
    if (ms.size() >= 2000) break;
  }
  std::sort(ms.begin(), ms.end());
  return best ? ms.front() : ms[ms.size() / 2];
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--best" || a == "--switch") {
      (a == "--best" ? o->best : o->switch_cost) = true;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) return false;
    if (a == "--dtype") {
      const std::string s = v;
      o->dtypes = {s == "f32" ? DType::kF32 : s == "f16" ? DType::kF16 : DType::kBF16};
    } else if (a == "--threads") {
      o->threads = {std::atoi(v)};
    } else if (a == "--T") {
      o->tokens = {std::atoll(v)};
    } else if (a == "--w-offset") {
      o->w_offset = static_cast<size_t>(std::atoll(v)) % 64;
    } else if (a == "--min-ms") {
      o->min_ms = std::atof(v);
    } else if (a == "--isa") {
      const std::string s = v;
      const loom::cpu::Isa isa = s == "scalar" ? loom::cpu::Isa::kScalar
                                 : s == "avx2" ? loom::cpu::Isa::kAvx2
                                               : loom::cpu::Isa::kAvx512;
      if (!loom::cpu::set_isa(isa)) {
        std::fprintf(stderr, "this CPU has no %s\n", s.c_str());
        return false;
      }
    } else {
      return false;
    }
    ++i;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, &opt)) {
    std::fprintf(
        stderr,
        "usage: loom_dense_bench [--dtype f32|f16|bf16] [--threads N] [--T N] "
        "[--isa scalar|avx2|avx512] [--min-ms MS] [--w-offset BYTES] [--best] [--switch]\n");
    return 2;
  }
  struct Shape {
    int64_t n, rows;
  };
  const Shape shapes[] = {{2048, 2048}, {2048, 5632}, {5632, 2048}};
  loom::cpu::OneDnnMatmul onednn;
  std::printf("isa %s, oneDNN %s\n", loom::cpu::isa_name(loom::cpu::active_isa()),
              onednn.available() ? "available" : "not available");
  std::printf("%-5s %5s %5s %4s %3s | %10s %10s | %10s %10s | %-6s %s\n", "dtype", "n", "rows", "T",
              "thr", "loom ms", "loom", "onednn ms", "onednn", "choice", "max|diff|/scale");

  for (const DType w : opt.dtypes) {
    for (const Shape& sh : shapes) {
      const size_t eb = elem_bytes(w);
      const size_t w_bytes = static_cast<size_t>(sh.n * sh.rows) * eb;
      // Enough copies that the whole rotation (>= 1 GiB) outgrows any cache.
      const int copies =
          static_cast<int>(std::max<size_t>(2, ((size_t{1} << 30) + w_bytes - 1) / w_bytes));
      Buffer weights(w_bytes * static_cast<size_t>(copies), opt.w_offset);
      fill_random(w, weights.data(), static_cast<size_t>(sh.n * sh.rows), 1);
      for (int c = 1; c < copies; ++c)
        std::memcpy(weights.data() + w_bytes * c, weights.data(), w_bytes);
      for (const int64_t T : opt.tokens) {
        Buffer x(static_cast<size_t>(T * sh.n) * eb, 0);
        fill_random(w, x.data(), static_cast<size_t>(T * sh.n), 2);
        const auto y_size = static_cast<size_t>(T * sh.rows);
        Buffer y_loom_buf(y_size * sizeof(float), 0), y_dnn_buf(y_size * sizeof(float), 0);
        auto* y_loom = reinterpret_cast<float*>(y_loom_buf.data());
        auto* y_dnn = reinterpret_cast<float*>(y_dnn_buf.data());
        const size_t w_row = static_cast<size_t>(sh.n) * eb, x_row = w_row;
        for (const int threads : opt.threads) {
          loom::cpu::ThreadPool pool(threads);
          const double ms_loom = time_ms(opt.min_ms, opt.best, copies, [&](int c) {
            const loom::Status s =
                loom::cpu::dense_matmul_loom(w, weights.data() + w_bytes * c, w_row, x.data(),
                                             x_row, T, y_loom, sh.rows, sh.n, sh.rows, pool);
            if (!s) std::fprintf(stderr, "loom: %s\n", s.message().c_str());
          });
          double ms_dnn = NAN;
          bool dnn_ok = onednn.available();
          if (dnn_ok) {
            // One trial call: oneDNN may refuse the case (bf16 below AVX-512, say).
            const loom::Status s = onednn.run(w, weights.data(), w_row, x.data(), x_row, T, y_dnn,
                                              sh.rows, sh.n, sh.rows, threads);
            if (!s) {
              std::fprintf(stderr, "onednn: %s\n", s.message().c_str());
              dnn_ok = false;
            }
          }
          if (dnn_ok) {
            ms_dnn = time_ms(opt.min_ms, opt.best, copies, [&](int c) {
              (void)onednn.run(w, weights.data() + w_bytes * c, w_row, x.data(), x_row, T, y_dnn,
                               sh.rows, sh.n, sh.rows, threads);
            });
          }
          // Agreement of the two, relative to the largest |y| (a sanity check;
          // tests/unit/cpu_dense_test.cpp holds the real bounds).
          double max_diff = 0.0, scale = 0.0;
          for (size_t i = 0; i < y_size; ++i) {
            max_diff = std::max(max_diff, std::fabs(static_cast<double>(y_loom[i]) - y_dnn[i]));
            scale = std::max(scale, std::fabs(static_cast<double>(y_loom[i])));
          }
          // GEMV: GB/s of weights; T > 1: GFLOP/s.
          const auto figure = [&](double ms) {
            return T == 1 ? static_cast<double>(w_bytes) / (ms * 1e6)
                          : 2.0 * static_cast<double>(T * sh.n * sh.rows) / (ms * 1e6);
          };
          const char* unit = T == 1 ? "GB/s" : "GFLOP/s";
          const loom::cpu::DenseImpl choice =
              loom::cpu::dense_prefill_choice(w, T, sh.n, sh.rows, threads);
          char dnn_cols[64];
          if (dnn_ok) {
            std::snprintf(dnn_cols, sizeof dnn_cols, "%10.3f %10.1f", ms_dnn, figure(ms_dnn));
          } else {
            std::snprintf(dnn_cols, sizeof dnn_cols, "%10s %10s", "-", "-");
          }
          std::printf("%-5s %5lld %5lld %4lld %3d | %10.3f %10.1f | %s | %-6s %.1e  (%s)\n",
                      std::string(loom::dtype_name(w)).c_str(), static_cast<long long>(sh.n),
                      static_cast<long long>(sh.rows), static_cast<long long>(T), threads, ms_loom,
                      figure(ms_loom), dnn_cols, loom::cpu::dense_impl_name(choice),
                      dnn_ok ? max_diff / scale : 0.0, unit);
          if (opt.switch_cost && dnn_ok) {
            // Alternate a oneDNN call (untimed) and ours (timed), as a forward
            // pass mixing the two would.
            std::vector<double> after;
            double total = 0.0;
            for (int i = 0; total < opt.min_ms || after.size() < 5; ++i) {
              (void)onednn.run(w, weights.data() + w_bytes * (2 * i % copies), w_row, x.data(),
                               x_row, T, y_dnn, sh.rows, sh.n, sh.rows, threads);
              const auto t0 = Clock::now();
              (void)loom::cpu::dense_matmul_loom(
                  w, weights.data() + w_bytes * ((2 * i + 1) % copies), w_row, x.data(), x_row, T,
                  y_loom, sh.rows, sh.n, sh.rows, pool);
              const double dt =
                  std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
              after.push_back(dt);
              total += 2 * dt;
              if (after.size() >= 2000) break;
            }
            std::sort(after.begin(), after.end());
            const double ms_after = opt.best ? after.front() : after[after.size() / 2];
            std::printf("      loom right after each oneDNN call: %.3f ms (%+.0f%%)\n", ms_after,
                        100.0 * (ms_after / ms_loom - 1.0));
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
