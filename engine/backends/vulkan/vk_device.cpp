#include "engine/backends/vulkan/vk_device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace loom::vk {

namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";
// Messages printed to stderr before the rest are only counted.
constexpr uint64_t kMaxPrintedMessages = 20;

std::string version_text(uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) +
         "." + std::to_string(VK_API_VERSION_PATCH(v));
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

// Lower is preferred: discrete GPUs first, the CPU rasterizer last.
int type_rank(const std::string& t) {
  if (t == "discrete") return 0;
  if (t == "integrated") return 1;
  if (t == "virtual") return 2;
  if (t == "other") return 3;
  return 4;
}

// Everything Loom reads about a physical device, in one place.
struct PhysInfo {
  VkPhysicalDevice phys = VK_NULL_HANDLE;
  VulkanDeviceInfo info;
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties mem{};
  uint32_t queue_family = UINT32_MAX;
  float timestamp_period = 0;
  uint32_t timestamp_bits = 0;
  uint32_t subgroup_ops = 0;
  uint32_t subgroup_stages = 0;
  bool f16_storage = false;
  bool int_dot = false;  ///< VK_KHR_shader_integer_dot_product with shaderIntegerDotProduct
  /// VK_NV_cooperative_matrix with the 16x16x16 F16 -> F32 subgroup shape, on
  /// 32-thread subgroups, and the features its shaders need (shaderFloat16;
  /// vulkanMemoryModel, which glslang's GL_NV_cooperative_matrix output declares,
  /// and vulkanMemoryModelDeviceScope for the other shaders' Device scope).
  bool coopmat = false;
  /// VK_KHR_cooperative_matrix with the same shape and features, where the
  /// subgroups are 32 threads wide or can be asked to be
  /// (VK_EXT_subgroup_size_control: coopmat_sub32 then): the same shaders
  /// through spirv_coopmat.h's rewrite.
  bool coopmat_khr = false;
  bool coopmat_sub32 = false;
  bool pipeline_statistics = false;  ///< VK_KHR_pipeline_executable_properties
  uint64_t max_allocation = 0;
};

// Hangs `s` on a pNext chain whose open end is *tail, which moves to s's own.
template <typename S>
void chain(void*** tail, S* s) {
  **tail = s;
  *tail = &s->pNext;
}

// The one shape the tensor-core shaders use: 16x16x16 at subgroup scope, F16
// A and B, F32 C and result. NV and KHR properties share these fields.
template <typename P>
bool is_coopmat_shape(const P& p, VkComponentTypeNV result) {
  return p.MSize == 16 && p.NSize == 16 && p.KSize == 16 &&
         p.AType == VK_COMPONENT_TYPE_FLOAT16_NV && p.BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
         p.CType == VK_COMPONENT_TYPE_FLOAT32_NV && result == VK_COMPONENT_TYPE_FLOAT32_NV &&
         p.scope == VK_SCOPE_SUBGROUP_NV;
}

// Whether the device lists that shape, from either extension's properties
// (P: VkCooperativeMatrixPropertiesNV or ...KHR; `result`: DType or ResultType).
template <typename P, typename Get, typename R>
bool lists_coopmat_shape(Get get, VkPhysicalDevice phys, VkStructureType stype, R P::*result) {
  if (!get) return false;
  uint32_t n = 0;
  if (get(phys, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<P> props(n, P{stype});
  if (get(phys, &n, props.data()) != VK_SUCCESS) return false;
  return std::any_of(props.begin(), props.begin() + n,
                     [&](const P& p) { return is_coopmat_shape(p, p.*result); });
}

PhysInfo describe(const Fns& fn, VkPhysicalDevice phys, int index) {
  PhysInfo p;
  p.phys = phys;
  fn.vkGetPhysicalDeviceProperties(phys, &p.props);
  fn.vkGetPhysicalDeviceMemoryProperties(phys, &p.mem);
  VulkanDeviceInfo& i = p.info;
  i.index = index;
  i.name = p.props.deviceName;
  i.type = type_name(p.props.deviceType);
  i.vendor_id = p.props.vendorID;
  i.device_id = p.props.deviceID;
  i.api_version = version_text(p.props.apiVersion);
  for (uint32_t h = 0; h < p.mem.memoryHeapCount; ++h) {
    if (p.mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      i.device_local_bytes = std::max<uint64_t>(i.device_local_bytes, p.mem.memoryHeaps[h].size);
    }
  }
  if (p.props.apiVersion < VK_API_VERSION_1_2) {
    i.why_not = "Vulkan " + i.api_version + " (Loom needs 1.2)";
    return p;
  }
  uint32_t n_ext = 0;
  fn.vkEnumerateDeviceExtensionProperties(phys, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  fn.vkEnumerateDeviceExtensionProperties(phys, nullptr, &n_ext, exts.data());
  bool has_int_dot_ext = false, has_coopmat_ext = false, has_khr_ext = false, has_ssc_ext = false,
       has_stats_ext = false;
  for (const VkExtensionProperties& e : exts) {
    has_int_dot_ext |=
        std::strcmp(e.extensionName, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME) == 0;
    has_coopmat_ext |= std::strcmp(e.extensionName, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) == 0;
    has_khr_ext |= std::strcmp(e.extensionName, VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME) == 0;
    has_ssc_ext |= std::strcmp(e.extensionName, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME) == 0;
    has_stats_ext |=
        std::strcmp(e.extensionName, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME) == 0;
  }
  VkPhysicalDeviceVulkan11Properties p11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES};
  VkPhysicalDeviceVulkan12Properties p12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties m3{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  p11.pNext = &p12;
  p12.pNext = &m3;
  VkPhysicalDeviceSubgroupSizeControlPropertiesEXT pssc{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
  if (has_ssc_ext) m3.pNext = &pssc;
  VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &p11;
  fn.vkGetPhysicalDeviceProperties2(phys, &props2);
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceShaderIntegerDotProductFeatures fdot{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV fcm{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceFeatures2 feats2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats2.pNext = &f11;
  f11.pNext = &f12;
  void** tail = &f12.pNext;
  if (has_int_dot_ext) chain(&tail, &fdot);
  if (has_coopmat_ext) chain(&tail, &fcm);
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR fkhr{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
  if (has_khr_ext) chain(&tail, &fkhr);
  VkPhysicalDeviceSubgroupSizeControlFeaturesEXT fssc{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
  if (has_ssc_ext) chain(&tail, &fssc);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR fstats{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  if (has_stats_ext) chain(&tail, &fstats);
  fn.vkGetPhysicalDeviceFeatures2(phys, &feats2);
  p.pipeline_statistics = has_stats_ext && fstats.pipelineExecutableInfo == VK_TRUE;
  p.int_dot = has_int_dot_ext && fdot.shaderIntegerDotProduct == VK_TRUE;
  // What both extensions' shaders need besides the matrices.
  const bool cm_base = f12.shaderFloat16 == VK_TRUE && f12.vulkanMemoryModel == VK_TRUE &&
                       f12.vulkanMemoryModelDeviceScope == VK_TRUE &&
                       (p11.subgroupSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT);
  // 32-thread subgroups on request, in workgroups of up to 8 of them (256 threads).
  const bool sub32 = has_ssc_ext && fssc.subgroupSizeControl == VK_TRUE &&
                     fssc.computeFullSubgroups == VK_TRUE && pssc.minSubgroupSize <= 32 &&
                     pssc.maxSubgroupSize >= 32 &&
                     (pssc.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                     pssc.maxComputeWorkgroupSubgroups >= 8;
  p.coopmat = has_coopmat_ext && fcm.cooperativeMatrix == VK_TRUE && cm_base &&
              p11.subgroupSize == 32 &&
              lists_coopmat_shape(fn.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV, phys,
                                  VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV,
                                  &VkCooperativeMatrixPropertiesNV::DType);
  p.coopmat_khr = has_khr_ext && fkhr.cooperativeMatrix == VK_TRUE && cm_base &&
                  (p11.subgroupSize == 32 || sub32) &&
                  lists_coopmat_shape(fn.vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR, phys,
                                      VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR,
                                      &VkCooperativeMatrixPropertiesKHR::ResultType);
  p.coopmat_sub32 = p.coopmat_khr && p11.subgroupSize != 32;

  i.coopmat = p.coopmat || p.coopmat_khr;
  i.coopmat_ext = p.coopmat && p.coopmat_khr ? "KHR and NV"
                  : p.coopmat                ? "NV"
                  : p.coopmat_khr            ? "KHR"
                                             : "";
  i.driver = std::string(p12.driverName) + " " + p12.driverInfo;
  i.subgroup_size = p11.subgroupSize;
  p.subgroup_ops = p11.subgroupSupportedOperations;
  p.subgroup_stages = p11.subgroupSupportedStages;
  i.subgroup_arithmetic = (p.subgroup_stages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                          (p.subgroup_ops & VK_SUBGROUP_FEATURE_BASIC_BIT) &&
                          (p.subgroup_ops & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                          p11.subgroupSize >= 4;
  p.f16_storage = f11.storageBuffer16BitAccess == VK_TRUE;
  i.storage_16bit = p.f16_storage;
  p.max_allocation = m3.maxMemoryAllocationSize;

  uint32_t nq = 0;
  fn.vkGetPhysicalDeviceQueueFamilyProperties(phys, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  fn.vkGetPhysicalDeviceQueueFamilyProperties(phys, &nq, qf.data());
  // A compute queue; one with timestamps if there is one.
  for (uint32_t q = 0; q < nq; ++q) {
    if (!(qf[q].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
    if (p.queue_family == UINT32_MAX || (qf[q].timestampValidBits > 0 && p.timestamp_period == 0)) {
      p.queue_family = q;
      p.timestamp_period = qf[q].timestampValidBits > 0 ? p.props.limits.timestampPeriod : 0.0f;
      p.timestamp_bits = qf[q].timestampValidBits;
    }
  }
  if (p.queue_family == UINT32_MAX) {
    i.why_not = "no compute queue";
    return p;
  }
  i.usable = true;
  return p;
}

}  // namespace

VKAPI_ATTR VkBool32 VKAPI_CALL Device::on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                  VkDebugUtilsMessageTypeFlagsEXT,
                                                  const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                  void* user) {
  auto* self = static_cast<Device*>(user);
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    const uint64_t n = self->validation_messages_.fetch_add(1) + 1;
    if (n <= kMaxPrintedMessages) {
      std::fprintf(stderr, "vulkan validation: %s\n",
                   data && data->pMessage ? data->pMessage : "(no text)");
    }
  }
  return VK_FALSE;  // never abort the call
}

Status Device::create_instance(bool validation) {
  LOOM_TRY(loader_.open());
  uint32_t api = VK_API_VERSION_1_0;
  if (loader_.fn.vkEnumerateInstanceVersion) loader_.fn.vkEnumerateInstanceVersion(&api);
  if (api < VK_API_VERSION_1_2) {
    return make_error(ErrorCode::kUnsupported,
                      "the Vulkan loader supports only Vulkan %s (Loom needs 1.2)",
                      version_text(api).c_str());
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "loom";
  app.pEngineName = "loom";
  app.apiVersion = VK_API_VERSION_1_2;

  std::vector<const char*> layers, exts;
  VkDebugUtilsMessengerCreateInfoEXT dbg{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  dbg.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                        VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  dbg.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  dbg.pfnUserCallback = &Device::on_message;
  dbg.pUserData = this;
  if (validation) {
    uint32_t n = 0;
    loader_.fn.vkEnumerateInstanceLayerProperties(&n, nullptr);
    std::vector<VkLayerProperties> lp(n);
    loader_.fn.vkEnumerateInstanceLayerProperties(&n, lp.data());
    const bool have = std::any_of(lp.begin(), lp.end(), [](const VkLayerProperties& l) {
      return std::strcmp(l.layerName, kValidationLayer) == 0;
    });
    if (!have) {
      return make_error(ErrorCode::kUnsupported,
                        "Vulkan validation was asked for but %s is not installed (Debian: "
                        "vulkan-validationlayers)",
                        kValidationLayer);
    }
    layers.push_back(kValidationLayer);
    exts.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  }
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  ci.enabledLayerCount = static_cast<uint32_t>(layers.size());
  ci.ppEnabledLayerNames = layers.data();
  ci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  ci.ppEnabledExtensionNames = exts.data();
  if (validation) ci.pNext = &dbg;  // also catches messages of vkCreateInstance itself
  // (Not synchronization validation: shaders bind whole block buffers, so it
  // would see every two dispatches on one block as a hazard; the backend's
  // barriers follow the byte ranges each dispatch really touches.)
  VkResult r = loader_.fn.vkCreateInstance(&ci, nullptr, &instance_);
  if (r != VK_SUCCESS) return vk_error(r, "vkCreateInstance");
  LOOM_TRY(loader_.load_instance(instance_));
  if (validation && loader_.fn.vkCreateDebugUtilsMessengerEXT) {
    r = loader_.fn.vkCreateDebugUtilsMessengerEXT(instance_, &dbg, nullptr, &messenger_);
    if (r != VK_SUCCESS) return vk_error(r, "vkCreateDebugUtilsMessengerEXT");
  }
  return {};
}

Result<std::vector<VulkanDeviceInfo>> Device::list() {
  std::unique_ptr<Device> d(new Device());
  LOOM_TRY(d->create_instance(false));
  const Fns& fn = d->loader_.fn;
  uint32_t n = 0;
  VkResult r = fn.vkEnumeratePhysicalDevices(d->instance_, &n, nullptr);
  if (r != VK_SUCCESS) return vk_error(r, "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> phys(n);
  r = fn.vkEnumeratePhysicalDevices(d->instance_, &n, phys.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return vk_error(r, "vkEnumeratePhysicalDevices");
  std::vector<VulkanDeviceInfo> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(describe(fn, phys[i], static_cast<int>(i)).info);
  return out;
}

Result<std::unique_ptr<Device>> Device::create(const VulkanOptions& opts) {
  std::unique_ptr<Device> d(new Device());
  LOOM_TRY(d->create_instance(opts.validation));
  const Fns& fn = d->loader_.fn;
  uint32_t n = 0;
  VkResult r = fn.vkEnumeratePhysicalDevices(d->instance_, &n, nullptr);
  if (r != VK_SUCCESS) return vk_error(r, "vkEnumeratePhysicalDevices");
  if (n == 0)
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: no devices (is a GPU driver with Vulkan installed?)");
  std::vector<VkPhysicalDevice> phys(n);
  r = fn.vkEnumeratePhysicalDevices(d->instance_, &n, phys.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return vk_error(r, "vkEnumeratePhysicalDevices");
  std::vector<PhysInfo> all;
  for (uint32_t i = 0; i < n; ++i) all.push_back(describe(fn, phys[i], static_cast<int>(i)));

  const PhysInfo* pick = nullptr;
  if (opts.device >= 0) {
    if (opts.device >= static_cast<int>(n)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "Vulkan device %d does not exist (there are %u; see `loom devices`)",
                        opts.device, n);
    }
    pick = &all[static_cast<size_t>(opts.device)];
    if (!pick->info.usable) {
      return make_error(ErrorCode::kUnsupported, "Vulkan device %d (%s) cannot run Loom: %s",
                        opts.device, pick->info.name.c_str(), pick->info.why_not.c_str());
    }
  } else {
    for (const PhysInfo& p : all) {
      if (!p.info.usable) continue;
      if (!pick || type_rank(p.info.type) < type_rank(pick->info.type) ||
          (type_rank(p.info.type) == type_rank(pick->info.type) &&
           p.info.device_local_bytes > pick->info.device_local_bytes)) {
        pick = &p;
      }
    }
    if (!pick) {
      return make_error(ErrorCode::kUnsupported, "no Vulkan device can run Loom (%s: %s)",
                        all[0].info.name.c_str(), all[0].info.why_not.c_str());
    }
  }
  d->phys_ = pick->phys;
  d->info_ = pick->info;
  d->queue_family_ = pick->queue_family;

  // Memory types: device-local for everything the shaders touch; host-visible
  // + coherent (cached if possible, for reading back) for staging.
  const VkPhysicalDeviceMemoryProperties& mp = pick->mem;
  int dev_type = -1, host_type = -1, host_cached = -1;
  for (uint32_t t = 0; t < mp.memoryTypeCount; ++t) {
    const VkMemoryPropertyFlags f = mp.memoryTypes[t].propertyFlags;
    if (dev_type < 0 && (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) dev_type = static_cast<int>(t);
    const VkMemoryPropertyFlags hv =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if ((f & hv) == hv) {
      if (host_type < 0) host_type = static_cast<int>(t);
      if (host_cached < 0 && (f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT))
        host_cached = static_cast<int>(t);
    }
  }
  if (dev_type < 0) dev_type = host_type;  // some software devices have no device-local type
  if (dev_type < 0 || host_type < 0) {
    return make_error(ErrorCode::kUnsupported, "Vulkan device %s has no usable memory types",
                      d->info_.name.c_str());
  }
  DeviceCaps& c = d->caps_;
  c.device_local_type = static_cast<uint32_t>(dev_type);
  c.host_type = static_cast<uint32_t>(host_cached >= 0 ? host_cached : host_type);
  c.device_local_heap = mp.memoryHeaps[mp.memoryTypes[dev_type].heapIndex].size;
  c.max_storage_range = pick->props.limits.maxStorageBufferRange;
  c.max_allocation = pick->max_allocation ? pick->max_allocation : (1ull << 30);
  for (int k = 0; k < 3; ++k) c.max_groups[k] = pick->props.limits.maxComputeWorkGroupCount[k];
  c.max_shared_bytes = pick->props.limits.maxComputeSharedMemorySize;
  c.max_push_bytes = pick->props.limits.maxPushConstantsSize;
  c.max_wg_threads = std::min(pick->props.limits.maxComputeWorkGroupInvocations,
                              pick->props.limits.maxComputeWorkGroupSize[0]);
  c.timestamp_period_ns = pick->timestamp_period;
  c.timestamp_bits = pick->timestamp_period > 0 ? pick->timestamp_bits : 0;
  c.subgroup_size = pick->info.subgroup_size;
  c.subgroup_arithmetic = opts.use_subgroups && pick->info.subgroup_arithmetic;
  c.subgroup_shuffle =
      c.subgroup_arithmetic && (pick->subgroup_ops & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) != 0;
  c.f16_storage = opts.use_f16_storage && pick->f16_storage;

  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = d->queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &prio;
  c.int_dot = opts.use_int_dot && pick->int_dot && c.subgroup_arithmetic;
  // KHR, or NV where the device has no KHR (or KHR is not preferred).
  bool prefer_khr = opts.prefer_coopmat_khr;
  if (const char* e = std::getenv("LOOM_VK_COOPMAT_KHR")) prefer_khr = std::atoi(e) != 0;
  c.coopmat_khr = opts.use_coopmat && pick->coopmat_khr && (prefer_khr || !pick->coopmat);
  c.coopmat = (opts.use_coopmat && pick->coopmat) || c.coopmat_khr;
  c.coopmat_sub32 = c.coopmat_khr && pick->coopmat_sub32;
  d->info_.coopmat_ext = c.coopmat_khr ? "KHR" : c.coopmat ? "NV" : "";
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.storageBuffer16BitAccess = c.f16_storage ? VK_TRUE : VK_FALSE;
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  f12.shaderFloat16 = c.coopmat ? VK_TRUE : VK_FALSE;
  f12.vulkanMemoryModel = c.coopmat ? VK_TRUE : VK_FALSE;
  // With the Vulkan memory model on, shaders that use Device scope (the
  // matvecs' arrival counters) need this too.
  f12.vulkanMemoryModelDeviceScope = c.coopmat ? VK_TRUE : VK_FALSE;
  VkPhysicalDeviceShaderIntegerDotProductFeatures fdot{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
  fdot.shaderIntegerDotProduct = VK_TRUE;
  VkPhysicalDeviceCooperativeMatrixFeaturesNV fcm{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  fcm.cooperativeMatrix = VK_TRUE;
  std::vector<const char*> dev_exts;
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &f11;
  f11.pNext = &f12;
  void** tail = &f12.pNext;
  // An extension to enable, with its features struct on the chain.
  auto enable = [&](const char* ext, auto* features) {
    dev_exts.push_back(ext);
    chain(&tail, features);
  };
  if (c.int_dot) enable(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME, &fdot);
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR fkhr{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
  fkhr.cooperativeMatrix = VK_TRUE;
  VkPhysicalDeviceSubgroupSizeControlFeaturesEXT fssc{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
  fssc.subgroupSizeControl = VK_TRUE;
  fssc.computeFullSubgroups = VK_TRUE;
  if (c.coopmat_khr) {
    enable(VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME, &fkhr);
    if (c.coopmat_sub32) enable(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME, &fssc);
  } else if (c.coopmat) {
    enable(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME, &fcm);
  }
  c.pipeline_statistics = opts.pipeline_statistics && pick->pipeline_statistics;
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR fstats{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  fstats.pipelineExecutableInfo = VK_TRUE;
  if (c.pipeline_statistics) enable(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME, &fstats);
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &feats;
  dci.enabledExtensionCount = static_cast<uint32_t>(dev_exts.size());
  dci.ppEnabledExtensionNames = dev_exts.data();
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  r = fn.vkCreateDevice(d->phys_, &dci, nullptr, &d->device_);
  if (r != VK_SUCCESS) return vk_error(r, "vkCreateDevice");
  LOOM_TRY(d->loader_.load_device(d->device_));
  d->loader_.fn.vkGetDeviceQueue(d->device_, d->queue_family_, 0, &d->queue_);
  return d;
}

Device::~Device() {
  const Fns& fn = loader_.fn;
  if (device_) {
    fn.vkDeviceWaitIdle(device_);
    fn.vkDestroyDevice(device_, nullptr);
  }
  if (messenger_) fn.vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
  if (instance_) fn.vkDestroyInstance(instance_, nullptr);
}

}  // namespace loom::vk
