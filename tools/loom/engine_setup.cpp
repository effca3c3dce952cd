#include "tools/loom/engine_setup.h"

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
  e->backend = std::make_unique<CpuBackend>(threads);
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
