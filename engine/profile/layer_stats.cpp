#include "engine/profile/layer_stats.h"

#include <algorithm>

namespace loom {

LayerStats::LayerStats(int64_t n_layer)
    : n_layer_(std::max<int64_t>(n_layer, 0)),
      layers_(new LatencyHistogram[static_cast<size_t>(n_layer_)]) {}

std::vector<LayerStats::Layer> LayerStats::snapshot() const {
  std::vector<Layer> out(static_cast<size_t>(n_layer_));
  for (int64_t l = 0; l < n_layer_; ++l) {
    const LatencyHistogram::Snapshot s = layers_[static_cast<size_t>(l)].snapshot();
    Layer& o = out[static_cast<size_t>(l)];
    o.count = s.count;
    o.p50_ms = s.percentile_ms(0.50);
    o.p99_ms = s.percentile_ms(0.99);
    o.mean_ms = s.mean_ms();
  }
  return out;
}

void LayerStats::reset() {
  for (int64_t l = 0; l < n_layer_; ++l) layers_[static_cast<size_t>(l)].reset();
}

}  // namespace loom
