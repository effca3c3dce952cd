// The CUDA backend: every forward-pass op as CUDA kernels on one stream of
// one device (compute capability 9.0 and later; code for sm_90 plus PTX).
//
// How work flows: ops queue kernels on the backend's stream and return;
// download()/synchronize() wait. Host inputs of ops (token ids, positions,
// RoPE cos/sin) are written to a pinned host ring and copied to a device
// ring of the same size by cudaMemcpyAsync on the stream, so the kernels
// that read them are ordered after the copy; the ring starts over after a
// synchronize (a full ring synchronizes first).
//
// Memory: weights are copied as their GGUF rows (no repacking; the kernels
// decode the block formats, quant_device.cuh), one allocation per tensor,
// keyed by the host address range of the tensor (upload_weight,
// release_weight). Activations are cudaMalloc'd buffers; an Act names one
// by `buffer` (the allocation's device address) plus `offset`. A KV storage
// (attention/cuda_attention.h) holds the layers made resident in it.
// CudaOptions::memory_limit bounds weights plus KV (kOutOfMemory naming the
// bytes past it; the placement then runs those ops elsewhere).
//
// Errors: an op cannot return one, so the first failure is kept and every
// later op is skipped; the next download()/synchronize() reports it.
//
// Timing: scope timing (the profiler) records a CUDA event per scope
// boundary; times are read after a synchronize.
//
// Steps as CUDA graphs (cuda_step.cpp): between begin_step() and the next
// download()/synchronize(), ops do their host part at once (checks, inputs
// into the ring) and keep their launches, each mixing its arguments (device
// addresses, shapes, scalars) into a hash of the step. At the end a step
// whose hash has a graph replays it; one whose hash was also the previous
// step's is captured into a graph (stream capture) and launched; any other
// runs its launches as they are. Host inputs sit at the same ring offsets
// every step, so a replay copies this step's values. Per-step values that
// are launch arguments (the attention's split plan) are bucketed so that the
// hash changes only when the bucket does. LOOM_CUDA_GRAPHS=0 turns it off.
//
// Use from one thread at a time (each entry point makes the backend's
// device current on the calling thread). ActBuffers and KvStorages it hands
// out must be destroyed before it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/backends/cuda/cuda.h"
#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/cuda_matmul.h"

namespace loom {

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const CudaOptions& opts);
  ~CudaBackend() override;

  std::string name() const override;
  bool supports(OpKind op, DType dtype) const override;

  bool host_memory() const override { return false; }
  Result<std::unique_ptr<ActBuffer>> alloc_act(int64_t n_floats) override;
  Status upload(const float* src, Act dst) override;
  Status download(Act src, float* dst) override;
  Status synchronize() override;
  void begin_step() override;
  Status upload_weight(const Weight& w) override;
  void release_weights() override;
  void release_weight(const Weight& w) override;
  uint64_t weight_bytes() const override { return weight_bytes_; }
  bool has_weight(OpKind op, const Weight& w) const override;
  Result<std::unique_ptr<KvStorage>> create_kv_storage(const KvCacheConfig& cfg) override;
  /// The memory limit, or the device's memory (the default device KV budget).
  uint64_t memory_capacity() const override {
    return budget_.limit ? budget_.limit : info_.total_bytes;
  }

  bool device_timing() const override { return true; }
  void set_scope_timing(bool on) override;
  void begin_scope(int32_t id) override;
  void take_scope_times(std::vector<ScopeTime>* out) override;

  void get_rows(const Weight& w, const int32_t* ids, Act out) override;
  void rms_norm(Act x, const Weight& w, float eps, Act out) override;
  void matmul(const Weight& w, Act x, Act out, const Weight* bias) override;
  void rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
            const cpu::RopeParams& p) override;
  /// q and k rotated in one launch, from one cos/sin table.
  void rope_qk(Act q, Act k, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
               const int32_t* pos, const cpu::RopeParams& p) override;
  void kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) override;
  /// RoPE of q and k and the KV store in one launch (rope_kv_store) where the
  /// cache allows it (LOOM_CUDA_FUSE_ROPE=0: apart); else the default.
  void rope_qk_kv(Act q, Act k, Act v, KvCache& kv, int64_t layer, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                  const cpu::RopeParams& p) override;
  void attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                 float scale, Act out) override;
  /// Rows of different sequences in one launch each (cuda_rows.cpp), where
  /// every cache holds the layer on this device, untiered, in one format
  /// (LOOM_CUDA_ROWS=0 or set_row_ops(false): one sequence at a time).
  bool rope_qk_kv_rows(Act q, Act k, Act v, std::span<KvCache* const> kvs, int64_t layer,
                       int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                       const cpu::RopeParams& p) override;
  bool attention_rows(std::span<KvCache* const> kvs, int64_t layer, Act q, const int32_t* pos,
                      int64_t n_heads, float scale, Act out) override;
  /// The device KV tier (cuda_kv_tier.cpp): the GPU's split-K partials over
  /// the layer's slots merged with the host's over its host blocks; prompts
  /// (16 query rows or more) gather the blocks by position instead.
  Status attention_split(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                         float scale, Act out, const HostAttentionFn& host) override;
  void silu_mul(Act gate, Act up, Act out) override;
  void gelu_mul(Act gate, Act up, Act out) override;
  void add(Act a, Act b, Act out) override;
  /// y += W x in one product (the matvec's or the GEMM's accumulate).
  void matmul_add(const Weight& w, Act x, Act y, Act tmp) override;
  /// silu(gate x) * (up x) in one matvec when gate and up match; else the default.
  void matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) override;
  /// The three products with one Q8 (decode) or F16 (prefill) copy of x.
  void matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                  const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v) override;

  const CudaDeviceInfo& device_info() const { return info_; }
  /// Steps replayed from a graph, graphs captured, and captures that failed
  /// (the step then ran op by op).
  struct GraphStats {
    uint64_t replays = 0, captures = 0, capture_failures = 0;
  };
  const GraphStats& graph_stats() const { return graph_stats_; }
  /// Device memory held: weights, KV (through the budget), scratch.
  uint64_t device_bytes() const;
  /// Test hooks of the attention kernels (AttentionScratch).
  cuda::AttentionScratch& attention_scratch() { return *attn_scratch_; }
  /// Who reads a device-tiered layer's pinned host blocks at decode (tests;
  /// LOOM_CUDA_KV_GPU_READ_MIB and LOOM_CUDA_KV_GPU_SHARE otherwise): the GPU
  /// alone up to `gpu_read_bytes` a layer, past that the GPU `share_pct`
  /// percent of them (the newest) and the CPU the rest.
  void set_tier_reads(uint64_t gpu_read_bytes, int64_t share_pct) {
    tier_gpu_read_ = gpu_read_bytes;
    tier_gpu_share_ = share_pct;
  }
  /// Test hook: whether rope_qk_kv_rows and attention_rows take rows (else
  /// they decline, and the caller goes one sequence at a time).
  void set_row_ops(bool on) { row_ops_ = on; }
  /// Test hook: the next op fails as a lost device would, and every later one is skipped.
  void simulate_failure(const std::string& why) {
    fail(make_error(ErrorCode::kInternal, "%s", why.c_str()));
  }

 private:
  CudaBackend() = default;
  Status init(const CudaOptions& opts);
  void fail(const Status& s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }
  // Makes the device current; false (nothing to do) after a failure.
  bool ready();
  float* dev(const Act& a) const {
    return reinterpret_cast<float*>(static_cast<uint8_t*>(a.buffer) + a.offset);
  }
  bool check_act(const Act& a, const char* op);
  // The device address of w's first byte (uploading its tensor when it is
  // not resident yet), or null after recording the failure.
  const void* weight_ptr(const Weight& w, const char* op);
  bool dev_matrix(const Weight& w, const char* op, cuda::DevMatrix* m);
  // Copies n bytes of host input into the ring; its device address, or null.
  const void* put(const void* data, uint64_t bytes);
  // RoPE's cos/sin per token and pair (cpu::rope's float expressions) in
  // the ring: its device address, or null after recording the failure.
  const float* rope_table(int64_t T, const int32_t* pos, const cpu::RopeParams& p);
  bool check_rope(const cpu::RopeParams& p, int64_t head_dim);
  // The rotation fits the head (what check_rope checks, without failing).
  static bool rope_params_ok(const cpu::RopeParams& p, int64_t head_dim);
  // The device KV layer of `layer` in kv's storage, or a failure.
  bool kv_layer(KvCache& kv, int64_t layer, const char* op, cuda::DevKvLayer* out);
  // Keys the decode attention's launch is planned for, past max_pos: powers
  // of two from 256, in eighths of an octave past 2048.
  static int64_t attention_plan(int64_t max_pos);
  // Each cache's device K/V of `layer` (rows) and the first one's format;
  // false where one is not on this device, is tiered or differs in format.
  bool row_layers(std::span<KvCache* const> kvs, int64_t layer, cuda::DevKvLayer* first,
                  std::vector<cuda::RowKv>* rows);

  // The device KV tier (cuda_kv_tier.cpp). Layers in block slots
  // (KvStorage::set_block_slots): their stores go to the slot rows the cache
  // names, their attention runs under the slot map.
  // The K/V rows that kv_store and rope_qk_kv write for T tokens at `pos`,
  // in the ring: the positions, or in a slotted layer the slot rows the
  // cache names (-1: stored by the cache in a host block, -2: left as it is
  // while recomputing; the kernels pass over rows < 0); null on a failure.
  // *to_host: some token goes to a host block (store_host_rows).
  const int32_t* store_rows(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l,
                            const int32_t* pos, int64_t T, std::vector<int32_t>* rows,
                            bool* to_host);
  // The tokens whose row is -1 stored by the cache (k, v brought down).
  void store_host_rows(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos,
                       const std::vector<int32_t>& rows);
  void attention_slotted(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l, Act q,
                         const int32_t* pos, int64_t n_heads, float scale, Act out);
  // Prefill over a slotted layer: its blocks up to the last position copied
  // by position (host blocks over PCIe once), then the flash prefill.
  // kOutOfMemory when the gather buffers do not fit (the caller splits).
  Status attention_gathered(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l, Act q,
                            const int32_t* pos, int64_t n_heads, float scale, Act out);
  // A tiered layer's host blocks [0, n_blocks) in mapped pinned memory
  // (mapped_blocks): their indices, host K pointers (each block K then V,
  // v_off bytes apart; heads head_bytes apart) and mapped device addresses.
  struct MappedBlocks {
    std::vector<int32_t> blocks;
    std::vector<const uint8_t*> host, dev;
    uint64_t v_off = 0, head_bytes = 0;
  };
  // Decode over a slotted layer whose host blocks `mb` (mapped_blocks, and
  // few enough that the GPU alone reads them: gpu_reads_all): one launch,
  // the kernel reading them from a staged copy or over PCIe where they are;
  // no host work, no wait. Also starts the next tiered layer's copy.
  void attention_mapped(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l, Act q,
                        const int32_t* pos, int64_t n_blocks, int64_t n_heads, float scale, Act out,
                        MappedBlocks& mb);
  // Where the decode attention into `out` can also write the o product's Q8
  // activations (into the norm's buffers, free between the q/k/v product
  // and the next norm): those buffers, else q null.
  cuda::Q8Out attention_q8(const cuda::DevKvLayer& l, int64_t n_heads, Act out) const;
  // Launches the attention of q over a slotted layer under `map`; with a
  // stage `si` >= 0 after its copy is done (and marks the stage read).
  void launch_slots(const cuda::DevKvLayer& l, Act q, const int32_t* d_pos, int64_t n_heads,
                    float scale, const cuda::SlotMap& map, Act out, int si);
  // The slot map of a slotted layer in the ring (n_slots entries, then the
  // first positions of `host_blocks`, by block index), or null.
  const int32_t* put_slot_map(KvCache& kv, int64_t layer, int64_t n_slots,
                              const std::vector<int32_t>& host_blocks = {});
  // At least `bytes` of pinned host memory in tier_host_ (after the stream's
  // earlier copies from it are done).
  Status tier_host(uint64_t bytes);

  // Runs `op` (a launch on stream_) now, or inside a step keeps it for
  // finish_step with `key` (its arguments) mixed into the step's hash.
  template <class F>
  void launch(std::initializer_list<uint64_t> key, F&& op) {
    ++op_seq_;
    if (!stepping_) {
      fail(op());
      return;
    }
    for (uint64_t k : key) step_hash_ = (step_hash_ ^ k) * 0x100000001b3ull + 0x9e3779b9u;
    step_ops_.emplace_back(std::forward<F>(op));
  }
  // The Q8 activations the last rms_norm made with its output (rms_norm_q8),
  // when the product about to be launched reads that output: true and *q
  // set when x is that output and no launch came between.
  bool norm_q8_for(const float* x, const Act& a, cuda::Q8Act* q) const;
  // Ends a step: replays its graph, captures one, or runs the kept launches.
  void finish_step();
  bool capture_step(const std::vector<std::function<Status()>>& ops, uint64_t hash);
  void drop_graphs();

  struct Resident {
    const uint8_t* end = nullptr;  ///< end of the host range it mirrors
    void* dev = nullptr;
    uint64_t bytes = 0;
    uint64_t fingerprint = 0;  ///< size and sampled bytes: a new tensor at the same address differs
  };
  struct Source {
    const uint8_t* begin = nullptr;
    uint64_t bytes = 0, fingerprint = 0;
  };
  static Source weight_source(const Weight& w);
  const Resident* find_weight(const void* p, const uint8_t** begin) const;
  void drop(std::map<const uint8_t*, Resident>::iterator it);

  int device_ = 0;
  CudaDeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  Status status_;
  std::unique_ptr<cuda::Matmul> matmul_;
  std::unique_ptr<cuda::AttentionScratch> attn_scratch_;
  cuda::DeviceBudget budget_;
  std::map<const uint8_t*, Resident> weights_;  ///< by host begin address
  uint64_t weight_bytes_ = 0;

  // Host inputs: pinned host ring and its device mirror.
  void* ring_host_ = nullptr;
  void* ring_dev_ = nullptr;
  uint64_t ring_bytes_ = 0, ring_used_ = 0;
  // The last inputs put into the ring since it started over, to copy an
  // input that comes again (same bytes) only once.
  struct PutCopy {
    const void* host = nullptr;
    const void* dev = nullptr;
    uint64_t bytes = 0;
  };
  static constexpr int kPutCache = 4;
  PutCopy put_cache_[kPutCache];
  int put_cache_n_ = 0, put_cache_next_ = 0;
  // The ring starts over from its first byte (its earlier copies are done).
  void ring_restart();
  std::vector<float> rope_cs_;  ///< host cos/sin table, reused

  // The RMS norm's Q8 copy of its output (decode, T <= 8), read by the next
  // product instead of a quantize launch of its own. LOOM_CUDA_FUSE_NORM=0
  // turns it off.
  bool fuse_norm_ = true;
  bool fuse_rope_ = true;  ///< rope_qk_kv in one launch
  bool row_ops_ = true;    ///< the *_rows ops (LOOM_CUDA_ROWS=0: one sequence at a time)
  /// The decode attention writes the o product's Q8 activations into the
  /// same buffers (LOOM_CUDA_FUSE_ATTN=0: off).
  bool fuse_attn_ = true;
  void* norm_xq_ = nullptr;  ///< [8, q8_token_bytes(norm_cols_)]
  void* norm_xd_ = nullptr;  ///< [8, norm_cols_ / 32] scale pairs (float2)
  int64_t norm_cols_ = 0;    ///< the widest row the buffers hold
  struct NormQ8 {
    const float* out = nullptr;
    int64_t rows = 0, cols = 0;
    uint64_t seq = 0;  ///< op_seq_ after its launch
  } norm_q8_;
  uint64_t op_seq_ = 0;  ///< launches so far

  // Scope timing: an event per boundary since the last take_scope_times.
  bool scope_on_ = false;
  struct Mark {
    int32_t starts;  ///< the scope this event opens (-1: none)
    cudaEvent_t ev;
  };
  std::vector<Mark> marks_;
  std::vector<cudaEvent_t> free_events_;

  // The device KV tier: pinned host memory (q, the host's partials, staged
  // host blocks) and device memory (staged blocks and the gathered K/V).
  void* tier_host_ = nullptr;
  uint64_t tier_host_bytes_ = 0;
  void* gather_ = nullptr;
  uint64_t gather_bytes_ = 0;
  cudaEvent_t tier_event_ = nullptr;  ///< q is on the host (the overlapped split)
  // Device copies of a tiered layer's host blocks (attention_mapped): two
  // buffers, which the copy engine fills on copy_stream_ (the next tiered
  // layer's blocks while this one computes). A copy serves while the cache's
  // host_epoch() and the layer's block list are those it was made from.
  struct TierStage {
    void* dev = nullptr;
    uint64_t bytes = 0;
    const KvCache* kv = nullptr;
    int64_t layer = -1;
    uint64_t epoch = 0;
    std::vector<const uint8_t*> blocks;
    cudaEvent_t ready = nullptr;  ///< the copy is done (copy_stream_)
    cudaEvent_t done = nullptr;   ///< the last kernel reading it is done (stream_)
    /// step_serial_ when `done` was recorded: a copy waits on it only within
    /// the same run of launches (an event recorded inside a stream capture
    /// marks nothing outside it).
    uint64_t done_serial = ~0ull;
  };
  TierStage stage_[2];
  bool tier_stage_ = true;  ///< LOOM_CUDA_KV_STAGE=0: the kernel reads the pinned blocks
  /// A tiered layer's host bytes up to which the GPU alone reads them (a
  /// staged copy, or PCIe: attention_mapped), and past that the share
  /// (percent, the newest blocks) it reads while the CPU attends over the
  /// rest where they lie (attention_split; 0: the CPU all).
  /// LOOM_CUDA_KV_GPU_READ_MIB, LOOM_CUDA_KV_GPU_SHARE. Measured on the H100
  /// machine (PCIe 5, 16 cores; 8B Q4_K_M, 2026-12-06; the CPU's speed
  /// varies between leases of it): 16 MiB a layer (516 MiB at 32k), GPU
  /// 69.5 tokens/s, CPU 58.2, both (40%) 64.1; 24 MiB a layer (772 MiB at
  /// 8k, another lease), CPU 70.8, GPU 56.1; 56 MiB a layer (1796 MiB at
  /// 16k), CPU 20.1, both 22.8 (40%) and 22.0 (25%).
  uint64_t tier_gpu_read_ = 20ull << 20;
  int64_t tier_gpu_share_ = 40;
  int next_stage_ = 0;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copy_join_ = nullptr;  ///< copy_stream_ joined back before a capture ends
  // The stage holding `blocks` (host K pointers) of `layer`, or -1.
  int staged(const KvCache& kv, int64_t layer, const std::vector<const uint8_t*>& blocks) const;
  // Queues the copy of `blocks` (each a K/V pair of `pair` bytes, pinned)
  // into a stage other than `avoid` (a launch: inside a step it is part of
  // the step's graph, a branch on copy_stream_); the stage, or -1 where
  // there is no device memory for it (the kernel then reads the blocks over
  // PCIe).
  int stage_copy(const KvCache& kv, int64_t layer, const std::vector<const uint8_t*>& blocks,
                 uint64_t pair, int avoid);
  // The host blocks [0, n_blocks) of a tiered layer, into *mb; false where
  // there are none, or one lies outside the storage's mapped pinned memory
  // (a spilled block's staging copy, RAM the storage did not give).
  bool mapped_blocks(KvCache& kv, int64_t layer, int64_t n_blocks, MappedBlocks* mb);
  // Whether the GPU alone reads mb's blocks in the slots' launch
  // (attention_mapped): at most tier_gpu_read_ bytes of them; past that the
  // CPU takes part.
  bool gpu_reads_all(const MappedBlocks& mb) const {
    return mb.host.size() * 2 * mb.v_off <= tier_gpu_read_;
  }

  // Steps (cuda_step.cpp).
  bool graphs_on_ = true;
  bool stepping_ = false;
  uint64_t step_serial_ = 0;  ///< counts runs of launches: each step, and each finish_step
  uint64_t step_hash_ = 0, last_eager_hash_ = 0, graph_clock_ = 0;
  std::vector<std::function<Status()>> step_ops_;
  struct StepGraph {
    uint64_t hash = 0, last_use = 0;
    cudaGraphExec_t exec = nullptr;
  };
  std::vector<StepGraph> graphs_;
  GraphStats graph_stats_;

  friend class CudaActBuffer;
};

}  // namespace loom
