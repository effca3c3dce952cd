#include "tools/loom/engine_setup.h"

#include "engine/backends/vulkan/vulkan.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace loom::cli {

std::unique_ptr<Engine> open_engine(const EngineOptions& o, const char* who) {
  auto e = std::make_unique<Engine>();
  auto m = load_model(o.model);
  if (!m.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, m.message().c_str());
    return nullptr;
  }
  e->model = std::move(m).value();
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  e->cpu = std::make_unique<CpuBackend>(threads);
  e->backend = e->cpu.get();
  if (o.backend == "vulkan") {
    VulkanOptions vo;
    vo.device = o.device;
    auto vb = create_vulkan_backend(vo);
    if (vb.ok()) {
      e->gpu = std::move(vb).value();
      e->backend = e->gpu.get();
    } else {
      std::fprintf(stderr, "%s: Vulkan unavailable: %s; using the CPU\n", who, vb.message().c_str());
    }
  } else if (o.backend != "cpu") {
    std::fprintf(stderr, "%s: unknown backend '%s' (cpu, vulkan)\n", who, o.backend.c_str());
    return nullptr;
  }
  SessionConfig sc;
  sc.n_ctx = o.ctx;
  sc.max_chunk = o.batch;
  auto kv = dtype_from_name(o.kv_type);
  if (!kv) {
    std::fprintf(stderr, "%s: unknown KV cache type '%s' (f16, q8_0)\n", who, o.kv_type.c_str());
    return nullptr;
  }
  sc.kv_dtype = *kv;
  auto s = Session::create(*e->model, *e->backend, sc);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, s.message().c_str());
    return nullptr;
  }
  e->session = std::move(s).value();
  if (e->gpu) {
    // Weights the GPU cannot take (dtype without a shader, out of memory) run
    // on the CPU, with explicit transfers; say which.
    e->session->forward().set_fallback(e->cpu.get());
    Status st = e->session->forward().prepare();
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", who, st.message().c_str());
      return nullptr;
    }
    for (const auto& n : e->session->forward().notes()) std::fprintf(stderr, "%s: note: %s\n", who, n.c_str());
  }
  return e;
}

uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024ull;
  }
  return 0;
}

}  // namespace loom::cli
