// Paged KV cache: fixed-size blocks of tokens and a block table per sequence
// (the layout the GPU tiers reuse). One physical block id covers the same
// tokens in every layer; each layer has its own K and V storage per block.
// Within a block, keys are laid out [kv_head][row][head_dim] so one head's
// keys for the block are contiguous.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/ops.h"
#include "engine/backends/backend.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace loom {

struct KvCacheConfig {
  int64_t n_layer = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t n_ctx = 0;          ///< most tokens one sequence may hold
  int64_t block_size = 32;    ///< tokens per block
  DType dtype = DType::kF16;  ///< F16 or Q8_0 (head_dim a multiple of 32)
};

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  int64_t n_tokens() const { return n_tokens_; }
  int64_t capacity() const { return cfg_.n_ctx; }
  /// Bytes allocated now (blocks are allocated as the sequence grows).
  uint64_t allocated_bytes() const;
  /// Bytes the cache would take holding n_ctx tokens.
  uint64_t full_bytes() const;

  /// Makes room for tokens [0, n): allocates blocks as needed. Fails past n_ctx
  /// or when memory runs out, naming which.
  Status reserve(int64_t n);
  /// Sets how many tokens are valid (after a store, or to drop a tail).
  void set_n_tokens(int64_t n) { n_tokens_ = n; }
  /// Forgets every token (blocks stay allocated for reuse).
  void clear() { n_tokens_ = 0; }

  /// Stores one token's K and V ([n_kv_heads, head_dim] floats each) at position `pos`.
  void store(int64_t layer, int64_t pos, const float* k, const float* v);
  /// The view attention reads for a layer.
  cpu::KvView view(int64_t layer) const;

  /// Hands K/V storage to a device backend (Backend::create_kv_storage).
  /// Layers made resident in it (move_layer) live there: the backend's
  /// kv_store/attention work on them, store()/view() do not. The others stay
  /// in host blocks. Fails with kInternal when storage is already attached.
  Status attach_storage(std::unique_ptr<KvStorage> storage);
  /// The attached device storage, or null when every layer is in host blocks.
  KvStorage* storage() const { return storage_.get(); }
  /// Whether `layer`'s K/V live in the attached device storage.
  bool on_device(int64_t layer) const { return storage_ && storage_->layer_resident(layer); }
  /// Moves one layer's K/V, tokens and all, between host blocks and the
  /// attached storage (a placement moved its attention). Bytes are copied as
  /// they are (no requantization). Errors: no storage, out of memory on the
  /// way (the layer then stays where it was).
  Status move_layer(int64_t layer, bool to_device);

 private:
  explicit KvCache(const KvCacheConfig& cfg);
  size_t block_bytes() const { return head_bytes_ * static_cast<size_t>(cfg_.n_kv_heads); }
  size_t row_bytes() const { return head_bytes_ / static_cast<size_t>(cfg_.block_size); }
  // Allocates host blocks [have, n_blocks) of one layer.
  Status grow_layer(size_t l, size_t n_blocks);
  void free_layer(size_t l);

  KvCacheConfig cfg_;
  size_t head_bytes_ = 0;
  int64_t n_tokens_ = 0;
  std::vector<int32_t> block_table_;  ///< logical block -> physical block (the same in every layer)
  // Per layer: physical block -> storage; k_ptrs_/v_ptrs_ follow the block table.
  std::vector<std::vector<std::unique_ptr<uint8_t[]>>> k_store_, v_store_;
  std::vector<std::vector<const void*>> k_ptrs_, v_ptrs_;
  std::unique_ptr<KvStorage> storage_;  ///< device K/V (then no host blocks), or null
};

}  // namespace loom
