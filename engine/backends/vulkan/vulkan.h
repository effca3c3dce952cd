// Public entry points of the Vulkan backend: what `loom devices`, `loom run
// --backend vulkan` and the tests need. Declared whether or not the build has
// Vulkan (LOOM_VULKAN); without it every call reports kUnsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/status.h"

namespace loom {

/// One Vulkan physical device as the loader reports it.
struct VulkanDeviceInfo {
  int index = 0;     ///< position in list_vulkan_devices(); VulkanOptions::device
  std::string name;  ///< "NVIDIA H200", "llvmpipe (LLVM 15.0.6, 256 bits)"
  std::string type;  ///< "discrete", "integrated", "virtual", "cpu" or "other"
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::string api_version;          ///< "1.3.230"
  std::string driver;               ///< driver name and version text
  uint64_t device_local_bytes = 0;  ///< size of the largest device-local heap
  uint32_t subgroup_size = 0;
  bool subgroup_arithmetic = false;  ///< subgroupAdd/Max in compute shaders
  bool storage_16bit = false;        ///< storageBuffer16BitAccess
  /// VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix with the 16x16x16
  /// F16 -> F32 subgroup shape and what its shaders need: prefill matmuls on
  /// the tensor cores (mul_mat_cm.comp).
  bool coopmat = false;
  /// Which: "NV", "KHR", "KHR and NV" (a device's list entry) or ""; an open
  /// device's info names the one it took.
  std::string coopmat_ext;
  bool usable = false;  ///< Loom can run on it (Vulkan 1.2+, a compute queue)
  std::string why_not;  ///< when !usable: the reason
};

/// How to set the Vulkan backend up.
struct VulkanOptions {
  int device = -1;            ///< index in list_vulkan_devices(); -1: the best (discrete GPU first)
  bool validation = false;    ///< enable VK_LAYER_KHRONOS_validation and count its messages
  bool profile = false;       ///< timestamp queries around every dispatch (take_vulkan_gpu_times)
  bool use_subgroups = true;  ///< false: shared-memory reductions even where subgroups exist
  /// false: float matvecs even where the device has 8-bit integer dot products
  /// (VK_KHR_shader_integer_dot_product).
  bool use_int_dot = true;
  /// false: the tiled prefill matmul even where the device has cooperative
  /// matrices (VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix; the
  /// tensor cores on NVIDIA, WMMA on AMD).
  bool use_coopmat = true;
  /// Where the device has both cooperative-matrix extensions (NVIDIA), take
  /// VK_KHR_cooperative_matrix (the NV shaders' SPIR-V rewritten; 13-16%
  /// faster prefill on an H100, docs/PERFORMANCE.md) rather than
  /// VK_NV_cooperative_matrix. LOOM_VK_COOPMAT_KHR=0 / 1 overrides it.
  bool prefer_coopmat_khr = true;
  /// Benchmarks: keep each pipeline's compiler statistics (registers, shared
  /// memory...; VK_KHR_pipeline_executable_properties, where the driver has
  /// it) for VulkanBackend::pipeline_statistics.
  bool pipeline_statistics = false;
  bool use_f16_storage =
      true;  ///< false: F16 read through 32-bit words even where 16-bit storage exists
  uint64_t memory_limit = 0;  ///< bytes of device memory Loom may take; 0: the device's heap
  uint32_t matvec_rows =
      0;  ///< tuning: rows per row group in single-token matvecs (1..4); 0: chosen per matrix
  /// Dispatches per command buffer inside one batch: the GPU starts on the
  /// first ones while the host records the rest. 0: chosen by device type
  /// (GPUs: a short first buffer, then longer ones; CPU devices: one buffer).
  uint32_t submit_every = 0;
  /// Microseconds the host polls a submission's fence before it blocks in
  /// vkWaitForFences (a blocked thread wakes tens of microseconds late, each
  /// decode step). -1: the default (kFenceSpinUs on GPUs, 0 on CPU devices,
  /// which need the host's cores).
  int fence_spin_us = -1;
  /// Experimental, off by default: while the host computes between two
  /// batches of a placement that uses both the CPU and the GPU
  /// (set_keep_busy), a kernel of this many workgroups (64 threads each)
  /// spins until the next batch starts, so the driver may keep the GPU's
  /// clocks up (on the H200 the SM clock fell from 1980 to 500-975 MHz in
  /// hybrid decode). One workgroup made no measurable difference there; more
  /// (one per SM) is not measured yet. GPUs only; 0: the GPU idles.
  uint32_t keep_busy_groups = 0;
};

/// GPU time of one shader variant, from timestamp queries (VulkanOptions::profile).
struct GpuOpTime {
  std::string name;  ///< shader variant, "matvec1_q4_k_sg"
  double ms = 0;     ///< total
  uint64_t calls = 0;
};

/// True when this build has the Vulkan backend (LOOM_VULKAN).
bool vulkan_built();

/// Every Vulkan device, in the loader's order. kUnsupported when the build has
/// no Vulkan or no loader is installed (the message says which).
Result<std::vector<VulkanDeviceInfo>> list_vulkan_devices();

/// The Vulkan backend on the device `opts` picks. Errors (with a message for
/// the user): no loader, no usable device, the index out of range, device
/// creation failed. The caller then keeps using the CPU backend.
Result<std::unique_ptr<Backend>> create_vulkan_backend(const VulkanOptions& opts);

/// The GPU time per shader variant since the last call, longest first, and
/// resets it: empty unless `b` is a Vulkan backend made with VulkanOptions::profile.
std::vector<GpuOpTime> take_vulkan_gpu_times(Backend& b);

/// Submissions `b` has made so far (a decode step should add one); 0 when `b`
/// is not a Vulkan backend.
uint64_t vulkan_submissions(Backend& b);

}  // namespace loom
