// Paged KV cache: fixed-size blocks of tokens and a block table per sequence
// (the layout the GPU tiers reuse). One physical block id covers the same
// tokens in every layer; each layer has its own K and V storage per block.
// Within a block, keys are laid out [kv_head][row][head_dim] so one head's
// keys for the block are contiguous; a host block holds K then V in one
// allocation (the unit that moves between tiers).
//
// Tiers (configure_tiers): with a RAM budget, host blocks beyond it go down
// to an SSD spill file (storage/kv_spill_file.h) between two steps, chosen by
// a KvTierPolicy; the attention sinks and the newest window never leave RAM.
// Before a host layer's attention, fetch_layer() reads its spilled blocks
// back into a staging area that view() then points at. A block that cannot be
// read back is reported lost: the session recomputes it from its tokens.
//
// The device tier (KvTierConfig::device_budget, kv_cache_device.cpp): a layer
// whose attention runs on a GPU keeps only some of its blocks there, in
// slots of the device storage (KvStorage::set_block_slots); the others are
// host blocks like a CPU layer's, in RAM or on the SSD. The same policy
// chooses; the sinks and the newest window stay on the device. Attention
// over such a layer is Backend::attention_split: the device's partial
// softmax over its slots merged exactly with the CPU's over the host blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu/ops.h"
#include "engine/backends/backend.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/runtime/kv_host_arena.h"
#include "engine/runtime/kv_policy.h"
#include "storage/kv_spill_file.h"

namespace loom {

struct KvCacheConfig {
  int64_t n_layer = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t n_ctx = 0;          ///< most tokens one sequence may hold
  int64_t block_size = 32;    ///< tokens per block
  DType dtype = DType::kF16;  ///< F16 or Q8_0 (head_dim a multiple of 32)
};

/// The device, RAM and SSD tiers of KV blocks.
struct KvTierConfig {
  /// Bytes of K/V kept on the device for the layers whose attention runs
  /// there, shared evenly by them; 0: no limit (every block of such a layer
  /// stays on the device, and the context ends where device memory does).
  uint64_t device_budget = 0;
  uint64_t ram_budget = 0;  ///< bytes of host K/V kept in RAM; 0: no limit, nothing spills
  std::string spill_dir;    ///< the spill file's folder (needed with a budget)
  std::string policy = "importance";  ///< lru | importance (kv_policy.h)
  /// Precision on the SSD: empty or the cache's own (bytes as they are),
  /// "q8_0" under an F16 cache (requantized on the way down: half the bytes
  /// to read back, at Q8_0's error), or "fp8" (E4M3 with one scale per head
  /// and block: about half an F16 cache's bytes, 3 mantissa bits).
  std::string spill_type;
  int64_t sink_tokens = 32;     ///< the first tokens never leave their tier (attention sinks)
  int64_t window_tokens = 128;  ///< nor do the newest ones (at least one block's worth)
  /// Write-behind: a step's spill writes go on while the next step computes
  /// (rebalance() finishes them first), the blocks staying in RAM till then,
  /// over the budget by that batch; else rebalance() waits for them.
  bool write_behind = false;
  uint64_t session = 0;         ///< names the spill file; 0: from the process id and time
  storage::SpillFaults faults;  ///< injected storage faults (tests)
};

/// Where the KV bytes are now, and what moved.
struct KvTierStats {
  uint64_t device_bytes = 0;  ///< device memory held for K/V (slots of the device tier included)
  uint64_t device_used_bytes = 0;  ///< of which blocks in use (device tier: slots holding a block)
  uint64_t ram_bytes = 0;          ///< host blocks in RAM
  uint64_t ssd_bytes = 0;          ///< host blocks in the spill file
  uint64_t staging_bytes = 0;      ///< RAM that holds spilled blocks while attention reads them
  uint64_t blocks_spilled = 0, blocks_promoted = 0;  ///< moves down and up, since creation
  uint64_t ssd_read_bytes = 0, ssd_written_bytes = 0;
  uint64_t ssd_read_requests = 0;  ///< reads the disk was asked for (a run of records each)
  uint64_t blocks_to_host = 0, blocks_to_device = 0;  ///< device tier moves, since creation
  uint64_t blocks_lost = 0;        ///< blocks that could not be read back (recomputed)
  uint64_t blocks_read_ahead = 0;  ///< spilled blocks read while the layer before computed
  bool spill_full = false;         ///< the disk filled up: spilling stopped
  std::string note;                ///< the spill file's I/O mode, or why spilling stopped
};

/// Where one layer's tokens lie: bytes of the blocks that hold them, per tier.
struct KvLayerTiers {
  uint64_t device = 0, ram = 0, ssd = 0;
};

/// Bytes of memory the kernel says are available now (MemAvailable), or 0.
uint64_t available_memory_bytes();
/// $XDG_CACHE_HOME/loom/kv (or ~/.cache/loom/kv): where spill files go by default.
std::string default_kv_spill_dir();
/// The RAM budget to use when the user set none: no limit (0) while the
/// whole context's KV fits in half the available memory, else that half.
uint64_t default_kv_ram_budget(uint64_t kv_bytes_full_context);

/// Frees a host (layer, block) pair where it came from: the device storage
/// (KvStorage::alloc_host_pair), the cache's huge-page arena, or new[].
struct HostPairFree {
  KvStorage* from = nullptr;
  KvHostArena* arena = nullptr;
  void operator()(uint8_t* p) const {
    if (from)
      from->free_host_pair(p);
    else if (arena)
      arena->free(p);
    else
      delete[] p;
  }
};
using HostPair = std::unique_ptr<uint8_t[], HostPairFree>;

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const KvCacheConfig& cfg);
  ~KvCache();

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
  void clear();

  /// Sets up the RAM and SSD tiers (before the first token). Removes spill
  /// files that crashed sessions left in the folder.
  Status configure_tiers(const KvTierConfig& tiers);
  /// Whether blocks may move between tiers (a RAM or a device budget).
  bool tiered() const { return tiers_.ram_budget > 0 || tiers_.device_budget > 0; }
  const KvTierConfig& tier_config() const { return tiers_; }
  KvTierStats tier_stats() const;
  /// Per layer, the bytes of the blocks holding its tokens on each tier (the
  /// app's per-layer view; SSD bytes in the spill precision).
  std::vector<KvLayerTiers> layer_tiers() const;
  /// Makes a host layer's spilled blocks readable through view() (reads them
  /// into staging). Blocks that cannot be read back are re-allocated empty and
  /// reported by take_lost(); then this returns an kIo error naming them.
  Status fetch_layer(int64_t layer);
  /// Begins reading the first layer's spilled blocks (after a step, while
  /// the caller samples), so that the next step finds them read.
  void prefetch_first_layer() { start_prefetch(0); }
  /// Enforces the RAM budget between two steps: moves the lowest-ranked
  /// blocks to the SSD, and hot ones back up. A full disk stops spilling
  /// (tier_stats().spill_full) and the budget then bounds the context.
  Status rebalance();
  /// Whether blocks were lost since the last take_lost().
  bool has_lost() const { return !lost_.empty(); }
  /// Token ranges [begin, end) of blocks lost since the last call, merged;
  /// those blocks are open to a recompute until finish_recompute().
  std::vector<std::pair<int64_t, int64_t>> take_lost();
  /// While set, store() writes only into blocks open to a recompute (the K/V
  /// that are intact stay as they are).
  void set_recomputing(bool on) { recomputing_ = on; }
  bool recomputing() const { return recomputing_; }
  void finish_recompute() { recompute_.clear(); }
  /// Whether the policy ranks by attention mass (the attention then reports it).
  bool wants_mass(int64_t layer) const;
  /// Adds one step's attention mass per block of a layer (n_blocks floats).
  void add_mass(int64_t layer, const float* mass, int64_t n_blocks);

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
  /// Makes this cache hold `src`'s first n tokens (n <= src.n_tokens()),
  /// each layer copied from wherever it lies to wherever it lies here (host
  /// blocks or device storage): a shared prompt prefix taken over instead of
  /// evaluated again. Both caches alike (shape, dtype, blocks) and untiered
  /// (kUnsupported otherwise; the caller then evaluates the prefix).
  Status copy_prefix(KvCache& src, int64_t n);

  /// @name The device tier (kv_cache_device.cpp).
  /// @{
  /// How many layers' attention will run on the device: they share the
  /// device budget. Call before their move_layer(l, true) (default: all layers).
  void set_device_layers(int64_t n) { n_dev_layers_ = n; }
  /// Device slots per layer (0: no device tier).
  int64_t device_slots() const { return dev_slots_; }
  /// Whether `layer` lives in device slots plus host blocks.
  bool device_tiered(int64_t layer) const {
    return on_device(layer) && storage_->layer_slots(layer) > 0;
  }
  /// Per slot of a device-tiered layer, the first token position of the block
  /// it holds, or -1 when free; entries up to the last slot in use.
  std::vector<int32_t> slot_positions(int64_t layer) const;
  /// The device row (slot * block_size + row) of token `pos` of a
  /// device-tiered layer, or -1 when its block is a host block.
  int64_t device_row(int64_t layer, int64_t pos) const;
  /// Changes whenever host blocks may have moved or been written (reserve,
  /// rebalance, a store into a tiered layer's host block, fetch_layer...):
  /// a device copy of host blocks made at one value holds their bytes while
  /// it lasts. Values are unique in the process: no two caches share one,
  /// even where one cache is made where another was freed.
  uint64_t host_epoch() const { return host_epoch_; }
  /// Whether any of blocks [0, n_blocks) of a device-tiered layer is a host block.
  bool has_host_blocks(int64_t layer, int64_t n_blocks) const;
  /// The host blocks among [0, n_blocks) of a device-tiered layer (after
  /// fetch_layer), as consecutive blocks in logical order; `blocks` gets the
  /// logical index of each. Valid until the next call.
  cpu::KvView host_view(int64_t layer, int64_t n_blocks, std::vector<int32_t>* blocks);
  /// Most tokens one step may add: the device tier needs a free slot for
  /// each new block beside the pinned ones. Large when there is no device tier.
  int64_t max_step_tokens() const;
  /// @}

 private:
  explicit KvCache(const KvCacheConfig& cfg);
  size_t block_bytes() const { return head_bytes_ * static_cast<size_t>(cfg_.n_kv_heads); }
  uint64_t pair_bytes() const { return 2ull * block_bytes(); }  // K + V of one (layer, block)
  size_t row_bytes() const { return head_bytes_ / static_cast<size_t>(cfg_.block_size); }
  // Allocates host blocks [have, n_blocks) of one layer.
  /// Tokens [0, n) of host layer l out to (`out`) or in from rows in the
  /// KvStorage transfer format: [kv_head][n][row bytes] of K, and of V.
  void host_rows(size_t l, int64_t n, uint8_t* k, uint8_t* v, bool out);
  Status grow_layer(size_t l, size_t n_blocks);
  void free_layer(size_t l);
  void point_at(size_t l, size_t b, uint8_t* kv_pair);
  /// Memory of one host (layer, block) pair: the storage's where layer l is
  /// device-tiered and it gives memory its device reads in place
  /// (KvStorage::alloc_host_pair), else the arena's (huge pages), else
  /// new[]; null when out of memory.
  HostPair new_pair(size_t l, bool zero = false);
  /// Bytes of one (layer, block) pair on the SSD, and its conversion from and
  /// to the cache's dtype (when the spill precision differs).
  uint64_t spill_pair_bytes() const;
  bool converts() const { return spill_fp8_ || spill_dtype_ != cfg_.dtype; }
  void convert_pair(const uint8_t* src, DType from, uint8_t* dst, DType to) const;
  /// A pair in the cache's dtype to its SSD precision, and back.
  void to_spill(const uint8_t* src, uint8_t* dst) const;
  void from_spill(const uint8_t* src, uint8_t* dst) const;
  bool pinned(int64_t block) const;
  Status spill(std::vector<std::pair<size_t, size_t>>& victims);
  /// The blocks of a spill whose writes are done leave RAM (or, where one
  /// moved meanwhile, its slot goes back).
  void commit_spill(const std::vector<std::pair<size_t, size_t>>& victims,
                    const std::vector<uint32_t>& slots);
  /// Waits for a write-behind batch and commits it; on failure its blocks
  /// stay in RAM, and a full disk stops spilling (spill_full_).
  Status settle_spill();
  Status promote(std::vector<std::pair<size_t, size_t>>& blocks);
  Status unspill_layer(size_t l);
  Status open_spill_file();
  std::vector<size_t> spilled_blocks(size_t l) const;
  /// What the spill record of (layer l, block b) must say.
  storage::SpillBlockKey spill_key(size_t l, size_t b) const;
  /// Gives a spilled (l, b) fresh RAM (zeroed when asked) and frees its slot.
  Status fresh_ram(size_t l, size_t b, bool zero);
  void start_prefetch(int64_t layer);
  void size_staging(size_t l, size_t n);
  uint8_t* read_target(size_t l, size_t i);
  void drain_prefetch();

  KvCacheConfig cfg_;
  size_t head_bytes_ = 0;
  int64_t n_tokens_ = 0;
  std::vector<int32_t> block_table_;  ///< logical block -> physical block (the same in every layer)
  std::unique_ptr<KvHostArena> arena_;  ///< host pairs (outlives blocks_)
  // Per layer: physical block -> K then V in RAM (null while on the SSD);
  // k_ptrs_/v_ptrs_ follow the block table (into staging for spilled blocks).
  std::vector<std::vector<HostPair>> blocks_;
  std::vector<std::vector<const void*>> k_ptrs_, v_ptrs_;
  // Tiers: per layer and physical block, the spill slot (-1: in RAM) and the
  // attention mass; lost (layer, block) pairs waiting for a recompute.
  KvTierConfig tiers_;
  std::unique_ptr<KvTierPolicy> policy_;
  DType spill_dtype_ = DType::kF16;  ///< set by configure_tiers (the cache's dtype by default)
  /// FP8 E4M3 on the SSD: per head and block a float scale, then one byte a value.
  bool spill_fp8_ = false;
  std::vector<uint8_t> spill_buf_;  ///< converted payloads on their way to or from the SSD
  std::vector<std::pair<size_t, size_t>> behind_;  ///< blocks of the write-behind batch
  std::vector<uint32_t> behind_slots_;             ///< and their slots in the spill file
  std::unique_ptr<storage::KvSpillFile> spill_;
  std::vector<std::vector<int64_t>> slot_;
  std::vector<std::vector<float>> mass_;
  std::vector<std::pair<size_t, size_t>> lost_, recompute_;
  // Spilled blocks being read: layer l's into staging_[l % 2], so that the
  // next layer's read-ahead (begun when a layer's fetch is done, finished by
  // its own fetch) never lands where the running attention reads.
  std::vector<uint8_t> staging_[2];
  std::vector<uint8_t> spill_staging_[2];  ///< the same blocks as read, where precisions differ
  int64_t prefetch_layer_ = -1;            ///< the layer whose read-ahead is in flight
  std::vector<size_t> prefetch_blocks_;    ///< its blocks, in staging order
  uint64_t n_prefetched_ = 0;              ///< blocks that came through a read-ahead
  bool recomputing_ = false, spill_full_ = false;
  uint64_t n_spilled_ = 0, n_promoted_ = 0, n_lost_ = 0;
  uint64_t n_ram_blocks_ = 0;  ///< host (layer, block) pairs in RAM
  // Device tier: per layer, the slot of each block (-1: a host block) and the
  // block in each slot (-1: free); slots per layer and the layers sharing the budget.
  std::vector<std::vector<int32_t>> dev_slot_, slot_block_;
  int64_t dev_slots_ = 0, n_dev_layers_ = 0;
  uint64_t n_to_host_ = 0, n_to_device_ = 0;
  uint64_t host_epoch_ = 0;    ///< host_epoch()
  void touch_host();           ///< a new host_epoch()
  uint64_t n_rebalances_ = 0;  ///< steps so far (wants_mass samples device-tiered layers)
  std::vector<const void*> host_k_, host_v_;  ///< host_view()'s block pointers
  /// Device tier moves of one block (between two steps): slot -> new RAM
  /// block; RAM (read back first from the SSD) -> slot.
  /// With `deferred`, the rows' export is left to the caller's
  /// KvStorage::export_blocks (before anything writes the slot or reads the block).
  Status block_to_host(size_t l, size_t b, std::vector<KvStorage::KvRowsOut>* deferred = nullptr);
  Status block_to_device(size_t l, size_t b, size_t slot);
  /// A free slot of layer l, or one whose block holds only forgotten tokens,
  /// or the coldest unpinned block's (moved to the host); blocks in
  /// [keep_from, keep_to) are not taken. kNoSpace when none.
  Result<size_t> take_slot(size_t l, size_t keep_from, size_t keep_to,
                           std::vector<KvStorage::KvRowsOut>* deferred = nullptr);
  /// Blocks [first, need) of a device-tiered layer (those the step writes)
  /// get slots: new ones, and host blocks come onto the device.
  Status device_reserve(size_t l, size_t first, size_t need);
  Status rebalance_device();
  Status layer_to_slots(size_t l);    ///< move_layer(l, true) under the device tier
  Status layer_from_slots(size_t l);  ///< move_layer(l, false) under the device tier
  double block_score(size_t l, size_t b) const;
  std::string spill_note_;
  std::unique_ptr<KvStorage> storage_;  ///< device K/V (then no host blocks), or null
};

}  // namespace loom
