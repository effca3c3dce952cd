// The backend interface: the ops a forward pass is written against. A backend
// runs ops on activations it can reach; the forward pass never knows which
// backend (CPU, Vulkan, CUDA) runs an op. Backends state what they support,
// and nothing unsupported is dispatched to them.
#pragma once

#include <cstdint>
#include <string>

#include "cpu/ops.h"
#include "engine/core/dtype.h"
#include "engine/model/model.h"

namespace loom {

class KvCache;

/// A float activation matrix [rows, cols], row-major and contiguous, in memory
/// the backend can address (host memory for the CPU backend).
struct Act {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  float* row(int64_t r) const { return data + r * cols; }
};

enum class OpKind { kGetRows, kRmsNorm, kMatmul, kRope, kKvStore, kAttention, kSiluMul, kAdd };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  /// Whether op `op` with weights (or KV) of dtype `dtype` can run here.
  virtual bool supports(OpKind op, DType dtype) const = 0;

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
  /// out = silu(gate) * up.                                         [T, n]
  virtual void silu_mul(Act gate, Act up, Act out) = 0;
  /// out = a + b.                                                   [T, n]
  virtual void add(Act a, Act b, Act out) = 0;
};

}  // namespace loom
