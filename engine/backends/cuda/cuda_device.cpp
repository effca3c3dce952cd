// The CUDA entry points (cuda.h) of a build with CUDA: the device list, with
// what makes a device unusable, and the backend's creation.
//
// The CUDA runtime is linked statically and opens the driver (libcuda.so.1)
// itself, so on a machine without the driver these calls fail with a reason
// instead of the program failing to start.
#include <cinttypes>
#include <string>

#include "engine/backends/cuda/cuda.h"
#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/cuda_util.h"

namespace loom {

namespace {

std::string version_string(int v) {
  // CUDA encodes versions as 1000 * major + 10 * minor.
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

bool cuda_built() {
  return true;
}

Result<std::vector<CudaDeviceInfo>> list_cuda_devices() {
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  if (driver == 0)
    return make_error(ErrorCode::kUnsupported,
                      "no NVIDIA driver found (libcuda.so.1 could not be loaded): install the "
                      "NVIDIA driver to use CUDA");
  if (driver < runtime)
    return make_error(ErrorCode::kUnsupported,
                      "the NVIDIA driver supports CUDA %s but Loom was built with %s: update the "
                      "driver",
                      version_string(driver).c_str(), version_string(runtime).c_str());
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice) {
    (void)cudaGetLastError();
    return std::vector<CudaDeviceInfo>();
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::kUnsupported, "the CUDA driver could not list devices: %s",
                      cudaGetErrorString(e));
  }
  std::vector<CudaDeviceInfo> out;
  for (int i = 0; i < n; ++i) {
    CudaDeviceInfo d;
    d.index = i;
    d.driver = version_string(driver);
    cudaDeviceProp p{};
    const cudaError_t pe = cudaGetDeviceProperties(&p, i);
    if (pe != cudaSuccess) {
      (void)cudaGetLastError();
      d.name = "device " + std::to_string(i);
      d.why_not = std::string("the driver cannot describe it: ") + cudaGetErrorString(pe);
      out.push_back(d);
      continue;
    }
    d.name = p.name;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.sm_count = p.multiProcessorCount;
    d.total_bytes = p.totalGlobalMem;
    d.free_bytes = 0;
    int prev = 0;
    (void)cudaGetDevice(&prev);
    if (cudaSetDevice(i) == cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        d.free_bytes = free_b;
      else
        (void)cudaGetLastError();
    }
    (void)cudaSetDevice(prev);
    if (p.major < 9) {
      // Loom ships sm_90 code and compute_90 PTX: the PTX JIT covers 9.0 and later only.
      d.why_not = "compute capability " + std::to_string(p.major) + "." + std::to_string(p.minor) +
                  ": Loom's CUDA kernels are built for 9.0 (Hopper) and later; use --backend "
                  "vulkan on this GPU";
    } else {
      d.usable = true;
    }
    out.push_back(d);
  }
  return out;
}

Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaOptions& opts) {
  LOOM_ASSIGN_OR_RETURN(auto b, CudaBackend::create(opts));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace loom
