// VulkanBackend's attention: tiled flash attention for prefill, split
// decode attention (attn_decode over F16 and Q8_0 rows on GPUs, else
// attn_split; then attn_merge), one split per slot for
// layers in device slots, and attention_split, where the host attends over
// the layer's host blocks and its partial is merged with the device's.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/ops.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

constexpr uint32_t kAttnHeadsPerGroup = 8;   // GM in attn_split.comp
constexpr uint32_t kAttnSplitKeys = 32;      // keys per split past kAttnOneSplitKeys (GPUs)
constexpr uint32_t kAttnOneSplitKeys = 128;  // up to this many keys in one split (GPUs)
constexpr uint64_t kAttnGroupScratch = 64ull
                                       << 20;  // partials of one group of query rows (device tier)
constexpr int64_t kAttnTileMaxHeadDim = 128;   // HD_MAX in attn_tile.comp
constexpr uint32_t kAttnTileRows = 16;         // BR in attn_tile.comp
constexpr uint32_t kWgAttnTile = 128;          // BR * TPQ in attn_tile.comp
constexpr uint32_t kAttnCmRows = 64;           // BR in attn_cm.comp
constexpr uint32_t kWgAttnCm = 128;            // NT in attn_cm.comp
constexpr uint32_t kAttnCmShared = 30720;      // its shared memory, bytes
// Query rows from which prefill attention takes the tensor cores: below, a
// 64-row tile would be mostly empty, and short prompts keep F32 scores and
// probabilities (as their matmuls keep F32 activations in the matvecs).
constexpr int64_t kAttnCmMinRows = 16;
// attn_decode.comp: GM, HD_MAX and NSG_MAX there; its workgroup size (at
// least a subgroup); the least keys of a split.
constexpr uint32_t kAttnDecodeHeads = 4;
constexpr int64_t kAttnDecodeMaxHeadDim = 256;
constexpr uint32_t kAttnDecodeMaxSubgroups = 64;
constexpr uint32_t kWgAttnDecode = 128;
constexpr uint32_t kAttnDecodeMinKeys = 32;
// Query rows from which attention over a slotted layer gathers its blocks
// (vulkan_kv_gather.cpp) instead of one split per slot and the host's part.
constexpr int64_t kGatherMinRows = 16;

bool gathers(int64_t T, int64_t hd) {
  return T >= kGatherMinRows && hd <= kAttnTileMaxHeadDim;
}

}  // namespace

void VulkanBackend::attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos,
                              int64_t n_heads, float scale, Act out) {
  if (!status_.ok() || !check_act(q, "attention") || !check_act(out, "attention")) return;
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  if (!s || s->owner_ != this)
    return fail(
        make_error(ErrorCode::kInternal, "Vulkan attention: the KV cache is not on this GPU"));
  if (!s->layer_resident(layer)) return fail(not_resident(layer, "attention"));
  const KvCacheConfig& c = s->cfg_;
  const int64_t T = q.rows, hd = c.head_dim;
  if (!positions_in_range(pos, T, c.n_ctx, "attention")) return;
  const auto l = static_cast<size_t>(layer);
  if (s->layer_slots(layer) > 0) {
    if (gathers(T, hd)) {
      Status g = attention_gathered(kv, *s, layer, q, pos, n_heads, scale, out);
      if (g.ok() || !status_.ok()) return;
      if (g.error().code() != ErrorCode::kOutOfMemory) return fail(g);
      // No device memory to gather into: one split per slot, below.
    }
    // Device tier: splits over the slots, causal by each slot's position; the
    // query rows in groups whose partials fit the scratch (no room to gather).
    const std::vector<int32_t> map = kv.slot_positions(layer);
    const int64_t tn = attn_rows_per_group(n_heads, hd, map.size() + 1);
    for (int64_t t0 = 0; t0 < T && status_.ok(); t0 += tn) {
      const int64_t n = std::min(tn, T - t0);
      attention_decode(*s, layer, q.rows_view(t0, n), pos + t0, n_heads, scale,
                       out.rows_view(t0, n), &map, 0, false, true);
    }
    return;
  }
  if (T > 1 && hd <= kAttnTileMaxHeadDim) {  // prefill: tiled flash attention
    attention_tile(q, pos, n_heads, scale, out, s->k_[l], s->v_[l], s->quant_bytes(l), c.n_ctx, c);
    return;
  }
  attention_decode(*s, layer, q, pos, n_heads, scale, out, nullptr, 0, false);
}

void VulkanBackend::attention_tile(Act q, const int32_t* pos, int64_t n_heads, float scale, Act out,
                                   const Alloc& ka, const Alloc& va, uint64_t quant_bytes,
                                   int64_t rows, const KvCacheConfig& c) {
  const int64_t T = q.rows;
  auto po = put_ints(pos, T);
  if (!po.ok()) return fail(po.status());
  struct {
    uint32_t q_off, q_ld, o_off, o_ld, kc_off, kc_d_off, vc_off, vc_d_off, n_ctx, n_heads,
        n_kv_heads, head_dim, pos_off, T;
    float scale;
  } pc{u32(q.offset / 4),
       u32(q.cols),
       u32(out.offset / 4),
       u32(out.cols),
       u32(ka.offset / 4),
       u32((ka.offset + quant_bytes) / 4),
       u32(va.offset / 4),
       u32((va.offset + quant_bytes) / 4),
       u32(rows),
       u32(n_heads),
       u32(c.n_kv_heads),
       u32(c.head_dim),
       *po,
       u32(T),
       scale};
  // Tensor cores where the device has cooperative matrices (subgroups of 32,
  // as they are or on request) and the head and the cache's offsets suit attn_cm.comp's 16-byte
  // loads.
  const vk::DeviceCaps& dc = dev_->caps();
  const bool cm = attn_coopmat_ && T >= kAttnCmMinRows && dc.coopmat &&
                  (dc.subgroup_size == 32 || dc.coopmat_sub32) &&
                  dc.max_shared_bytes >= kAttnCmShared && c.head_dim % 16 == 0 &&
                  ka.offset % 16 == 0 && va.offset % 16 == 0 && quant_bytes % 4 == 0;
  const uint32_t rows_per_group = cm ? kAttnCmRows : kAttnTileRows;
  dispatch(typed(cm ? "attn_cm" : "attn_tile", c.dtype, false, !cm),
           Spec{cm ? kWgAttnCm : kWgAttnTile},
           {act_bind(q, false), Bind{ka.block, ka.offset, ka.size, false},
            Bind{va.block, va.offset, va.size, false}, act_bind(out, true),
            Bind{ring_.block, 0, 0, false}},
           &pc, sizeof(pc), u32((T + rows_per_group - 1) / rows_per_group), u32(n_heads), 1);
}

int64_t VulkanBackend::attn_rows_per_group(int64_t n_heads, int64_t hd, size_t n_splits) const {
  const uint64_t per_row =
      static_cast<uint64_t>(n_heads) * n_splits * static_cast<uint64_t>(hd + 2) * 4;
  return static_cast<int64_t>(
      std::max<uint64_t>(1, kAttnGroupScratch / std::max<uint64_t>(per_row, 1)));
}

uint32_t VulkanBackend::attention_decode(VkKvStorage& s, int64_t layer, Act q, const int32_t* pos,
                                         int64_t n_heads, float scale, Act out,
                                         const std::vector<int32_t>* map, uint32_t extra_splits,
                                         bool keep_splits, bool slot_chunks) {
  const KvCacheConfig& c = s.cfg_;
  const auto l = static_cast<size_t>(layer);
  const int64_t T = q.rows, hd = c.head_dim;
  const Alloc& ka = s.k_[l];
  const Alloc& va = s.v_[l];
  const uint32_t wg = attn_wg_;
  uint32_t n_keys = 0, kps = 0;
  const std::vector<int32_t> no_block{-1};  // a layer with no block in a slot yet
  if (map && map->empty()) map = &no_block;
  if (map) {
    // A chunk per slot, and a split per slot (its (m, l) is the slot's
    // block's share: attention mass) unless slot_chunks.
    kps = u32(c.block_size);
    n_keys = u32(map->size()) * kps;
  } else {
    int32_t max_pos = 0;
    for (int64_t t = 0; t < T; ++t) max_pos = std::max(max_pos, pos[t]);
    // Keys per split: all of them up to kAttnOneSplitKeys (or a workgroup's
    // worth on CPU devices, where barriers are costly), else kAttnSplitKeys, so
    // the splits fill the GPU and each walks few V rows (on the H200, 32-key
    // splits and their merge took longer than one split at 65-192 keys, less at
    // 512-640). Threads per key: as many as the workgroup has for each key of a
    // split (up to one per dimension pair).
    n_keys = static_cast<uint32_t>(max_pos) + 1;
    kps = attn_split_keys_                              ? std::min(attn_split_keys_, wg)
          : n_keys <= kAttnOneSplitKeys || !gpu_device_ ? std::min(n_keys, wg)
                                                        : std::min(kAttnSplitKeys, wg);
  }
  {
    uint32_t n_dev = 0;
    if (attention_decode_onepass(s, layer, q, pos, n_heads, scale, out, n_keys, map, extra_splits,
                                 keep_splits, slot_chunks, &n_dev))
      return n_dev;
  }
  kps = std::max<uint32_t>(kps, 1);
  // Chunks of kps keys per split: one, unless there are more chunks than it
  // takes to fill the GPU (about kAttnSplitGroups workgroups), and then as
  // many as that leaves, so the merge reads few partials (on the H200 at
  // 32,768 keys: 1,024 splits a head, merged by one workgroup each).
  const uint32_t group = u32(n_heads / c.n_kv_heads);
  const uint32_t n_gchunks = (group + kAttnHeadsPerGroup - 1) / kAttnHeadsPerGroup;
  const uint32_t gy = u32(c.n_kv_heads) * n_gchunks;
  uint32_t n_chunks = std::max<uint32_t>((n_keys + kps - 1) / kps, 1);
  uint32_t cps = 1;
  const bool chunks_ok = !map || slot_chunks;
  if (chunks_ok && attn_split_chunks_) {
    cps = attn_split_chunks_;
  } else if (chunks_ok && gpu_device_ && !attn_split_keys_) {
    const uint32_t want = std::max<uint32_t>(1, attn_groups_ / (gy * u32(T)));
    if (n_chunks > want) {
      // Splits of several chunks: chunks of attn_chunk_keys_ (64) keys
      // (H200, decode after 32,768 tokens: 81.8 t/s, 67.8 with 32-key chunks).
      if (!map) {
        kps = std::min(attn_chunk_keys_, wg);
        n_chunks = std::max<uint32_t>((n_keys + kps - 1) / kps, 1);
      }
      cps = (n_chunks + want - 1) / want;
    }
  }
  const uint32_t n_dev = (n_chunks + cps - 1) / cps;
  const uint32_t n_splits = n_dev + extra_splits;
  uint32_t tpk = 1;
  while (tpk * 2 * std::min(kps, std::max<uint32_t>(n_keys, 1)) <= wg && tpk * 2 <= u32(hd / 2))
    tpk *= 2;
  const uint64_t part_bytes = n_splits > 1 ? static_cast<uint64_t>(T * n_heads) * n_splits *
                                                 static_cast<uint64_t>(hd + 2) * 4
                                           : 0;
  auto po = decode_inputs(part_bytes, pos, T, map);
  if (!po.ok()) {
    fail(po.status());
    return n_dev;
  }
  struct {
    uint32_t q_off, q_ld, o_off, o_ld, part_off, kc_off, kc_d_off, vc_off, vc_d_off, n_ctx, n_heads,
        n_kv_heads, head_dim, pos_off, n_splits;
    float scale;
    uint32_t kps, tpk, qo_off, qdo_off, map_off, map_keys, map_bs, cps;
  } pc{u32(q.offset / 4),
       u32(q.cols),
       u32(out.offset / 4),
       u32(out.cols),
       u32(scratch_.offset / 4),
       u32(ka.offset / 4),
       u32((ka.offset + s.quant_bytes(l)) / 4),
       u32(va.offset / 4),
       u32((va.offset + s.quant_bytes(l)) / 4),
       u32(s.rows(l)),
       u32(n_heads),
       u32(c.n_kv_heads),
       u32(hd),
       *po,
       n_splits,
       scale,
       kps,
       tpk,
       0,
       0,
       *po + u32(T),
       n_keys,
       map ? kps : 0,
       cps};
  static_assert(sizeof(pc) <= kPushBytes);
  const Bind part = part_bytes ? Bind{scratch_.block, scratch_.offset, part_bytes, true}
                               : Bind{ka.block, 0, 0, false};
  // One token with integer dots on: the output's Q8 copy for o, written by
  // whichever kernel writes the output (attn_split with one split, else attn_merge).
  const bool q8_out = attn_q8_out(out, n_heads, hd);
  if (q8_out && !part_bytes && wg % 8 == 0) {
    Xq8 copy;
    auto qo = xq8_out(out, &copy);
    if (!qo.ok()) {
      fail(qo.status());
      return n_dev;
    }
    pc.qo_off = copy.xq_off;
    pc.qdo_off = copy.xd_off;
    dispatch(typed("attn_split_q8", c.dtype, true, true), Spec{wg},
             {act_bind(q, false), Bind{ka.block, ka.offset, ka.size, false},
              Bind{va.block, va.offset, va.size, false}, act_bind(out, true),
              Bind{ring_.block, 0, 0, false}, part, *qo},
             &pc, sizeof(pc), n_dev, gy, u32(T));
    if (status_.ok()) xq8_ = copy;
    return n_dev;
  }
  dispatch(typed("attn_split", c.dtype, true, true), Spec{wg},
           {act_bind(q, false), Bind{ka.block, ka.offset, ka.size, false},
            Bind{va.block, va.offset, va.size, false},
            part_bytes ? Bind{static_cast<Block*>(out.buffer), out.offset, 0, false}
                       : act_bind(out, true),
            Bind{ring_.block, 0, 0, false}, part},
           &pc, sizeof(pc), n_dev, gy, u32(T));
  if (part_bytes && !keep_splits) attn_merge(out, n_heads, hd, n_splits, part_bytes, q8_out);
  return n_dev;
}

bool VulkanBackend::attention_decode_onepass(VkKvStorage& s, int64_t layer, Act q,
                                             const int32_t* pos, int64_t n_heads, float scale,
                                             Act out, uint32_t n_keys,
                                             const std::vector<int32_t>* map, uint32_t extra_splits,
                                             bool keep_splits, bool slot_chunks, uint32_t* n_dev) {
  const KvCacheConfig& c = s.cfg_;
  const auto l = static_cast<size_t>(layer);
  const int64_t T = q.rows, hd = c.head_dim;
  const Alloc& ka = s.k_[l];
  const Alloc& va = s.v_[l];
  const vk::DeviceCaps& dc = dev_->caps();
  const bool q8 = c.dtype == DType::kQ8_0;
  const uint64_t qb = s.quant_bytes(l);
  // (Without a map the test hooks' keys and chunks per split are attn_split's;
  // under one, chunks are slots per split for both kernels.)
  if (!attn_decode_ || (!map && (attn_split_keys_ || attn_split_chunks_)) || !dc.subgroup_shuffle ||
      (c.dtype != DType::kF16 && !q8) || hd % (q8 ? 32 : 8) != 0 || hd > kAttnDecodeMaxHeadDim ||
      ka.offset % 16 != 0 || va.offset % 16 != 0 || qb % 4 != 0 ||
      (!map && !attn_decode_always_ && n_keys <= kAttnOneSplitKeys))
    return false;
  // Lanes per key: one 16-byte segment of the row each (VS = 1: 8 halves, or
  // 16 of Q8_0's quants) where the subgroup has a lane for every segment,
  // else two (VS = 2, F16 rows).
  const uint32_t sg = dc.subgroup_size;
  const uint32_t wg = std::max<uint32_t>(kWgAttnDecode, sg);
  const uint32_t per_load = q8 ? 16 : 8;
  uint32_t vs = 0, lanes = 1;
  for (const uint32_t v : {1u, 2u}) {
    if (hd % (per_load * v) != 0 || (q8 && v > 1)) continue;
    uint32_t p = 1;
    while (p * per_load * v < hd) p *= 2;
    if (p <= sg) {
      vs = v;
      lanes = p;
      break;
    }
  }
  if (vs == 0 || wg > dc.max_wg_threads || wg / sg > kAttnDecodeMaxSubgroups) return false;
  // Splits: enough that the grid has about attn_decode_groups_ workgroups
  // (four per SM of an H100), of at least kAttnDecodeMinKeys keys. Under a
  // slot map (n_keys: all the slots' rows) a split takes whole slots: one
  // unless slot_chunks (a split's (m, l) is then its slot's block's share,
  // for the attention mass).
  const uint32_t group = u32(n_heads / c.n_kv_heads);
  const uint32_t gy = u32(c.n_kv_heads) * ((group + kAttnDecodeHeads - 1) / kAttnDecodeHeads);
  const uint32_t want = std::max<uint32_t>(1, attn_decode_groups_ / (gy * u32(T)));
  uint32_t chunk = std::max<uint32_t>(kAttnDecodeMinKeys, (n_keys + want - 1) / want);
  const uint32_t bs = map ? u32(c.block_size) : 0;
  if (map) {
    const uint32_t n_slots = u32(map->size());
    const uint32_t per = !slot_chunks         ? 1
                         : attn_split_chunks_ ? attn_split_chunks_
                                              : (n_slots + want - 1) / want;
    chunk = std::max<uint32_t>(per, 1) * bs;
  }
  const uint32_t n_dev_splits = (n_keys + chunk - 1) / chunk;
  const uint32_t n_splits = n_dev_splits + extra_splits;
  *n_dev = n_dev_splits;
  const uint64_t part_bytes =
      static_cast<uint64_t>(T * n_heads) * n_splits * static_cast<uint64_t>(hd + 2) * 4;
  auto po = decode_inputs(part_bytes, pos, T, map);
  if (!po.ok()) {
    fail(po.status());
    return true;
  }
  struct {
    uint32_t q_off, q_ld, part_off, k_off, v_off, kd_off, vd_off, n_ctx, n_heads, n_kv_heads,
        head_dim, pos_off, n_splits;
    float scale;
    uint32_t chunk, lanes, map_off, map_keys, map_bs;
  } pc{u32(q.offset / 4),
       u32(q.cols),
       u32(scratch_.offset / 4),
       u32(ka.offset / 16),
       u32(va.offset / 16),
       u32((ka.offset + qb) / 4),
       u32((va.offset + qb) / 4),
       u32(s.rows(l)),
       u32(n_heads),
       u32(c.n_kv_heads),
       u32(hd),
       *po,
       n_splits,
       scale,
       chunk,
       lanes,
       *po + u32(T),
       n_keys,
       bs};
  static_assert(sizeof(pc) <= kPushBytes);
  dispatch(
      plain(q8        ? "attn_decode_q8"
            : vs == 1 ? "attn_decode"
                      : "attn_decode_v2"),
      Spec{wg},
      {act_bind(q, false), Bind{ka.block, ka.offset, ka.size, false},
       Bind{va.block, va.offset, va.size, false},
       Bind{scratch_.block, scratch_.offset, part_bytes, true}, Bind{ring_.block, 0, 0, false}},
      &pc, sizeof(pc), n_dev_splits, gy, u32(T));
  if (!keep_splits)
    attn_merge(out, n_heads, hd, n_splits, part_bytes, attn_q8_out(out, n_heads, hd));
  return true;
}

Result<uint32_t> VulkanBackend::decode_inputs(uint64_t part_bytes, const int32_t* pos, int64_t T,
                                              const std::vector<int32_t>* map) {
  if (part_bytes) LOOM_TRY(ensure_scratch(part_bytes));
  if (!map) return put_ints(pos, T);
  std::vector<int32_t> ints(pos, pos + T);
  ints.insert(ints.end(), map->begin(), map->end());
  return put_ints(ints.data(), static_cast<int64_t>(ints.size()));
}

bool VulkanBackend::attn_q8_out(const Act& out, int64_t n_heads, int64_t hd) const {
  return int_dot_outputs_ && int_dot_ && dev_->caps().int_dot && out.rows == 1 && hd % 32 == 0 &&
         out.cols == n_heads * hd;
}

void VulkanBackend::attn_merge(Act out, int64_t n_heads, int64_t hd, uint32_t n_splits,
                               uint64_t part_bytes, bool q8_out) {
  struct {
    uint32_t part_off, o_off, o_ld, n_heads, head_dim, n_splits, qo_off, qdo_off;
  } mp{u32(scratch_.offset / 4),
       u32(out.offset / 4),
       u32(out.cols),
       u32(n_heads),
       u32(hd),
       n_splits,
       0,
       0};
  const Bind pb{scratch_.block, scratch_.offset, part_bytes, false};
  const uint32_t gz = u32((hd + 31) / 32);
  if (q8_out && hd % 32 == 0) {
    Xq8 copy;
    auto qo = xq8_out(out, &copy);
    if (!qo.ok()) return fail(qo.status());
    mp.qo_off = copy.xq_off;
    mp.qdo_off = copy.xd_off;
    dispatch(plain("attn_merge_q8", true), Spec{merge_wg_}, {pb, act_bind(out, true), *qo}, &mp,
             sizeof(mp), u32(n_heads), 1, gz);
    if (status_.ok()) xq8_ = copy;
    return;
  }
  dispatch(plain("attn_merge", true), Spec{merge_wg_}, {pb, act_bind(out, true)}, &mp, sizeof(mp),
           u32(n_heads), u32(out.rows), gz);
}

// The device's splits stay in the scratch ([row][split][m, l, o]; row = token
// x head); their (m, l) and q come to the host, which attends over the host
// blocks; its partial goes in as the last split, and attn_merge merges all.
Status VulkanBackend::attention_split(KvCache& kv, int64_t layer, Act q, const int32_t* pos,
                                      int64_t n_heads, float scale, Act out,
                                      const HostAttentionFn& host) {
  LOOM_TRY(status_);
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  if (!s || s->owner_ != this || s->layer_slots(layer) == 0)
    return make_error(ErrorCode::kInternal,
                      "Vulkan attention_split: layer %" PRId64 " is not in device slots here",
                      layer);
  if (!check_act(q, "attention") || !check_act(out, "attention")) return status_;
  const KvCacheConfig& c = s->cfg_;
  const int64_t T = q.rows, hd = c.head_dim, bs = c.block_size;
  if (!positions_in_range(pos, T, c.n_ctx, "attention")) return status_;
  int32_t max_pos = 0;
  for (int64_t t = 0; t < T; ++t) max_pos = std::max(max_pos, pos[t]);
  const int64_t n_blocks = max_pos / bs + 1;
  if (!kv.has_host_blocks(layer, n_blocks)) {  // all on the device: no host part
    attention(kv, layer, q, pos, n_heads, scale, out);
    return status_;
  }
  if (gathers(T, hd)) {  // prefill: host blocks go up once for all the rows
    Status g = attention_gathered(kv, *s, layer, q, pos, n_heads, scale, out);
    if (g.ok() || !status_.ok() || g.error().code() != ErrorCode::kOutOfMemory) return g;
    // No device memory to gather into: the split path below.
  }
  const std::vector<int32_t> map = kv.slot_positions(layer);
  const bool mass = kv.wants_mass(layer);
  std::vector<float> block_mass(mass ? static_cast<size_t>(n_blocks) : 0, 0.0f);
  const int64_t stride = hd + 2;
  const int64_t tn = attn_rows_per_group(n_heads, hd, map.size() + 1);
  std::vector<float> qh, dev_ml, host_ml, hpart;
  for (int64_t t0 = 0; t0 < T; t0 += tn) {
    const int64_t n = std::min(tn, T - t0), rows = n * n_heads;
    const Act qc = q.rows_view(t0, n), oc = out.rows_view(t0, n);
    const uint64_t q_bytes = static_cast<uint64_t>(n * q.cols) * 4;
    qh.resize(static_cast<size_t>(n * q.cols));
    // Without the attention mass nothing the host needs comes from the
    // device part: q comes down first, and the device part runs (submitted,
    // not waited for) while the CPU attends over the host blocks.
    const bool overlap = !mass;
    if (overlap) LOOM_TRY(download(qc, qh.data()));
    const uint32_t S =
        attention_decode(*s, layer, qc, pos + t0, n_heads, scale, oc, &map, 1, true, !mass);
    if (overlap) LOOM_TRY(submit_chunk());
    const uint32_t ns = S + 1;
    // q, and where the policy measures attention mass the (m, l) of each
    // device split, come to the host in one submission where the ring holds both.
    // The (m, l) come with the whole partials, in one copy: one region per
    // split (thousands per layer) cost more than the bytes (H200, 8B model
    // at 4096 tokens, half its KV in RAM: decode 7.6 t/s, 55.2 without mass).
    const uint64_t whole = static_cast<uint64_t>(rows) * ns * static_cast<uint64_t>(stride) * 4;
    const bool one_copy = whole <= ring_.size / 2;
    const uint64_t ml_bytes = !mass ? 0 : one_copy ? whole : static_cast<uint64_t>(rows) * S * 8;
    std::vector<float> split_ml(mass ? static_cast<size_t>(rows) * S * 2 : 0);
    auto take_ml = [&](uint64_t ml_off) {
      const uint8_t* m = ring_.block->mapped + ml_off;
      if (!one_copy) return std::memcpy(split_ml.data(), m, ml_bytes), void();
      for (int64_t r = 0; r < rows; ++r) {
        for (uint32_t sp = 0; sp < S; ++sp) {
          const uint64_t at = (static_cast<uint64_t>(r) * ns + sp) * static_cast<uint64_t>(stride);
          std::memcpy(&split_ml[(static_cast<size_t>(r) * S + sp) * 2], m + at * 4, 8);
        }
      }
    };
    auto copy_ml = [&](uint64_t ml_off) {
      if (one_copy) return copy_buffer(scratch_.block, scratch_.offset, ring_.block, ml_off, whole);
      std::vector<VkBufferCopy> regions;
      regions.reserve(static_cast<size_t>(rows) * S);
      for (int64_t r = 0; r < rows; ++r) {
        for (uint32_t sp = 0; sp < S; ++sp) {
          const uint64_t src =
              scratch_.offset +
              ((static_cast<uint64_t>(r) * ns + sp) * static_cast<uint64_t>(stride)) * 4;
          regions.push_back(VkBufferCopy{src, ml_off + (static_cast<uint64_t>(r) * S + sp) * 8, 8});
        }
      }
      copy_regions(scratch_.block, ring_.block, regions);
    };
    if (overlap) {
      // q is here; the device part is running.
    } else if (round256(ml_bytes) + round256(q_bytes) <= ring_.size) {
      LOOM_TRY(ring_reserve(round256(ml_bytes) + round256(q_bytes)));
      const uint64_t q_off = ring_put(nullptr, q_bytes);
      copy_buffer(static_cast<Block*>(qc.buffer), qc.offset, ring_.block, q_off, q_bytes);
      const uint64_t ml_off = ml_bytes ? ring_put(nullptr, ml_bytes) : 0;
      if (ml_bytes) copy_ml(ml_off);
      LOOM_TRY(flush());
      std::memcpy(qh.data(), ring_.block->mapped + q_off, q_bytes);
      if (ml_bytes) take_ml(ml_off);
    } else {
      if (ml_bytes) {
        LOOM_TRY(ring_reserve(ml_bytes));
        const uint64_t ml_off = ring_put(nullptr, ml_bytes);
        copy_ml(ml_off);
        LOOM_TRY(flush());
        take_ml(ml_off);
      }
      LOOM_TRY(download(qc, qh.data()));
    }
    // The device part's totals per row: M = max m_s, L = sum l_s e^(m_s - M)
    // (for the attention mass only).
    dev_ml.assign(mass ? static_cast<size_t>(rows) * 2 : 0, 0.0f);
    for (int64_t r = 0; mass && r < rows; ++r) {
      const float* sm = split_ml.data() + r * S * 2;
      float M = cpu::kAttnEmptyMax, L = 0.0f;
      for (uint32_t sp = 0; sp < S; ++sp) M = std::max(M, sm[2 * sp]);
      for (uint32_t sp = 0; sp < S; ++sp) L += sm[2 * sp + 1] * std::exp(sm[2 * sp] - M);
      dev_ml[static_cast<size_t>(2 * r)] = M;
      dev_ml[static_cast<size_t>(2 * r + 1)] = L;
    }
    hpart.assign(static_cast<size_t>(rows * stride), 0.0f);
    host(qh.data(), n, pos + t0, mass ? dev_ml.data() : nullptr, hpart.data(),
         mass ? block_mass.data() : nullptr, -1);
    if (mass) {  // each slot's share of the row's total, at its block
      for (int64_t r = 0; r < rows; ++r) {
        const float* h = hpart.data() + r * stride;
        const float Md = dev_ml[static_cast<size_t>(2 * r)],
                    Ld = dev_ml[static_cast<size_t>(2 * r + 1)];
        const float M = std::max(Md, h[0]);
        const float L = Ld * std::exp(Md - M) + h[1] * std::exp(h[0] - M);
        if (!(L > 0.0f)) continue;
        const float* sm = split_ml.data() + r * S * 2;
        for (uint32_t sp = 0; sp < S; ++sp) {
          if (map[sp] < 0) continue;
          const auto b = static_cast<size_t>(map[sp] / bs);
          if (b < block_mass.size()) block_mass[b] += sm[2 * sp + 1] * std::exp(sm[2 * sp] - M) / L;
        }
      }
    }
    // The host's partial as split S.
    const uint64_t hbytes = static_cast<uint64_t>(rows * stride) * 4;
    LOOM_TRY(ring_reserve(hbytes));
    const uint64_t h_off = ring_put(hpart.data(), hbytes);
    std::vector<VkBufferCopy> regions;
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t dst =
          scratch_.offset +
          ((static_cast<uint64_t>(r) * ns + S) * static_cast<uint64_t>(stride)) * 4;
      regions.push_back(VkBufferCopy{h_off + static_cast<uint64_t>(r * stride) * 4, dst,
                                     static_cast<uint64_t>(stride) * 4});
    }
    copy_regions(ring_.block, scratch_.block, regions);
    // (With the Q8 copy for o that the all-device path would write.)
    attn_merge(oc, n_heads, hd, ns,
               static_cast<uint64_t>(rows) * ns * static_cast<uint64_t>(stride) * 4,
               attn_q8_out(oc, n_heads, hd));
    LOOM_TRY(status_);
  }
  if (mass) kv.add_mass(layer, block_mass.data(), n_blocks);
  return status_;
}

}  // namespace loom
