// loom_cuda_attn_bench: the CUDA decode attention alone (cuda::attention of
// one query token over a layer's device K/V), on TinyLlama and Llama-3-8B
// head shapes, F16 and Q8_0 caches, at several context lengths.
//
//   TinyLlama   32 query heads, 4 KV heads, head_dim 64
//   Llama-3-8B  32 query heads, 8 KV heads, head_dim 128
//
// One call = one layer of one decode step (the query at position ctx - 1).
// The calls rotate through copies of the layer that together fill at least
// 1 GiB, so that K and V come from device memory and not from the L2 cache,
// as in a real model's step. Reported per case: µs per call (CUDA events over
// back-to-back launches, median of 5 rounds) and the K + V bytes read per
// second. For scale, the first line gives a device-to-device copy's rate
// (bytes read + written per second).
//
// Usage: loom_cuda_attn_bench [--shape NAME] [--ctx N[,N...]] [--dtype f16|q8_0]
//                             [--calls N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/backends/cuda/attention/cuda_attention.h"

namespace {

using loom::DType;

struct Shape {
  const char* name;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
};

constexpr Shape kShapes[] = {{"tinyllama", 32, 4, 64}, {"llama3-8b", 32, 8, 128}};
constexpr uint64_t kPoolTarget = uint64_t{1} << 30;

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Random F16 bits in [-1, 1) (finite), or Q8_0 rows (a half scale and 32
// int8 values per group).
std::vector<uint8_t> random_rows(DType dt, int64_t rows, int64_t hd, uint64_t row_bytes,
                                 std::mt19937& rng) {
  std::vector<uint8_t> out(static_cast<size_t>(rows) * row_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* p = out.data() + static_cast<size_t>(r) * row_bytes;
    if (dt == DType::kF16) {
      for (int64_t d = 0; d < hd; ++d) {
        // sign, exponent 0x0B..0x0E (2^-4 .. 2^-1), random mantissa
        const uint16_t h = static_cast<uint16_t>(
            (byte(rng) & 1) << 15 | (11 + byte(rng) % 4) << 10 | (byte(rng) << 2 & 0x3FF));
        std::memcpy(p + 2 * d, &h, 2);
      }
    } else {
      for (int64_t g = 0; g < hd / 32; ++g) {
        const uint16_t scale = 0x2000;  // 2^-7 as a half
        std::memcpy(p + 34 * g, &scale, 2);
        for (int i = 0; i < 32; ++i) p[34 * g + 2 + i] = static_cast<uint8_t>(byte(rng));
      }
    }
  }
  return out;
}

// Median µs per call of `calls` launches (after warm-up), over 5 rounds.
template <typename F>
double time_calls(F&& call, int calls, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) call(i);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> us;
  for (int round = 0; round < 5; ++round) {
    cudaEventRecord(a, s);
    for (int i = 0; i < calls; ++i) call(i);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(1000.0 * ms / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void copy_rate(cudaStream_t s) {
  const size_t bytes = size_t{512} << 20;
  void *x = nullptr, *y = nullptr;
  if (!ok(cudaMalloc(&x, bytes), "cudaMalloc") || !ok(cudaMalloc(&y, bytes), "cudaMalloc")) return;
  cudaMemsetAsync(x, 1, bytes, s);
  const double us =
      time_calls([&](int) { cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s); }, 4, s);
  std::printf("device-to-device copy of 512 MiB: %.1f µs, %.0f GB/s (read + written)\n", us,
              2.0 * static_cast<double>(bytes) / us / 1e3);
  cudaFree(x);
  cudaFree(y);
}

bool run_case(const Shape& sh, DType dt, int64_t ctx, int calls, cudaStream_t s,
              loom::cuda::AttentionScratch& scratch) {
  const int64_t hd = sh.head_dim;
  const uint64_t row_bytes =
      dt == DType::kF16 ? static_cast<uint64_t>(2 * hd) : static_cast<uint64_t>(hd / 32 * 34);
  const uint64_t layer_bytes = 2 * static_cast<uint64_t>(sh.n_kv_heads * ctx) * row_bytes;
  const int n_layers = static_cast<int>(std::max<uint64_t>(2, kPoolTarget / layer_bytes));
  std::mt19937 rng(1234);
  const std::vector<uint8_t> k = random_rows(dt, sh.n_kv_heads * ctx, hd, row_bytes, rng);
  const std::vector<uint8_t> v = random_rows(dt, sh.n_kv_heads * ctx, hd, row_bytes, rng);
  std::vector<loom::cuda::DevKvLayer> layers(static_cast<size_t>(n_layers));
  bool good = true;
  for (auto& L : layers) {
    L.dtype = dt;
    L.n_kv_heads = sh.n_kv_heads;
    L.head_dim = hd;
    L.capacity = ctx;
    L.row_bytes = row_bytes;
    good = good && ok(cudaMalloc(&L.k, k.size()), "cudaMalloc K") &&
           ok(cudaMalloc(&L.v, v.size()), "cudaMalloc V") &&
           ok(cudaMemcpy(L.k, k.data(), k.size(), cudaMemcpyHostToDevice), "upload K") &&
           ok(cudaMemcpy(L.v, v.data(), v.size(), cudaMemcpyHostToDevice), "upload V");
  }
  std::vector<float> qh(static_cast<size_t>(sh.n_heads * hd));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : qh) x = nd(rng);
  float *q = nullptr, *out = nullptr;
  int32_t* pos = nullptr;
  const int32_t p = static_cast<int32_t>(ctx - 1);
  good = good && ok(cudaMalloc(reinterpret_cast<void**>(&q), qh.size() * 4), "cudaMalloc q") &&
         ok(cudaMalloc(reinterpret_cast<void**>(&out), qh.size() * 4), "cudaMalloc out") &&
         ok(cudaMalloc(reinterpret_cast<void**>(&pos), 4), "cudaMalloc pos") &&
         ok(cudaMemcpy(q, qh.data(), qh.size() * 4, cudaMemcpyHostToDevice), "upload q") &&
         ok(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice), "upload pos");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  loom::Status st;
  double us = 0.0;
  if (good) {
    us = time_calls(
        [&](int i) {
          const auto r = loom::cuda::attention(layers[static_cast<size_t>(i % n_layers)], q, 1, pos,
                                               ctx - 1, sh.n_heads, scale, out, scratch, s);
          if (!r.ok() && st.ok()) st = r;
        },
        calls, s);
    good = ok(cudaStreamSynchronize(s), "attention");
  }
  if (good && st.ok())
    std::printf("%-10s %-5s ctx %6lld  %9.2f µs  %7.1f GB/s  (%d layer copies)\n", sh.name,
                dt == DType::kF16 ? "f16" : "q8_0", static_cast<long long>(ctx), us,
                static_cast<double>(layer_bytes) / us / 1e3, n_layers);
  else if (!st.ok())
    std::fprintf(stderr, "%s ctx %lld: %s\n", sh.name, static_cast<long long>(ctx),
                 st.message().c_str());
  for (auto& L : layers) {
    cudaFree(L.k);
    cudaFree(L.v);
  }
  cudaFree(q);
  cudaFree(out);
  cudaFree(pos);
  return good && st.ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape, dtype;
  std::vector<int64_t> ctxs = {512, 4096, 8192, 32768};
  int calls = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--shape" && has) {
      shape = argv[++i];
    } else if (a == "--dtype" && has) {
      dtype = argv[++i];
    } else if (a == "--calls" && has) {
      calls = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--ctx" && has) {
      ctxs.clear();
      for (const char* c = argv[++i]; *c;) {
        char* end = nullptr;
        const long long v = std::strtoll(c, &end, 10);
        if (end == c || v < 1) {
          std::fprintf(stderr, "--ctx: a list of positive numbers, e.g. 4096,32768\n");
          return 2;
        }
        ctxs.push_back(v);
        c = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr,
                   "usage: loom_cuda_attn_bench [--shape tinyllama|llama3-8b] [--ctx N[,N...]] "
                   "[--dtype f16|q8_0] [--calls N]\n");
      return 2;
    }
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "loom_cuda_attn_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s = nullptr;
  if (!ok(cudaStreamCreate(&s), "cudaStreamCreate")) return 1;
  copy_rate(s);
  auto scratch = loom::cuda::AttentionScratch::create();
  bool all = true;
  for (const Shape& sh : kShapes) {
    if (!shape.empty() && shape != sh.name) continue;
    for (const DType dt : {DType::kF16, DType::kQ8_0}) {
      if (!dtype.empty() && dtype != (dt == DType::kF16 ? "f16" : "q8_0")) continue;
      for (const int64_t ctx : ctxs) all = run_case(sh, dt, ctx, calls, s, *scratch) && all;
    }
  }
  cudaStreamDestroy(s);
  return all ? 0 : 1;
}
