#include "tools/loom/engine_setup.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "engine/backends/cuda/cuda.h"
#include "engine/backends/vulkan/vulkan.h"

namespace loom::cli {

namespace {
bool parse_dtype_opt(const std::string& s, std::optional<DType>* out, const char* what,
                     const char* who) {
  if (s.empty() || s == "keep") return true;
  auto d = dtype_from_name(s);
  if (!d) {
    std::fprintf(stderr, "%s: unknown %s '%s'\n", who, what, s.c_str());
    return false;
  }
  *out = *d;
  return true;
}
// --kv-gpu / --kv-ram / --kv-dir / --kv-policy; without --kv-ram, a budget
// only where the whole context's KV would not fit in half the available memory.
bool kv_tiers_from_options(const EngineOptions& o, const Model& m, const char* who,
                           KvTierConfig* t) {
  t->spill_dir = o.kv_dir.empty() ? default_kv_spill_dir() : o.kv_dir;
  t->policy = o.kv_policy;
  t->spill_type = o.kv_spill_type;
  // Spill writes finish while the next token computes; LOOM_KV_WRITE_BEHIND=0
  // waits for them inside the step (for comparisons).
  const char* wb = std::getenv("LOOM_KV_WRITE_BEHIND");
  t->write_behind = !(wb && std::strcmp(wb, "0") == 0);
  if (!o.kv_gpu.empty()) {
    auto b = parse_size(o.kv_gpu);
    if (!b || *b == 0) {
      std::fprintf(stderr, "%s: --kv-gpu '%s' is not a size (e.g. 1G, 512M)\n", who,
                   o.kv_gpu.c_str());
      return false;
    }
    t->device_budget = *b;
  }
  if (!o.kv_ram.empty()) {
    auto b = parse_size(o.kv_ram);
    if (!b) {
      std::fprintf(stderr, "%s: --kv-ram '%s' is not a size (e.g. 2G, 512M)\n", who,
                   o.kv_ram.c_str());
      return false;
    }
    t->ram_budget = *b;
    return true;
  }
  const int64_t n_ctx = o.ctx > 0 ? o.ctx : std::min<int64_t>(m.hp.n_ctx_train, 4096);
  const uint64_t need =
      kv_bytes_per_layer(m, n_ctx, o.kv_type == "q8_0" ? DType::kQ8_0 : DType::kF16) *
      static_cast<uint64_t>(m.hp.n_layer);
  t->ram_budget = default_kv_ram_budget(need);
  if (t->ram_budget > 0) {
    std::fprintf(stderr,
                 "%s: note: the KV cache of %lld tokens takes %.0f MiB, more than half the free "
                 "memory: blocks beyond %.0f MiB spill to %s (--kv-ram sets this)\n",
                 who, static_cast<long long>(n_ctx), static_cast<double>(need) / 1048576.0,
                 static_cast<double>(t->ram_budget) / 1048576.0, t->spill_dir.c_str());
  }
  return true;
}
}  // namespace

std::unique_ptr<Engine> open_engine(const EngineOptions& o, const char* who, bool calibrate_always,
                                    bool session) {
  auto e = std::make_unique<Engine>();
  LoadOptions lo;
  lo.tokenizer = o.tokenizer;
  auto m = load_model(o.model, lo);
  if (!m.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, m.message().c_str());
    return nullptr;
  }
  e->model = std::move(m).value();
  const Model& model = *e->model;
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  e->cpu = std::make_unique<CpuBackend>(threads);
  e->backend = e->cpu.get();

  StrategyOptions& so = e->strategy;
  if (o.backend != "cpu" && o.backend != "vulkan" && o.backend != "cuda") {
    std::fprintf(stderr, "%s: unknown backend '%s' (cpu, vulkan, cuda)\n", who, o.backend.c_str());
    return nullptr;
  }
  const bool gpu_backend = o.backend == "vulkan" || o.backend == "cuda";
  so.strategy = !o.strategy.empty()
                    ? o.strategy
                    : (!o.placement.empty() ? "custom" : (gpu_backend ? "gpu" : "cpu"));
  so.placement_file = o.placement;
  if (!o.vram_budget.empty()) {
    auto b = parse_size(o.vram_budget);
    if (!b) {
      std::fprintf(stderr, "%s: --vram-budget '%s' is not a size (e.g. 8G, 512M)\n", who,
                   o.vram_budget.c_str());
      return nullptr;
    }
    so.vram_budget = *b;
  }
  if (!kv_tiers_from_options(o, model, who, &e->kv_tiers)) return nullptr;
  if (!parse_dtype_opt(o.cpu_dtype, &so.cpu_dtype, "--cpu-dtype", who) ||
      !parse_dtype_opt(o.gpu_dtype, &so.gpu_dtype, "--gpu-dtype", who)) {
    return nullptr;
  }
  auto kv = dtype_from_name(o.kv_type);
  if (!kv || (*kv != DType::kF16 && *kv != DType::kQ8_0)) {
    std::fprintf(stderr, "%s: unknown KV cache type '%s' (f16, q8_0)\n", who, o.kv_type.c_str());
    return nullptr;
  }
  so.kv_dtype = *kv;
  so.n_ctx = o.ctx > 0 ? o.ctx : std::min<int64_t>(model.hp.n_ctx_train, 4096);

  // The GPU, when the strategy or the backend asks for it: CUDA with
  // --backend cuda, else Vulkan. The gpu and hybrid strategies place op
  // groups on whichever one this is.
  if (so.strategy != "cpu" || gpu_backend) {
    Result<std::unique_ptr<Backend>> gb = make_error(ErrorCode::kInternal, "no GPU backend");
    const char* label = "Vulkan";
    if (o.backend == "cuda") {
      label = "CUDA";
      CudaOptions co;
      co.device = o.device;
      co.profile = o.gpu_profile;
      co.memory_limit = so.vram_budget;
      gb = create_cuda_backend(co);
    } else {
      VulkanOptions vo;
      vo.device = o.device;
      vo.profile = o.gpu_profile;
      vo.keep_busy_groups = o.gpu_keep_groups;
      vo.memory_limit = so.vram_budget;
      auto vb = create_vulkan_backend(vo);
      if (vb.ok())
        gb = std::unique_ptr<Backend>(std::move(vb).value());
      else
        gb = vb.error();
    }
    if (gb.ok()) {
      e->gpu = std::move(gb).value();
      e->backend = e->gpu.get();
    } else {
      std::fprintf(stderr, "%s: %s unavailable: %s; using the CPU\n", who, label,
                   gb.message().c_str());
      so.strategy = "cpu";
      so.placement_file.clear();
    }
  }
  so.has_gpu = e->gpu != nullptr;
  // The prefill chunk: --batch, else as long as the GPU's memory allows where
  // one runs part of the model (its GEMMs and flash attention gain most on
  // long chunks), else the CPU's.
  if (o.batch > 0)
    so.max_chunk = o.batch;
  else if (e->gpu && so.strategy != "cpu")
    so.max_chunk = default_prefill_chunk(model, e->gpu->memory_capacity());
  else
    so.max_chunk = o.cpu_batch;

  if (calibrate_always || so.strategy == "auto") {
    auto c = calibrate(model, *e->cpu, e->gpu.get());
    if (c.ok())
      e->cost = *c;
    else
      std::fprintf(stderr, "%s: note: could not measure the cost model (%s); using defaults\n", who,
                   c.message().c_str());
  }
  auto p = make_placement(model, so, e->cost);
  if (!p.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, p.message().c_str());
    return nullptr;
  }
  if (const std::string why = model.host_attention_reason(); !why.empty() && p->uses(Unit::kGpu))
    std::fprintf(stderr, "%s: note: attention runs on the CPU: %s\n", who, why.c_str());
  if (!session) {
    e->planned = std::move(p).value();
    return e;
  }

  // Without --kv-gpu: the GPU layers' KV stays whole on the device while it
  // fits beside the weights, else what is left holds the device tier.
  if (o.kv_gpu.empty() && e->gpu) {
    e->kv_tiers.device_budget = default_kv_device_budget(model, *p, so, e->gpu->memory_capacity());
    if (e->kv_tiers.device_budget > 0) {
      std::fprintf(stderr,
                   "%s: note: the KV cache of the GPU layers at %lld tokens does not fit beside "
                   "the weights in %.0f MiB of GPU memory: %.1f MiB of it stays on the GPU, the "
                   "rest in RAM (--kv-gpu sets this)\n",
                   who, static_cast<long long>(so.n_ctx),
                   static_cast<double>(e->gpu->memory_capacity()) / 1048576.0,
                   static_cast<double>(e->kv_tiers.device_budget) / 1048576.0);
    }
  }
  SessionConfig sc;
  sc.kv_tiers = e->kv_tiers;
  sc.n_ctx = so.n_ctx;
  sc.max_chunk = so.max_chunk;
  sc.kv_dtype = so.kv_dtype;
  auto s = Session::create(model, *e->backend, sc);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, s.message().c_str());
    return nullptr;
  }
  e->session = std::move(s).value();
  ForwardPass& fwd = e->session->forward();
  fwd.set_fallback(e->cpu.get());
  // The CPU's weights from resident copies on huge pages; LOOM_RESIDENT_WEIGHTS=0
  // runs them from the file's mapping (for comparisons).
  const char* rw = std::getenv("LOOM_RESIDENT_WEIGHTS");
  fwd.set_resident_weights(!(rw && std::strcmp(rw, "0") == 0));
  Status st = fwd.set_placement(*p);
  if (st.ok()) st = fwd.prepare();
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, st.message().c_str());
    return nullptr;
  }
  for (const auto& n : fwd.notes()) std::fprintf(stderr, "%s: note: %s\n", who, n.c_str());
  e->planned = fwd.placement();
  if (so.strategy == "auto" && e->gpu && !o.no_adapt) {
    AdaptiveOptions ao;
    ao.window_tokens = o.adapt_window;
    e->adaptive = std::make_unique<AdaptiveController>(model, so, e->cost, ao);
    e->adaptive->set_listener([who](const AdaptiveEvent& ev) {
      if (ev.kind != AdaptiveEvent::Kind::kMeasured)
        std::fprintf(stderr, "%s: auto: %s\n", who, adaptive_event_text(ev).c_str());
    });
    e->adaptive->start(e->planned);
    e->session->set_adaptive(e->adaptive.get());
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
