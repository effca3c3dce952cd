#include "engine/runtime/kv_cache.h"

#include <cinttypes>
#include <cstring>
#include <new>
#include <vector>

namespace loom {

KvCache::KvCache(const KvCacheConfig& cfg) : cfg_(cfg) {
  head_bytes_ = cpu::kv_head_bytes(cfg.dtype, cfg.block_size, cfg.head_dim);
  const auto L = static_cast<size_t>(cfg.n_layer);
  k_store_.resize(L);
  v_store_.resize(L);
  k_ptrs_.resize(L);
  v_ptrs_.resize(L);
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
  uint64_t b = storage_ ? storage_->allocated_bytes() : 0;
  for (const auto& layer : k_store_) b += 2ull * block_bytes() * layer.size();
  return b;
}

uint64_t KvCache::full_bytes() const {
  const uint64_t blocks =
      static_cast<uint64_t>((cfg_.n_ctx + cfg_.block_size - 1) / cfg_.block_size);
  return 2ull * block_bytes() * blocks * static_cast<uint64_t>(cfg_.n_layer);
}

Status KvCache::grow_layer(size_t l, size_t n_blocks) {
  while (k_store_[l].size() < n_blocks) {
    std::unique_ptr<uint8_t[]> k(new (std::nothrow) uint8_t[block_bytes()]);
    std::unique_ptr<uint8_t[]> v(new (std::nothrow) uint8_t[block_bytes()]);
    if (!k || !v) {
      return make_error(ErrorCode::kOutOfMemory,
                        "KV cache: out of memory allocating block %zu of layer %zu (%zu bytes)",
                        k_store_[l].size(), l, 2 * block_bytes());
    }
    k_ptrs_[l].push_back(k.get());
    v_ptrs_[l].push_back(v.get());
    k_store_[l].push_back(std::move(k));
    v_store_[l].push_back(std::move(v));
  }
  return {};
}

void KvCache::free_layer(size_t l) {
  k_store_[l].clear();
  v_store_[l].clear();
  k_ptrs_[l].clear();
  v_ptrs_[l].clear();
}

Status KvCache::reserve(int64_t n) {
  if (n > cfg_.n_ctx) {
    return make_error(ErrorCode::kOutOfRange,
                      "KV cache: %" PRId64 " tokens do not fit in the context of %" PRId64, n,
                      cfg_.n_ctx);
  }
  if (storage_) LOOM_TRY(storage_->reserve(n));  // layers that live on the device backend
  const int64_t need = (n + cfg_.block_size - 1) / cfg_.block_size;
  while (static_cast<int64_t>(block_table_.size()) < need) {
    block_table_.push_back(static_cast<int32_t>(block_table_.size()));
  }
  for (size_t l = 0; l < k_store_.size(); ++l) {
    if (!on_device(static_cast<int64_t>(l))) LOOM_TRY(grow_layer(l, block_table_.size()));
  }
  return {};
}

Status KvCache::move_layer(int64_t layer, bool to_device) {
  if (!storage_)
    return make_error(ErrorCode::kInternal,
                      "KV cache: no device storage to move layer %" PRId64 " to or from", layer);
  if (layer < 0 || layer >= cfg_.n_layer)
    return make_error(ErrorCode::kInvalidArgument, "KV cache: no layer %" PRId64, layer);
  if (on_device(layer) == to_device) return {};
  const auto l = static_cast<size_t>(layer);
  const int64_t n = n_tokens_;
  const size_t rb = row_bytes();
  const auto H = static_cast<size_t>(cfg_.n_kv_heads);
  // Host rows [kv_head][n][row] of K and V: the KvStorage transfer format.
  std::vector<uint8_t> k(H * static_cast<size_t>(n) * rb), v(k.size());
  auto row_at = [&](const std::vector<std::unique_ptr<uint8_t[]>>& blocks, size_t h, int64_t t) {
    const auto b = static_cast<size_t>(block_table_[static_cast<size_t>(t / cfg_.block_size)]);
    return blocks[b].get() + h * head_bytes_ + static_cast<size_t>(t % cfg_.block_size) * rb;
  };
  if (to_device) {
    for (size_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < n; ++t) {
        const size_t at = (h * static_cast<size_t>(n) + static_cast<size_t>(t)) * rb;
        std::memcpy(k.data() + at, row_at(k_store_[l], h, t), rb);
        std::memcpy(v.data() + at, row_at(v_store_[l], h, t), rb);
      }
    }
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
  for (size_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      const size_t at = (h * static_cast<size_t>(n) + static_cast<size_t>(t)) * rb;
      std::memcpy(row_at(k_store_[l], h, t), k.data() + at, rb);
      std::memcpy(row_at(v_store_[l], h, t), v.data() + at, rb);
    }
  }
  return storage_->set_layer_resident(layer, false);
}

void KvCache::store(int64_t layer, int64_t pos, const float* k, const float* v) {
  const auto l = static_cast<size_t>(layer);
  const auto b = static_cast<size_t>(pos / cfg_.block_size);
  const int64_t row = pos % cfg_.block_size;
  const auto phys = static_cast<size_t>(block_table_[b]);
  cpu::kv_store(cfg_.dtype, k_store_[l][phys].get(), head_bytes_, cfg_.n_kv_heads, cfg_.head_dim,
                row, k);
  cpu::kv_store(cfg_.dtype, v_store_[l][phys].get(), head_bytes_, cfg_.n_kv_heads, cfg_.head_dim,
                row, v);
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
