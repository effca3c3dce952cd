#include "engine/runtime/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <new>
#include <vector>

namespace loom {

void KvCache::touch_host() {
  static std::atomic<uint64_t> last{0};
  host_epoch_ = last.fetch_add(1, std::memory_order_relaxed) + 1;
}

KvCache::KvCache(const KvCacheConfig& cfg) : cfg_(cfg) {
  touch_host();
  head_bytes_ = cpu::kv_head_bytes(cfg.dtype, cfg.block_size, cfg.head_dim);
  const auto L = static_cast<size_t>(cfg.n_layer);
  blocks_.resize(L);
  k_ptrs_.resize(L);
  v_ptrs_.resize(L);
  slot_.resize(L);
  mass_.resize(L);
  dev_slot_.resize(L);
  slot_block_.resize(L);
  n_dev_layers_ = cfg.n_layer;
  arena_ = std::make_unique<KvHostArena>(pair_bytes());
}

Result<std::unique_ptr<KvCache>> KvCache::create(const KvCacheConfig& cfg) {
  if (cfg.n_layer <= 0 || cfg.n_kv_heads <= 0 || cfg.head_dim <= 0 || cfg.n_ctx <= 0 ||
      cfg.block_size <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "KV cache: every size must be positive");
  }
  if (cfg.dtype != DType::kF16 && cfg.dtype != DType::kQ8_0) {
    return make_error(ErrorCode::kUnsupported, "KV cache: dtype %s is not supported (F16, Q8_0)",
                      std::string(dtype_name(cfg.dtype)).c_str());
  }
  if (cfg.dtype == DType::kQ8_0 && cfg.head_dim % 32 != 0) {
    return make_error(ErrorCode::kUnsupported,
                      "KV cache: Q8_0 needs a head size that is a multiple of 32 (got %" PRId64 ")",
                      cfg.head_dim);
  }
  return std::unique_ptr<KvCache>(new KvCache(cfg));
}

uint64_t KvCache::allocated_bytes() const {
  return (storage_ ? storage_->allocated_bytes() : 0) + n_ram_blocks_ * pair_bytes();
}

uint64_t KvCache::full_bytes() const {
  const uint64_t blocks =
      static_cast<uint64_t>((cfg_.n_ctx + cfg_.block_size - 1) / cfg_.block_size);
  return 2ull * block_bytes() * blocks * static_cast<uint64_t>(cfg_.n_layer);
}

void KvCache::point_at(size_t l, size_t b, uint8_t* kv_pair) {
  k_ptrs_[l][b] = kv_pair;
  v_ptrs_[l][b] = kv_pair ? kv_pair + block_bytes() : nullptr;
}

HostPair KvCache::new_pair(size_t l, bool zero) {
  if (storage_ && device_tiered(static_cast<int64_t>(l))) {
    if (uint8_t* p = storage_->alloc_host_pair(pair_bytes())) {
      if (zero) std::memset(p, 0, pair_bytes());
      return HostPair(p, HostPairFree{storage_.get()});
    }
  }
  if (uint8_t* p = arena_->alloc()) {
    if (zero) std::memset(p, 0, pair_bytes());
    return HostPair(p, HostPairFree{nullptr, arena_.get()});
  }
  return HostPair(zero ? new (std::nothrow) uint8_t[pair_bytes()]()
                       : new (std::nothrow) uint8_t[pair_bytes()]);
}

Status KvCache::grow_layer(size_t l, size_t n_blocks) {
  while (blocks_[l].size() < n_blocks) {
    HostPair kv = new_pair(l);
    if (!kv) {
      return make_error(ErrorCode::kOutOfMemory,
                        "KV cache: out of memory allocating block %zu of layer %zu (%" PRIu64
                        " bytes)",
                        blocks_[l].size(), l, pair_bytes());
    }
    k_ptrs_[l].push_back(nullptr);
    v_ptrs_[l].push_back(nullptr);
    point_at(l, blocks_[l].size(), kv.get());
    blocks_[l].push_back(std::move(kv));
    slot_[l].push_back(-1);
    mass_[l].push_back(0.0f);
    dev_slot_[l].push_back(-1);
    ++n_ram_blocks_;
  }
  return {};
}

void KvCache::free_layer(size_t l) {
  drain_prefetch();
  (void)settle_spill();  // (a failed write leaves its blocks in RAM, freed below)
  for (size_t b = 0; b < blocks_[l].size(); ++b) {
    if (blocks_[l][b]) --n_ram_blocks_;
    if (slot_[l][b] >= 0 && spill_) spill_->release(static_cast<uint32_t>(slot_[l][b]));
  }
  blocks_[l].clear();
  k_ptrs_[l].clear();
  v_ptrs_[l].clear();
  slot_[l].clear();
  mass_[l].clear();
  dev_slot_[l].clear();
  slot_block_[l].clear();
}

void KvCache::clear() {
  touch_host();
  n_tokens_ = 0;
  for (auto& m : mass_) std::fill(m.begin(), m.end(), 0.0f);  // the next tokens start afresh
}

Status KvCache::reserve(int64_t n) {
  touch_host();
  if (n > cfg_.n_ctx) {
    return make_error(ErrorCode::kOutOfRange,
                      "KV cache: %" PRId64 " tokens do not fit in the context of %" PRId64, n,
                      cfg_.n_ctx);
  }
  if (storage_) LOOM_TRY(storage_->reserve(n));  // layers that live on the device backend
  const int64_t need = (n + cfg_.block_size - 1) / cfg_.block_size;
  // New tokens must not go into a block whose write-behind is on the way
  // (after clear() or a rewind): that write is finished first.
  for (const auto& lb : behind_) {
    if (static_cast<int64_t>(lb.second) >= n_tokens_ / cfg_.block_size) {
      LOOM_TRY(settle_spill());
      break;
    }
  }
  if (tiered() && spill_full_ && need > static_cast<int64_t>(block_table_.size()) &&
      n_ram_blocks_ * pair_bytes() >= tiers_.ram_budget) {
    return make_error(ErrorCode::kNoSpace,
                      "KV cache: the RAM budget (%.1f MiB) is used up and the spill disk is "
                      "full (%s): the context ends at %" PRId64 " tokens",
                      static_cast<double>(tiers_.ram_budget) / 1048576.0, spill_note_.c_str(),
                      n_tokens_);
  }
  while (static_cast<int64_t>(block_table_.size()) < need) {
    block_table_.push_back(static_cast<int32_t>(block_table_.size()));
  }
  std::vector<std::pair<size_t, size_t>> back;  // spilled blocks that new tokens go into
  const auto first = static_cast<size_t>(n_tokens_ / cfg_.block_size);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (device_tiered(static_cast<int64_t>(l))) {
      LOOM_TRY(device_reserve(l, first, static_cast<size_t>(need)));
    } else if (on_device(static_cast<int64_t>(l))) {
      continue;
    } else {
      LOOM_TRY(grow_layer(l, block_table_.size()));
    }
    for (size_t b = first; b < block_table_.size(); ++b) {
      if (slot_[l][b] < 0) continue;
      // (During a recompute n_tokens_ is moved back, and later blocks still count.)
      if (recomputing_ || static_cast<int64_t>(b) * cfg_.block_size < n_tokens_) {
        back.emplace_back(l, b);  // holds tokens still in use: read it back
        continue;
      }
      drain_prefetch();                  // (its slot is released)
      LOOM_TRY(fresh_ram(l, b, false));  // holds only forgotten tokens: nothing to read
    }
  }
  if (!back.empty()) {
    LOOM_TRY(promote(back));
    if (!lost_.empty()) {
      return make_error(ErrorCode::kIo,
                        "KV cache: %zu spilled block(s) could not be read back; they are "
                        "recomputed from their tokens",
                        lost_.size());
    }
  }
  return {};
}

void KvCache::host_rows(size_t l, int64_t n, uint8_t* k, uint8_t* v, bool out) {
  const size_t rb = row_bytes();
  const auto H = static_cast<size_t>(cfg_.n_kv_heads);
  for (size_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      // V follows K in each block's allocation.
      const auto b = static_cast<size_t>(block_table_[static_cast<size_t>(t / cfg_.block_size)]);
      uint8_t* kr =
          blocks_[l][b].get() + h * head_bytes_ + static_cast<size_t>(t % cfg_.block_size) * rb;
      uint8_t* vr = kr + block_bytes();
      const size_t at = (h * static_cast<size_t>(n) + static_cast<size_t>(t)) * rb;
      if (out) {
        std::memcpy(k + at, kr, rb);
        std::memcpy(v + at, vr, rb);
      } else {
        std::memcpy(kr, k + at, rb);
        std::memcpy(vr, v + at, rb);
      }
    }
  }
}

Status KvCache::move_layer(int64_t layer, bool to_device) {
  touch_host();
  LOOM_TRY(settle_spill());
  if (!storage_)
    return make_error(ErrorCode::kInternal,
                      "KV cache: no device storage to move layer %" PRId64 " to or from", layer);
  if (layer < 0 || layer >= cfg_.n_layer)
    return make_error(ErrorCode::kInvalidArgument, "KV cache: no layer %" PRId64, layer);
  if (on_device(layer) == to_device) return {};
  const auto l = static_cast<size_t>(layer);
  if (to_device && tiers_.device_budget > 0) return layer_to_slots(l);
  if (!to_device && device_tiered(layer)) return layer_from_slots(l);
  if (to_device) LOOM_TRY(unspill_layer(l));  // every block in RAM first
  const int64_t n = n_tokens_;
  // Host rows [kv_head][n][row] of K and V: the KvStorage transfer format.
  std::vector<uint8_t> k(static_cast<size_t>(cfg_.n_kv_heads * n) * row_bytes()), v(k.size());
  if (to_device) {
    host_rows(l, n, k.data(), v.data(), true);
    LOOM_TRY(storage_->set_layer_resident(layer, true));
    Status s = storage_->reserve(static_cast<int64_t>(block_table_.size()) * cfg_.block_size);
    if (s.ok()) s = storage_->import_layer(layer, n, k.data(), v.data());
    if (!s.ok()) {
      (void)storage_->set_layer_resident(layer, false);
      return s;
    }
    free_layer(l);
    return {};
  }
  LOOM_TRY(storage_->export_layer(layer, n, k.data(), v.data()));
  Status s = grow_layer(l, block_table_.size());
  if (!s.ok()) {
    free_layer(l);
    return s;
  }
  host_rows(l, n, k.data(), v.data(), false);
  return storage_->set_layer_resident(layer, false);
}

Status KvCache::copy_prefix(KvCache& src, int64_t n) {
  const KvCacheConfig& a = src.cfg_;
  if (a.n_layer != cfg_.n_layer || a.n_kv_heads != cfg_.n_kv_heads || a.head_dim != cfg_.head_dim ||
      a.dtype != cfg_.dtype || a.block_size != cfg_.block_size)
    return make_error(ErrorCode::kInvalidArgument, "KV cache: copy_prefix between unlike caches");
  if (n < 0 || n > src.n_tokens_)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: copy_prefix of %" PRId64 " tokens, the source holds %" PRId64, n,
                      src.n_tokens_);
  if (tiered() || src.tiered())
    return make_error(ErrorCode::kUnsupported,
                      "KV cache: copy_prefix between caches with RAM/SSD or device tiers");
  n_tokens_ = 0;
  LOOM_TRY(reserve(n));
  std::vector<uint8_t> k(static_cast<size_t>(cfg_.n_kv_heads * n) * row_bytes()), v(k.size());
  for (int64_t layer = 0; layer < cfg_.n_layer; ++layer) {
    const auto l = static_cast<size_t>(layer);
    if (src.on_device(layer))
      LOOM_TRY(src.storage_->export_layer(layer, n, k.data(), v.data()));
    else
      src.host_rows(l, n, k.data(), v.data(), true);
    if (on_device(layer))
      LOOM_TRY(storage_->import_layer(layer, n, k.data(), v.data()));
    else
      host_rows(l, n, k.data(), v.data(), false);
  }
  n_tokens_ = n;
  return {};
}

void KvCache::store(int64_t layer, int64_t pos, const float* k, const float* v) {
  if (dev_slots_ > 0 && device_tiered(layer)) touch_host();  // a host block of a tiered layer
  const auto l = static_cast<size_t>(layer);
  const auto b = static_cast<size_t>(pos / cfg_.block_size);
  const int64_t row = pos % cfg_.block_size;
  const auto phys = static_cast<size_t>(block_table_[b]);
  if (recomputing_ &&
      std::find(recompute_.begin(), recompute_.end(), std::make_pair(l, phys)) == recompute_.end())
    return;  // intact: a recompute leaves it as it is
  uint8_t* kv = blocks_[l][phys].get();
  cpu::kv_store(cfg_.dtype, kv, head_bytes_, cfg_.n_kv_heads, cfg_.head_dim, row, k);
  cpu::kv_store(cfg_.dtype, kv + block_bytes(), head_bytes_, cfg_.n_kv_heads, cfg_.head_dim, row,
                v);
}

Status KvCache::attach_storage(std::unique_ptr<KvStorage> storage) {
  if (storage_)
    return make_error(ErrorCode::kInternal, "KV cache: device storage is already attached");
  storage_ = std::move(storage);
  return {};
}

cpu::KvView KvCache::view(int64_t layer) const {
  // Physical blocks are handed out in logical order for a single sequence, so
  // the per-layer pointer arrays are already in block-table order.
  cpu::KvView v;
  v.k_blocks = k_ptrs_[static_cast<size_t>(layer)].data();
  v.v_blocks = v_ptrs_[static_cast<size_t>(layer)].data();
  v.block_size = cfg_.block_size;
  v.n_kv_heads = cfg_.n_kv_heads;
  v.head_dim = cfg_.head_dim;
  v.head_stride_bytes = head_bytes_;
  v.dtype = cfg_.dtype;
  return v;
}

}  // namespace loom
