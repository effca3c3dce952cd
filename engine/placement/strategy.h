// Placement strategies: how a Placement is made for a model.
//   gpu        everything on the GPU
//   cpu        everything on the CPU
//   layers:N   the first N layers on the GPU, the rest on the CPU (llama.cpp's -ngl)
//   attn-gpu   attention and KV of every layer on the GPU; FFN weights there
//              while the budget lasts, the rest on the CPU
//   auto       the placement with the lowest predicted step time (CostModel)
//              under the budget, by dynamic programming over layers; in a
//              session, the adaptive controller (adaptive.h) then measures and
//              moves it while generating
//   custom     a JSON file (Placement::load)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/placement/cost_model.h"
#include "engine/placement/placement.h"

namespace loom {

struct StrategyOptions {
  std::string strategy = "gpu";
  std::string placement_file;  ///< for custom
  uint64_t vram_budget = 0;    ///< bytes the GPU may hold (weights, KV, activations); 0: no limit
  std::optional<DType> cpu_dtype;  ///< requantize weights of groups on the CPU to this
  std::optional<DType> gpu_dtype;  ///< requantize weights of groups on the GPU to this
  bool has_gpu = true;             ///< false: every strategy but cpu fails
  int64_t n_ctx = 4096;            ///< KV cache size (tokens) the budget must hold
  DType kv_dtype = DType::kF16;
  int64_t max_chunk = 256;  ///< activations the GPU needs, with the budget
};

/// Parses a size: "8G", "512M", "1.5GiB", "4096" (bytes).
std::optional<uint64_t> parse_size(const std::string& s);
/// Bytes of K and V of one layer at n_ctx tokens.
uint64_t kv_bytes_per_layer(const Model& m, int64_t n_ctx, DType kv_dtype);
/// GPU bytes the forward pass needs besides weights and KV (activations, the
/// prompt GEMMs' scratch, logits, margin).
uint64_t gpu_overhead_bytes(const Model& m, int64_t max_chunk);

/// Prompt tokens per forward step (the prefill chunk) on the CPU alone.
inline constexpr int64_t kCpuPrefillChunk = 256;
/// The largest prefill chunk a GPU gets by default.
inline constexpr int64_t kGpuPrefillChunk = 4096;
/// The prefill chunk where a GPU with `device_bytes` of memory for Loom runs
/// part of the model: the largest of kGpuPrefillChunk, its half, ... down to
/// 512 whose working memory (gpu_overhead_bytes) is at most 1/16 of it, else
/// kCpuPrefillChunk (also without a GPU: 0 bytes). A GPU's prompt GEMMs and
/// flash attention run far faster on long chunks: on an H100, llama3-8b
/// Q4_K_M through CUDA prefilled 8192 tokens at 9,335 tokens/s in chunks of
/// 512 and 18,080 in chunks of 4096 (64 MiB F16 slices; 21,865 with 256 MiB
/// ones: docs/PERFORMANCE.md).
int64_t default_prefill_chunk(const Model& m, uint64_t device_bytes);

/// The device KV budget (KvTierConfig::device_budget) to use when the user
/// set none, for placement `p` on a GPU with `device_bytes` of memory for
/// Loom: 0 (no limit) while the full-context KV of the layers whose attention
/// runs there fits beside the GPU's weights and working memory; else what is
/// left of `device_bytes` after them, less a 1/16 margin (0 left: 1 byte, so
/// that the session's error names the device budget as too small).
uint64_t default_kv_device_budget(const Model& m, const Placement& p, const StrategyOptions& o,
                                  uint64_t device_bytes);

/// Makes the placement `o.strategy` names. Errors: unknown strategy, a GPU
/// strategy without a GPU, a bad custom file.
Result<Placement> make_placement(const Model& m, const StrategyOptions& o, const CostModel& cost);

/// The placements the adaptive controller (adaptive.h) may try under `o`'s
/// budget, each named in Placement::strategy: auto's choice first, the DP's
/// choice without the switch margin ("auto:dp"), the whole-layer runs
/// ("first:N", "last:N", "+output" when the output matrix is on the GPU), and
/// layers:N for every N that fits, from the most layers down. Each placement
/// once (same units and precisions): a layers:N equal to an earlier one is
/// named in it ("auto = layers:12"). Empty without a GPU.
struct PlacementCandidate {
  Placement p;
  int64_t layers_n = -1;  ///< N where the placement is layers:N's, else -1
};
std::vector<PlacementCandidate> candidate_placements(const Model& m, const StrategyOptions& o,
                                                     const CostModel& cost);

}  // namespace loom
