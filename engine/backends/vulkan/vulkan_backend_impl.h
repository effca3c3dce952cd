// Internals of the Vulkan backend shared by the files that define
// VulkanBackend (vulkan_backend.cpp and the vulkan_*.cpp beside it):
// constants and push-constant layouts more than one of them uses, and
// VkKvStorage, a KV cache's layers in device memory. Include it from those
// files only; constants one file uses stay in that file.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "engine/backends/vulkan/vulkan_backend.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

using vk::Alloc;
using vk::Block;

namespace {

constexpr uint32_t kMaxQueries = 4096;  // two per dispatch
constexpr uint32_t kPushBytes = 128;    // push constants every device takes
// Rows per row group of single-token matvecs, at most (NR_MAX in
// mul_mat_vec.comp; VulkanOptions::matvec_rows is clamped to it).
constexpr uint32_t kMatvecRowsMax = 4;
constexpr uint32_t kWgSmall = 64;

inline uint32_t u32(uint64_t v) {
  return static_cast<uint32_t>(v);
}

inline uint64_t round256(uint64_t v) {
  return (v + 255) / 256 * 256;
}

// An op on a layer whose K/V are in host blocks (or a layer that does not
// exist): the forward pass placed it wrong, and the shader must not run on
// memory that is not there.
inline Status not_resident(int64_t layer, const char* op) {
  return make_error(ErrorCode::kInternal,
                    "Vulkan %s: layer %" PRId64 " of the KV cache is not resident on the GPU", op,
                    layer);
}

// `rows` Q8_0 host rows (head_dim / 32 blocks of an fp16 scale and 32 int8)
// in the device layout: each row's quants contiguous at `q`, its scales as
// floats holding the fp16 values at `d`.
inline void q8_rows_to_device(const uint8_t* src, uint64_t rows, uint64_t hd, uint8_t* q,
                              uint8_t* d) {
  const uint64_t nb = hd / 32, host_row = nb * sizeof(ref::BlockQ8_0);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t b = 0; b < nb; ++b) {
      ref::BlockQ8_0 blk;
      std::memcpy(&blk, src + r * host_row + b * sizeof(blk), sizeof(blk));
      const float s = ref::fp16_to_fp32(blk.d);
      std::memcpy(d + (r * nb + b) * 4, &s, 4);
      std::memcpy(q + r * hd + b * 32, blk.qs, 32);
    }
  }
}

// " MxK", appended to a matvec's profile label so each weight shape is timed apart.
inline std::string shape_tag(uint32_t M, int64_t K) {
  char b[48];
  std::snprintf(b, sizeof b, " %ux%lld", M, static_cast<long long>(K));
  return b;
}

// Push constants of mul_mat_vec.comp and mul_mat.comp (PC there). The last
// three are the up matrix of matvec1_glu; the other variants ignore them.
struct MatvecPush {
  uint32_t w_off, w_off2, row0, row_units, K, M, N, x_off, x_ld, y_off, y_ld, b_off, flags;
  uint32_t w_off_b = 0, w_off2_b = 0, row0_b = 0;
  uint32_t w_off_c = 0, w_off2_c = 0, m_a = 0, m_b = 0, y_off_b = 0, y_off_c = 0;
  uint32_t cnt_off = 0;              // matvec1x_glu_q8: the blocks' arrival counters
  uint32_t qo_off = 0, qdo_off = 0;  // matvec1x_glu_q8: y's Q8 copy (words, vec2s)
  uint32_t pad[5] = {0, 0, 0, 0, 0};
  uint32_t xq_off = 0, xd_off = 0;  // matvec1x: x's Q8 copy (words, vec2s)
};
static_assert(sizeof(MatvecPush) <= kPushBytes);

}  // namespace

/// One KV cache's layers in device memory: per resident layer a K and a V
/// allocation of [n_kv_heads][rows][head_dim] (F16 words, or Q8_0 quants
/// then scales), rows = n_ctx (row = position), or, under the device tier,
/// slots * block_size (row = slot * block_size + position % block_size, the
/// KvCache says which block is in which slot). Layers not resident hold
/// nothing (the KvCache keeps them in host blocks).
class VkKvStorage final : public KvStorage {
 public:
  VkKvStorage(VulkanBackend* owner, const KvCacheConfig& cfg)
      : owner_(owner),
        cfg_(cfg),
        k_(static_cast<size_t>(cfg.n_layer)),
        v_(static_cast<size_t>(cfg.n_layer)),
        slots_(static_cast<size_t>(cfg.n_layer), 0) {}
  ~VkKvStorage() override {
    for (auto& a : k_) owner_->device_pool_->free(a);
    for (auto& a : v_) owner_->device_pool_->free(a);
  }
  Status reserve(int64_t n) override {
    // Resident layers hold n_ctx rows from the start (set_layer_resident).
    if (n > cfg_.n_ctx)
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache: %" PRId64 " tokens exceed %" PRId64, n, cfg_.n_ctx);
    return {};
  }
  uint64_t allocated_bytes() const override {
    uint64_t b = 0;
    for (const auto& a : k_) b += a.size;
    for (const auto& a : v_) b += a.size;
    return b;
  }
  bool layer_resident(int64_t layer) const override {
    return layer >= 0 && layer < cfg_.n_layer && k_[static_cast<size_t>(layer)];
  }
  Status set_layer_resident(int64_t layer, bool resident) override {
    LOOM_TRY(check_layer(layer, "set_layer_resident"));
    const auto l = static_cast<size_t>(layer);
    if (resident == static_cast<bool>(k_[l])) return {};
    if (!resident) {
      // Recorded work may still read or write the layer: run it first.
      Status st = owner_->flush();
      owner_->device_pool_->free(k_[l]);
      owner_->device_pool_->free(v_[l]);
      k_[l] = v_[l] = Alloc{};
      slots_[l] = 0;
      return st;
    }
    slots_[l] = new_slots_;
    LOOM_ASSIGN_OR_RETURN(Alloc k, owner_->device_pool_->alloc(layer_bytes(l), "the KV cache"));
    auto v = owner_->device_pool_->alloc(layer_bytes(l), "the KV cache");
    if (!v.ok()) {
      owner_->device_pool_->free(k);
      slots_[l] = 0;
      return v.status();
    }
    k_[l] = k;
    v_[l] = *v;
    return {};
  }
  Status set_block_slots(int64_t block_size, int64_t n_slots) override {
    if (block_size <= 0 || n_slots <= 0 || n_slots * block_size > cfg_.n_ctx + block_size)
      return make_error(ErrorCode::kInvalidArgument,
                        "Vulkan KV cache: %" PRId64 " slots of %" PRId64
                        " rows do not fit a context of %" PRId64,
                        n_slots, block_size, cfg_.n_ctx);
    block_size_ = block_size;
    new_slots_ = n_slots;
    return {};
  }
  int64_t layer_slots(int64_t layer) const override {
    return layer_resident(layer) ? slots_[static_cast<size_t>(layer)] : 0;
  }
  Status export_rows(int64_t layer, int64_t row0, int64_t n, uint8_t* k, uint8_t* v) override {
    LOOM_TRY(check_rows(layer, row0, n, "export_rows"));
    return owner_->kv_transfer(*this, layer, row0, n, k, v, nullptr, nullptr);
  }
  Status export_blocks(int64_t layer, std::span<const KvRowsOut> items) override {
    std::vector<VulkanBackend::KvRows> rows;
    rows.reserve(items.size());
    for (const KvRowsOut& it : items) {
      LOOM_TRY(check_rows(layer, it.row0, it.n, "export_blocks"));
      rows.push_back(VulkanBackend::KvRows{it.row0, it.n, it.k, it.v, nullptr, nullptr});
    }
    return owner_->kv_transfer(*this, layer, rows);
  }
  Status import_rows(int64_t layer, int64_t row0, int64_t n, const uint8_t* k,
                     const uint8_t* v) override {
    LOOM_TRY(check_rows(layer, row0, n, "import_rows"));
    return owner_->kv_transfer(*this, layer, row0, n, nullptr, nullptr, k, v);
  }
  Status check_rows(int64_t layer, int64_t row0, int64_t n, const char* op) const {
    LOOM_TRY(check_transfer(layer, 0, op));
    if (row0 < 0 || n < 0 || row0 + n > rows(static_cast<size_t>(layer))) {
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache %s: rows %" PRId64 "..%" PRId64 " of a layer of %" PRId64,
                        op, row0, row0 + n, rows(static_cast<size_t>(layer)));
    }
    return {};
  }
  /// Rows per KV head of layer l: its row stride in the shaders.
  int64_t rows(size_t l) const { return slots_[l] ? slots_[l] * block_size_ : cfg_.n_ctx; }
  Status export_layer(int64_t layer, int64_t n, uint8_t* k, uint8_t* v) override {
    LOOM_TRY(check_transfer(layer, n, "export_layer"));
    return owner_->kv_transfer(*this, layer, 0, n, k, v, nullptr, nullptr);
  }
  Status import_layer(int64_t layer, int64_t n, const uint8_t* k, const uint8_t* v) override {
    LOOM_TRY(check_transfer(layer, n, "import_layer"));
    return owner_->kv_transfer(*this, layer, 0, n, nullptr, nullptr, k, v);
  }

  Status check_layer(int64_t layer, const char* op) const {
    if (layer < 0 || layer >= cfg_.n_layer) {
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache %s: layer %" PRId64 " does not exist (%" PRId64 " layers)",
                        op, layer, cfg_.n_layer);
    }
    return {};
  }
  Status check_transfer(int64_t layer, int64_t n, const char* op) const {
    LOOM_TRY(check_layer(layer, op));
    if (!k_[static_cast<size_t>(layer)]) {
      return make_error(ErrorCode::kInternal,
                        "Vulkan KV cache %s: layer %" PRId64 " is not resident on the GPU", op,
                        layer);
    }
    if (n < 0 || n > rows(static_cast<size_t>(layer))) {
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache %s: %" PRId64 " tokens (the cache holds %" PRId64 ")", op,
                        n, cfg_.n_ctx);
    }
    return {};
  }
  /// Bytes of the quants of layer l's K (or V); the Q8_0 scales follow at this offset.
  uint64_t quant_bytes(size_t l) const {
    const auto rows = static_cast<uint64_t>(cfg_.n_kv_heads * this->rows(l));
    const auto hd = static_cast<uint64_t>(cfg_.head_dim);
    return cfg_.dtype == DType::kF16 ? rows * hd * 2 : (rows * hd + 255) / 256 * 256;
  }
  uint64_t layer_bytes(size_t l) const {
    const auto rows = static_cast<uint64_t>(cfg_.n_kv_heads * this->rows(l));
    return cfg_.dtype == DType::kF16
               ? quant_bytes(l)
               : quant_bytes(l) + rows * static_cast<uint64_t>(cfg_.head_dim / 32) * 4;
  }

  VulkanBackend* owner_;
  KvCacheConfig cfg_;
  std::vector<Alloc> k_, v_;                ///< per layer; empty when the layer is not resident
  std::vector<int64_t> slots_;              ///< per resident layer: its slots (0: n_ctx rows)
  int64_t block_size_ = 0, new_slots_ = 0;  ///< set_block_slots()
};

}  // namespace loom
