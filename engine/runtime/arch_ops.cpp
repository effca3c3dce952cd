#include "engine/runtime/arch_ops.h"

#include <cmath>
#include <vector>

#include "cpu/ops.h"

namespace loom {

void host_scale(Act x, float s) {
  const int64_t n = x.rows * x.cols;
  for (int64_t i = 0; i < n; ++i) x.data[i] *= s;
}

void host_softcap(Act x, float cap) {
  if (cap <= 0) return;
  const int64_t n = x.rows * x.cols;
  for (int64_t i = 0; i < n; ++i) x.data[i] = cap * std::tanh(x.data[i] / cap);
}

void host_attention(const KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                    float scale, float cap, int64_t window, Act out, cpu::ThreadPool* pool) {
  const cpu::KvView v = kv.view(layer);
  const cpu::AttnMods mods{cap, window};
  const size_t n_scratch = cpu::attention_scratch_floats(v);
  // By KV-head groups, so the query heads sharing a KV head stay together.
  const int64_t group = n_heads / v.n_kv_heads;
  auto work = [&](int64_t h0, int64_t h1, int) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < n_scratch) scratch.resize(n_scratch);
    cpu::attention(q.data, q.rows, pos, n_heads, v, scale, out.data, h0, h1, scratch.data(),
                   nullptr, mods);
  };
  if (pool && pool->size() > 1 && n_heads > group)
    pool->parallel_for(n_heads, group, work);
  else
    work(0, n_heads, 0);
}

}  // namespace loom
