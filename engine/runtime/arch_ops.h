// Host-side ops of gemma2 that no GPU backend has: scaling (the embedding),
// soft-capping (the logits), and attention with a logit soft-cap and a
// sliding window, reading the layer's paged KV cache. The
// ForwardPass calls them on host memory only: keep_host_ops_on_cpu
// (placement.h) keeps the attention and the embedding on the CPU.
#pragma once

#include <cstdint>

#include "cpu/thread_pool.h"
#include "engine/backends/backend.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

/// x *= s, every element of `x`.
void host_scale(Act x, float s);
/// x = cap * tanh(x / cap), every element (no-op when cap <= 0).
void host_softcap(Act x, float cap);

/// Causal GQA attention like Backend::attention, plus: scores soft-capped
/// (cap * tanh(s / cap), when cap > 0) before the softmax, and, when
/// `window` > 0, query position p seeing only keys at positions p - window < j <= p.
///   q [T, n_heads * head_dim] at positions pos[t]; out likewise.
/// cpu::attention with cpu::AttnMods (the SIMD kernels); with `pool`, the
/// KV-head groups are spread over its threads.
void host_attention(const KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                    float scale, float cap, int64_t window, Act out,
                    cpu::ThreadPool* pool = nullptr);

}  // namespace loom
