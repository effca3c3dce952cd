// Internal to loom_cuda_attention: flash attention for prompts on the tensor
// cores (flash_prefill.cu), called by cuda::attention (attention.cu) for
// T > 8 query tokens; the FP32 tile kernel stays for other head_dims and as
// the switch-off (LOOM_CUDA_ATTN=tile, or AttentionScratch::set_kernel(1)).
// Host-callable; no CUDA syntax here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/core/status.h"

namespace loom::cuda {

/// AttentionScratch::kernel() value that forces the flash prefill kernel
/// (test hook; 0 picks it by T and head_dim, 1 forces tiles, 2 split-K).
inline constexpr int kAttnKernelFlash = 3;
/// ... forced with F16 K/V tiles loaded through registers into one stage (as
/// Q8_0's are) instead of cp.async into two.
inline constexpr int kAttnKernelFlashOneStage = 4;

/// True when flash_prefill has a kernel for head_dim: 64, 80, 96, 128, 256.
bool flash_prefill_supports(int64_t head_dim);

/// False when the environment says LOOM_CUDA_ATTN=tile (read once): prompts
/// then take the FP32 tile kernel, so a device failure of the tensor-core
/// kernel can be switched off without a rebuild.
bool flash_prefill_enabled();

/// Causal GQA attention with the semantics of cuda::attention (the same q,
/// pos, out layouts; scores q.k * scale), on the tensor cores: Q and P
/// rounded to F16 (the K/V rows are F16, or Q8_0 dequantized to F16), the
/// products, softmax and output accumulated in FP32. The caller has checked
/// the layer (resident, positions inside the cache, n_heads a multiple of
/// n_kv_heads, T <= 65535); kUnsupported for a head_dim without a kernel.
/// F16 tiles are copied by cp.async into two stages, unless `one_stage` or
/// LOOM_CUDA_ATTN=sync (read once) asks for the one-stage kernel.
Status flash_prefill(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                     int64_t n_heads, float scale, float* out, cudaStream_t s,
                     bool one_stage = false);

}  // namespace loom::cuda
