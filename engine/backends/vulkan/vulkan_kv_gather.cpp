// Prefill over a layer of the device KV tier (KvTierConfig::device_budget):
// the layer's blocks are gathered, by position, into one contiguous K/V pair
// on the device (slots by device-to-device copies, host blocks in RAM, or
// read back from the SSD, through the staging ring), and the tiled flash
// attention runs over it as over a layer that holds its whole context.
//
// Why: the split path (attention_split) has the CPU attend over the host
// blocks once per query row, which at thousands of rows per prefill chunk
// is the whole prefill's time. Gathered, a host block crosses PCIe once per
// chunk and serves every row of it; decode (one row) keeps the split path,
// where no block is copied to the GPU just to be read once.
#include <algorithm>
#include <cstring>

#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

Status VulkanBackend::ensure_gather(const VkKvStorage& s, int64_t rows) {
  if (rows <= gather_rows_) return status_;
  // Recorded work may still read the old pair.
  LOOM_TRY(flush());
  device_pool_->free(gather_k_);
  device_pool_->free(gather_v_);
  gather_k_ = gather_v_ = Alloc{};
  gather_rows_ = 0;
  const KvCacheConfig& c = s.cfg_;
  // Room to grow by a quarter before the next reallocation, within n_ctx.
  const int64_t want = std::min<int64_t>(
      (rows + rows / 4 + c.block_size - 1) / c.block_size * c.block_size, c.n_ctx + c.block_size);
  const uint64_t bytes = gather_quant_bytes(c, want) + gather_scale_bytes(c, want);
  LOOM_ASSIGN_OR_RETURN(gather_k_, device_pool_->alloc(bytes, "the KV gather buffer"));
  auto v = device_pool_->alloc(bytes, "the KV gather buffer");
  if (!v.ok()) {
    device_pool_->free(gather_k_);
    gather_k_ = Alloc{};
    return v.status();
  }
  gather_v_ = *v;
  gather_rows_ = want;
  return status_;
}

uint64_t VulkanBackend::gather_quant_bytes(const KvCacheConfig& c, int64_t rows) {
  const auto n = static_cast<uint64_t>(c.n_kv_heads * rows * c.head_dim);
  return c.dtype == DType::kF16 ? n * 2 : round256(n);
}

uint64_t VulkanBackend::gather_scale_bytes(const KvCacheConfig& c, int64_t rows) {
  return c.dtype == DType::kF16
             ? 0
             : static_cast<uint64_t>(c.n_kv_heads * rows * (c.head_dim / 32)) * 4;
}

Status VulkanBackend::attention_gathered(KvCache& kv, VkKvStorage& s, int64_t layer, Act q,
                                         const int32_t* pos, int64_t n_heads, float scale,
                                         Act out) {
  const KvCacheConfig& c = s.cfg_;
  const auto l = static_cast<size_t>(layer);
  const int64_t T = q.rows, hd = c.head_dim, bs = c.block_size, H = c.n_kv_heads;
  int32_t max_pos = 0;
  for (int64_t t = 0; t < T; ++t) max_pos = std::max(max_pos, pos[t]);
  const int64_t n_blocks = max_pos / bs + 1;
  LOOM_TRY(ensure_gather(s, n_blocks * bs));
  const bool f16 = c.dtype == DType::kF16;
  const uint64_t nb = static_cast<uint64_t>(hd / 32);
  const uint64_t q_row = f16 ? static_cast<uint64_t>(hd) * 2 : static_cast<uint64_t>(hd);
  const uint64_t d_row = f16 ? 0 : nb * 4;
  const auto G = static_cast<uint64_t>(gather_rows_);
  const uint64_t g_quant = gather_quant_bytes(c, gather_rows_);
  const Alloc& ka = s.k_[l];
  const Alloc& va = s.v_[l];
  const auto srows = static_cast<uint64_t>(s.rows(l));
  const uint64_t s_quant = s.quant_bytes(l);
  const auto ubs = static_cast<uint64_t>(bs);

  // 1. The blocks in device slots: device-to-device copies, per KV head.
  const std::vector<int32_t> map = kv.slot_positions(layer);
  std::vector<VkBufferCopy> rq, rd;
  for (size_t sp = 0; sp < map.size(); ++sp) {
    if (map[sp] < 0 || map[sp] / bs >= n_blocks) continue;
    const auto b = static_cast<uint64_t>(map[sp] / bs);
    for (uint64_t h = 0; h < static_cast<uint64_t>(H); ++h) {
      const uint64_t src = h * srows + sp * ubs, dst = h * G + b * ubs;
      rq.push_back(VkBufferCopy{src * q_row, dst * q_row, ubs * q_row});
      if (d_row)
        rd.push_back(VkBufferCopy{s_quant + src * d_row, g_quant + dst * d_row, ubs * d_row});
    }
  }
  for (int which = 0; which < 2; ++which) {
    const Alloc& src = which == 0 ? ka : va;
    const Alloc& dst = which == 0 ? gather_k_ : gather_v_;
    std::vector<VkBufferCopy> r = rq;
    r.insert(r.end(), rd.begin(), rd.end());
    for (VkBufferCopy& x : r) {
      x.srcOffset += src.offset;
      x.dstOffset += dst.offset;
    }
    copy_regions(src.block, dst.block, r);
  }

  // 2. The host blocks, through the ring: [kv_head][rows][row] in a block;
  //    Q8_0 rows split into quants and float scales as the shaders read them.
  std::vector<int32_t> blocks;
  const cpu::KvView hv = kv.host_view(layer, n_blocks, &blocks);
  const uint64_t per_block =
      2 * static_cast<uint64_t>(H) * (round256(ubs * q_row) + (d_row ? round256(ubs * d_row) : 0));
  std::vector<VkBufferCopy> to_k, to_v;
  auto emit = [&] {
    copy_regions(ring_.block, gather_k_.block, to_k);
    copy_regions(ring_.block, gather_v_.block, to_v);
    to_k.clear();
    to_v.clear();
  };
  for (size_t i = 0; i < blocks.size() && status_.ok(); ++i) {
    const auto b = static_cast<uint64_t>(blocks[i]);
    if (ring_used_ + per_block > ring_.size) emit();  // the ring flushes next: record them first
    LOOM_TRY(ring_reserve(per_block));
    for (int which = 0; which < 2; ++which) {
      const auto* blk = static_cast<const uint8_t*>(which == 0 ? hv.k_blocks[i] : hv.v_blocks[i]);
      const Alloc& dst = which == 0 ? gather_k_ : gather_v_;
      auto& regions = which == 0 ? to_k : to_v;
      for (uint64_t h = 0; h < static_cast<uint64_t>(H); ++h) {
        const uint8_t* src = blk + h * hv.head_stride_bytes;
        const uint64_t row = h * G + b * ubs;
        const uint64_t qo = ring_put(f16 ? src : nullptr, ubs * q_row);
        regions.push_back(VkBufferCopy{qo, dst.offset + row * q_row, ubs * q_row});
        if (f16) continue;
        const uint64_t d_o = ring_put(nullptr, ubs * d_row);
        q8_rows_to_device(src, ubs, static_cast<uint64_t>(hd), ring_.block->mapped + qo,
                          ring_.block->mapped + d_o);
        regions.push_back(VkBufferCopy{d_o, dst.offset + g_quant + row * d_row, ubs * d_row});
      }
    }
  }
  emit();
  LOOM_TRY(status_);

  // 3. Tiled flash attention over the gathered pair (row = position).
  attention_tile(q, pos, n_heads, scale, out, gather_k_, gather_v_, g_quant, gather_rows_, c);
  return status_;
}

}  // namespace loom
