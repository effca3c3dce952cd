// Programmatic dependent launch (Hopper on): a decode step is a chain of
// short kernels, each waiting for the one before. Launched with
// `launch_chained`, a kernel may start while the one before it is still
// finishing, its blocks filling the SMs that its predecessor leaves, and do
// what needs no earlier result (the matvecs issue their first weight loads)
// before `pdl_wait()`.
//
// The rule for a kernel launched with `launch_chained`: it calls
// `pdl_wait()` before it reads anything an earlier launch wrote, and before
// it writes anything an earlier launch reads. `pdl_wait()` returns when the
// grid before it has finished and its writes are visible (so transitively
// every earlier grid). Kernels call `pdl_launch_dependents()` early, which
// lets the next chained launch start; both are no-ops in a grid launched
// without the attribute, and below sm_90.
//
// LOOM_CUDA_PDL=0 launches every kernel plainly (chained_launches() in
// cuda_util.h: A/B, and a way out).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "engine/backends/cuda/cuda_util.h"

namespace loom::cuda {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// kernel<<<grid, block, smem, s>>>(args...), allowed to overlap the launch
/// before it in s (see the rule above). Returns the launch's error.
template <typename... P, typename... A>
cudaError_t launch_chained(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                           A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = chained_launches() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

}  // namespace loom::cuda
