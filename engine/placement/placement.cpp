#include "engine/placement/placement.h"

#include <cinttypes>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cpu/ref/quants.h"

namespace loom {

const char* unit_name(Unit u) {
  return u == Unit::kGpu ? "gpu" : "cpu";
}

std::optional<Unit> unit_from_name(std::string_view s) {
  if (s == "cpu") return Unit::kCpu;
  if (s == "gpu") return Unit::kGpu;
  return std::nullopt;
}

namespace {
constexpr std::array<const char*, kNumOpGroups> kGroupNames = {"attn_w", "attn", "ffn", "norm"};
}

const char* op_group_name(OpGroup g) {
  return kGroupNames[static_cast<size_t>(g)];
}

std::optional<OpGroup> op_group_from_name(std::string_view s) {
  for (int i = 0; i < kNumOpGroups; ++i) {
    if (s == kGroupNames[static_cast<size_t>(i)]) return static_cast<OpGroup>(i);
  }
  return std::nullopt;
}

Placement Placement::uniform(int64_t n_layer, Unit u) {
  Placement p;
  p.strategy = unit_name(u);
  p.embed.unit = p.output.unit = u;
  p.layers.resize(static_cast<size_t>(n_layer));
  for (auto& l : p.layers) {
    for (auto& g : l.g) g.unit = u;
  }
  return p;
}

bool Placement::uses(Unit u) const {
  if (embed.unit == u || output.unit == u) return true;
  for (const auto& l : layers) {
    for (const auto& g : l.g) {
      if (g.unit == u) return true;
    }
  }
  return false;
}

namespace {

nlohmann::json group_json(const GroupPlace& g) {
  nlohmann::json j;
  j["unit"] = unit_name(g.unit);
  if (g.dtype) j["dtype"] = std::string(dtype_name(*g.dtype));
  return j;
}

Result<GroupPlace> group_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("unit") || !j["unit"].is_string()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "placement: %s needs a \"unit\" (\"cpu\" or \"gpu\")", where.c_str());
  }
  GroupPlace g;
  auto u = unit_from_name(j["unit"].get<std::string>());
  if (!u) {
    return make_error(ErrorCode::kInvalidArgument, "placement: %s: unknown unit '%s' (cpu, gpu)",
                      where.c_str(), j["unit"].get<std::string>().c_str());
  }
  g.unit = *u;
  if (j.contains("dtype") && !j["dtype"].is_null()) {
    if (!j["dtype"].is_string())
      return make_error(ErrorCode::kInvalidArgument, "placement: %s: dtype must be a string",
                        where.c_str());
    const std::string name = j["dtype"].get<std::string>();
    if (name != "keep") {
      auto d = dtype_from_name(name);
      if (!d)
        return make_error(ErrorCode::kInvalidArgument, "placement: %s: unknown dtype '%s'",
                          where.c_str(), name.c_str());
      g.dtype = *d;
    }
  }
  return g;
}

}  // namespace

std::string Placement::to_json() const {
  nlohmann::json j;
  j["strategy"] = strategy;
  j["embed"] = group_json(embed);
  j["output"] = group_json(output);
  nlohmann::json ls = nlohmann::json::array();
  for (const auto& l : layers) {
    nlohmann::json lj;
    for (int i = 0; i < kNumOpGroups; ++i)
      lj[kGroupNames[static_cast<size_t>(i)]] = group_json(l.g[static_cast<size_t>(i)]);
    ls.push_back(lj);
  }
  j["layers"] = ls;
  return j.dump(1);
}

Result<Placement> Placement::from_json(std::string_view text, int64_t n_layer) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return make_error(ErrorCode::kInvalidArgument, "placement: not a JSON object");
  Placement p;
  p.strategy = j.value("strategy", std::string("custom"));
  if (!j.contains("embed") || !j.contains("output") || !j.contains("layers") ||
      !j["layers"].is_array()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "placement: needs \"embed\", \"output\" and a \"layers\" array");
  }
  LOOM_ASSIGN_OR_RETURN(p.embed, group_from_json(j["embed"], "embed"));
  LOOM_ASSIGN_OR_RETURN(p.output, group_from_json(j["output"], "output"));
  const auto& ls = j["layers"];
  if (static_cast<int64_t>(ls.size()) != n_layer) {
    return make_error(ErrorCode::kInvalidArgument,
                      "placement: %zu layers, but the model has %" PRId64, ls.size(), n_layer);
  }
  for (size_t l = 0; l < ls.size(); ++l) {
    LayerPlace lp;
    for (int i = 0; i < kNumOpGroups; ++i) {
      const char* gname = kGroupNames[static_cast<size_t>(i)];
      if (!ls[l].is_object() || !ls[l].contains(gname)) {
        return make_error(ErrorCode::kInvalidArgument, "placement: layer %zu has no \"%s\"", l,
                          gname);
      }
      LOOM_ASSIGN_OR_RETURN(
          lp.g[static_cast<size_t>(i)],
          group_from_json(ls[l][gname], "layer " + std::to_string(l) + " " + gname));
    }
    p.layers.push_back(lp);
  }
  return p;
}

Result<Placement> Placement::load(const std::string& path, int64_t n_layer) {
  std::ifstream f(path);
  if (!f) return make_error(ErrorCode::kIo, "placement: cannot open '%s'", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  auto p = from_json(ss.str(), n_layer);
  if (!p.ok()) return make_error(p.error().code(), "%s: %s", path.c_str(), p.message().c_str());
  return p;
}

Status Placement::save(const std::string& path) const {
  std::ofstream f(path);
  f << to_json() << "\n";
  f.close();
  if (!f) return make_error(ErrorCode::kIo, "placement: cannot write '%s'", path.c_str());
  return {};
}

std::vector<const Weight*> group_weights(const Model& m, int64_t l, OpGroup g) {
  return group_weights(m.layers[static_cast<size_t>(l)], g);
}

std::vector<const Weight*> group_weights(const LayerWeights& w, OpGroup g) {
  std::vector<const Weight*> out;
  auto add = [&out](const Weight& x) {
    if (x.present()) out.push_back(&x);
  };
  switch (g) {
    case OpGroup::kAttnW:
      for (const Weight* x : {&w.wq, &w.wk, &w.wv, &w.wo, &w.bq, &w.bk, &w.bv}) add(*x);
      break;
    case OpGroup::kFfn:
      for (const Weight* x : {&w.w_gate, &w.w_up, &w.w_down}) add(*x);
      break;
    case OpGroup::kNorm:
      for (const Weight* x :
           {&w.attn_norm, &w.ffn_norm, &w.q_norm, &w.k_norm, &w.post_attn_norm, &w.post_ffn_norm})
        add(*x);
      break;
    case OpGroup::kAttn: break;
  }
  return out;
}

std::optional<DType> placement_dtype_for_tensor(const Placement& p, std::string_view name) {
  if (name == "token_embd.weight") return p.embed.dtype;
  if (name == "output.weight") return p.output.dtype;
  if (!name.starts_with("blk.")) return std::nullopt;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos || dot == 4) return std::nullopt;
  size_t l = 0;
  for (char c : name.substr(4, dot - 4)) {
    if (c < '0' || c > '9' || l > 1000000) return std::nullopt;
    l = l * 10 + static_cast<size_t>(c - '0');
  }
  if (l >= p.layers.size()) return std::nullopt;
  const std::string_view rest = name.substr(dot + 1);
  if (rest.starts_with("attn_") && !rest.starts_with("attn_norm"))
    return p.layers[l][OpGroup::kAttnW].dtype;
  if (rest.starts_with("ffn_") && !rest.starts_with("ffn_norm"))
    return p.layers[l][OpGroup::kFfn].dtype;
  return std::nullopt;
}

uint64_t weight_bytes_as(const Weight& w, std::optional<DType> dtype) {
  if (!w.present()) return 0;
  if (!dtype || *dtype == w.dtype) return w.row_bytes * static_cast<uint64_t>(w.n_out);
  auto rb = dtype_row_bytes(*dtype, static_cast<uint64_t>(w.n_in));
  return rb ? *rb * static_cast<uint64_t>(w.n_out) : w.row_bytes * static_cast<uint64_t>(w.n_out);
}

namespace {
// Matrices are requantized; vectors (norms, biases) stay F32.
bool is_matrix(const Weight& w) {
  return w.n_out > 1;
}

Status check_dtype(const Weight& w, std::optional<DType> dtype, const std::string& where) {
  if (!dtype || !is_matrix(w) || *dtype == w.dtype) return {};
  if (!ref::has_reference(*dtype) || !ref::has_reference(w.dtype)) {
    return make_error(ErrorCode::kUnsupported,
                      "placement: %s: cannot requantize tensor '%s' from %s to %s", where.c_str(),
                      w.name().c_str(), std::string(dtype_name(w.dtype)).c_str(),
                      std::string(dtype_name(*dtype)).c_str());
  }
  if (!dtype_row_bytes(*dtype, static_cast<uint64_t>(w.n_in))) {
    return make_error(ErrorCode::kUnsupported,
                      "placement: %s: tensor '%s' has rows of %" PRId64
                      " values, not a multiple of %s's block of %u",
                      where.c_str(), w.name().c_str(), w.n_in,
                      std::string(dtype_name(*dtype)).c_str(), traits(*dtype).block_size);
  }
  return {};
}
}  // namespace

bool keep_host_ops_on_cpu(const Model& m, Placement* p) {
  if (m.host_attention_reason().empty()) return false;
  bool moved = false;
  auto to_cpu = [&moved](GroupPlace& g) {
    moved = moved || g.unit != Unit::kCpu;
    g.unit = Unit::kCpu;
  };
  if (m.hp.embd_scale > 0) to_cpu(p->embed);
  for (LayerPlace& lp : p->layers) to_cpu(lp[OpGroup::kAttn]);
  return moved;
}

Status validate_placement(const Model& m, const Placement& p) {
  if (static_cast<int64_t>(p.layers.size()) != m.hp.n_layer) {
    return make_error(ErrorCode::kInvalidArgument, "placement has %zu layers, the model %" PRId64,
                      p.layers.size(), m.hp.n_layer);
  }
  LOOM_TRY(check_dtype(m.tok_embd, p.embed.dtype, "embed"));
  LOOM_TRY(check_dtype(m.output, p.output.dtype, "output"));
  for (int64_t l = 0; l < m.hp.n_layer; ++l) {
    for (int i = 0; i < kNumOpGroups; ++i) {
      const auto g = static_cast<OpGroup>(i);
      const std::string where = "layer " + std::to_string(l) + " " + op_group_name(g);
      for (const Weight* w : group_weights(m, l, g))
        LOOM_TRY(check_dtype(*w, p.layers[static_cast<size_t>(l)][g].dtype, where));
    }
  }
  return {};
}

PlacementBytes placement_bytes(const Model& m, const Placement& p, uint64_t kv_bytes_per_layer) {
  PlacementBytes b;
  b.layer.resize(p.layers.size());
  auto matrix_dtype = [](const Weight& w, std::optional<DType> d) {
    return is_matrix(w) ? d : std::nullopt;
  };
  b.embed = weight_bytes_as(m.tok_embd, matrix_dtype(m.tok_embd, p.embed.dtype));
  b.weights[static_cast<size_t>(p.embed.unit)] += b.embed;
  const bool tied = m.output.data == m.tok_embd.data;
  b.output = weight_bytes_as(m.output, matrix_dtype(m.output, p.output.dtype)) +
             weight_bytes_as(m.output_norm, std::nullopt);
  // A tied output matrix is the embedding: a second copy only when it runs elsewhere.
  if (!(tied && p.output.unit == p.embed.unit && p.output.dtype == p.embed.dtype)) {
    b.weights[static_cast<size_t>(p.output.unit)] += b.output;
  }
  for (size_t l = 0; l < p.layers.size() && l < m.layers.size(); ++l) {
    for (int i = 0; i < kNumOpGroups; ++i) {
      const auto g = static_cast<OpGroup>(i);
      const GroupPlace& gp = p.layers[l][g];
      uint64_t bytes = 0;
      if (g == OpGroup::kAttn) {
        bytes = kv_bytes_per_layer;
        b.kv[static_cast<size_t>(gp.unit)] += bytes;
      } else {
        for (const Weight* w : group_weights(m, static_cast<int64_t>(l), g))
          bytes += weight_bytes_as(*w, matrix_dtype(*w, gp.dtype));
        b.weights[static_cast<size_t>(gp.unit)] += bytes;
      }
      b.layer[l][static_cast<size_t>(i)] = bytes;
    }
  }
  return b;
}

}  // namespace loom
