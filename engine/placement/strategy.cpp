#include "engine/placement/strategy.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <functional>
#include <limits>

namespace loom {

std::optional<uint64_t> parse_size(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double v = 0;
  try {
    v = std::stod(s.substr(0, i));
  } catch (...) {
    return std::nullopt;
  }
  std::string unit = s.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mul = 1;
  if (unit.empty() || unit == "b")
    mul = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    mul = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib")
    mul = 1024.0 * 1024 * 1024 * 1024;
  else
    return std::nullopt;
  return static_cast<uint64_t>(v * mul);
}

uint64_t kv_bytes_per_layer(const Model& m, int64_t n_ctx, DType kv_dtype) {
  const uint64_t row = dtype_row_bytes(kv_dtype, static_cast<uint64_t>(m.hp.head_dim))
                           .value_or(2 * static_cast<uint64_t>(m.hp.head_dim));
  return 2 * row * static_cast<uint64_t>(m.hp.n_head_kv) * static_cast<uint64_t>(n_ctx);
}

uint64_t gpu_overhead_bytes(const Model& m, int64_t max_chunk) {
  const HParams& hp = m.hp;
  const auto C = static_cast<uint64_t>(max_chunk);
  const uint64_t acts = 4 * C *
                        static_cast<uint64_t>(2 * hp.n_embd + 2 * hp.n_head * hp.head_dim +
                                              2 * hp.n_head_kv * hp.head_dim + 2 * hp.n_ff);
  // The prompt GEMMs' scratch: the FFN's up product (F32) and an F16 copy of
  // the widest input.
  const uint64_t gemm = C * (4 * static_cast<uint64_t>(hp.n_ff) +
                             2 * static_cast<uint64_t>(std::max(hp.n_ff, hp.n_embd)));
  // CUDA's F16 copy of a weight slice (the largest FFN matrix, at most 256 MiB).
  const uint64_t slice = std::min<uint64_t>(
      256ull << 20, 2 * static_cast<uint64_t>(hp.n_ff) * static_cast<uint64_t>(hp.n_embd));
  return acts + gemm + slice + 4 * static_cast<uint64_t>(hp.n_vocab) +
         (64ull << 20);  // logits, scratch and blocks' slack
}

int64_t default_prefill_chunk(const Model& m, uint64_t device_bytes) {
  if (device_bytes == 0) return kCpuPrefillChunk;
  for (int64_t c = kGpuPrefillChunk; c > kCpuPrefillChunk; c /= 2)
    if (gpu_overhead_bytes(m, c) <= device_bytes / 16) return c;
  return kCpuPrefillChunk;
}

uint64_t default_kv_device_budget(const Model& m, const Placement& p, const StrategyOptions& o,
                                  uint64_t device_bytes) {
  if (device_bytes == 0 || !p.uses(Unit::kGpu)) return 0;
  const PlacementBytes b = placement_bytes(m, p, kv_bytes_per_layer(m, o.n_ctx, o.kv_dtype));
  const uint64_t kv = b.kv[static_cast<size_t>(Unit::kGpu)];
  if (kv == 0) return 0;
  const uint64_t taken =
      b.weights[static_cast<size_t>(Unit::kGpu)] + gpu_overhead_bytes(m, o.max_chunk);
  const uint64_t left = device_bytes > taken ? device_bytes - taken : 0;
  if (kv <= left) return 0;
  return std::max<uint64_t>(1, left - left / 16);
}

namespace {

void set_dtypes(Placement* p, const StrategyOptions& o) {
  auto fix = [&o](GroupPlace& g) { g.dtype = g.unit == Unit::kGpu ? o.gpu_dtype : o.cpu_dtype; };
  fix(p->embed);
  fix(p->output);
  for (auto& l : p->layers) {
    for (auto& g : l.g) fix(g);
  }
}

struct Budget {
  uint64_t left;
  bool take(uint64_t b) {
    if (b > left) return false;
    left -= b;
    return true;
  }
};

uint64_t gpu_bytes_of(const Model& m, const Placement& p, uint64_t kv_layer) {
  return placement_bytes(m, p, kv_layer).on(Unit::kGpu);
}

// Applies step(&t, i) for i = 0 .. n - 1 to a copy t of *p, keeping each
// result while the GPU's share fits the budget; stops at the first that does not.
void grow_while_fits(const Model& m, const StrategyOptions& o, uint64_t kv_layer, uint64_t budget,
                     int64_t n, const std::function<void(Placement*, int64_t)>& step,
                     Placement* p) {
  for (int64_t i = 0; i < n; ++i) {
    Placement t = *p;
    step(&t, i);
    set_dtypes(&t, o);
    if (gpu_bytes_of(m, t, kv_layer) > budget) return;
    *p = std::move(t);
  }
}

Placement layers_n(const Model& m, int64_t n) {
  const int64_t L = m.hp.n_layer;
  Placement p = Placement::uniform(L, Unit::kCpu);
  n = std::clamp<int64_t>(n, 0, L);
  for (int64_t l = 0; l < n; ++l) {
    for (auto& g : p.layers[static_cast<size_t>(l)].g) g.unit = Unit::kGpu;
  }
  if (n == L) p.output.unit = Unit::kGpu;
  p.strategy = "layers:" + std::to_string(n);
  return p;
}

// Dynamic programming over layers: per layer, attention side (attn_w, attn,
// norm) and FFN each on the CPU or the GPU; state = where the residual stream
// is and how much of the budget is used (in kSteps buckets, rounded up).
// What the GPU cannot run for the model (keep_host_ops_on_cpu: gemma2's
// attention, whose KV then stays on the host) is on the CPU in every choice,
// so the costs and bytes compared are those of what will run. Empty when
// nothing fits.
Placement dp_placement(const Model& m, const StrategyOptions& o, const CostModel& cost,
                       uint64_t budget, uint64_t kv_layer) {
  const int64_t L = m.hp.n_layer;
  constexpr int kSteps = 4096;  // budget resolution: rounding loses at most one step per item
  const double step = std::max(1.0, static_cast<double>(budget) / kSteps);
  const int64_t n_past = std::max<int64_t>(1, o.n_ctx / 2);
  const bool host_attn = !m.host_attention_reason().empty();
  // A choice's units (bit 0: attention side on the GPU, bit 1: FFN), with
  // what the GPU cannot run for this model left on the CPU.
  auto place = [host_attn](LayerPlace& lp, int choice) {
    const Unit ua = (choice & 1) ? Unit::kGpu : Unit::kCpu,
               uf = (choice & 2) ? Unit::kGpu : Unit::kCpu;
    for (OpGroup g : {OpGroup::kAttnW, OpGroup::kAttn, OpGroup::kNorm}) lp[g].unit = ua;
    lp[OpGroup::kFfn].unit = uf;
    if (host_attn) lp[OpGroup::kAttn].unit = Unit::kCpu;
  };
  auto buckets = [&](uint64_t bytes) {
    return static_cast<int>(std::ceil(static_cast<double>(bytes) / step));
  };
  auto group_gpu_bytes = [&](int64_t l, OpGroup g) {
    uint64_t b = 0;
    for (const Weight* w : group_weights(m, l, g))
      b += weight_bytes_as(*w, w->n_out > 1 ? o.gpu_dtype : std::nullopt);
    return b;
  };
  Placement best;
  double best_s = std::numeric_limits<double>::infinity();
  // The output matrix on the GPU or not, each solved over the rest of the budget.
  for (const Unit out_unit : {Unit::kGpu, Unit::kCpu}) {
    Placement base = Placement::uniform(L, Unit::kCpu);
    base.output.unit = out_unit;
    set_dtypes(&base, o);
    const uint64_t out_bytes = out_unit == Unit::kGpu ? placement_bytes(m, base, 0).weights[1] : 0;
    if (out_bytes > budget) continue;
    const int B = std::min(kSteps, static_cast<int>((budget - out_bytes) / step));
    constexpr double kInf = std::numeric_limits<double>::infinity();
    // cost[l + 1][residual unit][buckets used], with the choice that led there.
    struct Cell {
      double s = kInf;
      int prev_r = 0, prev_b = 0, choice = 0;
    };
    std::vector<std::vector<std::vector<Cell>>> dp(
        static_cast<size_t>(L + 1),
        std::vector<std::vector<Cell>>(2, std::vector<Cell>(static_cast<size_t>(B + 1))));
    dp[0][0][0].s = 0;  // the embedding runs on the CPU
    for (int64_t l = 0; l < L; ++l) {
      const int attn_b = buckets(group_gpu_bytes(l, OpGroup::kAttnW) +
                                 group_gpu_bytes(l, OpGroup::kNorm) + (host_attn ? 0 : kv_layer));
      const int ffn_b = buckets(group_gpu_bytes(l, OpGroup::kFfn));
      for (int r = 0; r < 2; ++r) {
        for (int b = 0; b <= B; ++b) {
          const Cell& c =
              dp[static_cast<size_t>(l)][static_cast<size_t>(r)][static_cast<size_t>(b)];
          if (c.s == kInf) continue;
          for (int choice = 0; choice < 4;
               ++choice) {  // bit 0: attention side on the GPU, bit 1: FFN
            const int nb = b + ((choice & 1) ? attn_b : 0) + ((choice & 2) ? ffn_b : 0);
            if (nb > B) continue;
            LayerPlace lp = base.layers[static_cast<size_t>(l)];
            place(lp, choice);
            for (auto& g : lp.g) g.dtype = g.unit == Unit::kGpu ? o.gpu_dtype : o.cpu_dtype;
            const double s =
                c.s + cost.layer_s(m, l, lp, r ? Unit::kGpu : Unit::kCpu, n_past, o.kv_dtype);
            Cell& n = dp[static_cast<size_t>(l + 1)][static_cast<size_t>((choice & 1) != 0)]
                        [static_cast<size_t>(nb)];
            if (s < n.s) n = Cell{s, r, b, choice};
          }
        }
      }
    }
    // Best end state, then walk the choices back.
    int er = 0, eb = 0;
    double es = kInf;
    for (int r = 0; r < 2; ++r) {
      for (int b = 0; b <= B; ++b) {
        const double s =
            dp[static_cast<size_t>(L)][static_cast<size_t>(r)][static_cast<size_t>(b)].s;
        if (s < es) es = s, er = r, eb = b;
      }
    }
    if (es == kInf) continue;
    Placement p = base;
    for (int64_t l = L; l > 0; --l) {
      const Cell& c = dp[static_cast<size_t>(l)][static_cast<size_t>(er)][static_cast<size_t>(eb)];
      LayerPlace& lp = p.layers[static_cast<size_t>(l - 1)];
      place(lp, c.choice);
      er = c.prev_r;
      eb = c.prev_b;
    }
    set_dtypes(&p, o);
    const double total = cost.predict(m, p, n_past, o.kv_dtype).step_ms;
    if (total < best_s) {
      best_s = total;
      best = p;
    }
  }
  if (!best.layers.empty()) best.strategy = "auto:dp";
  return best;
}

// Whole layers on the GPU in one run, the first ones or the last ones, with
// the output matrix there or not (as many as the budget holds): two switches
// per step at most.
std::vector<Placement> run_placements(const Model& m, const StrategyOptions& o, uint64_t budget,
                                      uint64_t kv_layer) {
  const int64_t L = m.hp.n_layer;
  std::vector<Placement> runs;
  for (const bool last : {false, true}) {
    for (const Unit out_unit : {Unit::kGpu, Unit::kCpu}) {
      Placement p = Placement::uniform(L, Unit::kCpu);
      p.output.unit = out_unit;
      set_dtypes(&p, o);
      if (gpu_bytes_of(m, p, kv_layer) > budget) continue;
      grow_while_fits(
          m, o, kv_layer, budget, L,
          [&](Placement* t, int64_t i) {
            for (auto& g : t->layers[static_cast<size_t>(last ? L - 1 - i : i)].g)
              g.unit = Unit::kGpu;
            keep_host_ops_on_cpu(m, t);  // gemma2's attention (and its KV) stays on the host
          },
          &p);
      int64_t n = 0;
      for (const auto& lp : p.layers) n += lp[OpGroup::kFfn].unit == Unit::kGpu;
      p.strategy = std::string(last ? "last:" : "first:") + std::to_string(n) +
                   (out_unit == Unit::kGpu ? "+output" : "");
      runs.push_back(std::move(p));
    }
  }
  return runs;
}

// `dp`: dp_placement's choice where the caller has it already.
Placement auto_placement(const Model& m, const StrategyOptions& o, const CostModel& cost,
                         uint64_t budget, uint64_t kv_layer, const Placement* dp = nullptr) {
  const int64_t L = m.hp.n_layer;
  const int64_t n_past = std::max<int64_t>(1, o.n_ctx / 2);
  Placement best = dp ? *dp : dp_placement(m, o, cost, budget, kv_layer);
  const double best_s = best.layers.empty() ? std::numeric_limits<double>::infinity()
                                            : cost.predict(m, best, n_past, o.kv_dtype).step_ms;
  // The DP's choice must beat the best whole-layer run by kManySwitchMargin
  // when it switches more often: switches are what the cost model measures
  // least well (on the H200, a placement with 28 copies per step predicted at
  // 26.6 ms took 34, while layers:16, 2 copies, predicted at 28.3 took 27.6:
  // the GPU's clocks drop when it works in short bursts).
  constexpr double kManySwitchMargin = 1.15;
  Placement run;
  double run_s = std::numeric_limits<double>::infinity();
  for (Placement& p : run_placements(m, o, budget, kv_layer)) {
    const double total = cost.predict(m, p, n_past, o.kv_dtype).step_ms;
    if (total < run_s) {
      run_s = total;
      run = std::move(p);
    }
  }
  if (!run.layers.empty()) {
    const bool more_switches =
        best.layers.empty() || cost.predict(m, best, n_past, o.kv_dtype).transfers >
                                   cost.predict(m, run, n_past, o.kv_dtype).transfers;
    if (run_s <= best_s * (more_switches ? kManySwitchMargin : 1.0)) best = run;
  }
  if (best.layers.empty()) {
    best = Placement::uniform(L, Unit::kCpu);
    set_dtypes(&best, o);
  }
  best.strategy = "auto";
  return best;
}

uint64_t budget_of(const Model& m, const StrategyOptions& o) {
  const uint64_t overhead = gpu_overhead_bytes(m, o.max_chunk);
  return o.vram_budget == 0 ? std::numeric_limits<uint64_t>::max() / 4
                            : (o.vram_budget > overhead ? o.vram_budget - overhead : 0);
}

}  // namespace

Result<Placement> make_placement(const Model& m, const StrategyOptions& o, const CostModel& cost) {
  const int64_t L = m.hp.n_layer;
  const std::string& s = o.strategy;
  if (s == "custom" || !o.placement_file.empty()) {
    if (o.placement_file.empty())
      return make_error(ErrorCode::kInvalidArgument,
                        "strategy custom needs a placement file (--placement FILE.json)");
    LOOM_ASSIGN_OR_RETURN(Placement p, Placement::load(o.placement_file, L));
    if (p.uses(Unit::kGpu) && !o.has_gpu) {
      return make_error(ErrorCode::kUnsupported,
                        "placement '%s' puts work on the GPU, but no GPU is available",
                        o.placement_file.c_str());
    }
    LOOM_TRY(validate_placement(m, p));
    p.strategy = "custom";
    return p;
  }
  if (s == "cpu") {
    Placement p = Placement::uniform(L, Unit::kCpu);
    set_dtypes(&p, o);
    return p;
  }
  const bool gpu_strategy =
      s == "gpu" || s == "attn-gpu" || s == "auto" || s.rfind("layers:", 0) == 0;
  if (!gpu_strategy) {
    return make_error(ErrorCode::kInvalidArgument,
                      "unknown strategy '%s' (gpu, cpu, layers:N, attn-gpu, auto, custom)",
                      s.c_str());
  }
  if (!o.has_gpu) {
    return make_error(ErrorCode::kUnsupported,
                      "strategy '%s' needs a GPU, and none is available (use --strategy cpu)",
                      s.c_str());
  }
  const uint64_t kv_layer = kv_bytes_per_layer(m, o.n_ctx, o.kv_dtype);
  const uint64_t budget = budget_of(m, o);
  Placement p;
  if (s == "gpu") {
    p = Placement::uniform(L, Unit::kGpu);
  } else if (s.rfind("layers:", 0) == 0) {
    char* end = nullptr;
    const long long n = std::strtoll(s.c_str() + 7, &end, 10);
    if (end == s.c_str() + 7 || *end != '\0' || n < 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "strategy '%s': N must be a number of layers (0..%" PRId64 ")", s.c_str(),
                        L);
    }
    p = layers_n(m, n);
  } else if (s == "attn-gpu") {
    p = Placement::uniform(L, Unit::kCpu);
    for (auto& lp : p.layers) {
      for (OpGroup g : {OpGroup::kAttnW, OpGroup::kAttn, OpGroup::kNorm}) lp[g].unit = Unit::kGpu;
    }
    set_dtypes(&p, o);
    // Then the output matrix, then FFNs from the first layer on, while the budget lasts.
    grow_while_fits(
        m, o, kv_layer, budget, 1, [](Placement* t, int64_t) { t->output.unit = Unit::kGpu; }, &p);
    grow_while_fits(
        m, o, kv_layer, budget, L,
        [](Placement* t, int64_t l) {
          t->layers[static_cast<size_t>(l)][OpGroup::kFfn].unit = Unit::kGpu;
        },
        &p);
    p.strategy = "attn-gpu";
  } else {
    Placement a = auto_placement(m, o, cost, budget, kv_layer);
    keep_host_ops_on_cpu(m, &a);  // what the GPU cannot run for this model (gemma2's attention)
    return a;
  }
  keep_host_ops_on_cpu(m, &p);
  set_dtypes(&p, o);
  if (p.strategy.empty()) p.strategy = s;
  LOOM_TRY(validate_placement(m, p));
  return p;
}

std::vector<PlacementCandidate> candidate_placements(const Model& m, const StrategyOptions& o,
                                                     const CostModel& cost) {
  std::vector<PlacementCandidate> out;
  if (!o.has_gpu) return out;
  const uint64_t kv_layer = kv_bytes_per_layer(m, o.n_ctx, o.kv_dtype);
  const uint64_t budget = budget_of(m, o);
  auto add = [&](Placement p, int64_t n) {
    keep_host_ops_on_cpu(m, &p);
    if (p.layers.empty() || gpu_bytes_of(m, p, kv_layer) > budget) return;
    for (PlacementCandidate& q : out) {
      if (!q.p.same_as(p)) continue;
      // The same as an earlier one: that one's name says so ("auto = layers:12").
      if (n >= 0) {
        q.p.strategy += " = " + p.strategy;
        q.layers_n = n;
      }
      return;
    }
    out.push_back(PlacementCandidate{std::move(p), n});
  };
  const Placement dp = dp_placement(m, o, cost, budget, kv_layer);
  add(auto_placement(m, o, cost, budget, kv_layer, &dp), -1);
  add(dp, -1);
  for (Placement& p : run_placements(m, o, budget, kv_layer)) add(std::move(p), -1);
  for (int64_t n = m.hp.n_layer; n >= 0; --n) {
    Placement p = layers_n(m, n);
    set_dtypes(&p, o);
    add(std::move(p), n);
  }
  return out;
}

}  // namespace loom
