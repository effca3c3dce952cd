// The Vulkan backend: every forward-pass op as a compute shader, on any
// Vulkan 1.2 device (tested on Mesa lavapipe, tuned for NVIDIA).
//
// How work flows: ops are recorded into one command buffer (no fence per
// op); a pipeline barrier is inserted only where a dispatch reads or writes
// a byte range an earlier, unbarriered dispatch wrote (or writes one it
// read). download()/synchronize() submit and wait. A decode step is thus one
// submission. Host inputs of ops (token ids, positions, RoPE frequency
// factors) go through a host-visible ring the shaders read directly.
//
// Memory: weights are repacked once into device-local blocks (upload_weight,
// keyed by the host address range of their tensor; release_weight drops one);
// activations and the KV cache are device-local too. A KV storage holds only
// the layers made resident in it (each [kv_head][n_ctx][head_dim]); rows move
// to and from the host's block rows through the staging ring (export/import).
//
// Timing: VulkanOptions::profile brackets every dispatch with timestamps
// (per shader variant, take_vulkan_gpu_times); scope timing (set_scope_timing)
// writes one timestamp per scope boundary, for the forward pass's profiler.
//
// Errors: an op cannot return one, so the first failure (device lost, out of
// memory, a missing weight) is kept and every later op is skipped; the next
// download()/synchronize() reports it. After a lost device the backend stays
// failed: the caller moves on to the CPU backend.
//
// Use from one thread at a time. ActBuffers and KvStorages it hands out must
// be destroyed before it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/vulkan/vk_device.h"
#include "engine/backends/vulkan/vk_memory.h"
#include "engine/backends/vulkan/vk_weights.h"
#include "engine/backends/vulkan/vulkan.h"

namespace loom {

class VkKvStorage;

class VulkanBackend final : public Backend {
 public:
  static Result<std::unique_ptr<VulkanBackend>> create(const VulkanOptions& opts);
  ~VulkanBackend() override;

  std::string name() const override;
  bool supports(OpKind op, DType dtype) const override;

  bool host_memory() const override { return false; }
  Result<std::unique_ptr<ActBuffer>> alloc_act(int64_t n_floats) override;
  Status upload(const float* src, Act dst) override;
  Status download(Act src, float* dst) override;
  Status synchronize() override;
  Status upload_weight(const Weight& w) override;
  Status upload_weights(const std::vector<const Weight*>& ws) override;
  void set_keep_busy(bool on) override;
  /// Test hook: keep_busy on CPU devices too, and without the option (it is for GPUs' clocks).
  void force_keep_busy(bool on = true) { keep_allowed_ = on; }
  /// Times the keep_busy kernel was started (tests).
  uint64_t keep_busy_starts() const { return keep_starts_; }
  void release_weights() override;
  void release_weight(const Weight& w) override;
  uint64_t weight_bytes() const override { return weight_bytes_; }
  uint64_t memory_capacity() const override { return device_pool_ ? device_pool_->limit() : 0; }
  bool has_weight(OpKind op, const Weight& w) const override;
  Result<std::unique_ptr<KvStorage>> create_kv_storage(const KvCacheConfig& cfg) override;

  bool device_timing() const override { return dev_->caps().timestamp_period_ns > 0; }
  void set_scope_timing(bool on) override;
  void begin_scope(int32_t id) override {
    if (scope_on_) mark_scope(id);  // off: one test, nothing recorded
  }
  void take_scope_times(std::vector<ScopeTime>* out) override;

  void get_rows(const Weight& w, const int32_t* ids, Act out) override;
  void rms_norm(Act x, const Weight& w, float eps, Act out) override;
  void matmul(const Weight& w, Act x, Act out, const Weight* bias) override;
  void rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
            const cpu::RopeParams& p) override;
  /// Single-token steps: one matvec that adds into y. Otherwise the default.
  void matmul_add(const Weight& w, Act x, Act y, Act tmp) override;
  /// Single-token steps: one matvec over interleaved gate and up rows.
  void matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) override;
  void matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                  const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v) override;
  /// Single-token steps with an F16 cache: one matvec that also rotates q
  /// and k and stores k and v (matvec1_qkv_rope). Otherwise the two ops.
  void matmul_qkv_rope_kv(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                          const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v,
                          KvCache& kv, int64_t layer, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, const int32_t* pos, const cpu::RopeParams& p) override;
  /// One dispatch for both.
  void rope_qk(Act q, Act k, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
               const int32_t* pos, const cpu::RopeParams& p) override;
  void rope_qk_kv(Act q, Act k, Act v, KvCache& kv, int64_t layer, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                  const cpu::RopeParams& p) override;
  void kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) override;
  void attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                 float scale, Act out) override;
  Status attention_split(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                         float scale, Act out, const HostAttentionFn& host) override;
  void silu_mul(Act gate, Act up, Act out) override;
  void gelu_mul(Act gate, Act up, Act out) override;
  void add(Act a, Act b, Act out) override;
  /// dst = src ([rows, cols] each; row strides may differ).
  void copy(Act src, Act dst);

  const VulkanDeviceInfo& device_info() const { return dev_->info(); }
  const vk::DeviceCaps& caps() const { return dev_->caps(); }
  /// Each pipeline made so far ("shader/spec" key) with its compiler
  /// statistics as "name=value" pairs (VulkanOptions::pipeline_statistics;
  /// empty where the driver has no VK_KHR_pipeline_executable_properties).
  std::vector<std::pair<std::string, std::string>> pipeline_statistics() const;
  /// Validation-layer warnings and errors so far (VulkanOptions::validation).
  uint64_t validation_messages() const { return dev_->validation_messages(); }
  /// Device memory held in blocks (weights, activations, KV, scratch), bytes.
  uint64_t device_bytes() const;
  /// Per shader variant GPU times since the last reset (empty unless profiling).
  std::vector<GpuOpTime> gpu_times() const;
  void reset_gpu_times() { times_.clear(); }
  bool profiling() const { return profile_; }
  /// Submissions so far (a decode step should add one).
  uint64_t submissions() const { return submissions_; }
  /// Compute dispatches recorded so far.
  uint64_t dispatches() const { return dispatches_; }
  /// Test hook: the next submission fails as a lost device would.
  void simulate_device_lost() { simulate_lost_ = true; }
  /// Test hook: KV export/import stage at most this many bytes per submission
  /// (0: the whole staging ring), so small caches exercise the chunking.
  void set_transfer_chunk(uint64_t bytes) { transfer_chunk_ = bytes; }
  /// Test hook: threads per row group of single-token matvecs (a power of two
  /// up to the workgroup size; 0: chosen from the matrix), so small shapes
  /// exercise every reduction path of mul_mat_vec.comp.
  void set_matvec_threads_per_row(uint32_t tpr) { matvec_tpr_ = tpr; }
  /// Test hook: prefill matmuls in 128 x 64 tiles, as on devices with less
  /// than 32 KiB of shared memory (else 128 x 128 where there is room).
  void set_matmul_n64(bool on) { matmul_n64_ = on; }
  /// Test hook: prefill matmuls on cooperative matrices where the device has
  /// them (the default; caps().coopmat), or the tiled kernel. `variant`: 0 the
  /// default; 64 or 128 tokens per tile (matmul_cm_n64, matmul_cm); 2 64 or
  /// 128 by the shape; 3 as 2 with matmul_cm_np for 128.
  void set_matmul_coopmat(bool on, uint32_t variant = 0) {
    coopmat_ = on;
    coopmat_variant_ = variant;
    cm_tile_name_.clear();
  }
  /// Test and bench hook: every prefill matmul on cooperative matrices in
  /// the tile of that name (mul_mat_cm.comp's variants: "matmul_cm_n64", ...;
  /// one the device has no room for falls back to "matmul_cm_n64"); empty:
  /// chosen as set_matmul_coopmat says.
  void set_matmul_cm_tile(std::string name) { cm_tile_name_ = std::move(name); }
  /// Test hook: the F16 copy of x that prefill matmuls on cooperative matrices
  /// read (to_f16.comp): rows of `units` 32-wide units, zeros past x.cols, as
  /// half-precision bit patterns.
  Result<std::vector<uint16_t>> f16_copy(Act x, uint32_t units);
  /// Test hook: rows row0 .. row0 + rows - 1 of a quantized weight (uploaded
  /// first) as the direct tensor-core matmul reads them (dequant_f16.comp):
  /// rows of row_units 32-wide units, half-precision bit patterns.
  Result<std::vector<uint16_t>> f16_weight_copy(const Weight& w, uint64_t row0, uint32_t rows);
  /// The names set_matmul_cm_tile() takes.
  static std::vector<std::string> matmul_cm_tiles();
  /// Test hook: prefill attention on cooperative matrices where the device
  /// has them (attn_cm.comp, the default), or the tiled kernel (attn_tile.comp).
  void set_attn_coopmat(bool on) { attn_coopmat_ = on; }
  /// Test hook: keys per split of decode attention (0: chosen from the context).
  void set_attn_split_keys(uint32_t k) { attn_split_keys_ = k; }
  /// Test hook: chunks of those keys per split (0: chosen from the context).
  void set_attn_split_chunks(uint32_t c) { attn_split_chunks_ = c; }
  /// Test hook: decode attention over F16 K/V in one pass (attn_decode.comp;
  /// on by default on GPUs, past one split's keys) or on attn_split.comp. With
  /// `always`, attn_decode takes every context it can (CPU devices included).
  void set_attn_decode(bool on, bool always = false) {
    attn_decode_ = on;
    attn_decode_always_ = on && always;
  }
  bool attn_decode_on() const { return attn_decode_; }
  /// Test hook: matmul_qkv_rope_kv in one dispatch where it can (the default) or as two ops.
  void set_qkv_rope(bool on) { qkv_rope_ = on; }
  /// Test hook: integer-dot matvecs where the device has them (the default),
  /// or float matvecs only. `outputs` (the default): the fused gate+up matvec
  /// and the attention merge also write Q8 copies of their outputs, for the
  /// down and o matrices. `inputs`: matmul_add makes a Q8 copy of an input
  /// that has none first (quant_q8, a dispatch each; slower on the H200).
  void set_int_dot(bool on, bool inputs = false, bool outputs = true) {
    int_dot_ = on;
    int_dot_inputs_ = inputs;
    int_dot_outputs_ = outputs;
  }
  /// Integer-dot matvec dispatches recorded so far (tests).
  uint64_t int_dot_dispatches() const { return int_dot_dispatches_; }
  /// Test hook: rows per row group of single-token matvecs (1..4; 0: as created).
  void set_matvec_rows(uint32_t nr) {
    matvec_rows_ = nr ? std::min<uint32_t>(nr, 4) : matvec_rows_opt_;
  }
  /// Tuning (benchmarks): single-token matvec workgroup size, parts per
  /// thread and step, and the workgroup count to aim for; 0 keeps the default.
  struct MatvecTuning {
    uint32_t wg = 0, unroll = 0, groups = 0;
  };
  void set_matvec_tuning(const MatvecTuning& t) { mv_tune_ = t; }

  /// A weight's device copy: where its data starts and how it is laid out
  /// (shaders/dequant.glsl). Public for the KV and activation helpers only.
  struct Resident {
    const uint8_t* end = nullptr;  ///< end of the host range it mirrors
    vk::Alloc alloc;
    DType dtype = DType::kF32;
    size_t src_row_bytes = 0;
    int64_t n_in = 0, n_rows = 0;
    uint32_t row_units = 0;  ///< 32-element units per row
    uint64_t off2 = 0;       ///< bytes from alloc.offset to the second array (Q8_0/Q4_0 scales)
    /// Shape, type and sampled bytes: a new tensor at the same address differs.
    uint64_t fingerprint = 0;
    /// Start of the host range it mirrors (the tensor's first row).
    const uint8_t* begin() const { return end - static_cast<size_t>(n_rows) * src_row_bytes; }
    /// Byte offset in alloc's block of host address p inside that range (a
    /// vector weight's data, or its own first byte). Row-packed layouts only
    /// map rows whole: F32 vectors and row starts.
    uint64_t device_offset(const void* p) const {
      return alloc.offset + static_cast<uint64_t>(static_cast<const uint8_t*>(p) - begin());
    }
  };

 private:
  explicit VulkanBackend(std::unique_ptr<vk::Device> dev);
  Status init(const VulkanOptions& opts);

  // A buffer range a dispatch touches (size 0: bound but not touched).
  struct Bind {
    vk::Block* block = nullptr;
    uint64_t offset = 0;
    uint64_t size = 0;
    bool write = false;
  };
  // The compiler statistics of a pipeline made with CAPTURE_STATISTICS, as text.
  std::string statistics_text(VkPipeline pipe) const;
  struct Pipeline {
    VkPipeline pipe = VK_NULL_HANDLE;
    uint32_t n_bindings = 0;
    std::string name;   ///< the variant, for timestamps
    std::string stats;  ///< compiler statistics (VulkanOptions::pipeline_statistics)
  };
  // A shader variant before it is named: op, dtype and the optional features
  // it may use (subgroups, 16-bit storage); the device decides which apply.
  struct Variant {
    const char* op;
    bool has_dtype = false;
    DType dtype = DType::kF32;
    bool sg = false, h = false;
  };
  static Variant plain(const char* op, bool sg = false) {
    return Variant{op, false, DType::kF32, sg, false};
  }
  static Variant typed(const char* op, DType dt, bool sg, bool h) {
    return Variant{op, true, dt, sg, h};
  }
  // Key of the per-dispatch pipeline lookup (no strings on the hot path; `op`
  // is compared by address, call sites pass literals).
  struct FastKey {
    const char* op;
    uint32_t dtype, flags, wg, c1, c2, c3;
    bool operator==(const FastKey&) const = default;
  };
  struct FastKeyHash {
    size_t operator()(const FastKey& k) const;
  };
  static constexpr uint32_t kMaxBindings = 8;
  struct DescKey {
    uint32_t n = 0;
    std::array<VkBuffer, kMaxBindings> b{};
    bool operator==(const DescKey&) const = default;
  };
  struct DescKeyHash {
    size_t operator()(const DescKey& k) const;
  };

  // Recording and submission.
  Status begin();
  Status flush();
  void fail(const Status& s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }
  // Specialization constants: 0 = workgroup size, 1 and 2 as each shader says.
  struct Spec {
    uint32_t wg = 64, c1 = 1, c2 = 1, c3 = 1;
  };
  Result<Pipeline*> pipeline(std::string_view shader, const Spec& spec, uint32_t n_bindings);
  Result<VkDescriptorSet> descriptor_set(const Bind* binds, uint32_t n);
  void barrier_if_needed(const Bind* binds, uint32_t n);
  void full_barrier();
  Result<Pipeline*> pipeline_for(const Variant& v, const Spec& spec, uint32_t n_bindings);
  void dispatch(const Variant& v, const Spec& spec, std::initializer_list<Bind> binds,
                const void* push, uint32_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz);
  void eltwise(const char* op, Act a, Act b, Act out);  // add, silu_mul, gelu_mul, copy (b unused)
  void copy_buffer(vk::Block* src, uint64_t src_off, vk::Block* dst, uint64_t dst_off,
                   uint64_t bytes);
  // Splits a 1-D count of workgroups into x (<= the device limit) and z.
  void grid_1d(uint64_t n, uint32_t* gx, uint32_t* gz) const;
  std::string variant_name(const Variant& v) const;

  // The host-visible ring for op inputs and transfers; reset at each flush.
  Status ring_reserve(uint64_t bytes);
  uint64_t ring_put(const void* data,
                    uint64_t bytes);  // after ring_reserve; returns the byte offset
  // Positions or ids of the current op in the ring (cached while unchanged), as an int offset.
  Result<uint32_t> put_ints(const int32_t* v, int64_t n);
  // A decode attention dispatch's inputs: the scratch grown to part_bytes
  // for its partials (0: none), then the positions and a slot map (if any)
  // in one put_ints (a second put may flush the ring). Returns the
  // positions' offset; the map's follows at + T.
  Result<uint32_t> decode_inputs(uint64_t part_bytes, const int32_t* pos, int64_t T,
                                 const std::vector<int32_t>* map);

  const Resident* find_weight(const void* p) const;
  /// The resident tensor `w` is all of (not a row range of), or null.
  const Resident* whole_tensor(const Weight& w) const;
  // Uploads: the host range a weight's device copy mirrors (its whole tensor),
  // and whether a copy of those bytes is resident already.
  struct Source {
    const uint8_t* begin = nullptr;
    int64_t n_rows = 0;
    uint64_t bytes = 0, fingerprint = 0;
    bool resident = false;
  };
  Source weight_source(const Weight& w) const;
  Status check_packable(const Weight& w, const vk::PackedLayout& l) const;
  // Frees copies that overlap src's bytes (stale: an unloaded tensor's).
  void drop_stale(const Source& src);
  // Repacks w into `a` (freed on failure) and records it as resident.
  Status upload_into(const Weight& w, const Source& src, const vk::PackedLayout& l, vk::Alloc a);
  Bind act_bind(const Act& a, bool write) const;
  bool check_act(const Act& a, const char* op);
  bool positions_in_range(const int32_t* pos, int64_t n, int64_t n_ctx, const char* op);
  Status ensure_scratch(uint64_t bytes);
  // KvStorage::export_layer/export_rows (out set) or import_layer/import_rows
  // (in set) of rows [row0, row0 + n) of every KV head.
  struct KvRows {  // rows [row0, row0 + n) of every KV head, out (k_out/v_out) or in
    int64_t row0, n;
    uint8_t *k_out, *v_out;
    const uint8_t *k_in, *v_in;
  };
  Status kv_transfer(VkKvStorage& s, int64_t layer, std::span<const KvRows> items);
  Status kv_transfer(VkKvStorage& s, int64_t layer, int64_t row0, int64_t n, uint8_t* k_out,
                     uint8_t* v_out, const uint8_t* k_in, const uint8_t* v_in);
  // kv_store() of tokens into the given device rows of a layer.
  void kv_store_rows(VkKvStorage& s, int64_t layer, Act k, Act v, const int32_t* rows);
  // Decode attention (attn_decode where attention_decode_onepass takes it,
  // else attn_split; then attn_merge unless `keep_splits`) of a layer: with
  // `map` (slotted layers: the first position of each slot's block, -1 when
  // free) one split per slot over the slots' rows, causal by position;
  // `extra_splits` more splits are left for the caller to fill
  // (attention_split's host part). `slot_chunks`: with `map`, a split may
  // take several slots (no slot's own (m, l) is wanted: no attention mass).
  // Returns the number of device splits.
  uint32_t attention_decode(VkKvStorage& s, int64_t layer, Act q, const int32_t* pos,
                            int64_t n_heads, float scale, Act out, const std::vector<int32_t>* map,
                            uint32_t extra_splits, bool keep_splits, bool slot_chunks = false);
  // attn_decode.comp's dispatch where it applies (F16 or Q8_0 rows, a
  // subgroup shape that holds the head), as attention_decode's arguments;
  // false, and nothing recorded, where not.
  bool attention_decode_onepass(VkKvStorage& s, int64_t layer, Act q, const int32_t* pos,
                                int64_t n_heads, float scale, Act out, uint32_t n_keys,
                                const std::vector<int32_t>* map, uint32_t extra_splits,
                                bool keep_splits, bool slot_chunks, uint32_t* n_dev);
  // attn_merge of the n_splits partials in the scratch into out.
  void attn_merge(Act out, int64_t n_heads, int64_t hd, uint32_t n_splits, uint64_t part_bytes,
                  bool q8_out);
  // Whether attention output `out` (one token) gets a Q8 copy for the o matvec.
  bool attn_q8_out(const Act& out, int64_t n_heads, int64_t hd) const;
  // Tiled flash attention (attn_tile) of T query rows over a K/V pair of
  // `rows` rows per KV head (row = position; Q8_0 scales at `quant_bytes`).
  void attention_tile(Act q, const int32_t* pos, int64_t n_heads, float scale, Act out,
                      const vk::Alloc& ka, const vk::Alloc& va, uint64_t quant_bytes, int64_t rows,
                      const KvCacheConfig& c);
  // Prefill over a slotted layer (vulkan_kv_gather.cpp): its device and host
  // blocks gathered by position into gather_k_/gather_v_, then attention_tile.
  Status attention_gathered(KvCache& kv, VkKvStorage& s, int64_t layer, Act q, const int32_t* pos,
                            int64_t n_heads, float scale, Act out);
  Status ensure_gather(const VkKvStorage& s, int64_t rows);
  static uint64_t gather_quant_bytes(const KvCacheConfig& c, int64_t rows);
  static uint64_t gather_scale_bytes(const KvCacheConfig& c, int64_t rows);
  // Query rows per group whose partials (n_splits each) fit kAttnGroupScratch.
  int64_t attn_rows_per_group(int64_t n_heads, int64_t hd, size_t n_splits) const;
  // One vkCmdCopyBuffer of many regions.
  void copy_regions(vk::Block* src, vk::Block* dst, const std::vector<VkBufferCopy>& regions);

  // Scope timing: a timestamp at each boundary (begin_scope), resolved in flush().
  void mark_scope(int32_t id);
  void write_scope_mark(int32_t starts, bool ends);
  Status make_scope_pool(uint32_t n);
  void resolve_scopes();
  uint64_t ticks_to_ns(uint64_t ticks) const {
    return static_cast<uint64_t>(static_cast<double>(ticks) * dev_->caps().timestamp_period_ns +
                                 0.5);
  }

  std::unique_ptr<vk::Device> dev_;
  std::unique_ptr<vk::MemoryPool> device_pool_, host_pool_;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;  ///< the one being recorded: cmds_[cmd_index_]
  // A batch (begin() .. flush()) may go out in several command buffers: every
  // submit_every_ dispatches the current one is submitted without waiting
  // (submit_chunk) and recording goes on in the next; flush() submits the last
  // with fence_, which covers every earlier submission of the queue.
  std::vector<VkCommandBuffer> cmds_;
  size_t cmd_index_ = 0;
  uint32_t submit_every_ = 0;      ///< 0: one command buffer per batch
  uint32_t submit_first_ = 0;      ///< dispatches in the batch's first command buffer
  uint32_t chunk_dispatches_ = 0;  ///< dispatches in cmd_
  uint64_t dispatches_ = 0;        ///< all dispatches recorded (dispatches())
  int fence_spin_us_ = 0;          ///< see VulkanOptions::fence_spin_us
  VkResult wait_fence();           ///< the fence of the last submission
  Status submit_chunk();
  Status begin_cmd();
  VkFence fence_ = VK_NULL_HANDLE;
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  VkQueryPool query_pool_ = VK_NULL_HANDLE;
  std::array<VkDescriptorSetLayout, kMaxBindings + 1> set_layouts_{};
  std::array<VkPipelineLayout, kMaxBindings + 1> pipe_layouts_{};
  std::vector<VkDescriptorPool> desc_pools_;
  uint32_t desc_pool_left_ = 0;
  std::unordered_map<DescKey, VkDescriptorSet, DescKeyHash> desc_cache_;
  std::unordered_map<std::string, Pipeline> pipelines_;
  std::unordered_map<FastKey, Pipeline*, FastKeyHash> fast_pipes_;
  uint32_t reduce_wg_ = 128;  ///< workgroup size of rms_norm and attention (see init)
  uint32_t matvec_rows_ =
      0;  ///< rows per row group of single-token matvecs (VulkanOptions::matvec_rows; 0: auto)
  uint32_t matvec_rows_opt_ = 0;  ///< matvec_rows_ as VulkanOptions set it
  uint32_t matvec_tpr_ = 0;       ///< threads per row group of single-token matvecs (0: auto)
  uint32_t matvec_wg_ = 128;      ///< workgroup size of single-token matvecs
  MatvecTuning mv_tune_;
  uint32_t norm_wg_ = 128;  ///< workgroup size of rms_norm
  uint32_t attn_wg_ = 128;  ///< workgroup size of attn_split
  uint32_t merge_wg_ = 32;  ///< workgroup size of attn_merge (a multiple of 32)
  // keep_busy: allowed (options, GPU), asked for (set_keep_busy), the kernel
  // submitted and not told to stop yet; its flag word and command buffer.
  bool keep_allowed_ = false, keep_on_ = false, keep_running_ = false;
  uint64_t keep_starts_ = 0;
  uint32_t keep_groups_ = 1;
  vk::Alloc keep_flag_;
  VkCommandBuffer keep_cmd_ = VK_NULL_HANDLE;
  void start_keep_busy();  // after a batch's fence, when allowed and asked for
  void stop_keep_busy();   // as the next batch starts recording
  Status record_keep_busy();
  volatile uint32_t* keep_word() const;  // the flag the kernel polls (host-visible)
  uint32_t attn_split_keys_ = 0;         ///< set_attn_split_keys()
  uint32_t attn_split_chunks_ = 0;       ///< set_attn_split_chunks()
  // Decode attention on GPUs: the workgroups that fill the GPU, past which a
  // split takes several chunks, and the keys per chunk then.
  // LOOM_VK_ATTN_GROUPS, LOOM_VK_ATTN_KEYS (A/B runs).
  uint32_t attn_groups_ = 1024;
  uint32_t attn_chunk_keys_ = 64;
  // attn_decode.comp: on (set_attn_decode, LOOM_VK_ATTN_DECODE; GPUs), for
  // every context (tests), and the workgroups its splits aim at
  // (LOOM_VK_ATTN_DECODE_GROUPS).
  bool attn_decode_ = true;
  bool attn_decode_always_ = false;
  uint32_t attn_decode_groups_ = 512;
  bool attn_coopmat_ = true;      ///< set_attn_coopmat(), LOOM_VK_ATTN_CM
  bool matmul_n64_ = false;       ///< set_matmul_n64()
  bool coopmat_ = true;           ///< set_matmul_coopmat(), LOOM_VK_COOPMAT
  uint32_t coopmat_variant_ = 0;  ///< set_matmul_coopmat(), LOOM_VK_COOPMAT
  std::string cm_tile_name_;      ///< set_matmul_cm_tile(), LOOM_VK_CM_TILE
  bool qkv_rope_ = true;          ///< set_qkv_rope()
  bool probe_loads_ = false;      ///< LOOM_VK_PROBE_LOADS (benchmarks)
  bool int_dot_ = true;           ///< set_int_dot()
  bool int_dot_inputs_ = false;   ///< set_int_dot(): quant_q8 copies of o's and down's inputs
  bool int_dot_outputs_ = true;   ///< set_int_dot(): Q8 copies from gate+up and the attention merge
  // The Q8 copy last made of one token's row (by rms_norm_q8, the gate+up
  // matvec, the attention merge or quant_q8: the act range it mirrors, and
  // where its quants and block scales are): the integer-dot matvecs (matvec1x)
  // read it while no dispatch has written that range since. xq8_buf_ has two
  // slots, so a dispatch can read one copy and write the next.
  struct Xq8 {
    void* buffer = nullptr;  ///< null: none
    uint64_t offset = 0;
    int64_t n = 0;
    uint32_t xq_off = 0, xd_off = 0;  ///< words, vec2s in xq8_buf_
    uint64_t base = 0;                ///< its slot's byte offset in xq8_buf_'s block
  };
  Xq8 xq8_;
  vk::Alloc xq8_buf_;
  uint64_t xq8_slot_ = 0;  ///< bytes per slot of xq8_buf_
  // xq8_ when x is the row it copies, K long, and t has an integer-dot matvec.
  const Xq8* xq8_for(const Act& x, int64_t K, DType t) const;
  // The F16 copy of a prefill matmul's input in xf16_buf_ (to_f16.comp),
  // rows of `units` 32-wide units: q, k and v (gate and up) read one copy.
  // A write over the source rows makes it stale (barrier_if_needed).
  struct Xf16 {
    void* buffer = nullptr;  ///< the source activation's block
    uint64_t offset = 0;
    int64_t rows = 0, cols = 0;
    uint32_t units = 0;
    uint64_t src_bytes() const { return static_cast<uint64_t>(rows * cols) * 4; }
  };
  Xf16 xf16_;
  vk::Alloc xf16_buf_;
  // x's F16 copy (made now unless xf16_ holds it), bound for reading.
  Result<Bind> xf16_for(const Act& x, uint32_t units);
  // Rows row0 .. row0 + rows - 1 of a quantized resident weight as F16 rows
  // in wf16_buf_ (dequant_f16.comp), for the direct tensor-core matmul; the
  // last copy is kept while the next call asks for the same rows.
  struct Wf16 {
    const void* block = nullptr;  ///< the weight's block, offset and fingerprint
    uint64_t offset = 0, fingerprint = 0;
    uint64_t row0 = 0, rows = 0;
  };
  Wf16 wf16_;
  vk::Alloc wf16_buf_;
  Result<Bind> wf16_for(const Resident& r, uint64_t row0, uint32_t rows);
  // Replaces a scratch buffer by one of `bytes` (after a flush: recorded
  // work may still use the old one); its contents are gone.
  Status grow_scratch(vk::Alloc* buf, uint64_t bytes, const char* what);
  // A bound range's bytes as half-precision bit patterns (test hooks).
  Result<std::vector<uint16_t>> download_halves(const Bind& b);
  static bool int_dot_type(DType t);     // a matvec1x variant exists for t
  static uint64_t q8_bytes(uint64_t n);  // a Q8 copy of n: int8 quants, then (d, d sum q) per block
  Status ensure_xq8(uint64_t n);         // xq8_buf_'s slots hold a copy of n elements
  // The slot xq8_ is not in made ready for a copy of `row`: the copy's record
  // (set xq8_ to it once written) and its bytes to write.
  Result<Bind> xq8_out(const Act& row, Xq8* copy);
  void quantize_q8(Act x);  // xq8_ = a Q8 copy of one token's row x (quant_q8)
  Bind xq8_bind();          // xq8_'s bytes, read (and counts an integer-dot dispatch)
  uint64_t int_dot_dispatches_ = 0;
  bool gpu_device_ = true;  ///< not a CPU device (lavapipe)
  // Single-token matvec launch shape: workgroup size, rows and threads per row group.
  struct MatvecShape {
    uint32_t wg, nr, tpr, unroll;
  };
  MatvecShape matvec1_shape(uint32_t M, uint32_t row_units, DType dtype, bool int_dot) const;
  // Workgroups (x spilling into z) for M rows of single-token matvecs of shape s.
  void matvec1_grid(const MatvecShape& s, uint32_t M, uint32_t* gx, uint32_t* gz) const;
  // matmul(), or with `accumulate` (single-token subgroup matvecs only) out += W x.
  void matmul_impl(const Weight& w, Act x, Act out, const Weight* bias, bool accumulate);
  // rope() of x, and of x2 (n_heads2 heads) in the same dispatch when n_heads2 > 0.
  // With kv (rope_kv), x2 is k: also stores k and v in that layer's F16 cache.
  struct RopeKv {
    Act v;
    const vk::Alloc* k_cache;
    const vk::Alloc* v_cache;
    uint32_t n_ctx;
  };
  void rope_impl(Act x, int64_t n_heads, Act x2, int64_t n_heads2, int64_t head_dim,
                 const int32_t* pos, const cpu::RopeParams& p, const RopeKv* kv = nullptr);
  // Positions (and frequency factors, if any) of RoPE into the ring: their offsets there.
  Status put_rope_inputs(const int32_t* pos, int64_t n, const cpu::RopeParams& p, uint32_t* pos_off,
                         uint32_t* ff_off);
  // matmul_qkv_rope_kv's RoPE and KV store, done by the matvec.
  struct QkvRope {
    const RopeKv* kv;
    const int32_t* pos;
    const cpu::RopeParams* p;
    uint32_t head_dim;
  };
  // matmul_qkv(), or with `rope` matvec1_qkv_rope: then false (nothing
  // recorded) when the three matrices do not fuse into one matvec.
  bool qkv_impl(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v,
                const QkvRope* rope);
  bool recording_ = false;
  Status status_;
  bool simulate_lost_ = false;
  uint64_t submissions_ = 0;

  // Hazard tracking since the last barrier: ranges written and read.
  struct Range {
    VkBuffer buf;
    uint64_t lo, hi;
  };
  std::vector<Range> pending_writes_, pending_reads_;

  vk::Alloc ring_;
  uint64_t ring_used_ = 0;
  std::vector<int32_t> ints_memo_;  ///< last put_ints() contents in this batch
  uint64_t ints_memo_off_ = 0;
  bool ints_memo_valid_ = false;

  vk::Alloc scratch_;  ///< attention partials
  /// One layer's K and V gathered by position (prefill over the device tier).
  vk::Alloc gather_k_, gather_v_;
  int64_t gather_rows_ = 0;  ///< rows per KV head they hold
  // Arrival counters of dispatches that finish part of their output once all
  // of it is written (matvec1x_glu_q8's Q8 blocks): zero between dispatches
  // (whoever completes a count resets it). Allocated and zeroed on first use.
  vk::Alloc counters_;
  static constexpr uint32_t kCounters = 4096;
  // The first n counters, bound for writing (so dispatches using them are ordered).
  Result<Bind> counters(uint32_t n);

  std::map<const uint8_t*, Resident> weights_;  ///< by host begin address
  uint64_t weight_bytes_ = 0;                   ///< sum of their allocations
  uint64_t transfer_chunk_ = 0;                 ///< set_transfer_chunk

  // Timestamps: two queries per dispatch, labelled; summed at each flush.
  bool profile_ = false;
  std::string prof_shape_;  // appended to the next dispatch's profile label (then cleared)
  uint32_t n_queries_ = 0;
  std::vector<std::string> query_labels_;
  std::map<std::string, GpuOpTime> times_;

  // Scope timing (set_scope_timing). Timestamp i of a submission ends the
  // scope that was open before it (when `ends`) and starts scope `starts`
  // (-1: none); the last one of a submission with a scope still open only
  // pauses it, and the next submission's first one resumes it, so a scope cut
  // by a flush still comes out as one entry.
  struct ScopeMark {
    int32_t starts;
    bool ends;
  };
  bool scope_on_ = false;
  VkQueryPool scope_pool_ = VK_NULL_HANDLE;
  uint32_t scope_cap_ = 0;    ///< queries in scope_pool_
  uint32_t scope_want_ = 0;   ///< capacity for the next submission (grows when one fills the pool)
  bool scope_reset_ = false;  ///< scope_pool_ reset in the command buffer being recorded
  std::vector<ScopeMark> scope_marks_;  ///< this submission's timestamps
  int32_t scope_open_ = -1;
  uint64_t scope_carry_ = 0;  ///< ticks of the open scope in earlier submissions
  std::vector<ScopeTime> scope_done_;

  friend class VkActBuffer;
  friend class VkKvStorage;
};

}  // namespace loom
