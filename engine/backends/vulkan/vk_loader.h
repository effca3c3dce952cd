// The Vulkan loader, opened at run time (dlopen of libvulkan.so.1), so the
// engine links no Vulkan library and runs where none is installed. Function
// pointers live in a plain table filled in three stages: loader, instance,
// device (VK_NO_PROTOTYPES: nothing calls a Vulkan symbol directly).
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include "engine/core/status.h"

// VK_KHR_cooperative_matrix (Vulkan 1.3.255): Debian 12's headers (1.3.239)
// predate it, so the few names Loom uses are declared here, as the registry
// defines them, where the headers lack them.
#ifndef VK_KHR_cooperative_matrix
#define VK_KHR_cooperative_matrix 1
#define VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME "VK_KHR_cooperative_matrix"
constexpr VkStructureType VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR =
    static_cast<VkStructureType>(1000506000);
constexpr VkStructureType VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR =
    static_cast<VkStructureType>(1000506001);
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
} VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
// VkComponentTypeKHR and VkScopeKHR share their values with the NV enums.
typedef struct VkCooperativeMatrixPropertiesKHR {
  VkStructureType sType;
  void* pNext;
  uint32_t MSize;
  uint32_t NSize;
  uint32_t KSize;
  VkComponentTypeNV AType;
  VkComponentTypeNV BType;
  VkComponentTypeNV CType;
  VkComponentTypeNV ResultType;
  VkBool32 saturatingAccumulation;
  VkScopeNV scope;
} VkCooperativeMatrixPropertiesKHR;
typedef VkResult(VKAPI_PTR* PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(
    VkPhysicalDevice physicalDevice, uint32_t* pPropertyCount,
    VkCooperativeMatrixPropertiesKHR* pProperties);
#endif

namespace loom::vk {

// X-macro lists of the entry points Loom uses, by the stage that loads them.
#define LOOM_VK_GLOBAL_FNS(X)               \
  X(vkCreateInstance)                       \
  X(vkEnumerateInstanceExtensionProperties) \
  X(vkEnumerateInstanceLayerProperties)     \
  X(vkEnumerateInstanceVersion)

#define LOOM_VK_INSTANCE_FNS(X)               \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define LOOM_VK_DEBUG_FNS(X)        \
  X(vkCreateDebugUtilsMessengerEXT) \
  X(vkDestroyDebugUtilsMessengerEXT)

// Instance-level entry points of device extensions; null where the loader has none.
#define LOOM_VK_OPTIONAL_INSTANCE_FNS(X)              \
  X(vkGetPhysicalDeviceCooperativeMatrixPropertiesNV) \
  X(vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)

#define LOOM_VK_DEVICE_FNS(X)      \
  X(vkDestroyDevice)               \
  X(vkGetDeviceQueue)              \
  X(vkQueueSubmit)                 \
  X(vkDeviceWaitIdle)              \
  X(vkAllocateMemory)              \
  X(vkFreeMemory)                  \
  X(vkMapMemory)                   \
  X(vkUnmapMemory)                 \
  X(vkCreateBuffer)                \
  X(vkDestroyBuffer)               \
  X(vkGetBufferMemoryRequirements) \
  X(vkBindBufferMemory)            \
  X(vkCreateShaderModule)          \
  X(vkDestroyShaderModule)         \
  X(vkCreatePipelineCache)         \
  X(vkDestroyPipelineCache)        \
  X(vkCreateComputePipelines)      \
  X(vkDestroyPipeline)             \
  X(vkCreatePipelineLayout)        \
  X(vkDestroyPipelineLayout)       \
  X(vkCreateDescriptorSetLayout)   \
  X(vkDestroyDescriptorSetLayout)  \
  X(vkCreateDescriptorPool)        \
  X(vkDestroyDescriptorPool)       \
  X(vkAllocateDescriptorSets)      \
  X(vkUpdateDescriptorSets)        \
  X(vkCreateCommandPool)           \
  X(vkDestroyCommandPool)          \
  X(vkAllocateCommandBuffers)      \
  X(vkBeginCommandBuffer)          \
  X(vkEndCommandBuffer)            \
  X(vkResetCommandBuffer)          \
  X(vkCmdBindPipeline)             \
  X(vkCmdBindDescriptorSets)       \
  X(vkCmdPushConstants)            \
  X(vkCmdDispatch)                 \
  X(vkCmdPipelineBarrier)          \
  X(vkCmdCopyBuffer)               \
  X(vkCmdFillBuffer)               \
  X(vkCmdResetQueryPool)           \
  X(vkCmdWriteTimestamp)           \
  X(vkCreateFence)                 \
  X(vkDestroyFence)                \
  X(vkResetFences)                 \
  X(vkWaitForFences)               \
  X(vkGetFenceStatus)              \
  X(vkCreateQueryPool)             \
  X(vkDestroyQueryPool)            \
  X(vkGetQueryPoolResults)

// Device-level entry points of optional extensions; null where not enabled.
#define LOOM_VK_OPTIONAL_DEVICE_FNS(X)    \
  X(vkGetPipelineExecutablePropertiesKHR) \
  X(vkGetPipelineExecutableStatisticsKHR)

/// The function table. Loader::open fills the global part; load_instance
/// and load_device the rest. Pointers of a stage not loaded are null.
struct Fns {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
#define LOOM_VK_DECLARE_FN(name) PFN_##name name = nullptr;
  LOOM_VK_GLOBAL_FNS(LOOM_VK_DECLARE_FN)
  LOOM_VK_INSTANCE_FNS(LOOM_VK_DECLARE_FN)
  LOOM_VK_DEBUG_FNS(LOOM_VK_DECLARE_FN)
  LOOM_VK_OPTIONAL_INSTANCE_FNS(LOOM_VK_DECLARE_FN)
  LOOM_VK_DEVICE_FNS(LOOM_VK_DECLARE_FN)
  LOOM_VK_OPTIONAL_DEVICE_FNS(LOOM_VK_DECLARE_FN)
#undef LOOM_VK_DECLARE_FN
};

/// An opened Vulkan loader library; closes it when destroyed.
class Loader {
 public:
  Loader() = default;
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// dlopen()s the loader (libvulkan.so.1, then libvulkan.so) and loads the
  /// global entry points. kUnsupported, with a hint, when there is none.
  Status open();
  /// Loads instance-level entry points (the debug-utils and optional ones may stay null).
  Status load_instance(VkInstance instance);
  /// Loads device-level entry points.
  Status load_device(VkDevice device);

  Fns fn;

 private:
  void* lib_ = nullptr;
};

/// "VK_ERROR_OUT_OF_DEVICE_MEMORY" and the like.
const char* result_name(VkResult r);

/// Error for a failed call: kOutOfMemory for the out-of-memory results,
/// kIo ("device lost") for VK_ERROR_DEVICE_LOST, kInternal otherwise.
Error vk_error(VkResult r, const char* what);

}  // namespace loom::vk
