// VulkanBackend's command recording and submission: batches of command
// buffers and their fence, barriers from hazard tracking, pipelines and
// descriptor sets, dispatch, buffer copies, the staging ring, and the
// keep-busy kernel between batches.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "engine/backends/vulkan/spirv_coopmat.h"
#include "engine/backends/vulkan/vk_shaders.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

// A submission that has not finished after this long is treated as a lost
// device: the user gets an error instead of a hang.
constexpr uint64_t kFenceTimeoutNs = 120ull * 1000 * 1000 * 1000;
constexpr uint32_t kDescSetsPerPool = 256;
const char* dtype_suffix(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_K: return "q4_k";
    case DType::kQ5_K: return "q5_k";
    case DType::kQ6_K: return "q6_k";
    default: return "?";
  }
}

}  // namespace

namespace vk {
const SpirvBlob* find_shader(std::string_view name) {
  const auto all = all_shaders();
  auto it = std::lower_bound(
      all.begin(), all.end(), name,
      [](const SpirvBlob& b, std::string_view n) { return std::string_view(b.name) < n; });
  return it != all.end() && std::string_view(it->name) == name ? &*it : nullptr;
}
}  // namespace vk

std::string VulkanBackend::variant_name(const Variant& v) const {
  std::string n = v.op;
  if (v.has_dtype) {
    n += '_';
    n += dtype_suffix(v.dtype);
  }
  if (v.sg && dev_->caps().subgroup_arithmetic) n += "_sg";
  if (v.h && v.has_dtype && v.dtype == DType::kF16 && dev_->caps().f16_storage) n += "_h";
  return n;
}

size_t VulkanBackend::FastKeyHash::operator()(const FastKey& k) const {
  size_t h = std::hash<const void*>()(k.op);
  for (uint32_t v : {k.dtype, k.flags, k.wg, k.c1, k.c2, k.c3}) h = h * 1000003u ^ v;
  return h;
}

size_t VulkanBackend::DescKeyHash::operator()(const DescKey& k) const {
  size_t h = k.n;
  for (uint32_t i = 0; i < k.n; ++i)
    h = h * 1000003u ^ std::hash<const void*>()(reinterpret_cast<const void*>(k.b[i]));
  return h;
}

// ---- recording ---------------------------------------------------------------

Status VulkanBackend::begin_cmd() {
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  const VkResult r = dev_->fn().vkBeginCommandBuffer(cmd_, &bi);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkBeginCommandBuffer");
  chunk_dispatches_ = 0;
  // Writes of earlier submissions (previous decode steps, uploads, the
  // batch's earlier command buffers) reach this one's reads through a
  // barrier: its first scope is every command submitted before.
  full_barrier();
  return {};
}

Status VulkanBackend::submit_chunk() {
  const vk::Fns& fn = dev_->fn();
  VkResult r = fn.vkEndCommandBuffer(cmd_);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkEndCommandBuffer");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  r = fn.vkQueueSubmit(dev_->queue(), 1, &si, VK_NULL_HANDLE);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkQueueSubmit");
  ++submissions_;
  if (++cmd_index_ == cmds_.size()) {
    VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = cmd_pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    r = fn.vkAllocateCommandBuffers(dev_->device(), &cai, &cb);
    if (r != VK_SUCCESS) return vk::vk_error(r, "vkAllocateCommandBuffers");
    cmds_.push_back(cb);
  }
  cmd_ = cmds_[cmd_index_];
  return begin_cmd();
}

VkResult VulkanBackend::wait_fence() {
  const vk::Fns& fn = dev_->fn();
  if (fence_spin_us_ > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t k = 1;; ++k) {
      const VkResult r = fn.vkGetFenceStatus(dev_->device(), fence_);
      if (r != VK_NOT_READY) return r;
      if ((k & 63) == 0 &&
          std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(fence_spin_us_))
        break;
    }
  }
  return fn.vkWaitForFences(dev_->device(), 1, &fence_, VK_TRUE, kFenceTimeoutNs);
}

Status VulkanBackend::begin() {
  if (recording_) return {};
  stop_keep_busy();
  cmd_index_ = 0;
  cmd_ = cmds_[0];
  LOOM_TRY(begin_cmd());
  recording_ = true;
  n_queries_ = 0;
  query_labels_.clear();
  if (profile_) dev_->fn().vkCmdResetQueryPool(cmd_, query_pool_, 0, kMaxQueries);
  scope_marks_.clear();
  scope_reset_ = false;
  if (scope_on_) {
    // The last submission filled the pool: a bigger one now that none is in flight.
    if (scope_want_ > scope_cap_ && !make_scope_pool(scope_want_).ok()) scope_want_ = scope_cap_;
    // The scope the last flush paused goes on.
    if (scope_open_ >= 0) write_scope_mark(scope_open_, false);
  }
  return {};
}

void VulkanBackend::full_barrier() {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                     VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags st =
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  dev_->fn().vkCmdPipelineBarrier(cmd_, st, st, 0, 1, &mb, 0, nullptr, 0, nullptr);
  pending_writes_.clear();
  pending_reads_.clear();
}

void VulkanBackend::barrier_if_needed(const Bind* binds, uint32_t n) {
  auto overlaps = [](const std::vector<Range>& v, VkBuffer buf, uint64_t lo, uint64_t hi) {
    for (const Range& r : v) {
      if (r.buf == buf && r.lo < hi && lo < r.hi) return true;
    }
    return false;
  };
  bool need = false;
  for (uint32_t i = 0; i < n && !need; ++i) {
    const Bind& b = binds[i];
    if (!b.size) continue;
    const uint64_t lo = b.offset, hi = b.offset + b.size;
    // Read after write, write after write, write after read.
    need = overlaps(pending_writes_, b.block->buffer, lo, hi) ||
           (b.write && overlaps(pending_reads_, b.block->buffer, lo, hi));
  }
  if (need) full_barrier();
  for (uint32_t i = 0; i < n; ++i) {
    const Bind& b = binds[i];
    if (!b.size) continue;
    // A write over the row xq8_ copies makes the copy stale.
    if (b.write && xq8_.buffer == b.block && b.offset < xq8_.offset + uint64_t(xq8_.n) * 4 &&
        xq8_.offset < b.offset + b.size)
      xq8_ = Xq8{};
    // Likewise the F16 copy of a prefill matmul's input (xf16_for).
    if (b.write && xf16_.buffer == b.block && b.offset < xf16_.offset + xf16_.src_bytes() &&
        xf16_.offset < b.offset + b.size)
      xf16_ = Xf16{};
    (b.write ? pending_writes_ : pending_reads_)
        .push_back(Range{b.block->buffer, b.offset, b.offset + b.size});
  }
}

Status VulkanBackend::flush() {
  if (!recording_) return status_;
  recording_ = false;
  const vk::Fns& fn = dev_->fn();
  // A scope still open pauses here; the next submission resumes it.
  if (scope_open_ >= 0 && !scope_marks_.empty()) write_scope_mark(-1, false);
  // Transfers into the ring (downloads) must be visible to the host after the fence.
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  fn.vkCmdPipelineBarrier(cmd_,
                          VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                          VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  pending_writes_.clear();
  pending_reads_.clear();
  ring_used_ = 0;
  ints_memo_valid_ = false;
  VkResult r = fn.vkEndCommandBuffer(cmd_);
  if (r != VK_SUCCESS) {
    fail(vk::vk_error(r, "vkEndCommandBuffer"));
    if (cmd_index_ > 0) (void)fn.vkDeviceWaitIdle(dev_->device());
    return status_;
  }
  if (!status_.ok()) {  // something failed while recording: do not run the rest of the batch
    if (cmd_index_ > 0)
      (void)fn.vkDeviceWaitIdle(dev_->device());  // earlier buffers went out: let them end
    return status_;
  }
  if (simulate_lost_) {
    fail(vk::vk_error(VK_ERROR_DEVICE_LOST, "vkQueueSubmit"));
    if (cmd_index_ > 0) (void)fn.vkDeviceWaitIdle(dev_->device());
    return status_;
  }
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  r = fn.vkQueueSubmit(dev_->queue(), 1, &si, fence_);
  if (r != VK_SUCCESS) {
    fail(vk::vk_error(r, "vkQueueSubmit"));
    if (cmd_index_ > 0) (void)fn.vkDeviceWaitIdle(dev_->device());  // the batch's earlier buffers
    return status_;
  }
  ++submissions_;
  r = wait_fence();
  if (r != VK_SUCCESS) {
    fail(vk::vk_error(r, "vkWaitForFences"));
    return status_;
  }
  fn.vkResetFences(dev_->device(), 1, &fence_);
  if (profile_ && n_queries_) {
    std::vector<uint64_t> ts(n_queries_);
    r = fn.vkGetQueryPoolResults(dev_->device(), query_pool_, 0, n_queries_,
                                 ts.size() * sizeof(uint64_t), ts.data(), sizeof(uint64_t),
                                 VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (r == VK_SUCCESS) {
      const double ns = dev_->caps().timestamp_period_ns;
      for (uint32_t i = 0; i + 1 < n_queries_; i += 2) {
        GpuOpTime& t = times_[query_labels_[i / 2]];
        t.name = query_labels_[i / 2];
        t.ms += static_cast<double>(ts[i + 1] - ts[i]) * ns * 1e-6;
        t.calls += 1;
      }
    }
  }
  resolve_scopes();
  if (status_.ok()) start_keep_busy();
  return status_;
}

// ---- keep_busy ----------------------------------------------------------------------

namespace {
// A poll reads host memory across the bus (a microsecond or more), then spins
// kKeepSpin dependent multiply-adds (a few microseconds at 2 GHz).
constexpr uint32_t kKeepMaxPolls = 20000;
constexpr uint32_t kKeepSpin = 2000;
}  // namespace

volatile uint32_t* VulkanBackend::keep_word() const {
  return reinterpret_cast<volatile uint32_t*>(keep_flag_.block->mapped + keep_flag_.offset);
}

void VulkanBackend::set_keep_busy(bool on) {
  keep_on_ = on;
  if (!on) stop_keep_busy();
}

Status VulkanBackend::record_keep_busy() {
  LOOM_ASSIGN_OR_RETURN(keep_flag_,
                        host_pool_->alloc(vk::MemoryPool::kAlign, "the keep-busy flag"));
  const Bind b{keep_flag_.block, keep_flag_.offset, keep_flag_.size, true};
  LOOM_ASSIGN_OR_RETURN(Pipeline * p, pipeline_for(plain("keep_busy"), Spec{kWgSmall}, 1));
  LOOM_ASSIGN_OR_RETURN(VkDescriptorSet set, descriptor_set(&b, 1));
  const vk::Fns& fn = dev_->fn();
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = cmd_pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  VkResult r = fn.vkAllocateCommandBuffers(dev_->device(), &cai, &keep_cmd_);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkAllocateCommandBuffers");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;  // an old one may still be polling
  r = fn.vkBeginCommandBuffer(keep_cmd_, &bi);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkBeginCommandBuffer");
  const uint32_t pc[3] = {u32(keep_flag_.offset / 4), kKeepMaxPolls, kKeepSpin};
  fn.vkCmdBindPipeline(keep_cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
  fn.vkCmdBindDescriptorSets(keep_cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipe_layouts_[1], 0, 1,
                             &set, 0, nullptr);
  fn.vkCmdPushConstants(keep_cmd_, pipe_layouts_[1], VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(pc),
                        pc);
  fn.vkCmdDispatch(keep_cmd_, keep_groups_, 1, 1);
  r = fn.vkEndCommandBuffer(keep_cmd_);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkEndCommandBuffer");
  return {};
}

void VulkanBackend::start_keep_busy() {
  if (!keep_allowed_ || !keep_on_ || keep_running_) return;
  if (!keep_cmd_) {
    // Not worth an error: without it the GPU only idles.
    if (!record_keep_busy().ok()) {
      keep_allowed_ = false;
      return;
    }
  }
  *keep_word() = 0;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &keep_cmd_;
  if (dev_->fn().vkQueueSubmit(dev_->queue(), 1, &si, VK_NULL_HANDLE) != VK_SUCCESS) {
    keep_allowed_ = false;
    return;
  }
  keep_running_ = true;
  ++keep_starts_;
}

void VulkanBackend::stop_keep_busy() {
  if (!keep_running_) return;
  // The next submission's first barrier waits for the kernel, which sees this within a poll.
  *keep_word() = 1;
  keep_running_ = false;
}

// ---- pipelines and dispatch -------------------------------------------------

Result<VulkanBackend::Pipeline*> VulkanBackend::pipeline(std::string_view shader, const Spec& spec,
                                                         uint32_t n_bindings) {
  std::string key(shader);
  key += '/' + std::to_string(spec.wg) + '/' + std::to_string(spec.c1) + '/' +
         std::to_string(spec.c2) + '/' + std::to_string(spec.c3);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return &it->second;

  const vk::SpirvBlob* blob = vk::find_shader(shader);
  if (!blob)
    return make_error(ErrorCode::kInternal, "Vulkan: no shader variant '%s' in this build",
                      key.c_str());
  const vk::Fns& fn = dev_->fn();
  const VkDevice d = dev_->device();
  const vk::DeviceCaps& caps = dev_->caps();
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = blob->n_words * 4;
  mi.pCode = blob->words;
  // Tensor-core shaders are written against VK_NV_cooperative_matrix; a
  // device with the KHR extension only gets them rewritten.
  const std::span<const uint32_t> words(blob->words, blob->n_words);
  const bool tensor_cores = vk::spirv_uses_nv_coopmat(words);
  std::vector<uint32_t> khr;
  if (tensor_cores && caps.coopmat_khr) {
    Result<std::vector<uint32_t>> k = vk::spirv_nv_coopmat_to_khr(words);
    if (!k.ok())
      return make_error(ErrorCode::kInternal,
                        "Vulkan: shader '%s' for VK_KHR_cooperative_matrix: %s", key.c_str(),
                        k.error().message().c_str());
    khr = std::move(*k);
    mi.codeSize = khr.size() * 4;
    mi.pCode = khr.data();
  }
  VkShaderModule mod = VK_NULL_HANDLE;
  VkResult r = fn.vkCreateShaderModule(d, &mi, nullptr, &mod);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateShaderModule");
  const uint32_t values[4] = {spec.wg, spec.c1, spec.c2, spec.c3};
  const VkSpecializationMapEntry entries[4] = {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}, {3, 12, 4}};
  VkSpecializationInfo si{4, entries, sizeof(values), values};
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = VkPipelineShaderStageCreateInfo{VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = &si;
  // Their subgroups must be 32 threads (gl_SubgroupID tiles the workgroup).
  VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT sub32{
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT};
  sub32.requiredSubgroupSize = 32;
  if (tensor_cores && caps.coopmat_sub32) {
    ci.stage.pNext = &sub32;
    ci.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT;
  }
  ci.layout = pipe_layouts_[n_bindings];
  if (caps.pipeline_statistics) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  Pipeline p;
  p.n_bindings = n_bindings;
  p.name = std::string(shader);
  r = fn.vkCreateComputePipelines(d, pipeline_cache_, 1, &ci, nullptr, &p.pipe);
  fn.vkDestroyShaderModule(d, mod, nullptr);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateComputePipelines");
  if (caps.pipeline_statistics) p.stats = statistics_text(p.pipe);
  return &pipelines_.emplace(key, p).first->second;
}

std::string VulkanBackend::statistics_text(VkPipeline pipe) const {
  const vk::Fns& fn = dev_->fn();
  if (!fn.vkGetPipelineExecutablePropertiesKHR || !fn.vkGetPipelineExecutableStatisticsKHR)
    return {};
  VkPipelineInfoKHR pi{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  pi.pipeline = pipe;
  uint32_t n_exe = 0;
  if (fn.vkGetPipelineExecutablePropertiesKHR(dev_->device(), &pi, &n_exe, nullptr) != VK_SUCCESS)
    return {};
  std::string out;
  for (uint32_t e = 0; e < n_exe; ++e) {
    VkPipelineExecutableInfoKHR ei{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    ei.pipeline = pipe;
    ei.executableIndex = e;
    uint32_t n = 0;
    if (fn.vkGetPipelineExecutableStatisticsKHR(dev_->device(), &ei, &n, nullptr) != VK_SUCCESS)
      continue;
    std::vector<VkPipelineExecutableStatisticKHR> st(
        n, VkPipelineExecutableStatisticKHR{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    if (fn.vkGetPipelineExecutableStatisticsKHR(dev_->device(), &ei, &n, st.data()) != VK_SUCCESS)
      continue;
    for (uint32_t k = 0; k < n; ++k) {
      char v[64];
      switch (st[k].format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
          std::snprintf(v, sizeof v, "%s", st[k].value.b32 ? "true" : "false");
          break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
          std::snprintf(v, sizeof v, "%lld", static_cast<long long>(st[k].value.i64));
          break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
          std::snprintf(v, sizeof v, "%llu", static_cast<unsigned long long>(st[k].value.u64));
          break;
        default: std::snprintf(v, sizeof v, "%g", st[k].value.f64); break;
      }
      if (!out.empty()) out += ", ";
      out += std::string(st[k].name) + "=" + v;
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> VulkanBackend::pipeline_statistics() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, p] : pipelines_) out.emplace_back(key, p.stats);
  std::sort(out.begin(), out.end());
  return out;
}

Result<VkDescriptorSet> VulkanBackend::descriptor_set(const Bind* binds, uint32_t n) {
  // Sets bind whole block buffers, so a few of them serve every dispatch: cache them.
  DescKey key;
  key.n = n;
  for (uint32_t i = 0; i < n; ++i) key.b[i] = binds[i].block->buffer;
  auto it = desc_cache_.find(key);
  if (it != desc_cache_.end()) return it->second;
  const vk::Fns& fn = dev_->fn();
  const VkDevice d = dev_->device();
  if (desc_pool_left_ == 0) {
    VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kDescSetsPerPool * kMaxBindings};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = kDescSetsPerPool;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &ps;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    const VkResult r = fn.vkCreateDescriptorPool(d, &pi, nullptr, &pool);
    if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateDescriptorPool");
    desc_pools_.push_back(pool);
    desc_pool_left_ = kDescSetsPerPool;
  }
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = desc_pools_.back();
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &set_layouts_[n];
  VkDescriptorSet set = VK_NULL_HANDLE;
  const VkResult r = fn.vkAllocateDescriptorSets(d, &ai, &set);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkAllocateDescriptorSets");
  --desc_pool_left_;
  VkDescriptorBufferInfo bi[kMaxBindings];
  VkWriteDescriptorSet w[kMaxBindings];
  for (uint32_t i = 0; i < n; ++i) {
    bi[i] = VkDescriptorBufferInfo{binds[i].block->buffer, 0, VK_WHOLE_SIZE};
    w[i] = VkWriteDescriptorSet{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    w[i].dstSet = set;
    w[i].dstBinding = i;
    w[i].descriptorCount = 1;
    w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w[i].pBufferInfo = &bi[i];
  }
  fn.vkUpdateDescriptorSets(d, n, w, 0, nullptr);
  desc_cache_.emplace(key, set);
  return set;
}

Result<VulkanBackend::Pipeline*> VulkanBackend::pipeline_for(const Variant& v, const Spec& spec,
                                                             uint32_t n_bindings) {
  const FastKey key{v.op,
                    v.has_dtype ? static_cast<uint32_t>(v.dtype) : 0xFFFFFFFFu,
                    (v.sg ? 1u : 0u) | (v.h ? 2u : 0u) | (n_bindings << 2),
                    spec.wg,
                    spec.c1,
                    spec.c2,
                    spec.c3};
  auto it = fast_pipes_.find(key);
  if (it != fast_pipes_.end()) return it->second;
  LOOM_ASSIGN_OR_RETURN(Pipeline * p, pipeline(variant_name(v), spec, n_bindings));
  fast_pipes_.emplace(key, p);
  return p;
}

void VulkanBackend::dispatch(const Variant& v, const Spec& spec, std::initializer_list<Bind> binds,
                             const void* push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                             uint32_t gz) {
  if (!status_.ok()) return;
  if (gx == 0 || gy == 0 || gz == 0) return;
  const auto n = static_cast<uint32_t>(binds.size());
  auto p = pipeline_for(v, spec, n);
  if (!p.ok()) return fail(p.status());
  auto set = descriptor_set(binds.begin(), n);
  if (!set.ok()) return fail(set.status());
  Status st = begin();
  if (!st.ok()) return fail(st);
  const vk::Fns& fn = dev_->fn();
  barrier_if_needed(binds.begin(), n);
  fn.vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, (*p)->pipe);
  fn.vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipe_layouts_[n], 0, 1, &*set, 0,
                             nullptr);
  fn.vkCmdPushConstants(cmd_, pipe_layouts_[n], VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  const bool timed = profile_ && n_queries_ + 2 <= kMaxQueries;
  if (timed)
    // At the compute stage, so the time starts when the work before it has
    // ended (top of pipe would count the previous dispatch's tail here).
    fn.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, query_pool_, n_queries_);
  fn.vkCmdDispatch(cmd_, gx, gy, gz);
  if (timed) {
    fn.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, query_pool_, n_queries_ + 1);
    n_queries_ += 2;
    query_labels_.push_back(prof_shape_.empty() ? (*p)->name : (*p)->name + prof_shape_);
  }
  prof_shape_.clear();
  ++chunk_dispatches_;
  ++dispatches_;
  if (submit_every_ && chunk_dispatches_ >= (cmd_index_ == 0 ? submit_first_ : submit_every_)) {
    st = submit_chunk();
    if (!st.ok()) {  // the batch is cut short: let what went out end, record nothing more
      (void)fn.vkDeviceWaitIdle(dev_->device());
      recording_ = false;
      fail(st);
    }
  }
}

void VulkanBackend::copy_buffer(Block* src, uint64_t src_off, Block* dst, uint64_t dst_off,
                                uint64_t bytes) {
  if (!status_.ok() || bytes == 0) return;
  Status st = begin();
  if (!st.ok()) return fail(st);
  const Bind binds[2] = {{src, src_off, bytes, false}, {dst, dst_off, bytes, true}};
  barrier_if_needed(binds, 2);
  VkBufferCopy region{src_off, dst_off, bytes};
  dev_->fn().vkCmdCopyBuffer(cmd_, src->buffer, dst->buffer, 1, &region);
}

void VulkanBackend::grid_1d(uint64_t n, uint32_t* gx, uint32_t* gz) const {
  const uint64_t max_x = std::min<uint64_t>(dev_->caps().max_groups[0], 65535);
  if (n <= max_x) {
    *gx = u32(n);
    *gz = 1;
  } else {
    *gx = u32(max_x);
    *gz = u32((n + max_x - 1) / max_x);
  }
}

void VulkanBackend::copy_regions(Block* src, Block* dst, const std::vector<VkBufferCopy>& regions) {
  if (!status_.ok() || regions.empty()) return;
  Status st = begin();
  if (!st.ok()) return fail(st);
  uint64_t s0 = UINT64_MAX, s1 = 0, d0 = UINT64_MAX, d1 = 0;
  for (const VkBufferCopy& r : regions) {
    s0 = std::min<uint64_t>(s0, r.srcOffset);
    s1 = std::max<uint64_t>(s1, r.srcOffset + r.size);
    d0 = std::min<uint64_t>(d0, r.dstOffset);
    d1 = std::max<uint64_t>(d1, r.dstOffset + r.size);
  }
  const Bind binds[2] = {{src, s0, s1 - s0, false}, {dst, d0, d1 - d0, true}};
  barrier_if_needed(binds, 2);
  dev_->fn().vkCmdCopyBuffer(cmd_, src->buffer, dst->buffer, u32(regions.size()), regions.data());
}

// ---- ring ---------------------------------------------------------------------

Status VulkanBackend::ring_reserve(uint64_t bytes) {
  bytes = (bytes + 255) / 256 * 256;
  if (bytes > ring_.size)
    return make_error(ErrorCode::kInternal, "Vulkan: %" PRIu64 " bytes exceed the staging ring",
                      bytes);
  if (ring_used_ + bytes > ring_.size) LOOM_TRY(flush());
  return status_;
}

uint64_t VulkanBackend::ring_put(const void* data, uint64_t bytes) {
  const uint64_t off = ring_.offset + ring_used_;
  if (data && bytes) std::memcpy(ring_.block->mapped + off, data, bytes);
  ring_used_ += (bytes + 255) / 256 * 256;
  return off;
}

Result<uint32_t> VulkanBackend::put_ints(const int32_t* v, int64_t n) {
  const auto count = static_cast<size_t>(n);
  // Every layer's rope, kv_store and attention get the same positions: put them once per batch.
  if (ints_memo_valid_ && ints_memo_.size() == count &&
      std::equal(v, v + count, ints_memo_.begin())) {
    return u32(ints_memo_off_ / 4);
  }
  LOOM_TRY(ring_reserve(count * 4));
  const uint64_t off = ring_put(v, count * 4);
  ints_memo_.assign(v, v + count);
  ints_memo_off_ = off;
  ints_memo_valid_ = true;
  return u32(off / 4);
}

}  // namespace loom
