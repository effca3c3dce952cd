// Decode attention (a few queries over a long cache), internal to
// loom_cuda_attention: cuda::attention calls it for T <= 8.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backends/cuda/attention/cuda_attention.h"

namespace loom::cuda::detail {

/// Query t (q [T, n_heads * head_dim]) over cached keys 0 .. pos[t] of
/// `layer`; out [T, n_heads * head_dim]. The launch is planned for
/// `plan_keys` keys (>= every pos[t] + 1); `forced_chunk` > 0 fixes the keys
/// per split (tests), else the split count follows plan_keys and the SMs.
/// `q8` (optional, head_dim a multiple of 32): out's Q8 activations too.
/// `slots` (optional): the layer's rows are device-tier slots (SlotMap); the
/// plan then covers every slot, a split taking whole slots. `keep`
/// (optional): the splits are left unmerged with one more split for the
/// host's partials, described in *keep (merge_splits combines them; no q8).
/// `rows` (optional, device [T]): query row t reads rows[t]'s K/V, in
/// layer's format (attention_rows).
Status decode_attention(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                        int64_t plan_keys, int n_heads, float scale, int64_t forced_chunk,
                        AttentionScratch& scratch, float* out, cudaStream_t s,
                        const Q8Out* q8 = nullptr, const SlotMap* slots = nullptr,
                        SplitPartials* keep = nullptr, const RowKv* rows = nullptr);

}  // namespace loom::cuda::detail
