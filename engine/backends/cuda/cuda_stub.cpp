// The CUDA entry points of a build without CUDA (LOOM_CUDA=OFF).
#include "engine/backends/cuda/cuda.h"

namespace loom {

namespace {
constexpr const char* kNotBuilt =
    "this build of Loom has no CUDA backend (configured without nvcc, or with LOOM_CUDA=OFF)";
}

bool cuda_built() {
  return false;
}

Result<std::vector<CudaDeviceInfo>> list_cuda_devices() {
  return make_error(ErrorCode::kUnsupported, "%s", kNotBuilt);
}

Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaOptions&) {
  return make_error(ErrorCode::kUnsupported, "%s", kNotBuilt);
}

}  // namespace loom
