// Element-wise and attention kernels on the CPU (everything but the matmuls).
// Each has a scalar reference in cpu/ref/ops_ref.h that tests compare against;
// the fast versions dispatch on active_isa() (cpu/matmul.h).
//
// Shapes are given innermost last in comments: [T, n] means T rows of n
// contiguous floats.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/core/dtype.h"

namespace loom::cpu {

/// y[n] = x[n] / sqrt(mean(x^2) + eps) * w[n]   (one row; y may alias x)
void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n);

/// out[n] = silu(gate[n]) * up[n], silu(g) = g / (1 + exp(-g))   (out may alias gate or up)
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

/// out[n] = a[n] + b[n]   (out may alias a or b)
void add(const float* a, const float* b, float* out, int64_t n);

/// In-place softmax over x[n] (max-subtracted).
void softmax(float* x, int64_t n);

/// In place, x[n] = cap * tanh(x[n] / cap) (gemma2's soft-capped attention
/// scores and logits); cap > 0. Within 1e-6 relative of std::tanh's (the
/// AVX-512 kernel; elsewhere std::tanh itself).
void softcap(float* x, int64_t n, float cap);

/// Dequantizes row `row` of a [rows, n] weight of dtype `t` into out[n] (embedding lookup).
void get_row(DType t, const void* w, size_t row_bytes, int64_t row, float* out, int64_t n);

/// RoPE parameters, as GGUF metadata gives them.
struct RopeParams {
  int64_t n_rot = 0;  ///< rotated dimensions per head (<= head_dim, even)
  bool neox = false;  ///< NeoX ordering: pairs (i, i + n_rot/2); else pairs (2i, 2i+1)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  ///< linear scaling: 1 / factor
  const float* freq_factors =
      nullptr;  ///< [n_rot/2] divisors of each frequency (llama3 rope_freqs), or null
  // YaRN (ext_factor > 0 turns it on)
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;  ///< multiplies cos and sin (YaRN magnitude correction)
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int64_t n_ctx_orig = 0;  ///< original training context (YaRN)
};

/// cos and sin of each of the p.n_rot / 2 pairs at position `pos`, times
/// YaRN's mscale: cs[2i] = cos, cs[2i + 1] = sin. The float expressions of
/// ggml's rope, so every backend that rotates with this table (cpu::rope,
/// the CUDA backend's) gives the same bits.
void rope_cos_sin(int32_t pos, const RopeParams& p, float* cs);

/// Rotates x [T, n_heads, head_dim] in place; token t is at position pos[t].
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
          const RopeParams& p);

/// One layer's KV cache as attention reads it: paged in blocks of `block_size`
/// tokens. Block b holds, for each KV head h, `block_size` rows of head_dim
/// keys at k_blocks[b] + h * head_stride_bytes (values likewise), in `dtype`
/// (F16, or Q8_0 with head_dim a multiple of 32). Logical token i lives in
/// block i / block_size, row i % block_size.
struct KvView {
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int64_t block_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  size_t head_stride_bytes = 0;  ///< bytes between heads inside a block
  DType dtype = DType::kF16;
};

/// Bytes of one head's rows in a block: block_size * row bytes of head_dim in `dtype`.
size_t kv_head_bytes(DType dtype, int64_t block_size, int64_t head_dim);

/// Writes one token's K or V ([n_kv_heads, head_dim] floats) into row `row` of a block.
void kv_store(DType dtype, void* block, size_t head_stride_bytes, int64_t n_kv_heads,
              int64_t head_dim, int64_t row, const float* src);

/// `n` floats rounded to F16 (nearest even, as ref::fp32_to_fp16; NaN
/// payloads aside) at SIMD speed: F16 KV rows, and the activations of F16
/// matmuls (cpu/matmul.h convert_activation).
void f32_to_f16_row(const float* x, void* y, int64_t n);

/// KV values from a spill precision back to F16 (what the SSD tier does on
/// every decode step): `n` values (a multiple of 32) of Q8_0 blocks, or `n`
/// FP8 E4M3 codes times `scale`. Bit for bit what the cpu/ref dequantizers
/// followed by rounding to F16 (nearest even) give, at SIMD speed.
void q8_0_to_f16(const void* src, void* dst, int64_t n);
void fp8_e4m3_to_f16(const uint8_t* src, float scale, void* dst, int64_t n);

/// What some architectures add to attention (gemma2): scores soft-capped to
/// softcap * tanh(s / softcap) after the scale, before the softmax (when
/// softcap > 0), and, when window > 0, the query at position p seeing only
/// the keys at positions p - window < j <= p (a sliding window).
struct AttnMods {
  float softcap = 0.0f;
  int64_t window = 0;
};

/// Causal grouped-query attention for query heads [h0, h1):
///   q   [T, n_heads, head_dim], token t at position q_pos[t]
///   out [T, n_heads, head_dim]
/// Query t attends to cached tokens 0 .. q_pos[t] (inclusive), which must
/// already be stored. Query head h uses KV head h / (n_heads / n_kv_heads).
/// scores = q·k * scale, softmax online over blocks (running max and sum), so
/// no [T, n_ctx] matrix is formed. `scratch` holds at least
/// attention_scratch_floats(kv) floats for this thread.
/// With `block_mass` (one float per cached block, zeroed by the caller), adds
/// the attention probability each block received, summed over the rows
/// (query tokens x heads) computed here: each row adds 1 in all.
void attention(const float* q, int64_t T, const int32_t* q_pos, int64_t n_heads, const KvView& kv,
               float scale, float* out, int64_t h0, int64_t h1, float* scratch,
               float* block_mass = nullptr, const AttnMods& mods = {});
size_t attention_scratch_floats(const KvView& kv);

/// Query rows that reach no key in a partial get this max (the GPU's NEG_BIG),
/// a sum of 0 and zero outputs, so that a merge weighs them by 0.
inline constexpr float kAttnEmptyMax = -1.0e30f;

/// attention() over part of a layer's keys (the host blocks of a layer whose
/// other blocks are on a GPU), leaving the softmax unfinished so that another
/// part can be merged with it exactly (log-sum-exp, as split-K decoding does).
/// For query row (t, h) it writes part[(t * n_heads + h) * (head_dim + 2) + i]:
/// i = 0 the running max m of the scaled scores, i = 1 the sum l of
/// exp(score - m), i = 2.. the unnormalized sum of exp(score - m) * v
/// ([head_dim]). `block_mass` as in attention(), but normalized over both
/// parts when `other_ml` ([T][n_heads][2]: the other part's m and l) is given.
void attention_partial(const float* q, int64_t T, const int32_t* q_pos, int64_t n_heads,
                       const KvView& kv, float scale, float* part, int64_t h0, int64_t h1,
                       float* scratch, float* block_mass = nullptr,
                       const float* other_ml = nullptr);

/// Folds partial `p` (one row of the layout above: m, l, then head_dim
/// unnormalized sums) into `acc`, rescaling whichever has the smaller max
/// (log-sum-exp). A partial that saw no key (l == 0) leaves acc as it is; an
/// empty acc is {kAttnEmptyMax, 0, zeros}.
void attention_fold_partial(float* acc, const float* p, int64_t head_dim);

/// Merges two partials of the layout above into normalized outputs
/// out [rows][head_dim] (rows = T * n_heads): the reference of the GPU merge.
void attention_merge_partials(const float* a, const float* b, int64_t rows, int64_t head_dim,
                              float* out);

}  // namespace loom::cpu
