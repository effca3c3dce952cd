#include "engine/backends/vulkan/vk_loader.h"

#include <dlfcn.h>

namespace loom::vk {

Loader::~Loader() {
  if (lib_) dlclose(lib_);
}

Status Loader::open() {
  if (lib_) return {};
  for (const char* name : {"libvulkan.so.1", "libvulkan.so"}) {
    lib_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib_) break;
  }
  if (!lib_) {
    return make_error(
        ErrorCode::kUnsupported,
        "no Vulkan loader (libvulkan.so.1) on this system: install the GPU driver's Vulkan "
        "support (Debian: libvulkan1 plus mesa-vulkan-drivers or the vendor driver)");
  }
  fn.vkGetInstanceProcAddr =
      reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib_, "vkGetInstanceProcAddr"));
  if (!fn.vkGetInstanceProcAddr) {
    return make_error(ErrorCode::kUnsupported, "the Vulkan loader has no vkGetInstanceProcAddr");
  }
#define LOOM_VK_LOAD_GLOBAL(name) \
  fn.name = reinterpret_cast<PFN_##name>(fn.vkGetInstanceProcAddr(VK_NULL_HANDLE, #name));
  LOOM_VK_GLOBAL_FNS(LOOM_VK_LOAD_GLOBAL)
#undef LOOM_VK_LOAD_GLOBAL
  if (!fn.vkCreateInstance || !fn.vkEnumerateInstanceExtensionProperties) {
    return make_error(ErrorCode::kUnsupported, "the Vulkan loader lacks vkCreateInstance");
  }
  return {};
}

Status Loader::load_instance(VkInstance instance) {
#define LOOM_VK_LOAD_INSTANCE(name)                                                  \
  fn.name = reinterpret_cast<PFN_##name>(fn.vkGetInstanceProcAddr(instance, #name)); \
  if (!fn.name) return make_error(ErrorCode::kUnsupported, "Vulkan instance lacks %s", #name);
  LOOM_VK_INSTANCE_FNS(LOOM_VK_LOAD_INSTANCE)
#undef LOOM_VK_LOAD_INSTANCE
#define LOOM_VK_LOAD_OPTIONAL(name) \
  fn.name = reinterpret_cast<PFN_##name>(fn.vkGetInstanceProcAddr(instance, #name));
  LOOM_VK_DEBUG_FNS(LOOM_VK_LOAD_OPTIONAL)
  LOOM_VK_OPTIONAL_INSTANCE_FNS(LOOM_VK_LOAD_OPTIONAL)
#undef LOOM_VK_LOAD_OPTIONAL
  return {};
}

Status Loader::load_device(VkDevice device) {
#define LOOM_VK_LOAD_DEVICE(name)                                                \
  fn.name = reinterpret_cast<PFN_##name>(fn.vkGetDeviceProcAddr(device, #name)); \
  if (!fn.name) return make_error(ErrorCode::kUnsupported, "Vulkan device lacks %s", #name);
  LOOM_VK_DEVICE_FNS(LOOM_VK_LOAD_DEVICE)
#undef LOOM_VK_LOAD_DEVICE
#define LOOM_VK_LOAD_OPTIONAL_DEVICE(name) \
  fn.name = reinterpret_cast<PFN_##name>(fn.vkGetDeviceProcAddr(device, #name));
  LOOM_VK_OPTIONAL_DEVICE_FNS(LOOM_VK_LOAD_OPTIONAL_DEVICE)
#undef LOOM_VK_LOAD_OPTIONAL_DEVICE
  return {};
}

const char* result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_INCOMPLETE: return "VK_INCOMPLETE";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "VK_ERROR (unknown)";
  }
}

Error vk_error(VkResult r, const char* what) {
  ErrorCode code = ErrorCode::kInternal;
  const char* hint = "";
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
    code = ErrorCode::kOutOfMemory;
    hint = r == VK_ERROR_OUT_OF_DEVICE_MEMORY
               ? ": the GPU is out of memory (lower the context size or place fewer layers on it)"
               : ": out of host memory";
  } else if (r == VK_ERROR_DEVICE_LOST) {
    code = ErrorCode::kIo;
    hint = ": the GPU device was lost (driver reset or hang); the Vulkan backend cannot continue";
  } else if (r == VK_TIMEOUT) {
    code = ErrorCode::kIo;
    hint = ": the GPU did not finish in time (treated as a lost device)";
  } else if (r == VK_ERROR_INCOMPATIBLE_DRIVER) {
    code = ErrorCode::kUnsupported;
    hint = ": no driver supports Vulkan 1.2";
  }
  return make_error(code, "Vulkan: %s failed with %s%s", what, result_name(r), hint);
}

}  // namespace loom::vk
