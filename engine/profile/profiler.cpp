#include "engine/profile/profiler.h"

namespace loom {

Profiler::Profiler(int64_t n_layer)
    : n_layer_(n_layer), hist_(new LatencyHistogram[static_cast<size_t>(n_layer * kPerLayer)]) {}

void Profiler::record_scope(int32_t scope, uint64_t ns) {
  if (scope < 0) return;
  if (scope == embed_scope()) return embed_.record_ns(ns);
  if (scope == output_scope()) return output_.record_ns(ns);
  const int64_t layer = scope / kNumOpGroups;
  if (layer < n_layer_) at(layer, scope % kNumOpGroups).record_ns(ns);
}

void Profiler::record_xfer(int64_t layer, uint64_t ns) {
  if (layer >= 0 && layer < n_layer_)
    at(layer, kXfer).record_ns(ns);
  else
    xfer_other_.record_ns(ns);
}

void Profiler::record_layer(int64_t layer, uint64_t ns) {
  if (layer >= 0 && layer < n_layer_) at(layer, kLayerTotal).record_ns(ns);
}

ProfileStat Profiler::stat(const LatencyHistogram& h) {
  const auto s = h.snapshot();
  ProfileStat r;
  r.count = s.count;
  if (!s.count) return r;
  r.p50_ms = s.percentile_ms(0.50);
  r.p90_ms = s.percentile_ms(0.90);
  r.p99_ms = s.percentile_ms(0.99);
  r.max_ms = static_cast<double>(s.max_ns) * 1e-6;
  r.mean_ms = s.mean_ms();
  return r;
}

Profiler::Snapshot Profiler::snapshot() const {
  Snapshot s;
  s.layers.resize(static_cast<size_t>(n_layer_));
  for (int64_t l = 0; l < n_layer_; ++l) {
    for (int k = 0; k < kPerLayer; ++k) {
      s.layers[static_cast<size_t>(l)][static_cast<size_t>(k)] =
          stat(hist_[static_cast<size_t>(l * kPerLayer + k)]);
    }
  }
  s.embed = stat(embed_);
  s.output = stat(output_);
  s.xfer_other = stat(xfer_other_);
  s.step = stat(step_);
  s.ttft = stat(ttft_);
  s.itl = stat(itl_);
  return s;
}

void Profiler::reset() {
  for (int64_t i = 0; i < n_layer_ * kPerLayer; ++i) hist_[static_cast<size_t>(i)].reset();
  for (LatencyHistogram* h : {&embed_, &output_, &xfer_other_, &step_, &ttft_, &itl_}) h->reset();
}

}  // namespace loom
