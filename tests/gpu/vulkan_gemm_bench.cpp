// loom_vulkan_gemm_bench: GPU time of the Vulkan prefill matmul (Y = X W^T,
// T tokens) per weight dtype, matrix shape and cooperative-matrix tile, from
// the backend's timestamp queries. A program that prints figures, not a test
// (the kernels' results are checked by VulkanMatmul.CoopmatMatchesReference
// and GpuOps.LargeMatmuls). At the end, each matmul pipeline's compiler
// statistics where the driver reports them.
//
//   loom_vulkan_gemm_bench [--dtypes q4_0,q4_k,f16] [--shapes 4096x4096,...]
//       [--tokens 512,2048] [--tiles default,matmul_cm_64,...|all] [--reps 10]
//
// A shape is rows x n_in (output x input features); the default shapes are
// an 8B llama's q/o (4096 x 4096), gate/up (14336 x 4096) and down (4096 x
// 14336). "default" is the backend's own choice; "tiled" the kernel without
// cooperative matrices. Each line: the tile, microseconds per matmul (mean
// over the reps after one warm-up, from timestamps), TFLOP/s (2 rows n_in
// T) and the wall time per matmul of the reps in one submission. Before each
// shape's figures the default kernel runs for 0.3 s (GPU clocks up).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cpu/ref/quants.h"
#include "engine/backends/vulkan/vulkan_backend.h"
#include "engine/core/dtype.h"

using namespace loom;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Random values in [-1, 1) quantized to `t`, rows split over the host's threads.
std::vector<uint8_t> random_weight(DType t, int64_t n_in, int64_t rows, size_t rb) {
  std::vector<uint8_t> bytes(rb * static_cast<size_t>(rows));
  const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < nt; ++i) {
    pool.emplace_back([&, i] {
      std::mt19937 rng(17 + i);
      std::uniform_real_distribution<float> d(-1, 1);
      std::vector<float> f(static_cast<size_t>(n_in));
      for (int64_t r = i; r < rows; r += nt) {
        for (float& v : f) v = d(rng);
        (void)ref::quantize_row(t, f.data(), bytes.data() + rb * static_cast<size_t>(r), n_in);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtypes = "q4_0,q4_k,f16", shapes = "4096x4096,14336x4096,4096x14336",
              tokens = "512,2048", tiles = "default";
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dtypes") {
      dtypes = v;
    } else if (a == "--shapes") {
      shapes = v;
    } else if (a == "--tokens") {
      tokens = v;
    } else if (a == "--tiles") {
      tiles = v;
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(v));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<std::string> tile_list = split(tiles, ',');
  if (tiles == "all") {
    tile_list = {"default"};
    for (const std::string& t : VulkanBackend::matmul_cm_tiles()) tile_list.push_back(t);
  }

  VulkanOptions o;
  o.profile = true;
  o.pipeline_statistics = true;
  auto created = VulkanBackend::create(o);
  if (!created.ok()) {
    std::fprintf(stderr, "no Vulkan device: %s\n", created.message().c_str());
    return 1;
  }
  auto be = std::move(created).value();
  std::printf("device: %s, cooperative matrices %s, %u bytes of shared memory\n",
              be->device_info().name.c_str(), be->caps().coopmat ? "on" : "off",
              be->caps().max_shared_bytes);

  for (const std::string& dn : split(dtypes, ',')) {
    const std::optional<DType> dt = dtype_from_name(dn);
    if (!dt) {
      std::fprintf(stderr, "unknown dtype %s\n", dn.c_str());
      return 2;
    }
    for (const std::string& sh : split(shapes, ',')) {
      const size_t xpos = sh.find('x');
      const int64_t rows = std::stoll(sh.substr(0, xpos)), n_in = std::stoll(sh.substr(xpos + 1));
      const size_t rb = static_cast<size_t>(*dtype_row_bytes(*dt, static_cast<uint64_t>(n_in)));
      const std::vector<uint8_t> bytes = random_weight(*dt, n_in, rows, rb);
      Weight w{bytes.data(), *dt, n_in, rows, rb, nullptr};
      if (Status st = be->upload_weight(w); !st.ok()) {
        std::fprintf(stderr, "upload: %s\n", st.message().c_str());
        return 1;
      }
      for (const std::string& tn : split(tokens, ',')) {
        const int64_t T = std::stoll(tn);
        auto bx = be->alloc_act(T * n_in), by = be->alloc_act(T * rows);
        if (!bx.ok() || !by.ok()) {
          std::fprintf(stderr, "out of device memory for %lld tokens\n", static_cast<long long>(T));
          return 1;
        }
        std::vector<float> x(static_cast<size_t>(T * n_in));
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> d(-1, 1);
        for (float& v : x) v = d(rng);
        const Act ax = (*bx)->view(T, n_in), ay = (*by)->view(T, rows);
        if (!be->upload(x.data(), ax).ok()) return 1;
        // Clocks up before the first figure: about 0.3 s of the default kernel.
        for (const auto t0 = std::chrono::steady_clock::now();
             std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300);) {
          for (int r = 0; r < 8; ++r) be->matmul(w, ax, ay, nullptr);
          if (!be->synchronize().ok()) return 1;
        }
        for (const std::string& tile : tile_list) {
          be->set_matmul_coopmat(tile != "tiled");
          if (tile != "default" && tile != "tiled") be->set_matmul_cm_tile(tile);
          be->matmul(w, ax, ay, nullptr);  // warm-up: the pipeline is created here
          if (!be->synchronize().ok()) return 1;
          be->reset_gpu_times();
          const auto t0 = std::chrono::steady_clock::now();
          for (int r = 0; r < reps; ++r) be->matmul(w, ax, ay, nullptr);
          if (!be->synchronize().ok()) return 1;
          const double wall_us =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count() /
              reps;
          double ms = 0;
          uint64_t calls = 0;
          std::string shader;
          for (const GpuOpTime& g : be->gpu_times()) {
            if (g.name.rfind("matmul", 0) != 0) continue;
            ms += g.ms;
            calls += g.calls;
            shader = g.name;
          }
          const double us = calls ? 1e3 * ms / static_cast<double>(calls) : 0;
          const double tflops = us > 0 ? 2.0 * rows * n_in * T / (us * 1e6) : 0;
          std::printf(
              "gemm %-5s %6lldx%-6lld T=%-5lld %-22s %-28s %9.1f us %7.1f TFLOP/s (wall %9.1f "
              "us)\n",
              dn.c_str(), static_cast<long long>(rows), static_cast<long long>(n_in),
              static_cast<long long>(T), tile.c_str(), shader.c_str(), us, tflops, wall_us);
        }
        be->set_matmul_coopmat(true);
      }
      be->release_weights();
    }
  }
  // What the driver's compiler made of each matmul (registers, shared
  // memory, ...: occupancy), where it tells (VK_KHR_pipeline_executable_properties).
  for (const auto& [key, stats] : be->pipeline_statistics()) {
    if (key.find("matmul") != std::string::npos)
      std::printf("pipeline %s: %s\n", key.c_str(),
                  stats.empty() ? "(no statistics)" : stats.c_str());
  }
  return 0;
}
