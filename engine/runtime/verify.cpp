#include "engine/runtime/verify.h"

#include <cmath>

#include "engine/runtime/forward.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/reference.h"

namespace loom {

namespace {

double rel_error(const std::vector<float>& y, const std::vector<double>& ref,
                 const std::vector<double>* base) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(y[i]) - ref[i];
    const double r = base ? ref[i] - (*base)[i] : ref[i];
    num += d * d;
    den += r * r;
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

// One forward pass running a placement, with its own cache.
struct Runner {
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<ForwardPass> fwd;
};

Result<Runner> make_runner(const Model& m, Backend& cpu, Backend* gpu, const Placement& p,
                           int64_t T) {
  Runner r;
  KvCacheConfig kc;
  kc.n_layer = m.hp.n_layer;
  kc.n_kv_heads = m.hp.n_head_kv;
  kc.head_dim = m.hp.head_dim;
  kc.n_ctx = (T + 31) / 32 * 32;
  kc.block_size = 32;
  kc.dtype = DType::kF16;
  LOOM_ASSIGN_OR_RETURN(r.kv, KvCache::create(kc));
  Backend& primary = (gpu && p.uses(Unit::kGpu)) ? *gpu : cpu;
  r.fwd = std::make_unique<ForwardPass>(m, primary, *r.kv, T);
  if (&primary != &cpu) r.fwd->set_fallback(&cpu);
  LOOM_TRY(r.fwd->set_placement(p));
  LOOM_TRY(r.fwd->prepare());
  return r;
}

}  // namespace

Result<VerifyReport> verify_placement(const Model& m, Backend& cpu, Backend* gpu,
                                      const Placement& p, std::span<const int32_t> tokens,
                                      const std::function<bool(int64_t)>& progress) {
  const auto T = static_cast<int64_t>(tokens.size());
  if (T < 1 || T > 256) {
    return make_error(ErrorCode::kInvalidArgument, "verify: %lld tokens (1 to 256)",
                      static_cast<long long>(T));
  }
  LOOM_TRY(validate_placement(m, p));
  const int64_t L = m.hp.n_layer;
  VerifyReport rep;
  rep.n_tokens = T;

  // The whole placement, then one pass per op group: that group as placed,
  // the rest on the CPU in the file's precision.
  LOOM_ASSIGN_OR_RETURN(Runner all, make_runner(m, cpu, gpu, p, T));
  rep.placement = all.fwd->placement();
  rep.notes = all.fwd->notes();
  std::array<Runner, kNumOpGroups> per_group;
  for (int g = 0; g < kNumOpGroups; ++g) {
    Placement q = Placement::uniform(L, Unit::kCpu);
    for (int64_t l = 0; l < L; ++l) {
      q.layers[static_cast<size_t>(l)].g[static_cast<size_t>(g)] =
          rep.placement.layers[static_cast<size_t>(l)].g[static_cast<size_t>(g)];
    }
    LOOM_ASSIGN_OR_RETURN(per_group[static_cast<size_t>(g)], make_runner(m, cpu, gpu, q, T));
  }

  LOOM_ASSIGN_OR_RETURN(std::vector<double> x, reference_embed(m, tokens));
  std::vector<float> xf(x.size()), y(x.size());
  for (int64_t l = 0; l < L; ++l) {
    LOOM_ASSIGN_OR_RETURN(std::vector<double> ref, reference_layer(m, l, x, T));
    for (size_t i = 0; i < x.size(); ++i) xf[i] = static_cast<float>(x[i]);
    VerifyRow row;
    row.layer = l;
    for (int g = 0; g < kNumOpGroups; ++g) {
      LOOM_TRY(per_group[static_cast<size_t>(g)].fwd->eval_layer(l, xf.data(), T, y.data()));
      row.group[static_cast<size_t>(g)] = rel_error(y, ref, nullptr);
    }
    LOOM_TRY(all.fwd->eval_layer(l, xf.data(), T, y.data()));
    row.all = rel_error(y, ref, nullptr);
    row.all_delta = rel_error(y, ref, &x);
    rep.rows.push_back(row);
    x = std::move(ref);
    if (progress && !progress(l)) return make_error(ErrorCode::kCancelled, "verify cancelled");
  }
  return rep;
}

}  // namespace loom
