#include "engine/runtime/probe.h"

#include <algorithm>
#include <cmath>

#include "engine/runtime/reference.h"

namespace loom {

ActStats activation_stats(std::span<const double> x) {
  ActStats s;
  s.n = static_cast<int64_t>(x.size());
  if (x.empty()) return s;
  s.min = s.max = x[0];
  double sum = 0;
  for (double v : x) {
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
    sum += v;
  }
  s.mean = sum / static_cast<double>(x.size());
  double ss = 0;  // second pass: no cancellation for large means
  for (double v : x) ss += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(ss / static_cast<double>(x.size()));
  const double lim = kProbeOutlierSigmas * s.std;
  int64_t out = 0;
  for (double v : x) out += std::abs(v - s.mean) > lim;
  s.outlier_share = static_cast<double>(out) / static_cast<double>(x.size());
  return s;
}

Result<ProbeReport> probe_model(const Model& m, std::span<const int32_t> tokens,
                                const std::function<bool(int64_t)>& progress) {
  const auto T = static_cast<int64_t>(tokens.size());
  if (T < 1 || T > 256) {
    return make_error(ErrorCode::kInvalidArgument, "probe: %lld tokens (1 to 256)",
                      static_cast<long long>(T));
  }
  ProbeReport rep;
  rep.n_tokens = T;
  LOOM_ASSIGN_OR_RETURN(std::vector<double> x, reference_embed(m, tokens));
  rep.embd = activation_stats(x);
  ReferenceTaps taps;
  for (int64_t l = 0; l < m.hp.n_layer; ++l) {
    LOOM_ASSIGN_OR_RETURN(x, reference_layer(m, l, x, T, &taps));
    ProbeRow row;
    row.layer = l;
    row.attn_in = activation_stats(taps.attn_in);
    row.ffn_in = activation_stats(taps.ffn_in);
    row.out = activation_stats(x);
    rep.rows.push_back(row);
    if (progress && !progress(l)) return make_error(ErrorCode::kCancelled, "probe cancelled");
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<double> y, reference_rms_norm(m, m.output_norm, x));
  rep.final_norm = activation_stats(y);
  return rep;
}

}  // namespace loom
