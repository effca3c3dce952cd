// What `loom run` and `loom bench` share: model, CPU backend and session set-up.
#pragma once

#include <memory>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/placement/adaptive.h"
#include "engine/placement/cost_model.h"
#include "engine/placement/strategy.h"
#include "engine/runtime/session.h"
#include "tools/loom/commands.h"

namespace loom::cli {

struct Engine {
  std::unique_ptr<Model> model;
  std::unique_ptr<CpuBackend> cpu;  ///< always there: runs what the GPU cannot
  std::unique_ptr<Backend> gpu;     ///< the Vulkan backend when asked for and available
  Backend* backend = nullptr;       ///< the one the session runs on
  /// Strategy auto with a GPU (unless --no-adapt): attached to the session,
  /// its changes logged to stderr as they happen.
  std::unique_ptr<AdaptiveController> adaptive;
  std::unique_ptr<Session> session;  ///< declared last: destroyed before the backends
  StrategyOptions strategy;          ///< what the placement was made from
  KvTierConfig kv_tiers;             ///< the KV cache's RAM budget and spill folder
  Placement planned;                 ///< the placement in force (after prepare's moves)
  CostModel cost =
      CostModel::defaults();  ///< measured when the strategy is auto (or for plan/bench)
  std::string backend_name() const { return backend->name(); }
};

/// Loads everything, printing the error (prefixed by `who`) and returning null on failure.
/// `calibrate`: measure the cost model even when the strategy does not need it.
/// `session`: false for commands that only plan (no KV cache, no weight uploads).
std::unique_ptr<Engine> open_engine(const EngineOptions& o, const char* who, bool calibrate = false,
                                    bool session = true);

/// Peak resident memory of this process in bytes (VmHWM), or 0.
uint64_t peak_rss_bytes();

}  // namespace loom::cli
