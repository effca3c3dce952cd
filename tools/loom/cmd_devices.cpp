// `loom devices`: the CPU and every Vulkan and CUDA device, with what Loom can use.
#include <cstdio>
#include <string>
#include <thread>

#include "cpu/matmul.h"
#include "engine/backends/cuda/cuda.h"
#include "engine/backends/vulkan/vulkan.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {

void print_cuda() {
  if (!cuda_built()) {
    std::printf("cuda:    not built into this binary\n");
    return;
  }
  auto devs = list_cuda_devices();
  if (!devs.ok()) {
    std::printf("cuda:    none (%s)\n", devs.message().c_str());
    return;
  }
  if (devs->empty()) std::printf("cuda:    no devices\n");
  for (const auto& d : *devs) {
    std::printf(
        "cuda %d:  %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free), driver "
        "CUDA %s%s%s\n",
        d.index, d.name.c_str(), d.cc_major, d.cc_minor, d.sm_count,
        static_cast<double>(d.total_bytes) / (1024.0 * 1024.0 * 1024.0),
        static_cast<double>(d.free_bytes) / (1024.0 * 1024.0 * 1024.0), d.driver.c_str(),
        d.usable ? "" : " — not usable: ", d.usable ? "" : d.why_not.c_str());
  }
}

}  // namespace

int cmd_devices(const DevicesOptions&) {
  std::printf("cpu:     %u threads, kernels %s (best available: %s)\n",
              std::thread::hardware_concurrency(), cpu::isa_name(cpu::active_isa()),
              cpu::isa_name(cpu::detected_isa()));
  if (!vulkan_built()) {
    std::printf("vulkan:  not built into this binary\n");
    print_cuda();
    return 0;
  }
  auto devs = list_vulkan_devices();
  if (!devs.ok()) {
    std::printf("vulkan:  none (%s)\n", devs.message().c_str());
    print_cuda();
    return 0;
  }
  if (devs->empty()) std::printf("vulkan:  no devices\n");
  for (const auto& d : *devs) {
    const std::string cm =
        d.coopmat ? ", cooperative matrices (" + d.coopmat_ext + "; tensor-core prefill)" : "";
    std::printf("vulkan %d: %s (%s), %.1f GiB device memory, Vulkan %s, %s%s%s%s\n", d.index,
                d.name.c_str(), d.type.c_str(),
                static_cast<double>(d.device_local_bytes) / (1024.0 * 1024.0 * 1024.0),
                d.api_version.c_str(), d.driver.c_str(), cm.c_str(),
                d.usable ? "" : " — not usable: ", d.usable ? "" : d.why_not.c_str());
  }
  print_cuda();
  return 0;
}

}  // namespace loom::cli
