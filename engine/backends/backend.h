// The backend interface: the ops a forward pass is written against. A backend
// runs ops on activations it can reach; the forward pass never knows which
// backend (CPU, Vulkan, CUDA) runs an op. Backends state what they support,
// and nothing unsupported is dispatched to them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/model/model.h"

namespace loom {

class KvCache;
struct KvCacheConfig;

/// A float activation matrix [rows, cols], row-major and contiguous, in memory
/// the backend can address. Host backends (the CPU) set `data`; device
/// backends (Vulkan) leave it null and name their memory by `buffer` (an
/// opaque handle only the owning backend reads) plus a byte `offset`.
struct Act {
  float* data = nullptr;  ///< host address, or null for device memory
  int64_t rows = 0;
  int64_t cols = 0;
  void* buffer = nullptr;  ///< device memory handle of the owning backend (null: host)
  uint64_t offset = 0;     ///< bytes from the start of `buffer`
  float* row(int64_t r) const { return data + r * cols; }
  /// Rows [r0, r0 + n) as an Act of their own (host or device alike).
  Act rows_view(int64_t r0, int64_t n) const {
    Act a = *this;
    if (a.data) a.data += r0 * cols;
    a.offset += static_cast<uint64_t>(r0 * cols) * sizeof(float);
    a.rows = n;
    return a;
  }
};

/// Memory for activations, allocated by a backend (Backend::alloc_act) and
/// released when destroyed. Holds `capacity` floats; view() shapes a prefix.
class ActBuffer {
 public:
  virtual ~ActBuffer() = default;
  int64_t capacity() const { return base_.cols; }
  /// The first rows * cols floats as a [rows, cols] matrix (rows * cols <= capacity()).
  Act view(int64_t rows, int64_t cols) const {
    Act a = base_;
    a.rows = rows;
    a.cols = cols;
    return a;
  }

 protected:
  Act base_;  ///< the whole buffer as one row of `capacity` floats
};

/// K/V storage a device backend keeps for a KvCache (Backend::create_kv_storage);
/// the KvCache owns it and forwards reserve() to it. Host backends have none
/// and read the KvCache's own blocks.
///
/// A storage holds the layers marked resident in it (set_layer_resident); the
/// KvCache keeps the other layers in host blocks. Rows move between the two
/// through export_layer/import_layer in the host row format: K (and V) of a
/// layer as [n_kv_heads][n][row bytes], a row being head_dim values of the
/// cache dtype (F16 words, or head_dim / 32 Q8_0 blocks of 34 bytes).
class KvStorage {
 public:
  virtual ~KvStorage() = default;
  /// Makes room for tokens [0, n) of every resident layer.
  virtual Status reserve(int64_t n) = 0;
  /// Bytes of device memory held.
  virtual uint64_t allocated_bytes() const = 0;
  /// Whether `layer` lives here. A storage starts with no layer resident.
  virtual bool layer_resident(int64_t layer) const = 0;
  /// Makes `layer` live here (allocating its memory; contents undefined until
  /// import_layer or kv_store) or not (freeing it). kOutOfMemory when it does not fit.
  virtual Status set_layer_resident(int64_t layer, bool resident) = 0;
  /// Copies tokens [0, n) of a resident layer to host rows (format above),
  /// once every queued op has run.
  virtual Status export_layer(int64_t layer, int64_t n, uint8_t* k, uint8_t* v) = 0;
  /// Writes tokens [0, n) of a resident layer from host rows (format above).
  virtual Status import_layer(int64_t layer, int64_t n, const uint8_t* k, const uint8_t* v) = 0;

  /// @name The device tier (KvTierConfig::device_budget). A layer made
  /// resident after set_block_slots(bs, n) holds n slots of bs rows per KV
  /// head instead of n_ctx rows; the KvCache decides which block sits in
  /// which slot (KvCache::slot_positions, device_row) and keeps the others
  /// in host blocks. The defaults are those of a storage that cannot: the
  /// cache then keeps every block of a GPU layer on the device.
  /// @{
  /// Slots of `block_size` rows for layers made resident from now on;
  /// kUnsupported where the storage keeps whole layers only.
  virtual Status set_block_slots(int64_t block_size, int64_t n_slots) {
    (void)block_size;
    (void)n_slots;
    return make_error(ErrorCode::kUnsupported,
                      "this backend keeps whole layers of K/V on the device: the device KV "
                      "tier (--kv-gpu) is not supported on it yet");
  }
  /// Slots of a resident layer (0: it holds n_ctx rows by position).
  virtual int64_t layer_slots(int64_t layer) const {
    (void)layer;
    return 0;
  }
  /// Copies rows [row0, row0 + n) of every KV head of a resident layer to
  /// host rows [n_kv_heads][n][row bytes] (one host block's K, and V, when n
  /// is the block size), once every queued op has run.
  virtual Status export_rows(int64_t layer, int64_t row0, int64_t n, uint8_t* k, uint8_t* v) {
    (void)layer, (void)row0, (void)n, (void)k, (void)v;
    return make_error(ErrorCode::kUnsupported, "export_rows: no device tier on this backend");
  }
  /// Rows to export (export_blocks): [row0, row0 + n) into k and v.
  struct KvRowsOut {
    int64_t row0 = 0, n = 0;
    uint8_t *k = nullptr, *v = nullptr;
  };
  /// export_rows of several ranges of one layer, in as few submissions as the
  /// storage can (the device tier's evictions of one step).
  virtual Status export_blocks(int64_t layer, std::span<const KvRowsOut> items) {
    for (const KvRowsOut& it : items) LOOM_TRY(export_rows(layer, it.row0, it.n, it.k, it.v));
    return {};
  }
  /// Writes rows [row0, row0 + n) of every KV head from host rows (as above).
  virtual Status import_rows(int64_t layer, int64_t row0, int64_t n, const uint8_t* k,
                             const uint8_t* v) {
    (void)layer, (void)row0, (void)n, (void)k, (void)v;
    return make_error(ErrorCode::kUnsupported, "import_rows: no device tier on this backend");
  }
  /// Host memory for one host block (K then V, `bytes`) of a device-tiered
  /// layer, which the device can read in place (the CUDA backend's mapped
  /// pinned memory), or null: the KvCache then allocates it itself. A block
  /// given out goes back through free_host_pair, before the storage dies;
  /// the KvCache frees a block only while no queued device work reads it
  /// (between steps, after export/import, which wait for the queue).
  virtual uint8_t* alloc_host_pair(uint64_t bytes) {
    (void)bytes;
    return nullptr;
  }
  virtual void free_host_pair(uint8_t* p) { (void)p; }
  /// @}
};

/// The host's part of a split layer's attention (Backend::attention_split):
/// given q [T, n_heads * head_dim] in host memory, the tokens' positions and
/// the device part's m and l per query row ([T][n_heads][2]), fills
/// part [T][n_heads][head_dim + 2] as cpu::attention_partial does, and, when
/// `block_mass` is given, adds each host block's attention mass (normalized
/// over both parts) at its logical index. `n_blocks` >= 0: over the first
/// n_blocks host blocks only (KvCache::host_view's order; the device reads
/// the others), else all.
using HostAttentionFn =
    std::function<void(const float* q, int64_t T, const int32_t* pos, const float* device_ml,
                       float* part, float* block_mass, int64_t n_blocks)>;

enum class OpKind { kGetRows, kRmsNorm, kMatmul, kRope, kKvStore, kAttention, kSiluMul, kAdd };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  /// Whether op `op` with weights (or KV) of dtype `dtype` can run here.
  virtual bool supports(OpKind op, DType dtype) const = 0;

  /// @name Memory. The defaults are those of a host backend (plain host
  /// memory, work done when the op returns); device backends override them.
  /// Device backends may queue ops and run them later: results are only
  /// guaranteed in host memory after download() or synchronize(), which also
  /// report an error (device lost, out of memory) from any op queued before.
  /// @{
  /// True when Acts are host memory that callers may read, write and wrap
  /// (Act{ptr, rows, cols}) themselves.
  virtual bool host_memory() const { return true; }
  /// A buffer of `n_floats` floats for activations.
  virtual Result<std::unique_ptr<ActBuffer>> alloc_act(int64_t n_floats);
  /// dst (rows * cols floats) = src.
  virtual Status upload(const float* src, Act dst);
  /// dst (rows * cols floats) = src, once every op queued before has run.
  virtual Status download(Act src, float* dst);
  /// Waits for every queued op.
  virtual Status synchronize() { return {}; }
  /// The ops from here to the next download() or synchronize() are one step
  /// that repeats (a decode step run wholly on this backend): a device
  /// backend may record them once and replay the recording (CUDA graphs).
  /// A hint; the default runs ops as they come.
  virtual void begin_step() {}
  /// Makes weight `w` (or the whole tensor it is a row range of) resident on
  /// this backend; ops on `w` need it first. Done once per tensor at load;
  /// later calls are free. kOutOfMemory when it does not fit: the caller runs
  /// the ops on that weight elsewhere. Host backends read the mapped file.
  virtual Status upload_weight(const Weight& w) {
    (void)w;
    return {};
  }
  /// upload_weight() of weights used together (q, k, v, o; gate, up, down).
  /// A backend may keep them side by side so that fused ops read them in one
  /// dispatch. Stops at the first error (the ones before stay resident).
  virtual Status upload_weights(const std::vector<const Weight*>& ws) {
    for (const Weight* w : ws) {
      Status s = upload_weight(*w);
      if (!s.ok()) return s;
    }
    return {};
  }
  /// The placement runs on this backend and another one in turn: a GPU may
  /// keep itself busy while the other one works (VulkanOptions::keep_busy_groups).
  virtual void set_keep_busy(bool on) { (void)on; }
  /// Forgets every resident weight copy (call when the model they mirror is
  /// unloaded; its file mapping may be reused by the next one).
  virtual void release_weights() {}
  /// Forgets the copy of the tensor `w` belongs to (a placement moved it away).
  virtual void release_weight(const Weight& w) { (void)w; }
  /// Bytes of weights resident in this backend's own memory (0 for host backends).
  virtual uint64_t weight_bytes() const { return 0; }
  /// Bytes of device memory this backend may take in all (its memory limit,
  /// or the device's), 0 when unknown or for host backends. The default
  /// device KV budget (default_kv_device_budget) comes from it.
  virtual uint64_t memory_capacity() const { return 0; }
  /// Whether ops on `w` can run here now: the dtype is supported and the
  /// weight is resident (upload_weight succeeded).
  virtual bool has_weight(OpKind op, const Weight& w) const { return supports(op, w.dtype); }
  /// K/V storage of this backend for a cache of config `cfg`, or null when the
  /// backend works on the KvCache's host blocks (the CPU).
  virtual Result<std::unique_ptr<KvStorage>> create_kv_storage(const KvCacheConfig& cfg) {
    (void)cfg;
    return std::unique_ptr<KvStorage>();
  }
  /// @}

  /// @name Device-clock timing (the profiler). Backends that queue work time
  /// it on the device: begin_scope(id) ends the open scope and starts scope
  /// `id` (>= 0; -1 ends the open one without starting another). Times of
  /// finished scopes are collected by take_scope_times() once synchronize()
  /// or download() has returned. Host backends return false from
  /// device_timing(): the caller times them with its own clock.
  /// @{
  virtual bool device_timing() const { return false; }
  /// Turns scope timing on or off (off: begin_scope costs nothing).
  virtual void set_scope_timing(bool on) { (void)on; }
  virtual void begin_scope(int32_t id) { (void)id; }
  struct ScopeTime {
    int32_t id;
    uint64_t ns;
  };
  /// Appends the (scope, nanoseconds) pairs finished since the last call.
  virtual void take_scope_times(std::vector<ScopeTime>* out) { (void)out; }
  /// @}

  /// @name Ops. Acts come from this backend's alloc_act (or, for a host
  /// backend, any host memory); `ids` and `pos` are host arrays of T entries.
  /// @{

  /// out[t] = row ids[t] of the embedding w (dequantized).        out [T, n_in]
  virtual void get_rows(const Weight& w, const int32_t* ids, Act out) = 0;
  /// out[t] = rms_norm(x[t]) * w.                                  x, out [T, n]
  virtual void rms_norm(Act x, const Weight& w, float eps, Act out) = 0;
  /// out[t] = W x[t] (+ bias).                  x [T, w.n_in], out [T, w.n_out]
  virtual void matmul(const Weight& w, Act x, Act out, const Weight* bias) = 0;
  /// Rotates x [T, n_heads * head_dim] in place; token t at position pos[t].
  virtual void rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                    const cpu::RopeParams& p) = 0;
  /// Stores k, v [T, n_kv_heads * head_dim] of a layer at positions pos[t].
  virtual void kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) = 0;
  /// Causal GQA attention of q [T, n_heads * head_dim] over the layer's cache.
  virtual void attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                         float scale, Act out) = 0;
  /// attention() of a layer whose blocks lie partly on this backend's device
  /// (KvStorage::set_block_slots) and partly in host blocks: this backend
  /// attends over its blocks, `host` over the host ones, and the two partial
  /// softmax results are merged exactly. Synchronizes (q goes to the host).
  /// The default, for backends without a device tier, reports kUnsupported.
  virtual Status attention_split(KvCache& kv, int64_t layer, Act q, const int32_t* pos,
                                 int64_t n_heads, float scale, Act out,
                                 const HostAttentionFn& host) {
    (void)kv, (void)layer, (void)q, (void)pos, (void)n_heads, (void)scale, (void)out, (void)host;
    return make_error(ErrorCode::kUnsupported,
                      "%s cannot merge attention across KV tiers (no device tier)", name().c_str());
  }
  /// out = silu(gate) * up.                                         [T, n]
  virtual void silu_mul(Act gate, Act up, Act out) = 0;
  /// out = gelu(gate) * up, GELU's tanh form (gemma's GeGLU).       [T, n]
  virtual void gelu_mul(Act gate, Act up, Act out) = 0;
  /// out = a + b.                                                   [T, n]
  virtual void add(Act a, Act b, Act out) = 0;
  /// @}

  /// @name Fused ops. The defaults run the plain ops above; a backend whose
  /// dispatches cost more than their arithmetic (a GPU at decode) overrides
  /// them with one kernel giving the same results.
  /// @{

  /// y += W x (the residual add after the attention output and FFN down
  /// matrices); tmp [T, w.n_out] is scratch the default may use.
  virtual void matmul_add(const Weight& w, Act x, Act y, Act tmp) {
    matmul(w, x, tmp, nullptr);
    add(y, tmp, y);
  }
  /// out = silu(gate x) * (up x) (the FFN's first half); tmp [T, up.n_out]
  /// is scratch the default uses.
  virtual void matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) {
    matmul(gate, x, out, nullptr);
    matmul(up, x, tmp, nullptr);
    silu_mul(out, tmp, out);
  }
  /// The attention's three projections of one input: q = wq x (+ bq), k = wk x
  /// (+ bk), v = wv x (+ bv); a bias that is not present() is none.
  virtual void matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                          const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v) {
    matmul(wq, x, q, bq.present() ? &bq : nullptr);
    matmul(wk, x, k, bk.present() ? &bk : nullptr);
    matmul(wv, x, v, bv.present() ? &bv : nullptr);
  }
  /// rope() of q [T, n_heads * head_dim] and k [T, n_kv_heads * head_dim].
  virtual void rope_qk(Act q, Act k, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                       const int32_t* pos, const cpu::RopeParams& p) {
    rope(q, n_heads, head_dim, pos, p);
    rope(k, n_kv_heads, head_dim, pos, p);
  }
  /// rope_qk(), then kv_store() of the rotated k and of v into `layer`.
  virtual void rope_qk_kv(Act q, Act k, Act v, KvCache& kv, int64_t layer, int64_t n_heads,
                          int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                          const cpu::RopeParams& p) {
    rope_qk(q, k, n_heads, n_kv_heads, head_dim, pos, p);
    kv_store(kv, layer, k, v, pos);
  }
  /// rope_qk_kv() of single rows of different sequences (continuous
  /// batching's decode rows): row t at pos[t] into kvs[t]'s cache, in one
  /// go. false (nothing done): the caller takes them one sequence at a time.
  virtual bool rope_qk_kv_rows(Act q, Act k, Act v, std::span<KvCache* const> kvs, int64_t layer,
                               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                               const int32_t* pos, const cpu::RopeParams& p) {
    (void)q, (void)k, (void)v, (void)kvs, (void)layer, (void)n_heads, (void)n_kv_heads,
        (void)head_dim, (void)pos, (void)p;
    return false;
  }
  /// attention() of single rows of different sequences: row t over kvs[t]'s
  /// cache, in one go. false (nothing done): one sequence at a time.
  virtual bool attention_rows(std::span<KvCache* const> kvs, int64_t layer, Act q,
                              const int32_t* pos, int64_t n_heads, float scale, Act out) {
    (void)kvs, (void)layer, (void)q, (void)pos, (void)n_heads, (void)scale, (void)out;
    return false;
  }
  /// matmul_qkv(), then rope_qk_kv() of its outputs (a decode step's whole
  /// attention input, where one backend runs the projections and the attention).
  virtual void matmul_qkv_rope_kv(const Weight& wq, const Weight& wk, const Weight& wv,
                                  const Weight& bq, const Weight& bk, const Weight& bv, Act x,
                                  Act q, Act k, Act v, KvCache& kv, int64_t layer, int64_t n_heads,
                                  int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                                  const cpu::RopeParams& p) {
    matmul_qkv(wq, wk, wv, bq, bk, bv, x, q, k, v);
    rope_qk_kv(q, k, v, kv, layer, n_heads, n_kv_heads, head_dim, pos, p);
  }
  /// @}
};

}  // namespace loom
