// loom_ops_bench: decode attention over a paged KV cache (cpu::attention),
// one thread, on TinyLlama and Llama-3-8B head shapes.
//
//   TinyLlama   32 query heads, 4 KV heads, head_dim 64
//   Llama-3-8B  32 query heads, 8 KV heads, head_dim 128
//   KV cache F16 and Q8_0; contexts 512, 4096, 32768; block size 32 (--block-size)
//
// One call = one layer of one decode step: T = 1 at position n_ctx - 1, all
// query heads. Reported per case:
//   cold  µs per layer when the calls rotate through copies of the layer's
//         cache filling >= 1 GiB (blocks scattered across the whole pool), so
//         that the KV is read from memory as in a real model's decode step;
//   hot   µs per layer for the same layer again and again (cache-resident
//         when it fits);
//   GB/s  K + V bytes read per call / cold time.
// Each figure is the median of repeated calls after warm-up. --threads N adds,
// per case, N threads that attend at once, each over its own layers as in
// the cold runs (the host tier's attention is N such threads): the bytes all
// of them read per second, and the per-layer time.
// --prefill adds
// one prefill case per shape (T = 512 from position 0, ms per layer).
//
// The pool is madvised for transparent huge pages (--no-huge-pages: 4 KiB
// pages, where every scattered block costs TLB misses).
//
// Usage: loom_ops_bench [--isa scalar|avx2|avx512] [--block-size N] [--min-ms MS] [--prefill]
//                       [--no-huge-pages] [--threads N] [--shape NAME] [--ctx N]
// --shape and --ctx run that shape or that context only.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/ops.h"

namespace {

using loom::DType;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
};

struct Options {
  int64_t block_size = 32;
  double min_ms = 200.0;
  bool prefill = false;
  bool huge_pages = true;  // madvise(MADV_HUGEPAGE) on the KV pool
  int threads = 1;         // --threads N: N threads attend at once, each its own layers
  std::string shape;       // --shape NAME: that shape only
  int64_t ctx = 0;         // --ctx N: that context only (decode)
};

constexpr size_t kPoolTarget = size_t{1} << 30;  // bytes of KV the cold runs rotate through

// Paged KV for `n_layers` copies of one layer: every block of every layer is
// a distinct slot of one pool, slots assigned in shuffled order.
class KvPool {
 public:
  KvPool(const Shape& s, DType dt, int64_t bs, int64_t n_ctx, int64_t n_layers, bool huge_pages)
      : n_layers_(n_layers), blocks_per_layer_((n_ctx + bs - 1) / bs) {
    head_stride_ = loom::cpu::kv_head_bytes(dt, bs, s.head_dim);
    block_bytes_ = head_stride_ * static_cast<size_t>(s.n_kv_heads);
    const int64_t n_slots = 2 * blocks_per_layer_ * n_layers_;
    // 2 MiB aligned and, where the kernel allows, backed by huge pages.
    const size_t huge = size_t{2} << 20;
    pool_bytes_ = (block_bytes_ * static_cast<size_t>(n_slots) + huge - 1) / huge * huge;
    pool_ = static_cast<uint8_t*>(std::aligned_alloc(huge, pool_bytes_));
    if (!pool_) {
      std::fprintf(stderr, "out of memory (%zu bytes)\n", pool_bytes_);
      std::exit(1);
    }
    if (huge_pages) madvise(pool_, pool_bytes_, MADV_HUGEPAGE);
    uint8_t* base = pool_;

    // A few blocks of valid data (finite values), copied into every slot.
    constexpr int kTemplates = 4;
    std::vector<uint8_t> templates(block_bytes_ * kTemplates);
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(s.n_kv_heads * s.head_dim));
    for (int t = 0; t < kTemplates; ++t) {
      for (int64_t r = 0; r < bs; ++r) {
        for (float& x : row) x = normal(rng);
        loom::cpu::kv_store(dt, templates.data() + block_bytes_ * t, head_stride_, s.n_kv_heads,
                            s.head_dim, r, row.data());
      }
    }
    for (int64_t i = 0; i < n_slots; ++i) {
      std::memcpy(base + block_bytes_ * static_cast<size_t>(i),
                  templates.data() + block_bytes_ * (i % kTemplates), block_bytes_);
    }
    std::vector<int64_t> slots(static_cast<size_t>(n_slots));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    tables_.resize(static_cast<size_t>(n_slots));
    for (int64_t i = 0; i < n_slots; ++i)
      tables_[i] = base + block_bytes_ * static_cast<size_t>(slots[i]);

    view_.block_size = bs;
    view_.n_kv_heads = s.n_kv_heads;
    view_.head_dim = s.head_dim;
    view_.head_stride_bytes = head_stride_;
    view_.dtype = dt;
  }

  // Layer l: K block table then V block table, blocks_per_layer_ each.
  loom::cpu::KvView layer(int64_t l) const {
    loom::cpu::KvView v = view_;
    v.k_blocks = tables_.data() + 2 * blocks_per_layer_ * l;
    v.v_blocks = v.k_blocks + blocks_per_layer_;
    return v;
  }
  int64_t n_layers() const { return n_layers_; }
  ~KvPool() { std::free(pool_); }
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

 private:
  int64_t n_layers_;
  int64_t blocks_per_layer_;
  size_t head_stride_ = 0;
  size_t block_bytes_ = 0;
  uint8_t* pool_ = nullptr;
  size_t pool_bytes_ = 0;
  std::vector<const void*> tables_;
  loom::cpu::KvView view_;
};

// Median time in µs of calls to f(i), i counting up, after 3 warm-up calls,
// repeated for at least min_ms.
template <typename F>
double median_us(F&& f, double min_ms) {
  for (int i = 0; i < 3; ++i) f(i);
  std::vector<double> us;
  const auto start = Clock::now();
  for (int64_t i = 3;; ++i) {
    const auto t0 = Clock::now();
    f(i);
    const auto t1 = Clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (us.size() >= 5 && std::chrono::duration<double, std::milli>(t1 - start).count() >= min_ms)
      break;
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

size_t kv_row_bytes(DType dt, int64_t head_dim) {
  return loom::cpu::kv_head_bytes(dt, 1, head_dim);
}

// o.threads threads at once, thread i over layers i, i + threads, ...: the
// bytes they read per second together, and the mean time of one call.
void run_decode_threads(const Shape& s, const KvPool& pool, const std::vector<float>& q,
                        int64_t n_ctx, size_t layer_kv_bytes, const Options& o) {
  const int n = o.threads;
  const int32_t pos = static_cast<int32_t>(n_ctx - 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  std::vector<int64_t> calls(static_cast<size_t>(n), 0);
  const auto deadline = Clock::now() + std::chrono::duration<double, std::milli>(o.min_ms);
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&, t] {
      std::vector<float> out(q.size());
      std::vector<float> scratch(loom::cpu::attention_scratch_floats(pool.layer(0)));
      int64_t i = t;
      do {
        loom::cpu::attention(q.data(), 1, &pos, s.n_heads, pool.layer(i % pool.n_layers()), scale,
                             out.data(), 0, s.n_heads, scratch.data());
        i += n;
        ++calls[static_cast<size_t>(t)];
      } while (Clock::now() < deadline);
    });
  }
  for (auto& th : ts) th.join();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  const double total = static_cast<double>(std::accumulate(calls.begin(), calls.end(), int64_t{0}));
  std::printf("%-11s %*s %2d threads: %9.1f us per call  %6.1f GB/s together\n", s.name, 40, "", n,
              us * n / total, static_cast<double>(layer_kv_bytes) * total / us / 1e3);
}

void run_decode(const Shape& s, DType dt, int64_t n_ctx, const Options& o) {
  const size_t layer_kv_bytes =
      2 * kv_row_bytes(dt, s.head_dim) * static_cast<size_t>(n_ctx * s.n_kv_heads);
  const int64_t n_layers = std::max<int64_t>(
      1, static_cast<int64_t>((kPoolTarget + layer_kv_bytes - 1) / layer_kv_bytes));
  const KvPool pool(s, dt, o.block_size, n_ctx, n_layers, o.huge_pages);

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(s.n_heads * s.head_dim));
  for (float& x : q) x = normal(rng);
  std::vector<float> out(q.size());
  const loom::cpu::KvView kv0 = pool.layer(0);
  std::vector<float> scratch(loom::cpu::attention_scratch_floats(kv0));
  const int32_t pos = static_cast<int32_t>(n_ctx - 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

  auto call = [&](const loom::cpu::KvView& kv) {
    loom::cpu::attention(q.data(), 1, &pos, s.n_heads, kv, scale, out.data(), 0, s.n_heads,
                         scratch.data());
  };
  const double cold =
      median_us([&](int64_t i) { call(pool.layer(i % pool.n_layers())); }, o.min_ms);
  const double hot = median_us([&](int64_t) { call(kv0); }, o.min_ms);
  std::printf("%-11s %-5s ctx %6lld  KV %8.2f MiB  cold %9.1f us  hot %9.1f us  %6.1f GB/s\n",
              s.name, std::string(loom::dtype_name(dt)).c_str(), static_cast<long long>(n_ctx),
              static_cast<double>(layer_kv_bytes) / (1 << 20), cold, hot,
              static_cast<double>(layer_kv_bytes) / cold / 1e3);
  if (o.threads > 1) run_decode_threads(s, pool, q, n_ctx, layer_kv_bytes, o);
  std::fflush(stdout);
}

void run_prefill(const Shape& s, DType dt, const Options& o) {
  const int64_t T = 512;
  const KvPool pool(s, dt, o.block_size, T, 1, o.huge_pages);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(T * s.n_heads * s.head_dim));
  for (float& x : q) x = normal(rng);
  std::vector<float> out(q.size());
  const loom::cpu::KvView kv = pool.layer(0);
  std::vector<float> scratch(loom::cpu::attention_scratch_floats(kv));
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), 0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double us = median_us(
      [&](int64_t) {
        loom::cpu::attention(q.data(), T, pos.data(), s.n_heads, kv, scale, out.data(), 0,
                             s.n_heads, scratch.data());
      },
      o.min_ms);
  // Causal: T (T + 1) / 2 query-key pairs per head, 2 flops each for QK and PV.
  const double flops = 4.0 * s.head_dim * s.n_heads * (T * (T + 1) / 2.0);
  std::printf("%-11s %-5s prefill T=%lld from 0: %8.2f ms per layer  %6.1f GFLOP/s\n", s.name,
              std::string(loom::dtype_name(dt)).c_str(), static_cast<long long>(T), us / 1e3,
              flops / us / 1e3);
  std::fflush(stdout);
}

int usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s [--isa scalar|avx2|avx512] [--block-size N] [--min-ms MS] [--prefill] "
      "[--no-huge-pages] [--threads N] [--shape TinyLlama|Llama-3-8B] [--ctx 512|4096|32768]\n",
      argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--isa" && has_value) {
      const std::string v = argv[++i];
      const loom::cpu::Isa isa = v == "scalar" ? loom::cpu::Isa::kScalar
                                 : v == "avx2" ? loom::cpu::Isa::kAvx2
                                               : loom::cpu::Isa::kAvx512;
      if (!loom::cpu::set_isa(isa)) {
        std::fprintf(stderr, "this CPU has no %s\n", v.c_str());
        return 1;
      }
    } else if (a == "--block-size" && has_value) {
      o.block_size = std::atoll(argv[++i]);
      if (o.block_size <= 0) return usage(argv[0]);
    } else if (a == "--min-ms" && has_value) {
      o.min_ms = std::atof(argv[++i]);
    } else if (a == "--prefill") {
      o.prefill = true;
    } else if (a == "--no-huge-pages") {
      o.huge_pages = false;
    } else if (a == "--threads" && has_value) {
      o.threads = std::atoi(argv[++i]);
      if (o.threads <= 0) return usage(argv[0]);
    } else if (a == "--shape" && has_value) {
      o.shape = argv[++i];
    } else if (a == "--ctx" && has_value) {
      o.ctx = std::atoll(argv[++i]);
    } else {
      return usage(argv[0]);
    }
  }
  std::printf("decode attention, 1 thread, isa %s, block size %lld\n",
              loom::cpu::isa_name(loom::cpu::active_isa()), static_cast<long long>(o.block_size));
  const Shape shapes[] = {{"TinyLlama", 32, 4, 64}, {"Llama-3-8B", 32, 8, 128}};
  for (const Shape& s : shapes) {
    if (!o.shape.empty() && o.shape != s.name) continue;
    for (const DType dt : {DType::kF16, DType::kQ8_0}) {
      for (const int64_t n_ctx : {512, 4096, 32768}) {
        if (o.ctx == 0 || o.ctx == n_ctx) run_decode(s, dt, n_ctx, o);
      }
    }
  }
  if (o.prefill) {
    for (const Shape& s : shapes) {
      if (!o.shape.empty() && o.shape != s.name) continue;
      for (const DType dt : {DType::kF16, DType::kQ8_0}) run_prefill(s, dt, o);
    }
  }
  return 0;
}
