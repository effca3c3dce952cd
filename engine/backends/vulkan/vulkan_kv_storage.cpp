// VulkanBackend and the KV cache: device KV storage (VkKvStorage, in
// vulkan_backend_impl.h), rows moved to and from the host's block format
// through the staging ring, and kv_store (into device rows or, under the
// device tier, device slots and host blocks).
#include <algorithm>
#include <cstring>

#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

constexpr int64_t kAttnMaxHeadDim = 256;  // HD_MAX in attn_split.comp

}  // namespace

Result<std::unique_ptr<KvStorage>> VulkanBackend::create_kv_storage(const KvCacheConfig& cfg) {
  if (cfg.dtype != DType::kF16 && cfg.dtype != DType::kQ8_0) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: KV cache type %s is not supported (f16, q8_0)",
                      std::string(dtype_name(cfg.dtype)).c_str());
  }
  if (cfg.head_dim % 2 || cfg.head_dim > kAttnMaxHeadDim ||
      (cfg.dtype == DType::kQ8_0 && cfg.head_dim % 32)) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: head size %" PRId64 " is not supported for a %s KV cache",
                      cfg.head_dim, std::string(dtype_name(cfg.dtype)).c_str());
  }
  // No layer is resident yet: the KvCache decides which live here (set_layer_resident).
  auto s = std::make_unique<VkKvStorage>(this, cfg);
  return std::unique_ptr<KvStorage>(std::move(s));
}

// ---- KV transfers -----------------------------------------------------------------

// Rows go through the staging ring in chunks of whole rows of one head; the
// conversion between the host row format and the device layout is done on
// the host while staged. F16 rows are the same bytes on both sides. A Q8_0
// host row is head_dim / 32 blocks of (fp16 d, 32 int8); the device keeps the
// quants of a row contiguous and the scales apart as floats holding fp16
// values, so fp16 -> float -> fp16 gives back the same bits.
Status VulkanBackend::kv_transfer(VkKvStorage& s, int64_t layer, int64_t row0, int64_t n,
                                  uint8_t* k_out, uint8_t* v_out, const uint8_t* k_in,
                                  const uint8_t* v_in) {
  const KvRows one{row0, n, k_out, v_out, k_in, v_in};
  return kv_transfer(s, layer, std::span<const KvRows>(&one, 1));
}

// Several row ranges of one layer, all out or all in: exports share their
// submissions (one, while the ring holds them all).
Status VulkanBackend::kv_transfer(VkKvStorage& s, int64_t layer, std::span<const KvRows> items) {
  LOOM_TRY(status_);
  if (items.empty()) return status_;
  const bool out = items[0].k_out != nullptr;
  const KvCacheConfig& c = s.cfg_;
  const bool f16 = c.dtype == DType::kF16;
  const auto hd = static_cast<uint64_t>(c.head_dim);
  const uint64_t nb = hd / 32;  // Q8_0 blocks per row
  const uint64_t host_row = f16 ? hd * 2 : nb * sizeof(ref::BlockQ8_0);
  const uint64_t q_row = f16 ? hd * 2 : hd;  // device bytes of a row's values
  const uint64_t d_row = f16 ? 0 : nb * 4;   // and of its scales
  const uint64_t limit = transfer_chunk_ ? std::min(transfer_chunk_, ring_.size) : ring_.size;
  const uint64_t chunk = std::max<uint64_t>(1, (limit > 512 ? limit - 512 : 0) / (q_row + d_row));
  const auto l = static_cast<size_t>(layer);
  const auto ctx = static_cast<uint64_t>(s.rows(l));

  // Export: chunks copied into the ring, converted once their submission ran.
  struct Staged {
    uint64_t q_off, d_off, n_tok;
    uint8_t* dst;
  };
  std::vector<Staged> staged;
  auto drain = [&]() -> Status {
    LOOM_TRY(flush());
    const uint8_t* m = ring_.block->mapped;
    for (const Staged& g : staged) {
      if (f16) {
        std::memcpy(g.dst, m + g.q_off, g.n_tok * host_row);
        continue;
      }
      for (uint64_t r = 0; r < g.n_tok; ++r) {
        for (uint64_t b = 0; b < nb; ++b) {
          float d;
          std::memcpy(&d, m + g.d_off + (r * nb + b) * 4, 4);
          ref::BlockQ8_0 blk;
          blk.d = ref::fp32_to_fp16(d);
          std::memcpy(blk.qs, m + g.q_off + r * hd + b * 32, 32);
          std::memcpy(g.dst + r * host_row + b * sizeof(blk), &blk, sizeof(blk));
        }
      }
    }
    staged.clear();
    return {};
  };

  for (const KvRows& it : items) {
    const auto un = static_cast<uint64_t>(it.n), r0 = static_cast<uint64_t>(it.row0);
    for (int which = 0; which < 2; ++which) {
      const Alloc& a = which == 0 ? s.k_[l] : s.v_[l];
      for (uint64_t h = 0; h < static_cast<uint64_t>(c.n_kv_heads); ++h) {
        for (uint64_t t0 = 0; t0 < un; t0 += chunk) {
          const uint64_t m = std::min(chunk, un - t0);
          const uint64_t row = h * ctx + r0 + t0;  // device row of token t0
          const uint64_t host = (h * un + t0) * host_row;
          const uint64_t qb = m * q_row, db = m * d_row;
          const uint64_t q_dev = a.offset + row * q_row,
                         d_dev = a.offset + s.quant_bytes(l) + row * d_row;
          if (out) {
            if (ring_used_ + round256(qb) + round256(db) > ring_.size) LOOM_TRY(drain());
            const uint64_t qo = ring_put(nullptr, qb), d_o = db ? ring_put(nullptr, db) : 0;
            copy_buffer(a.block, q_dev, ring_.block, qo, qb);
            if (db) copy_buffer(a.block, d_dev, ring_.block, d_o, db);
            staged.push_back(Staged{qo, d_o, m, (which == 0 ? it.k_out : it.v_out) + host});
          } else {
            // A flush here runs the copies out of the ring staged before.
            LOOM_TRY(ring_reserve(round256(qb) + round256(db)));
            const uint64_t qo = ring_put(nullptr, qb), d_o = db ? ring_put(nullptr, db) : 0;
            const uint8_t* src = (which == 0 ? it.k_in : it.v_in) + host;
            uint8_t* mp = ring_.block->mapped;
            if (f16) {
              std::memcpy(mp + qo, src, qb);
            } else {
              q8_rows_to_device(src, m, hd, mp + qo, mp + d_o);
            }
            copy_buffer(ring_.block, qo, a.block, q_dev, qb);
            if (db) copy_buffer(ring_.block, d_o, a.block, d_dev, db);
          }
          LOOM_TRY(status_);
        }
      }
    }
  }
  if (out && !staged.empty()) LOOM_TRY(drain());
  return status_;
}

void VulkanBackend::kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) {
  if (!status_.ok() || !check_act(k, "kv_store") || !check_act(v, "kv_store")) return;
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  if (!s || s->owner_ != this)
    return fail(
        make_error(ErrorCode::kInternal, "Vulkan kv_store: the KV cache is not on this GPU"));
  if (!s->layer_resident(layer)) return fail(not_resident(layer, "kv_store"));
  if (!positions_in_range(pos, k.rows, s->cfg_.n_ctx, "kv_store")) return;
  if (s->layer_slots(layer) == 0) return kv_store_rows(*s, layer, k, v, pos);
  // Device tier: tokens whose block has a slot go there; those whose block
  // is a host block (a recompute of a block lost on the SSD) are stored
  // by the cache, and while recomputing, blocks on the device stay as they are.
  std::vector<int32_t> rows(static_cast<size_t>(k.rows));
  bool to_host = false;
  for (int64_t t = 0; t < k.rows; ++t) {
    const int64_t r = kv.device_row(layer, pos[t]);
    rows[static_cast<size_t>(t)] = r < 0 ? -1 : kv.recomputing() ? -2 : static_cast<int32_t>(r);
    to_host |= r < 0;
  }
  for (int64_t t0 = 0; t0 < k.rows;) {  // runs of tokens stored on the device
    int64_t t1 = t0;
    while (t1 < k.rows && rows[static_cast<size_t>(t1)] >= 0) ++t1;
    if (t1 > t0)
      kv_store_rows(*s, layer, k.rows_view(t0, t1 - t0), v.rows_view(t0, t1 - t0),
                    rows.data() + t0);
    t0 = std::max(t1, t0 + 1);
  }
  if (!to_host) return;
  std::vector<float> kh(static_cast<size_t>(k.rows * k.cols)), vh(kh.size());
  Status st = download(k, kh.data());
  if (st.ok()) st = download(v, vh.data());
  if (!st.ok()) return fail(st);
  for (int64_t t = 0; t < k.rows; ++t) {
    if (rows[static_cast<size_t>(t)] == -1)
      kv.store(layer, pos[t], kh.data() + t * k.cols, vh.data() + t * k.cols);
  }
}

void VulkanBackend::kv_store_rows(VkKvStorage& s, int64_t layer, Act k, Act v,
                                  const int32_t* rows) {
  const KvCacheConfig& c = s.cfg_;
  const auto l = static_cast<size_t>(layer);
  if (!positions_in_range(rows, k.rows, s.rows(l), "kv_store")) return;
  auto po = put_ints(rows, k.rows);
  if (!po.ok()) return fail(po.status());
  const Alloc& ka = s.k_[l];
  const Alloc& va = s.v_[l];
  struct {
    uint32_t k_off, k_ld, v_off, v_ld, kc_off, kc_d_off, vc_off, vc_d_off, n_ctx, n_kv_heads,
        head_dim, pos_off;
  } pc{u32(k.offset / 4),  u32(k.cols),
       u32(v.offset / 4),  u32(v.cols),
       u32(ka.offset / 4), u32((ka.offset + s.quant_bytes(l)) / 4),
       u32(va.offset / 4), u32((va.offset + s.quant_bytes(l)) / 4),
       u32(s.rows(l)),     u32(c.n_kv_heads),
       u32(c.head_dim),    *po};
  const bool f16 = c.dtype == DType::kF16;
  const uint64_t items =
      static_cast<uint64_t>(c.n_kv_heads * (f16 ? c.head_dim / 2 : c.head_dim / 32));
  dispatch(typed("kv_store", c.dtype, false, false), Spec{kWgSmall},
           {act_bind(k, false), act_bind(v, false), Bind{ka.block, ka.offset, ka.size, true},
            Bind{va.block, va.offset, va.size, true}, Bind{ring_.block, 0, 0, false}},
           &pc, sizeof(pc), u32((items + kWgSmall - 1) / kWgSmall), u32(k.rows), 1);
}

}  // namespace loom
