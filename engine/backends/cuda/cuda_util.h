// Host-side helpers shared by the three parts of the CUDA backend: CUDA
// errors as Status values. No CUDA syntax, so .cpp files include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "engine/core/status.h"

namespace loom::cuda {

/// Whether the kernels of a step are launched chained (programmatic
/// dependent launch: pdl.cuh). LOOM_CUDA_PDL=0 turns it off; tests switch it.
inline bool& chained_launch_flag() {
  static bool on = [] {
    const char* e = std::getenv("LOOM_CUDA_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}
inline bool chained_launches() {
  return chained_launch_flag();
}
inline void set_chained_launches(bool on) {
  chained_launch_flag() = on;
}

/// Ok, or an error naming what failed (`what`) and CUDA's description.
/// cudaErrorMemoryAllocation becomes kOutOfMemory; the rest kInternal.
inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  const ErrorCode code =
      e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal;
  return make_error(code, "CUDA %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/// The launch error of the kernel just queued, if any.
inline Status launch_status(const char* kernel) {
  return cuda_status(cudaGetLastError(), kernel);
}

/// cudaMalloc of `bytes`; kOutOfMemory names the bytes and what they were for.
inline Status device_alloc(void** p, uint64_t bytes, const char* what) {
  *p = nullptr;
  if (bytes == 0) return {};
  const cudaError_t e = cudaMalloc(p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear the sticky-free error so later launches work
    return make_error(ErrorCode::kOutOfMemory,
                      "CUDA: out of device memory allocating %.1f MiB for %s",
                      static_cast<double>(bytes) / 1048576.0, what);
  }
  return cuda_status(e, what);
}

/// Device memory Loom may take on one device (CudaOptions::memory_limit),
/// shared by the weights, the KV cache and the scratch that count against it.
struct DeviceBudget {
  uint64_t limit = 0;  ///< 0: no limit of Loom's own (the device's memory is)
  uint64_t used = 0;
  /// Counts `bytes` as taken, or kOutOfMemory (naming them and `what`) past the limit.
  Status take(uint64_t bytes, const char* what) {
    if (limit && used + bytes > limit)
      return make_error(ErrorCode::kOutOfMemory,
                        "CUDA: %.1f MiB for %s would pass the memory limit (%.1f of %.1f MiB "
                        "used)",
                        static_cast<double>(bytes) / 1048576.0, what,
                        static_cast<double>(used) / 1048576.0,
                        static_cast<double>(limit) / 1048576.0);
    used += bytes;
    return {};
  }
  void give(uint64_t bytes) { used = bytes > used ? 0 : used - bytes; }
};

}  // namespace loom::cuda

/// Returns the Status of a failed CUDA runtime call from the current function.
#define LOOM_CUDA_TRY(expr, what)                                                              \
  do {                                                                                         \
    const cudaError_t loom_cuda_err_ = (expr);                                                 \
    if (loom_cuda_err_ != cudaSuccess) return ::loom::cuda::cuda_status(loom_cuda_err_, what); \
  } while (0)
