// The CPU backend: ops on host memory through cpu/ kernels (run-time ISA
// dispatch), parallel sections on one persistent thread pool.
#pragma once

#include <memory>
#include <vector>

#include "cpu/gemm_onednn.h"
#include "cpu/thread_pool.h"
#include "engine/backends/backend.h"

namespace loom {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads);
  std::string name() const override;
  bool supports(OpKind op, DType dtype) const override;
  int n_threads() const { return pool_.size(); }
  cpu::ThreadPool& pool() { return pool_; }

  void get_rows(const Weight& w, const int32_t* ids, Act out) override;
  void rms_norm(Act x, const Weight& w, float eps, Act out) override;
  void matmul(const Weight& w, Act x, Act out, const Weight* bias) override;
  void rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
            const cpu::RopeParams& p) override;
  void kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) override;
  void attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                 float scale, Act out) override;
  /// The same with what some architectures add (gemma2's soft-capped scores
  /// and sliding window: cpu::AttnMods), which only the CPU runs (the
  /// ForwardPass keeps such attention here: keep_host_ops_on_cpu).
  void attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                 float scale, Act out, const cpu::AttnMods& mods);
  /// The host part of a device-tiered layer's attention (the HostAttentionFn
  /// a GPU backend's attention_split calls): attention_partial over the
  /// layer's host blocks (KvCache::host_view; the first `n_blocks` of them
  /// where that is >= 0), causal by position.
  void attention_host_part(KvCache& kv, int64_t layer, const float* q, int64_t T,
                           const int32_t* pos, int64_t n_heads, float scale, const float* device_ml,
                           float* part, float* block_mass, int64_t n_blocks = -1);
  void silu_mul(Act gate, Act up, Act out) override;
  void gelu_mul(Act gate, Act up, Act out) override;
  void add(Act a, Act b, Act out) override;
  // Fused for a few tokens (cpu_fused.cpp): one conversion, one parallel section.
  void matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                  const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v) override;
  void matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) override;
  void matmul_add(const Weight& w, Act x, Act y, Act tmp) override;
  /// Off: the fused ops run as their separate parts (tests, A/B runs; LOOM_CPU_FUSE=0).
  void set_fuse(bool on) { fuse_ = on; }

  // Rows of a matmul handed to one thread come in multiples of this, so threads
  // never share a cache line of output and kernels can work on row groups.
  static constexpr int64_t kRowAlign = 16;

 private:
  void add_bias(Act out, const Weight& bias, int64_t r0, int64_t r1);
  // The fused ops take T tokens' input for a and b together (cpu_fused.cpp).
  bool fusable(const Weight& a, const Weight& b, int64_t T) const;
  // x's rows converted for weights of dtype w into act_buf_ (in parallel for
  // large inputs); matmul and the fused ops.
  const uint8_t* convert_input(DType w, Act x);
  // Attention without the mass over the view's `nb` blocks in `ranges`
  // ranges, a task each (every head), their partials merged into `part`
  // (attention_host_part, and decode in attention). Row t sees the view's
  // first hpos[t] + 1 rows.
  void host_ranges(const float* q, int64_t T, const int32_t* hpos, int64_t n_heads,
                   const cpu::KvView& view, int64_t nb, float scale, float* part, int64_t ranges);

  cpu::ThreadPool pool_;
  std::unique_ptr<cpu::OneDnnMatmul> onednn_;    ///< dense prefill matmuls, made on first use
  std::vector<uint8_t> act_buf_;                 ///< converted activations of the current matmul
  std::vector<std::vector<float>> att_scratch_;  ///< per thread
  std::vector<std::vector<float>> att_mass_;     ///< per thread: attention mass per KV block
  std::vector<float> range_parts_;               ///< host_ranges(): a partial per range and row
  std::vector<float> range_out_;                 ///< attention(): the ranges' merged partials
  bool fuse_ = true;                             ///< the fused decode ops (LOOM_CPU_FUSE)
};

}  // namespace loom
