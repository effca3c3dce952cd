// Rows of different sequences in one launch (CudaBackend::rope_qk_kv_rows,
// attention_rows): continuous batching's decode step holds one row per
// sequence, each with its own cache. One sequence at a time, a step of 64
// sequences made 64 rope/store and 64 attention launches per layer, each
// with its own uploads; here the caches' K/V addresses go up once per op
// (cuda::RowKv), and the kernels take row t's K/V from them.
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/launch_key.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

using namespace launch_key;  // NOLINT(google-build-using-namespace)

bool CudaBackend::row_layers(std::span<KvCache* const> kvs, int64_t layer, cuda::DevKvLayer* first,
                             std::vector<cuda::RowKv>* rows) {
  rows->clear();
  for (KvCache* kv : kvs) {
    auto* st = dynamic_cast<cuda::CudaKvStorage*>(kv->storage());
    if (!st || !st->layer_resident(layer) || kv->device_tiered(layer)) return false;
    const cuda::DevKvLayer l = st->layer(layer);
    if (!l.k || !l.v) return false;
    if (rows->empty())
      *first = l;
    else if (l.dtype != first->dtype || l.row_bytes != first->row_bytes ||
             l.head_dim != first->head_dim || l.n_kv_heads != first->n_kv_heads)
      return false;
    rows->push_back(cuda::RowKv{l.k, l.v, l.capacity});
  }
  return !rows->empty();
}

bool CudaBackend::rope_qk_kv_rows(Act q, Act k, Act v, std::span<KvCache* const> kvs, int64_t layer,
                                  int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                  const int32_t* pos, const cpu::RopeParams& p) {
  const int64_t n_pairs = p.n_rot / 2, T = q.rows;
  if (!row_ops_ || !fuse_rope_ || n_pairs == 0 || !rope_params_ok(p, head_dim) ||
      T != static_cast<int64_t>(kvs.size()))
    return false;
  cuda::DevKvLayer l;
  std::vector<cuda::RowKv> rows;
  if (!row_layers(kvs, layer, &l, &rows) || l.n_kv_heads != n_kv_heads ||
      !cuda::rope_kv_store_fits(l, head_dim))
    return false;
  for (int64_t t = 0; t < T; ++t)
    if (pos[t] < 0 || pos[t] >= rows[static_cast<size_t>(t)].capacity)
      return false;  // one at a time, the store names the position
  if (!ready() || !check_act(q, "rope_qk_kv") || !check_act(k, "rope_qk_kv") ||
      !check_act(v, "rope_qk_kv"))
    return true;  // the failure is recorded
  const auto* d_rows =
      static_cast<const cuda::RowKv*>(put(rows.data(), rows.size() * sizeof(cuda::RowKv)));
  const auto* d_pos =
      static_cast<const int32_t*>(put(pos, static_cast<uint64_t>(T) * sizeof(int32_t)));
  const float* d_cs = d_rows && d_pos ? rope_table(T, pos, p) : nullptr;
  if (!d_cs) return true;
  float* qp = dev(q);
  float* kp = dev(k);
  const float* vp = dev(v);
  const bool neox = p.neox;
  launch({kOpRopeKv, u(d_rows), l.row_bytes, u(l.head_dim), u(l.n_kv_heads),
          static_cast<uint64_t>(l.dtype), u(qp), u(kp), u(vp), u(T), u(n_heads), u(n_pairs), neox,
          u(d_cs), u(d_pos)},
         [=, this] {
           return cuda::rope_kv_store(l, qp, n_heads, kp, vp, T, n_pairs, neox, d_cs, d_pos,
                                      stream_, d_rows);
         });
  return true;
}

bool CudaBackend::attention_rows(std::span<KvCache* const> kvs, int64_t layer, Act q,
                                 const int32_t* pos, int64_t n_heads, float scale, Act out) {
  const int64_t T = q.rows;
  if (!row_ops_ || T != static_cast<int64_t>(kvs.size())) return false;
  cuda::DevKvLayer l;
  std::vector<cuda::RowKv> rows;
  if (!row_layers(kvs, layer, &l, &rows)) return false;
  if (!ready() || !check_act(q, "attention") || !check_act(out, "attention")) return true;
  int64_t max_pos = -1;
  for (int64_t t = 0; t < T; ++t) max_pos = pos[t] > max_pos ? pos[t] : max_pos;
  const auto* d_rows =
      static_cast<const cuda::RowKv*>(put(rows.data(), rows.size() * sizeof(cuda::RowKv)));
  const auto* d_pos =
      static_cast<const int32_t*>(put(pos, static_cast<uint64_t>(T) * sizeof(int32_t)));
  if (!d_rows || !d_pos) return true;
  const int64_t plan = attention_plan(max_pos);
  const float* qp = dev(q);
  float* o = dev(out);
  launch(
      {kOpAttention, u(d_rows), l.row_bytes, u(l.head_dim), u(l.n_kv_heads),
       static_cast<uint64_t>(l.dtype), u(qp), u(T), u(d_pos), u(n_heads), u(scale), u(o), u(plan)},
      [=, this] {
        return cuda::attention_rows(l, d_rows, qp, T, d_pos, plan, n_heads, scale, o,
                                    *attn_scratch_, stream_);
      });
  return true;
}

}  // namespace loom
