// The Vulkan entry points of a build without Vulkan (LOOM_VULKAN=OFF).
#include "engine/backends/vulkan/vulkan.h"

namespace loom {

bool vulkan_built() {
  return false;
}

Result<std::vector<VulkanDeviceInfo>> list_vulkan_devices() {
  return make_error(ErrorCode::kUnsupported,
                    "this build of Loom has no Vulkan backend (configured with LOOM_VULKAN=OFF)");
}

Result<std::unique_ptr<Backend>> create_vulkan_backend(const VulkanOptions&) {
  return make_error(ErrorCode::kUnsupported,
                    "this build of Loom has no Vulkan backend (configured with LOOM_VULKAN=OFF)");
}

std::vector<GpuOpTime> take_vulkan_gpu_times(Backend&) {
  return {};
}

uint64_t vulkan_submissions(Backend&) {
  return 0;
}

}  // namespace loom
