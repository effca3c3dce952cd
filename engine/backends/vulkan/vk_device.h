// Vulkan instance, physical-device selection and the logical device with its
// compute queue: the part of the backend that talks to the loader and driver
// before any memory or shader exists.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backends/vulkan/vk_loader.h"
#include "engine/backends/vulkan/vulkan.h"

namespace loom::vk {

/// What the shaders and the allocator need to know about the device.
struct DeviceCaps {
  bool subgroup_arithmetic = false;  ///< used by the *_sg variants (and allowed by the options)
  uint32_t subgroup_size = 0;
  /// Subgroup shuffles in compute shaders, with subgroup arithmetic (attn_decode.comp).
  bool subgroup_shuffle = false;
  bool f16_storage = false;        ///< storageBuffer16BitAccess enabled (and allowed)
  uint64_t max_storage_range = 0;  ///< bytes one storage-buffer binding may span
  uint64_t max_allocation = 0;     ///< maxMemoryAllocationSize
  uint32_t max_groups[3] = {0, 0, 0};
  uint32_t max_wg_threads =
      128;  ///< min(maxComputeWorkGroupInvocations, maxComputeWorkGroupSize[0])
  uint32_t max_shared_bytes = 0;
  uint32_t max_push_bytes = 128;  ///< maxPushConstantsSize
  bool int_dot = false;  ///< shaderIntegerDotProduct enabled (and allowed): the matvec1x variants
  /// VK_NV_cooperative_matrix enabled (and allowed), with 16x16x16 F16 x F16 -> F32
  /// subgroup matrices, 32-thread subgroups and shaderFloat16 / vulkanMemoryModel:
  /// the matmul_cm prefill variants (mul_mat_cm.comp). Or the same through
  /// VK_KHR_cooperative_matrix (coopmat_khr).
  bool coopmat = false;
  /// The cooperative matrices are VK_KHR_cooperative_matrix's: pipelines of
  /// shaders written against the NV extension get their SPIR-V rewritten
  /// (spirv_coopmat.h).
  bool coopmat_khr = false;
  /// The device's subgroups are not 32 threads wide, so the tensor-core
  /// pipelines ask for 32 (VK_EXT_subgroup_size_control, full subgroups).
  bool coopmat_sub32 = false;
  /// VK_KHR_pipeline_executable_properties enabled (VulkanOptions::pipeline_statistics).
  bool pipeline_statistics = false;
  float timestamp_period_ns = 0;   ///< 0: no timestamps on the compute queue
  uint32_t timestamp_bits = 0;     ///< valid low bits of a timestamp (timestampValidBits)
  uint32_t device_local_type = 0;  ///< memory type index for weights, activations, KV
  uint32_t host_type = 0;          ///< memory type index for staging (host-visible, coherent)
  uint64_t device_local_heap = 0;  ///< bytes of the heap of device_local_type
};

/// The instance, the chosen device and its queue. Owns them; destroys in order.
class Device {
 public:
  /// Opens the loader, creates the instance (with the validation layer and a
  /// message counter when asked), picks the device and creates it.
  static Result<std::unique_ptr<Device>> create(const VulkanOptions& opts);
  /// Every device of a fresh instance (no validation).
  static Result<std::vector<VulkanDeviceInfo>> list();
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const Fns& fn() const { return loader_.fn; }
  VkDevice device() const { return device_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }
  const DeviceCaps& caps() const { return caps_; }
  const VulkanDeviceInfo& info() const { return info_; }
  /// Validation-layer messages of severity warning or error so far (0 without validation).
  uint64_t validation_messages() const { return validation_messages_.load(); }

 private:
  Device() = default;
  Status create_instance(bool validation);
  static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                   VkDebugUtilsMessageTypeFlagsEXT types,
                                                   const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                   void* user);

  Loader loader_;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  DeviceCaps caps_;
  VulkanDeviceInfo info_;
  std::atomic<uint64_t> validation_messages_{0};
};

}  // namespace loom::vk
