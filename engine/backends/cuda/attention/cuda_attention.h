// The CUDA backend's KV cache and attention (loom_cuda_attention): the K/V of
// the layers whose attention runs on the GPU, stored on the device, and
// causal GQA attention over them: split-K flash decoding for a few query
// tokens, flash attention on the tensor cores for prompts. Host-callable; no
// CUDA syntax here, so the backend's .cpp files include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/cuda_util.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/runtime/kv_cache.h"

namespace loom::cuda {

/// One layer's K and V on the device, each [n_kv_heads][capacity][row]: a row
/// is head_dim F16 values, or head_dim / 32 Q8_0 blocks of 34 bytes (the host
/// row format of KvStorage, so export/import copy rows as they are).
struct DevKvLayer {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF16;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t capacity = 0;    ///< tokens room is made for
  uint64_t row_bytes = 0;  ///< bytes of one token's row of one head
};

/// Stores k and v [T, n_kv_heads * head_dim] (f32, device) at positions
/// pos[t] (device int32[T]), converting to the layer's dtype.
Status kv_store(const DevKvLayer& layer, const float* k, const float* v, int64_t T,
                const int32_t* pos, cudaStream_t s);

/// One query row's K/V of a layer, in a step whose rows belong to different
/// sequences, each with its own cache of one format (continuous batching's
/// decode rows): rope_kv_store's and attention_rows' `rows` (device [T]).
struct RowKv {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t capacity = 0;
};

/// Whether rope_kv_store takes this layer with heads of head_dim: an F16 or
/// Q8_0 cache, head_dim a multiple of 32 (at most 1024).
bool rope_kv_store_fits(const DevKvLayer& layer, int64_t head_dim);
/// RoPE of q [T, n_heads, head_dim] and k [T, n_kv_heads, head_dim] in place
/// (cos/sin table cs [T, n_pairs, 2], pairs as cuda::rope), then kv_store of
/// the rotated k and of v, in one launch; the same values as cuda::rope_qk
/// followed by kv_store. With `rows`, row t goes to rows[t]'s K/V instead of
/// layer's (which then gives only the format).
Status rope_kv_store(const DevKvLayer& layer, float* q, int64_t n_heads, float* k, const float* v,
                     int64_t T, int64_t n_pairs, bool neox, const float* cs, const int32_t* pos,
                     cudaStream_t s, const RowKv* rows = nullptr);

/// Scratch of the attention kernels (split-K partial results), owned by the
/// backend, grown as needed; also the kernel choice and its test hooks.
class AttentionScratch {
 public:
  static std::unique_ptr<AttentionScratch> create();
  AttentionScratch() = default;
  ~AttentionScratch();
  AttentionScratch(const AttentionScratch&) = delete;
  AttentionScratch& operator=(const AttentionScratch&) = delete;
  uint64_t bytes() const { return bytes_; }
  /// Test hook: keys per split of the decode kernel (0: chosen from the
  /// context length and the SM count).
  void set_split_keys(int64_t keys) { split_keys_ = keys; }
  int64_t split_keys() const { return split_keys_; }
  /// Test hook: 0 picks by T (split-K decoding for T <= 8, beyond it the
  /// tensor-core flash prefill where it has the head_dim, else tiles);
  /// 1 forces the tiled prefill kernel, 2 the split-K decode kernel, 3 the
  /// flash prefill, 4 its one-stage variant (flash_prefill.h;
  /// LOOM_CUDA_ATTN=tile turns 0's use of it off).
  void set_kernel(int k) { kernel_ = k; }
  int kernel() const { return kernel_; }

  /// At least `bytes` of device memory (synchronizes `s` before growing).
  Status ensure(uint64_t bytes, cudaStream_t s);
  void* data() const { return data_; }
  /// Multiprocessors of the current device (cached).
  int sm_count();

 private:
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  int64_t split_keys_ = 0;
  int kernel_ = 0;
  int sm_count_ = 0;
};

/// Where the decode attention also writes its output's Q8 activations (the
/// layout of the decode matvecs, matmul/q8_act.cuh): q [T, token_bytes]
/// bytes, d [T, width / 32] scales, width = n_heads * head_dim.
struct Q8Out {
  int8_t* q = nullptr;
  float2* d = nullptr;  ///< scale pairs (q8_act.cuh)
  uint64_t token_bytes = 0;
};
/// Whether attention() of T queries over `layer` writes a Q8Out it is given:
/// the split-K decode kernels (T <= 8 unless another kernel is forced),
/// head_dim a multiple of 32.
bool attention_writes_q8(const DevKvLayer& layer, int64_t T, const AttentionScratch& scratch);

/// Causal GQA attention: query t (q [T, n_heads * head_dim], f32, device)
/// attends to cached tokens 0 .. pos[t] inclusive (pos: device int32[T];
/// `max_pos` is the largest pos[t], known on the host), query head h to KV
/// head h / (n_heads / n_kv_heads); scores q.k * scale, softmax, sum of v.
/// out [T, n_heads * head_dim] f32. Semantics of cpu::attention (cpu/ops.h).
/// `plan_keys` (0: max_pos + 1): the key count the launch is planned for (the
/// split count and grid), at least max_pos + 1; the kernels read the keys of
/// each query from `pos` on the device, so one launch serves every position
/// up to it (a captured CUDA graph replays it as the context grows).
/// `q8` (optional; used where attention_writes_q8): out's Q8 activations too.
Status attention(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                 int64_t max_pos, int64_t n_heads, float scale, float* out,
                 AttentionScratch& scratch, cudaStream_t s, int64_t plan_keys = 0,
                 const Q8Out* q8 = nullptr);

/// attention() of T single query rows of different sequences: row t over
/// keys 0 .. pos[t] of rows[t]'s K/V (device [T]), all in `layer`'s format,
/// in one split-K decode launch (and its merge) planned for plan_keys keys.
Status attention_rows(const DevKvLayer& layer, const RowKv* rows, const float* q, int64_t T,
                      const int32_t* pos, int64_t plan_keys, int64_t n_heads, float scale,
                      float* out, AttentionScratch& scratch, cudaStream_t s);

/// @name The device KV tier (KvTierConfig::device_budget; cuda_kv_tier.cpp).
/// A layer in block slots holds n_slots slots of block_size rows per KV head
/// (capacity = n_slots * block_size); the KvCache says which block sits in
/// which slot, the others being host blocks.
/// @{
/// Per slot the first position of the block it holds, or -1 when free
/// (device int32[n_slots]).
struct SlotMap {
  const int32_t* first_pos = nullptr;
  int64_t block_size = 0;
  int64_t n_slots = 0;
  /// Host blocks the kernel reads in place (CudaKvStorage::mapped), after
  /// the slots: first_pos then has n_slots + n_host entries, and host block
  /// i is at host[i] (device addresses, device uint8_t*[n_host]): K as
  /// [n_kv_heads][block_size][row] with heads host_head_bytes apart, V
  /// host_v_offset bytes after K. Only the one-pass kernel (F16 rows,
  /// head_dim a multiple of 8 up to 256) reads them (host_slots_fit).
  const uint8_t* const* host = nullptr;
  int64_t n_host = 0;
  uint64_t host_head_bytes = 0;
  uint64_t host_v_offset = 0;
};
/// Whether attention_slots reads host blocks of `layer` in place (SlotMap::host).
bool host_slots_fit(const DevKvLayer& layer);
/// Unmerged split-K partials: per query row r = t * n_heads + h and split s,
/// the unnormalized sum o[(r * n_splits + s) * head_dim ..] and (max, sum)
/// ml[r * n_splits + s]. The last split is the host's (attention_slots with
/// keep); each device split covers `split_rows` rows (whole slots).
struct SplitPartials {
  float* o = nullptr;
  float2* ml = nullptr;
  int64_t n_splits = 0;
  int64_t split_rows = 0;
};
/// Attention of T queries over a slotted layer's rows, each row counting
/// when its slot holds a block at a position up to the query's.
/// `split_rows` > 0 fixes the rows per split (a multiple of block_size:
/// one split per slot measures each block's attention mass), else planned
/// for the SMs. Without `keep` the result goes to out; with it the splits
/// stay in the scratch (valid until its next use) with the last one left
/// for the host's partials, and merge_splits() writes out. Without `keep`,
/// `q8` (optional, where attention_writes_q8): out's Q8 activations too.
Status attention_slots(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                       int64_t n_heads, float scale, const SlotMap& slots, int64_t split_rows,
                       float* out, AttentionScratch& scratch, cudaStream_t s,
                       SplitPartials* keep = nullptr, const Q8Out* q8 = nullptr);
/// out = the partials' splits combined exactly (log-sum-exp); `q8`
/// (optional): out's Q8 activations too.
Status merge_splits(const SplitPartials& sp, int64_t T, int64_t n_heads, int64_t head_dim,
                    float* out, cudaStream_t s, const Q8Out* q8 = nullptr);
/// The blocks [0, n_blocks) of a slotted layer copied by position into
/// gk/gv ([n_kv_heads][n_blocks * block_size][row]): src[b] >= 0 is the slot
/// holding block b, else block b is host block -src[b] - 1 of `staged`
/// ([i][K, V][n_kv_heads][block_size][row], device memory).
Status gather_blocks(const DevKvLayer& layer, int64_t block_size, const int32_t* src,
                     int64_t n_blocks, const uint8_t* staged, void* gk, void* gv, cudaStream_t s);
/// @}

/// The device K/V of a KvCache (Backend::create_kv_storage of the CUDA
/// backend): the layers made resident here, each as a DevKvLayer.
class CudaKvStorage : public KvStorage {
 public:
  /// `stream`: the backend's stream, which export/import order themselves on;
  /// `budget` (optional, outliving the storage): the device memory limit the
  /// layers count against. Layers hold room for the tokens reserved so far
  /// (at least 256, at most n_ctx); reserve() grows every resident layer,
  /// copying its rows. kInvalidArgument for a dtype other than F16 or Q8_0.
  static Result<std::unique_ptr<CudaKvStorage>> create(const KvCacheConfig& cfg,
                                                       cudaStream_t stream,
                                                       DeviceBudget* budget = nullptr);
  /// The device K/V of a resident layer (null pointers when not resident).
  virtual DevKvLayer layer(int64_t l) const = 0;
  /// The device's address of host memory this storage gave out
  /// (alloc_host_pair: mapped pinned memory, which kernels read over PCIe
  /// in place), or null for any other host memory.
  virtual const uint8_t* mapped(const void* host) const = 0;
  /// Slabs of mapped host memory freed so far in the process (by storages
  /// destroyed): a new slab can come at a freed one's address, where a CUDA
  /// graph that copied from the old one must not be replayed (begin_step).
  static uint64_t slabs_freed();
};

}  // namespace loom::cuda
