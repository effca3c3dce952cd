// CudaKvStorage: the K/V of the layers whose attention runs on the GPU, one
// device allocation per resident layer for K and one for V, each
// [n_kv_heads][capacity][row]. Rows are the host cache's rows byte for byte
// (F16 values, or Q8_0 blocks), so export/import are strided copies.
//
// The device KV tier: a layer made resident after set_block_slots(bs, n)
// holds n * bs rows per KV head (its slots) for good; reserve() grows only
// the layers that hold whole contexts. export_rows/import_rows move one
// block's rows (every head) between a slot and the host block format.
//
// Host blocks of the tiered layers (alloc_host_pair) come from slabs of
// mapped pinned memory, so the decode attention reads them over PCIe where
// they lie (cuda_kv_tier.cpp); LOOM_CUDA_KV_HOST=cpu gives none out, and the
// CPU attends over the host blocks instead (the path before 2026-12-06).
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/backends/cuda/cuda_util.h"

namespace loom::cuda {

namespace {

std::atomic<uint64_t> g_slabs_freed{0};  // CudaKvStorage::slabs_freed

constexpr int64_t kMinCapacity = 256;  // tokens a layer first has room for
// Pinned slabs for host blocks: the first of 16 MiB, each next twice the
// last, up to 256 MiB.
constexpr uint64_t kFirstSlab = 16ull << 20, kMostSlab = 256ull << 20;

bool host_pairs_mapped() {
  static const bool on = [] {
    const char* e = std::getenv("LOOM_CUDA_KV_HOST");
    return !(e && std::strcmp(e, "cpu") == 0);
  }();
  return on;
}

class KvStorageImpl final : public CudaKvStorage {
 public:
  KvStorageImpl(const KvCacheConfig& cfg, cudaStream_t stream, DeviceBudget* budget,
                uint64_t row_bytes)
      : cfg_(cfg),
        stream_(stream),
        budget_(budget),
        row_bytes_(row_bytes),
        k_(static_cast<size_t>(cfg.n_layer), nullptr),
        v_(static_cast<size_t>(cfg.n_layer), nullptr),
        slots_(static_cast<size_t>(cfg.n_layer), 0) {}
  ~KvStorageImpl() override {
    (void)cudaStreamSynchronize(stream_);
    for (size_t l = 0; l < k_.size(); ++l) free_layer(l);
    if (slabs_.empty()) return;
    // A copy out of a slab may still run on another stream (the backend's
    // read-ahead of host blocks).
    (void)cudaDeviceSynchronize();
    for (const Slab& sl : slabs_) (void)cudaFreeHost(sl.host);
    g_slabs_freed.fetch_add(slabs_.size());
  }

  uint8_t* alloc_host_pair(uint64_t bytes) override {
    if (!host_pairs_mapped() || bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(host_mu_);
    if (pair_bytes_ != 0 && bytes != pair_bytes_) return nullptr;  // one size per cache
    pair_bytes_ = bytes;
    if (free_pairs_.empty() && !grow_slabs()) return nullptr;
    uint8_t* p = free_pairs_.back();
    free_pairs_.pop_back();
    return p;
  }

  void free_host_pair(uint8_t* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(host_mu_);
    free_pairs_.push_back(p);
  }

  const uint8_t* mapped(const void* host) const override {
    const auto* h = static_cast<const uint8_t*>(host);
    std::lock_guard<std::mutex> lock(host_mu_);
    for (const Slab& sl : slabs_) {
      if (h >= sl.host && h < sl.host + sl.bytes) return sl.dev + (h - sl.host);
    }
    return nullptr;
  }

  Status reserve(int64_t n) override {
    // The KvCache checks n against n_ctx; it may ask for whole blocks past
    // it (move_layer), which need no room here.
    if (n > cfg_.n_ctx) n = cfg_.n_ctx;
    if (n <= capacity_) return {};
    int64_t cap = capacity_ * 2 > n ? capacity_ * 2 : n;
    if (cap < kMinCapacity) cap = kMinCapacity;
    if (cap > cfg_.n_ctx) cap = cfg_.n_ctx;
    // New allocations for every resident layer first, so that a failure
    // leaves the cache as it was.
    std::vector<std::pair<void*, void*>> fresh(k_.size(), {nullptr, nullptr});
    const uint64_t bytes = layer_bytes(cap);
    Status st;
    for (size_t l = 0; l < k_.size() && st.ok(); ++l) {
      if (k_[l] && slots_[l] == 0) st = alloc_pair(bytes, &fresh[l].first, &fresh[l].second);
    }
    if (!st.ok()) {
      for (auto& [k, v] : fresh) {
        if (!k) continue;
        (void)cudaFree(k);
        (void)cudaFree(v);
        if (budget_) budget_->give(2 * bytes);
      }
      return st;
    }
    const uint64_t old_pitch = static_cast<uint64_t>(capacity_) * row_bytes_;
    const uint64_t new_pitch = static_cast<uint64_t>(cap) * row_bytes_;
    for (size_t l = 0; l < k_.size(); ++l) {
      if (!fresh[l].first) continue;
      if (capacity_ > 0) {
        LOOM_CUDA_TRY(cudaMemcpy2DAsync(fresh[l].first, new_pitch, k_[l], old_pitch, old_pitch,
                                        static_cast<size_t>(cfg_.n_kv_heads),
                                        cudaMemcpyDeviceToDevice, stream_),
                      "KV cache growth (K)");
        LOOM_CUDA_TRY(cudaMemcpy2DAsync(fresh[l].second, new_pitch, v_[l], old_pitch, old_pitch,
                                        static_cast<size_t>(cfg_.n_kv_heads),
                                        cudaMemcpyDeviceToDevice, stream_),
                      "KV cache growth (V)");
      }
    }
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "KV cache growth");
    for (size_t l = 0; l < k_.size(); ++l) {
      if (!fresh[l].first) continue;
      free_layer(l);
      k_[l] = fresh[l].first;
      v_[l] = fresh[l].second;
    }
    capacity_ = cap;
    return {};
  }

  uint64_t allocated_bytes() const override {
    uint64_t b = 0;
    for (size_t l = 0; l < k_.size(); ++l)
      if (k_[l]) b += 2 * layer_bytes(rows(l));
    return b;
  }

  bool layer_resident(int64_t layer) const override {
    return layer >= 0 && layer < cfg_.n_layer && k_[static_cast<size_t>(layer)] != nullptr;
  }

  Status set_layer_resident(int64_t layer, bool resident) override {
    LOOM_TRY(check_layer(layer, "set_layer_resident"));
    const auto l = static_cast<size_t>(layer);
    if (resident == (k_[l] != nullptr)) return {};
    if (!resident) {
      // Queued kernels may still read or write the layer.
      const cudaError_t e = cudaStreamSynchronize(stream_);
      free_layer(l);
      slots_[l] = 0;
      return cuda_status(e, "KV cache release");
    }
    if (capacity_ == 0) capacity_ = kMinCapacity < cfg_.n_ctx ? kMinCapacity : cfg_.n_ctx;
    slots_[l] = pending_slots_;
    const uint64_t bytes = layer_bytes(rows(l));
    void *k = nullptr, *v = nullptr;
    Status st = alloc_pair(bytes, &k, &v);
    if (!st.ok()) {
      slots_[l] = 0;
      return st;
    }
    k_[l] = k;
    v_[l] = v;
    // Defined contents (zeros) until rows are stored or imported.
    LOOM_CUDA_TRY(cudaMemsetAsync(k, 0, bytes, stream_), "KV cache clear");
    LOOM_CUDA_TRY(cudaMemsetAsync(v, 0, bytes, stream_), "KV cache clear");
    return {};
  }

  Status export_layer(int64_t layer, int64_t n, uint8_t* k, uint8_t* v) override {
    LOOM_TRY(check_transfer(layer, n, "export_layer"));
    if (n == 0) return {};
    LOOM_TRY(copy_rows(layer, 0, n, k, v, false));
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "KV export");
    return {};
  }

  Status import_layer(int64_t layer, int64_t n, const uint8_t* k, const uint8_t* v) override {
    LOOM_TRY(check_transfer(layer, n, "import_layer"));
    if (n == 0) return {};
    LOOM_TRY(copy_rows(layer, 0, n, const_cast<uint8_t*>(k), const_cast<uint8_t*>(v), true));
    // The caller may free its rows when this returns.
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "KV import");
    return {};
  }

  Status set_block_slots(int64_t block_size, int64_t n_slots) override {
    if (block_size <= 0 || n_slots <= 0 || block_size * n_slots > cfg_.n_ctx + block_size)
      return make_error(ErrorCode::kInvalidArgument,
                        "CUDA KV cache: %" PRId64 " slots of %" PRId64 " rows (context %" PRId64
                        ")",
                        n_slots, block_size, cfg_.n_ctx);
    pending_slots_ = n_slots;
    block_size_ = block_size;
    return {};
  }

  int64_t layer_slots(int64_t layer) const override {
    return layer_resident(layer) ? slots_[static_cast<size_t>(layer)] : 0;
  }

  Status export_rows(int64_t layer, int64_t row0, int64_t n, uint8_t* k, uint8_t* v) override {
    const KvRowsOut one{row0, n, k, v};
    return export_blocks(layer, std::span<const KvRowsOut>(&one, 1));
  }

  Status export_blocks(int64_t layer, std::span<const KvRowsOut> items) override {
    for (const KvRowsOut& it : items) LOOM_TRY(copy_rows(layer, it.row0, it.n, it.k, it.v, false));
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "KV export");
    return {};
  }

  Status import_rows(int64_t layer, int64_t row0, int64_t n, const uint8_t* k,
                     const uint8_t* v) override {
    LOOM_TRY(copy_rows(layer, row0, n, const_cast<uint8_t*>(k), const_cast<uint8_t*>(v), true));
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "KV import");
    return {};
  }

  DevKvLayer layer(int64_t l) const override {
    DevKvLayer d;
    d.dtype = cfg_.dtype;
    d.n_kv_heads = cfg_.n_kv_heads;
    d.head_dim = cfg_.head_dim;
    d.capacity = layer_resident(l) ? rows(static_cast<size_t>(l)) : capacity_;
    d.row_bytes = row_bytes_;
    if (layer_resident(l)) {
      d.k = k_[static_cast<size_t>(l)];
      d.v = v_[static_cast<size_t>(l)];
    }
    return d;
  }

 private:
  uint64_t layer_bytes(int64_t cap) const {
    return static_cast<uint64_t>(cfg_.n_kv_heads) * static_cast<uint64_t>(cap) * row_bytes_;
  }
  Status alloc_pair(uint64_t bytes, void** k, void** v) {
    if (budget_) LOOM_TRY(budget_->take(2 * bytes, "the KV cache"));
    Status st = device_alloc(k, bytes, "the KV cache (K)");
    if (st.ok()) {
      st = device_alloc(v, bytes, "the KV cache (V)");
      if (!st.ok()) {
        (void)cudaFree(*k);
        *k = nullptr;
      }
    }
    if (!st.ok() && budget_) budget_->give(2 * bytes);
    return st;
  }
  void free_layer(size_t l) {
    if (!k_[l]) return;
    (void)cudaFree(k_[l]);
    (void)cudaFree(v_[l]);
    k_[l] = v_[l] = nullptr;
    if (budget_) budget_->give(2 * layer_bytes(rows(l)));
  }
  /// A new slab of pinned, mapped memory cut into free pairs (under host_mu_).
  /// After a failure no more are tried: the KvCache allocates its own.
  bool grow_slabs() {
    if (slabs_failed_) return false;
    const uint64_t want = std::min(kMostSlab, kFirstSlab << std::min<size_t>(slabs_.size(), 8));
    const uint64_t pieces = std::max<uint64_t>(1, want / pair_bytes_);
    Slab sl;
    sl.bytes = pieces * pair_bytes_;
    void* h = nullptr;
    void* d = nullptr;
    if (cudaHostAlloc(&h, sl.bytes, cudaHostAllocMapped) != cudaSuccess) {
      (void)cudaGetLastError();
      slabs_failed_ = true;
      return false;
    }
    if (cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaFreeHost(h);
      slabs_failed_ = true;
      return false;
    }
    sl.host = static_cast<uint8_t*>(h);
    sl.dev = static_cast<const uint8_t*>(d);
    slabs_.push_back(sl);
    for (uint64_t i = pieces; i-- > 0;) free_pairs_.push_back(sl.host + i * pair_bytes_);
    return true;
  }
  /// Rows per KV head of layer l: its slots' or the shared capacity.
  int64_t rows(size_t l) const { return slots_[l] > 0 ? slots_[l] * block_size_ : capacity_; }
  /// Rows [row0, row0 + n) of every KV head between a resident layer and
  /// host rows [n_kv_heads][n][row] (queued on the stream).
  Status copy_rows(int64_t layer, int64_t row0, int64_t n, uint8_t* k, uint8_t* v, bool in) {
    LOOM_TRY(check_layer(layer, in ? "import" : "export"));
    const auto l = static_cast<size_t>(layer);
    if (!k_[l])
      return make_error(ErrorCode::kInternal,
                        "CUDA KV cache: layer %" PRId64 " is not resident on the GPU", layer);
    if (row0 < 0 || n < 0 || row0 + n > rows(l))
      return make_error(ErrorCode::kOutOfRange,
                        "CUDA KV cache: rows [%" PRId64 ", %" PRId64 ") of a layer of %" PRId64,
                        row0, row0 + n, rows(l));
    if (n == 0) return {};
    const uint64_t width = static_cast<uint64_t>(n) * row_bytes_;
    const uint64_t pitch = static_cast<uint64_t>(rows(l)) * row_bytes_;
    const uint64_t off = static_cast<uint64_t>(row0) * row_bytes_;
    const auto heads = static_cast<size_t>(cfg_.n_kv_heads);
    auto* dk = static_cast<uint8_t*>(k_[l]) + off;
    auto* dv = static_cast<uint8_t*>(v_[l]) + off;
    if (in) {
      LOOM_CUDA_TRY(
          cudaMemcpy2DAsync(dk, pitch, k, width, width, heads, cudaMemcpyHostToDevice, stream_),
          "KV import (K)");
      LOOM_CUDA_TRY(
          cudaMemcpy2DAsync(dv, pitch, v, width, width, heads, cudaMemcpyHostToDevice, stream_),
          "KV import (V)");
    } else {
      LOOM_CUDA_TRY(
          cudaMemcpy2DAsync(k, width, dk, pitch, width, heads, cudaMemcpyDeviceToHost, stream_),
          "KV export (K)");
      LOOM_CUDA_TRY(
          cudaMemcpy2DAsync(v, width, dv, pitch, width, heads, cudaMemcpyDeviceToHost, stream_),
          "KV export (V)");
    }
    return {};
  }
  Status check_layer(int64_t layer, const char* op) const {
    if (layer < 0 || layer >= cfg_.n_layer)
      return make_error(ErrorCode::kOutOfRange,
                        "CUDA KV cache %s: layer %" PRId64 " does not exist (%" PRId64 " layers)",
                        op, layer, cfg_.n_layer);
    return {};
  }
  Status check_transfer(int64_t layer, int64_t n, const char* op) const {
    LOOM_TRY(check_layer(layer, op));
    if (!k_[static_cast<size_t>(layer)])
      return make_error(ErrorCode::kInternal,
                        "CUDA KV cache %s: layer %" PRId64 " is not resident on the GPU", op,
                        layer);
    if (n < 0 || n > rows(static_cast<size_t>(layer)))
      return make_error(ErrorCode::kOutOfRange,
                        "CUDA KV cache %s: %" PRId64 " tokens (room is made for %" PRId64 ")", op,
                        n, rows(static_cast<size_t>(layer)));
    return {};
  }

  KvCacheConfig cfg_;
  cudaStream_t stream_;
  DeviceBudget* budget_;
  uint64_t row_bytes_;
  int64_t capacity_ = 0;  ///< tokens each resident whole-context layer has room for
  std::vector<void*> k_, v_;
  std::vector<int64_t> slots_;  ///< per layer: its slots (0: a whole context)
  int64_t pending_slots_ = 0;   ///< slots of the layers made resident next (set_block_slots)
  int64_t block_size_ = 0;
  // Host pairs (alloc_host_pair): the slabs, and the pieces not given out.
  struct Slab {
    uint8_t* host = nullptr;
    const uint8_t* dev = nullptr;
    uint64_t bytes = 0;
  };
  mutable std::mutex host_mu_;
  std::vector<Slab> slabs_;
  std::vector<uint8_t*> free_pairs_;
  uint64_t pair_bytes_ = 0;
  bool slabs_failed_ = false;
};

}  // namespace

uint64_t CudaKvStorage::slabs_freed() {
  return g_slabs_freed.load();
}

Result<std::unique_ptr<CudaKvStorage>> CudaKvStorage::create(const KvCacheConfig& cfg,
                                                             cudaStream_t stream,
                                                             DeviceBudget* budget) {
  if (cfg.n_layer <= 0 || cfg.n_kv_heads <= 0 || cfg.head_dim <= 0 || cfg.n_ctx <= 0)
    return make_error(ErrorCode::kInvalidArgument, "CUDA KV cache: empty configuration");
  uint64_t row_bytes = 0;
  if (cfg.dtype == DType::kF16) {
    row_bytes = static_cast<uint64_t>(cfg.head_dim) * 2;
  } else if (cfg.dtype == DType::kQ8_0 && cfg.head_dim % 32 == 0) {
    row_bytes = static_cast<uint64_t>(cfg.head_dim / 32) * 34;
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      "CUDA KV cache: a %s cache of head_dim %" PRId64
                      " (F16, or Q8_0 with "
                      "head_dim a multiple of 32)",
                      std::string(dtype_name(cfg.dtype)).c_str(), cfg.head_dim);
  }
  return std::unique_ptr<CudaKvStorage>(
      std::make_unique<KvStorageImpl>(cfg, stream, budget, row_bytes));
}

}  // namespace loom::cuda
