#include "engine/runtime/arch_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/ops.h"
#include "cpu/ref/quants.h"

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
  const int64_t hd = v.head_dim, group = n_heads / v.n_kv_heads;
  const size_t row_bytes =
      static_cast<size_t>(*dtype_row_bytes(v.dtype, static_cast<uint64_t>(hd)));
  auto row = [&](const void* const* blocks, int64_t j, int64_t kh, float* dst) {
    const auto* b = static_cast<const uint8_t*>(blocks[j / v.block_size]);
    const uint8_t* p = b + static_cast<size_t>(kh) * v.head_stride_bytes +
                       static_cast<size_t>(j % v.block_size) * row_bytes;
    (void)ref::dequantize_row(v.dtype, p, dst, hd);
  };
  // One (query row, head) pair per item: each writes its own head_dim outputs.
  auto work = [&](int64_t first, int64_t last, int) {
    std::vector<float> kr(static_cast<size_t>(hd)), vr(static_cast<size_t>(hd)), sc;
    for (int64_t w = first; w < last; ++w) {
      const int64_t t = w / n_heads, h = w % n_heads;
      const int64_t p = pos[t];
      const int64_t j0 = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      sc.resize(static_cast<size_t>(p - j0 + 1));
      const float* qh = q.row(t) + h * hd;
      const int64_t kh = h / group;
      float mx = -INFINITY;
      for (int64_t j = j0; j <= p; ++j) {
        row(v.k_blocks, j, kh, kr.data());
        float s = 0;
        for (int64_t i = 0; i < hd; ++i) s += qh[i] * kr[static_cast<size_t>(i)];
        s *= scale;
        if (cap > 0) s = cap * std::tanh(s / cap);
        sc[static_cast<size_t>(j - j0)] = s;
        mx = std::max(mx, s);
      }
      float sum = 0;
      for (float& s : sc) sum += s = std::exp(s - mx);
      float* o = out.row(t) + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = j0; j <= p; ++j) {
        row(v.v_blocks, j, kh, vr.data());
        const float wt = sc[static_cast<size_t>(j - j0)] / sum;
        for (int64_t i = 0; i < hd; ++i) o[i] += wt * vr[static_cast<size_t>(i)];
      }
    }
  };
  const int64_t items = q.rows * n_heads;
  if (pool && pool->size() > 1 && items > 1)
    pool->parallel_for(items, 1, work);
  else
    work(0, items, 0);
}

}  // namespace loom
