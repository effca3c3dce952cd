// A Placement: for every layer and op group, the compute unit that runs it and
// the weight precision it runs in; plus the embedding and the output matrix.
// Made by a strategy (strategy.h), run by the ForwardPass, shown by `loom plan`
// and the app's placement grid, saved and loaded as JSON.
//
// Op groups of a layer:
//   attn_w  the q/k/v/o projections (weights, and their biases)
//   attn    attention compute with the layer's KV cache (KV store, attention)
//   ffn     the FFN projections gate/up/down and the SiLU·mul between them
//   norm    the RMS norms, RoPE and the residual adds
// Activations move between units where consecutive ops sit on different ones
// (the ForwardPass inserts the transfers); each layer's KV lives on the unit
// of its attn group.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/model/model.h"

namespace loom {

/// A compute unit: the CPU, or the GPU backend the engine has (Vulkan).
enum class Unit : uint8_t { kCpu = 0, kGpu = 1 };
constexpr int kNumUnits = 2;
const char* unit_name(Unit u);
std::optional<Unit> unit_from_name(std::string_view s);

enum class OpGroup : uint8_t { kAttnW = 0, kAttn, kFfn, kNorm };
constexpr int kNumOpGroups = 4;
const char* op_group_name(OpGroup g);  ///< "attn_w", "attn", "ffn", "norm"
std::optional<OpGroup> op_group_from_name(std::string_view s);

/// Where one op group runs and in which weight precision.
struct GroupPlace {
  Unit unit = Unit::kCpu;
  std::optional<DType> dtype;  ///< requantize the weights to this at load; empty: the file's type
  bool operator==(const GroupPlace&) const = default;
};

struct LayerPlace {
  std::array<GroupPlace, kNumOpGroups> g{};
  GroupPlace& operator[](OpGroup x) { return g[static_cast<size_t>(x)]; }
  const GroupPlace& operator[](OpGroup x) const { return g[static_cast<size_t>(x)]; }
  bool operator==(const LayerPlace&) const = default;
};

struct Placement {
  std::string strategy;  ///< how it was made ("gpu", "layers:16", "auto", "custom"...)
  GroupPlace embed;      ///< token embedding lookup
  GroupPlace output;     ///< output norm and matrix (logits)
  std::vector<LayerPlace> layers;

  /// Everything on `u`, file precision.
  static Placement uniform(int64_t n_layer, Unit u);
  bool uses(Unit u) const;
  /// Same units and precisions (the strategy name is not compared).
  bool same_as(const Placement& o) const {
    return embed == o.embed && output == o.output && layers == o.layers;
  }

  /// JSON text: {"strategy", "embed": {"unit", "dtype"}, "output": ..., "layers": [{"attn_w": ...,
  /// ...}]}.
  std::string to_json() const;
  /// Parses to_json()'s format; errors name the bad field. `n_layer` must match.
  static Result<Placement> from_json(std::string_view text, int64_t n_layer);
  static Result<Placement> load(const std::string& path, int64_t n_layer);
  Status save(const std::string& path) const;
};

/// Checks a placement against a model: layer count, and that each requested
/// precision can hold the group's weights (row length a multiple of its block,
/// a quantizer exists). The error names the layer, group and tensor.
Status validate_placement(const Model& m, const Placement& p);

/// Moves to the CPU what the GPU backends cannot run for `m` yet
/// (Model::host_attention_reason(): gemma2's soft-capped, windowed attention,
/// and its scaled embedding lookup). True when anything moved.
bool keep_host_ops_on_cpu(const Model& m, Placement* p);

/// Bytes a placement puts on each unit.
struct PlacementBytes {
  std::array<uint64_t, kNumUnits> weights{};  ///< after requantization
  std::array<uint64_t, kNumUnits> kv{};       ///< KV cache at full context
  /// Per layer and group: weight bytes (KV bytes for attn).
  std::vector<std::array<uint64_t, kNumOpGroups>> layer;
  uint64_t embed = 0, output = 0;
  uint64_t on(Unit u) const { return weights[static_cast<size_t>(u)] + kv[static_cast<size_t>(u)]; }
};
/// `kv_bytes_per_layer`: K and V of one layer at full context.
PlacementBytes placement_bytes(const Model& m, const Placement& p, uint64_t kv_bytes_per_layer);

/// The model's weights of one group of layer `l` (null entries skipped by callers).
std::vector<const Weight*> group_weights(const Model& m, int64_t l, OpGroup g);
/// The same for one layer's weights (a model's, or the executor's requantized copies).
std::vector<const Weight*> group_weights(const LayerWeights& w, OpGroup g);
/// The precision `p` asks for the tensor named `gguf_name`: `blk.N.attn_*`
/// takes layer N's attn_w group's, `blk.N.ffn_*` its ffn group's,
/// `token_embd.weight` the embedding's, `output.weight` the output's; nullopt
/// for other tensors, layers outside `p`, or groups without a precision
/// (`loom convert --plan`).
std::optional<DType> placement_dtype_for_tensor(const Placement& p, std::string_view gguf_name);
/// Bytes of weight `w` stored as `dtype` (its own when empty).
uint64_t weight_bytes_as(const Weight& w, std::optional<DType> dtype);

}  // namespace loom
