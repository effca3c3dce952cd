// Public entry points of the CUDA backend: what `loom devices`, `loom run
// --backend cuda`, the app and the tests need. Declared whether or not the
// build has CUDA (LOOM_CUDA); without it every call reports kUnsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/status.h"

namespace loom {

/// One CUDA device as the driver reports it.
struct CudaDeviceInfo {
  int index = 0;                   ///< CUDA device ordinal; CudaOptions::device
  std::string name;                ///< "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;  ///< compute capability (9.0 on Hopper)
  int sm_count = 0;
  uint64_t total_bytes = 0;  ///< device memory
  uint64_t free_bytes = 0;   ///< free when listed
  std::string driver;        ///< driver's CUDA version, "13.0"
  bool usable = false;       ///< Loom's kernels run on it
  std::string why_not;       ///< when !usable: the reason
};

/// How to set the CUDA backend up.
struct CudaOptions {
  int device = -1;            ///< CUDA ordinal; -1: the first usable one
  bool profile = false;       ///< time every kernel with CUDA events
  uint64_t memory_limit = 0;  ///< bytes of device memory Loom may take; 0: what is free
  bool use_graphs = true;     ///< replay decode steps as CUDA graphs where possible
};

/// True when this build has the CUDA backend (LOOM_CUDA).
bool cuda_built();

/// Every CUDA device. kUnsupported when the build has no CUDA, or there is no
/// driver or it is older than the toolkit Loom was built with (the message says which).
Result<std::vector<CudaDeviceInfo>> list_cuda_devices();

/// The CUDA backend on the device `opts` picks. Errors (with a message for the
/// user): no driver, no usable device, index out of range, cuBLAS missing. The
/// caller then keeps using another backend.
Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaOptions& opts);

}  // namespace loom
