// What `loom run` and `loom bench` share: model, CPU backend and session set-up.
#pragma once

#include <memory>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/runtime/session.h"
#include "tools/loom/commands.h"

namespace loom::cli {

struct Engine {
  std::unique_ptr<Model> model;
  std::unique_ptr<CpuBackend> cpu;   ///< always there: runs what the GPU cannot
  std::unique_ptr<Backend> gpu;      ///< the Vulkan backend when asked for and available
  Backend* backend = nullptr;        ///< the one the session runs on
  std::unique_ptr<Session> session;  ///< declared last: destroyed before the backends
  std::string backend_name() const { return backend->name(); }
};

/// Loads everything, printing the error (prefixed by `who`) and returning null on failure.
std::unique_ptr<Engine> open_engine(const EngineOptions& o, const char* who);

/// Peak resident memory of this process in bytes (VmHWM), or 0.
uint64_t peak_rss_bytes();

}  // namespace loom::cli
