// Host-side ops of gemma2 that no GPU backend has: scaling (the embedding)
// and soft-capping (the logits). Its attention with a logit soft-cap and a
// sliding window is CpuBackend::attention with cpu::AttnMods. The
// ForwardPass calls them on host memory only: keep_host_ops_on_cpu
// (placement.h) keeps the attention and the embedding on the CPU.
#pragma once

#include <cstdint>

#include "engine/backends/backend.h"

namespace loom {

/// x *= s, every element of `x`.
void host_scale(Act x, float s);
/// x = cap * tanh(x / cap), every element (no-op when cap <= 0).
void host_softcap(Act x, float cap);

}  // namespace loom
