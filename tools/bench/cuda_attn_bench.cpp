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
// second. For scale, the first lines give a device-to-device copy's rate
// (bytes read + written per second) and PCIe's, to and from pinned host memory.
//
// With --host-keys H[,H...] (F16), each case runs again as a layer of the
// device KV tier: ctx keys in slots of 16 rows on the device (alone, then)
// with H more in host blocks of mapped pinned memory, which the kernel reads
// over PCIe (cuda_kv_tier.cpp's attention_mapped without its staging); the
// query sees all ctx + H keys.
//
// Usage: loom_cuda_attn_bench [--shape NAME] [--ctx N[,N...]] [--dtype f16|q8_0]
//                             [--calls N] [--host-keys H[,H...]]
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
  // PCIe, both ways, from and to pinned host memory (the bus the device KV
  // tier's host blocks cross; issue 16 asks for its bound).
  void* h = nullptr;
  if (ok(cudaHostAlloc(&h, bytes, cudaHostAllocDefault), "cudaHostAlloc")) {
    std::memset(h, 1, bytes);
    const double up =
        time_calls([&](int) { cudaMemcpyAsync(x, h, bytes, cudaMemcpyHostToDevice, s); }, 4, s);
    const double down =
        time_calls([&](int) { cudaMemcpyAsync(h, y, bytes, cudaMemcpyDeviceToHost, s); }, 4, s);
    std::printf(
        "pinned host to device, 512 MiB: %.1f µs, %.1f GB/s; device to host: %.1f µs, %.1f GB/s\n",
        up, static_cast<double>(bytes) / up / 1e3, down, static_cast<double>(bytes) / down / 1e3);
    cudaFreeHost(h);
  }
  cudaFree(x);
  cudaFree(y);
}

// host_keys < 0: a whole layer (cuda::attention); else a slotted one with
// host_keys more in host blocks (0: none, every key in the slots).
bool run_case(const Shape& sh, DType dt, int64_t ctx, int64_t host_keys, int calls, cudaStream_t s,
              loom::cuda::AttentionScratch& scratch) {
  constexpr int64_t kBs = 16;  // rows per slot and per host block
  const bool slotted = host_keys >= 0;
  if (host_keys < 0) host_keys = 0;
  if (slotted && (dt != DType::kF16 || ctx % kBs != 0 || host_keys % kBs != 0)) {
    std::fprintf(stderr, "--host-keys: F16, ctx and host keys multiples of %lld\n",
                 static_cast<long long>(kBs));
    return false;
  }
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
  const int32_t p = static_cast<int32_t>(ctx + host_keys - 1);
  // The tier's layout: slot i holds positions 16 i.., host block i positions
  // ctx + 16 i..; per layer copy its own host blocks (K then V, each
  // [kv_head][16][row]) and their device addresses.
  const int64_t n_slots = ctx / kBs, n_hb = host_keys / kBs;
  const uint64_t half = static_cast<uint64_t>(sh.n_kv_heads * kBs) * row_bytes;
  std::vector<uint8_t*> host_slabs;
  std::vector<const uint8_t**> host_tables;
  int32_t* slot_pos = nullptr;
  if (slotted && good) {
    std::vector<int32_t> sp(static_cast<size_t>(n_slots + n_hb));
    for (size_t i = 0; i < sp.size(); ++i) sp[i] = static_cast<int32_t>(i * kBs);
    good = ok(cudaMalloc(reinterpret_cast<void**>(&slot_pos), sp.size() * 4), "cudaMalloc map") &&
           ok(cudaMemcpy(slot_pos, sp.data(), sp.size() * 4, cudaMemcpyHostToDevice), "map");
    const std::vector<uint8_t> hk = random_rows(dt, sh.n_kv_heads * host_keys, hd, row_bytes, rng);
    for (int c = 0; c < n_layers && good && n_hb > 0; ++c) {
      void* h = nullptr;
      void* d = nullptr;
      good = ok(cudaHostAlloc(&h, 2 * half * static_cast<uint64_t>(n_hb), cudaHostAllocMapped),
                "cudaHostAlloc") &&
             ok(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");
      if (!good) break;
      host_slabs.push_back(static_cast<uint8_t*>(h));
      std::vector<const uint8_t*> at(static_cast<size_t>(n_hb));
      for (int64_t b = 0; b < n_hb; ++b) {
        uint8_t* blk = static_cast<uint8_t*>(h) + 2 * half * static_cast<uint64_t>(b);
        for (int which = 0; which < 2; ++which)  // K, then V: rows of this block's tokens
          for (int64_t kvh = 0; kvh < sh.n_kv_heads; ++kvh)
            std::memcpy(blk + which * half + static_cast<uint64_t>(kvh * kBs) * row_bytes,
                        hk.data() + static_cast<uint64_t>(kvh * host_keys + b * kBs) * row_bytes,
                        static_cast<uint64_t>(kBs) * row_bytes);
        at[static_cast<size_t>(b)] = static_cast<const uint8_t*>(d) + 2 * half * b;
      }
      const uint8_t** t = nullptr;
      good =
          ok(cudaMalloc(reinterpret_cast<void**>(&t), at.size() * sizeof(at[0])), "table") &&
          ok(cudaMemcpy(t, at.data(), at.size() * sizeof(at[0]), cudaMemcpyHostToDevice), "table");
      host_tables.push_back(t);
    }
  }
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
          const auto c = static_cast<size_t>(i % n_layers);
          loom::Status r;
          if (!slotted) {
            r = loom::cuda::attention(layers[c], q, 1, pos, ctx - 1, sh.n_heads, scale, out,
                                      scratch, s);
          } else {
            loom::cuda::SlotMap m{slot_pos, kBs, n_slots};
            m.host = n_hb > 0 ? host_tables[c] : nullptr;
            m.n_host = n_hb;
            m.host_head_bytes = static_cast<uint64_t>(kBs) * row_bytes;
            m.host_v_offset = half;
            r = loom::cuda::attention_slots(layers[c], q, 1, pos, sh.n_heads, scale, m, 0, out,
                                            scratch, s);
          }
          if (!r.ok() && st.ok()) st = r;
        },
        calls, s);
    good = ok(cudaStreamSynchronize(s), "attention");
  }
  if (good && st.ok() && slotted)
    std::printf(
        "%-10s %-5s ctx %6lld slotted + %5lld host keys (%.2f MiB over PCIe)  %9.2f µs  (%d layer "
        "copies)\n",
        sh.name, "f16", static_cast<long long>(ctx), static_cast<long long>(host_keys),
        static_cast<double>(2 * half * static_cast<uint64_t>(n_hb)) / 1048576.0, us, n_layers);
  else if (good && st.ok())
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
  for (uint8_t* h : host_slabs) cudaFreeHost(h);
  for (const uint8_t** t : host_tables) cudaFree(t);
  cudaFree(slot_pos);
  cudaFree(q);
  cudaFree(out);
  cudaFree(pos);
  return good && st.ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape, dtype;
  std::vector<int64_t> ctxs = {512, 4096, 8192, 32768}, host_keys;
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
    } else if ((a == "--ctx" || a == "--host-keys") && has) {
      std::vector<int64_t>& list = a == "--ctx" ? ctxs : host_keys;
      list.clear();
      for (const char* c = argv[++i]; *c;) {
        char* end = nullptr;
        const long long v = std::strtoll(c, &end, 10);
        if (end == c || v < 1) {
          std::fprintf(stderr, "%s: a list of positive numbers, e.g. 4096,32768\n", a.c_str());
          return 2;
        }
        list.push_back(v);
        c = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr,
                   "usage: loom_cuda_attn_bench [--shape tinyllama|llama3-8b] [--ctx N[,N...]] "
                   "[--dtype f16|q8_0] [--calls N] [--host-keys H[,H...]]\n");
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
      for (const int64_t ctx : ctxs) {
        all = run_case(sh, dt, ctx, -1, calls, s, *scratch) && all;
        if (dt != DType::kF16 || host_keys.empty()) continue;
        all = run_case(sh, dt, ctx, 0, calls, s, *scratch) && all;
        for (const int64_t h : host_keys) all = run_case(sh, dt, ctx, h, calls, s, *scratch) && all;
      }
    }
  }
  cudaStreamDestroy(s);
  return all ? 0 : 1;
}
