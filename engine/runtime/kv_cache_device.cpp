// KvCache's device tier (see kv_cache.h): blocks of layers whose attention
// runs on a device live in slots of the device storage, or in host blocks
// (RAM, and from there the SSD) once the slots are full. Moves happen between
// two steps: reserve() gives new blocks slots (taking the coldest unpinned
// block's when none is free), rebalance() brings pinned and hot host blocks
// up and sends cold ones down, ranked by the same KvTierPolicy as the RAM tier.
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <limits>
#include <new>

#include "engine/runtime/kv_cache.h"

namespace loom {

namespace {
// Most blocks brought onto the device in one rebalance (bounds the copies
// between two tokens; pinned blocks are not counted).
constexpr size_t kMaxDevicePromotions = 8;
}  // namespace

double KvCache::block_score(size_t l, size_t b) const {
  const KvBlockStats st{static_cast<int64_t>(l), static_cast<int64_t>(b), mass_[l][b]};
  return policy_ ? policy_->score(st) : static_cast<double>(b);
}

std::vector<int32_t> KvCache::slot_positions(int64_t layer) const {
  const auto& sb = slot_block_[static_cast<size_t>(layer)];
  size_t n = sb.size();
  while (n > 0 && sb[n - 1] < 0) --n;
  std::vector<int32_t> out(n, -1);
  for (size_t s = 0; s < n; ++s) {
    if (sb[s] >= 0) out[s] = static_cast<int32_t>(sb[s] * cfg_.block_size);
  }
  return out;
}

int64_t KvCache::device_row(int64_t layer, int64_t pos) const {
  const auto& ds = dev_slot_[static_cast<size_t>(layer)];
  const auto b = static_cast<size_t>(pos / cfg_.block_size);
  if (b >= ds.size() || ds[b] < 0) return -1;
  return static_cast<int64_t>(ds[b]) * cfg_.block_size + pos % cfg_.block_size;
}

bool KvCache::has_host_blocks(int64_t layer, int64_t n_blocks) const {
  const auto& ds = dev_slot_[static_cast<size_t>(layer)];
  const size_t n = std::min(ds.size(), static_cast<size_t>(std::max<int64_t>(n_blocks, 0)));
  return std::any_of(ds.begin(), ds.begin() + static_cast<ptrdiff_t>(n),
                     [](int32_t s) { return s < 0; });
}

cpu::KvView KvCache::host_view(int64_t layer, int64_t n_blocks, std::vector<int32_t>* blocks) {
  const auto l = static_cast<size_t>(layer);
  host_k_.clear();
  host_v_.clear();
  blocks->clear();
  const size_t n =
      std::min(dev_slot_[l].size(), static_cast<size_t>(std::max<int64_t>(n_blocks, 0)));
  for (size_t b = 0; b < n; ++b) {
    if (dev_slot_[l][b] >= 0) continue;
    host_k_.push_back(k_ptrs_[l][b]);
    host_v_.push_back(v_ptrs_[l][b]);
    blocks->push_back(static_cast<int32_t>(b));
  }
  cpu::KvView v = view(layer);
  v.k_blocks = host_k_.data();
  v.v_blocks = host_v_.data();
  return v;
}

int64_t KvCache::max_step_tokens() const {
  if (dev_slots_ == 0) return std::numeric_limits<int64_t>::max();
  const int64_t bs = cfg_.block_size;
  // Pinned: the sinks' blocks, the window's (plus one it may straddle), and
  // the partly filled block the step continues.
  const int64_t pinned =
      (tiers_.sink_tokens + bs - 1) / bs + (tiers_.window_tokens + bs - 1) / bs + 2;
  return std::max<int64_t>(dev_slots_ - pinned, 1) * bs;
}

Status KvCache::block_to_host(size_t l, size_t b, std::vector<KvStorage::KvRowsOut>* deferred) {
  const int32_t slot = dev_slot_[l][b];
  HostPair kv = new_pair(l);
  if (!kv) {
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache: out of memory moving block %zu of layer %zu off the device", b, l);
  }
  // A host block is K then V, each [kv_head][block_size][row]: the export format.
  const KvStorage::KvRowsOut rows{int64_t{slot} * cfg_.block_size, cfg_.block_size, kv.get(),
                                  kv.get() + block_bytes()};
  if (deferred)
    deferred->push_back(rows);
  else
    LOOM_TRY(storage_->export_rows(static_cast<int64_t>(l), rows.row0, rows.n, rows.k, rows.v));
  point_at(l, b, kv.get());
  blocks_[l][b] = std::move(kv);
  dev_slot_[l][b] = -1;
  slot_block_[l][static_cast<size_t>(slot)] = -1;
  ++n_ram_blocks_;
  ++n_to_host_;
  return {};
}

Status KvCache::block_to_device(size_t l, size_t b, size_t slot) {
  if (slot_[l][b] >= 0) {  // on the SSD: read it back first
    std::vector<std::pair<size_t, size_t>> one{{l, b}};
    LOOM_TRY(promote(one));
    if (!lost_.empty()) {
      return make_error(ErrorCode::kIo,
                        "KV cache: block %zu of layer %zu could not be read back from the spill "
                        "file; it is recomputed from its tokens",
                        b, l);
    }
  }
  const uint8_t* kv = blocks_[l][b].get();
  LOOM_TRY(storage_->import_rows(static_cast<int64_t>(l),
                                 static_cast<int64_t>(slot) * cfg_.block_size, cfg_.block_size, kv,
                                 kv + block_bytes()));
  blocks_[l][b].reset();
  point_at(l, b, nullptr);
  dev_slot_[l][b] = static_cast<int32_t>(slot);
  slot_block_[l][slot] = static_cast<int32_t>(b);
  --n_ram_blocks_;
  ++n_to_device_;
  return {};
}

Result<size_t> KvCache::take_slot(size_t l, size_t keep_from, size_t keep_to,
                                  std::vector<KvStorage::KvRowsOut>* deferred) {
  auto& sb = slot_block_[l];
  for (size_t s = 0; s < sb.size(); ++s) {
    if (sb[s] < 0) return s;
  }
  const auto keep = [&](size_t b) { return b >= keep_from && b < keep_to; };
  // A block holding only forgotten tokens (after clear() or a shorter
  // prompt) leaves without a copy: it is a block that was never written.
  for (size_t s = 0; s < sb.size(); ++s) {
    const auto b = static_cast<size_t>(sb[s]);
    if (keep(b) || static_cast<int64_t>(b) * cfg_.block_size < n_tokens_) continue;
    dev_slot_[l][b] = -1;
    mass_[l][b] = 0.0f;
    sb[s] = -1;
    return s;
  }
  // Else the coldest block that may leave: not pinned, not one the step writes.
  size_t best = sb.size();
  double best_score = 0;
  for (size_t s = 0; s < sb.size(); ++s) {
    const auto b = static_cast<size_t>(sb[s]);
    if (keep(b) || pinned(static_cast<int64_t>(b))) continue;
    const double sc = block_score(l, b);
    if (best == sb.size() || sc < best_score) {
      best = s;
      best_score = sc;
    }
  }
  if (best == sb.size()) {
    return make_error(ErrorCode::kNoSpace,
                      "KV cache: the device tier's %" PRId64
                      " blocks per layer (--kv-gpu) hold only the attention sinks, the newest "
                      "%" PRId64 " tokens and this step's: raise --kv-gpu",
                      dev_slots_, tiers_.window_tokens);
  }
  LOOM_TRY(block_to_host(l, static_cast<size_t>(sb[best]), deferred));
  return best;
}

Status KvCache::device_reserve(size_t l, size_t first, size_t need) {
  const size_t n = std::min(need, block_table_.size());
  while (blocks_[l].size() < block_table_.size()) {  // new blocks: no host memory yet
    blocks_[l].emplace_back();
    k_ptrs_[l].push_back(nullptr);
    v_ptrs_[l].push_back(nullptr);
    slot_[l].push_back(-1);
    mass_[l].push_back(0.0f);
    dev_slot_[l].push_back(-1);
  }
  // The evicted blocks' rows leave in one export (a prefill chunk evicts
  // one block per new block), before anything writes their slots.
  std::vector<KvStorage::KvRowsOut> evicted;
  auto export_evicted = [&]() -> Status {
    if (evicted.empty()) return {};
    Status s = storage_->export_blocks(static_cast<int64_t>(l), evicted);
    evicted.clear();
    return s;
  };
  for (size_t b = first; b < n; ++b) {
    if (dev_slot_[l][b] >= 0) continue;
    const bool holds_tokens = static_cast<int64_t>(b) * cfg_.block_size < n_tokens_;
    // A recompute writes lost host blocks where they are (store()).
    if (recomputing_ && (blocks_[l][b] || slot_[l][b] >= 0)) continue;
    auto taken = take_slot(l, first, n, &evicted);
    if (!taken.ok()) {
      (void)export_evicted();  // the blocks evicted so far keep their rows
      return taken.status();
    }
    const size_t slot = *taken;
    if (blocks_[l][b] || slot_[l][b] >= 0) {
      if (holds_tokens) {
        LOOM_TRY(export_evicted());  // the slot's old rows out before these go in
        LOOM_TRY(block_to_device(l, b, slot));
        continue;
      }
      // Only forgotten tokens: drop the host copy.
      drain_prefetch();
      if (slot_[l][b] >= 0) {
        spill_->release(static_cast<uint32_t>(slot_[l][b]));
        slot_[l][b] = -1;
      }
      if (blocks_[l][b]) --n_ram_blocks_;
      blocks_[l][b].reset();
      point_at(l, b, nullptr);
    }
    mass_[l][b] = 0.0f;
    dev_slot_[l][b] = static_cast<int32_t>(slot);
    slot_block_[l][slot] = static_cast<int32_t>(b);
  }
  return export_evicted();
}

Status KvCache::layer_to_slots(size_t l) {
  const auto layer = static_cast<int64_t>(l);
  const int64_t bs = cfg_.block_size;
  const int64_t n_layers = std::max<int64_t>(n_dev_layers_, 1);
  const int64_t slots = static_cast<int64_t>(
      std::min<uint64_t>(tiers_.device_budget / pair_bytes() / static_cast<uint64_t>(n_layers),
                         static_cast<uint64_t>((cfg_.n_ctx + bs - 1) / bs)));
  const int64_t need =
      (tiers_.sink_tokens + bs - 1) / bs + (tiers_.window_tokens + bs - 1) / bs + 3;
  if (slots < need) {
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: a device budget (--kv-gpu) of %" PRIu64
                      " KiB gives each of %" PRId64 " GPU layers %" PRId64
                      " blocks; the attention sinks, the newest %" PRId64
                      " tokens and a step need %" PRId64 " (%" PRIu64 " KiB in all)",
                      tiers_.device_budget >> 10, n_layers, slots, tiers_.window_tokens, need,
                      (static_cast<uint64_t>(need * n_layers) * pair_bytes()) >> 10);
  }
  LOOM_TRY(storage_->set_block_slots(bs, slots));
  LOOM_TRY(storage_->set_layer_resident(layer, true));
  if (storage_->layer_slots(layer) != slots) {
    (void)storage_->set_layer_resident(layer, false);
    return make_error(ErrorCode::kInternal, "KV cache: the device storage ignored its block slots");
  }
  dev_slots_ = slots;
  LOOM_TRY(grow_layer(l, block_table_.size()));  // every block a host block first
  slot_block_[l].assign(static_cast<size_t>(slots), -1);
  std::fill(dev_slot_[l].begin(), dev_slot_[l].end(), -1);
  // The pinned blocks come up now; hot ones at the next rebalance.
  const int64_t used = (n_tokens_ + bs - 1) / bs;
  size_t next = 0;
  for (int64_t b = 0; b < used; ++b) {
    if (!pinned(b)) continue;
    Status s = block_to_device(l, static_cast<size_t>(b), next++);
    if (!s.ok()) {
      (void)layer_from_slots(l);
      return s;
    }
  }
  return {};
}

Status KvCache::layer_from_slots(size_t l) {
  for (size_t b = 0; b < dev_slot_[l].size(); ++b) {
    if (dev_slot_[l][b] >= 0) LOOM_TRY(block_to_host(l, b));
  }
  slot_block_[l].clear();
  return storage_->set_layer_resident(static_cast<int64_t>(l), false);
}

Status KvCache::rebalance_device() {
  const int64_t used = (n_tokens_ + cfg_.block_size - 1) / cfg_.block_size;
  const double margin = policy_->promote_margin();
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (!device_tiered(static_cast<int64_t>(l))) continue;
    const size_t n = std::min(dev_slot_[l].size(), static_cast<size_t>(used));
    // Pinned host blocks come up first (after a new conversation reused the
    // blocks, or a layer moved onto the device). Only the sinks' blocks and
    // the window's (from a little before where it starts) can be pinned.
    const int64_t bs = cfg_.block_size;
    const auto sink_end = std::min(n, static_cast<size_t>((tiers_.sink_tokens + bs - 1) / bs));
    const auto window_from =
        std::min(n, static_cast<size_t>(
                        std::max<int64_t>(sink_end, (n_tokens_ - tiers_.window_tokens) / bs - 2)));
    auto bring_up = [&](size_t b) -> Status {
      if (dev_slot_[l][b] >= 0 || !pinned(static_cast<int64_t>(b))) return {};
      LOOM_ASSIGN_OR_RETURN(const size_t slot, take_slot(l, b, b + 1));
      return block_to_device(l, b, slot);
    };
    for (size_t b = 0; b < sink_end; ++b) LOOM_TRY(bring_up(b));
    for (size_t b = window_from; b < n; ++b) LOOM_TRY(bring_up(b));
    // Nothing to bring up without a host block; nothing can move without a
    // free slot where no swap is wanted (lru). Then no block is scored or
    // sorted (at 32k tokens, 2048 blocks a layer every step).
    if (std::none_of(dev_slot_[l].begin(), dev_slot_[l].begin() + static_cast<ptrdiff_t>(n),
                     [](int32_t s) { return s < 0; }))
      continue;
    size_t n_free =
        static_cast<size_t>(std::count(slot_block_[l].begin(), slot_block_[l].end(), -1));
    if (n_free == 0 && margin <= 0) continue;
    struct Cand {
      double score;
      size_t b;
    };
    std::vector<Cand> host, dev;
    for (size_t b = 0; b < n; ++b) {
      if (pinned(static_cast<int64_t>(b))) continue;
      (dev_slot_[l][b] >= 0 ? dev : host).push_back({block_score(l, b), b});
    }
    if (host.empty()) continue;
    std::sort(host.begin(), host.end(),
              [](const Cand& a, const Cand& b) { return a.score > b.score; });
    std::sort(dev.begin(), dev.end(),
              [](const Cand& a, const Cand& b) { return a.score < b.score; });
    size_t moved = 0, next_cold = 0;
    for (const Cand& hot : host) {
      if (moved >= kMaxDevicePromotions) break;
      if (n_free > 0) {  // a free slot takes the hottest host blocks as they are
        LOOM_ASSIGN_OR_RETURN(const size_t slot, take_slot(l, hot.b, hot.b + 1));
        LOOM_TRY(block_to_device(l, hot.b, slot));
        --n_free;
        ++moved;
        continue;
      }
      // Else a swap, where the host block clearly outranks the coldest on the device.
      if (margin <= 0 || next_cold >= dev.size()) break;
      const Cand& cold = dev[next_cold];
      if (hot.score <= cold.score * margin || hot.score <= 0) break;
      const auto slot = static_cast<size_t>(dev_slot_[l][cold.b]);
      LOOM_TRY(block_to_host(l, cold.b));
      LOOM_TRY(block_to_device(l, hot.b, slot));
      ++next_cold;
      ++moved;
    }
  }
  return {};
}

}  // namespace loom
