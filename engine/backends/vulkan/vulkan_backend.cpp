// VulkanBackend: set-up and teardown, activations and scratch buffers, host
// <-> device copies of activations, and vulkan.h's entry points. The rest of
// the class is defined beside it, by concept:
//   vulkan_commands.cpp          command buffers, submission, barriers, pipelines,
//                                descriptor sets, dispatch, the staging ring, keep-busy
//   vulkan_scope_timing.cpp      timestamps per profiler scope
//   vulkan_weight_residency.cpp  weights' device copies: upload (grouped), lookup, release
//   vulkan_kv_storage.cpp        the KV cache on the device: storage, transfers, kv_store
//   vulkan_attention.cpp         prefill and decode attention, the device tier's attention_split
//   vulkan_matmul.cpp            matvecs and prefill matmuls (tiled, cooperative
//                                matrices), Q8 copies of activations for integer dots
//   vulkan_fused.cpp             decode fusions: gate+up, qkv, qkv+RoPE+KV store
//   vulkan_ops.cpp               get_rows, rms_norm, RoPE, element-wise ops
// Internals they share: vulkan_backend_impl.h.
#include "engine/backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/backends/vulkan/vk_weights.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

constexpr int kFenceSpinUs = 3000;  // polling before blocking on a fence (GPUs)
// The ring for op inputs and transfers (staging), and the device block size.
constexpr uint64_t kRingBytes = 32ull << 20;
constexpr uint64_t kBlockBytes = 256ull << 20;
// Dispatches per command buffer on GPUs (VulkanOptions::submit_every): a
// short first one so the GPU starts early, then longer ones (each submission
// costs the host some microseconds).
constexpr uint32_t kSubmitEvery = 64;
constexpr uint32_t kSubmitFirst = 16;

}  // namespace

// ---- activations ---------------------------------------------------------------

class VkActBuffer final : public ActBuffer {
 public:
  VkActBuffer(VulkanBackend* owner, Alloc a, int64_t n) : owner_(owner), a_(a) {
    base_.buffer = a.block;
    base_.offset = a.offset;
    base_.rows = 1;
    base_.cols = n;
  }
  ~VkActBuffer() override { owner_->device_pool_->free(a_); }

 private:
  VulkanBackend* owner_;
  Alloc a_;
};

// ---- set-up -----------------------------------------------------------------

VulkanBackend::VulkanBackend(std::unique_ptr<vk::Device> dev) : dev_(std::move(dev)) {}

Result<std::unique_ptr<VulkanBackend>> VulkanBackend::create(const VulkanOptions& opts) {
  LOOM_ASSIGN_OR_RETURN(auto dev, vk::Device::create(opts));
  std::unique_ptr<VulkanBackend> be(new VulkanBackend(std::move(dev)));
  LOOM_TRY(be->init(opts));
  return be;
}

Status VulkanBackend::init(const VulkanOptions& opts) {
  const vk::Fns& fn = dev_->fn();
  const VkDevice d = dev_->device();
  const vk::DeviceCaps& c = dev_->caps();
  // Blocks no larger than one binding may span (lavapipe: 128 MiB).
  const uint64_t block = std::min({kBlockBytes, c.max_storage_range / 256 * 256, c.max_allocation});
  const uint64_t limit = opts.memory_limit ? opts.memory_limit : c.device_local_heap;
  device_pool_ = std::make_unique<vk::MemoryPool>(*dev_, c.device_local_type, false, block, limit);
  host_pool_ =
      std::make_unique<vk::MemoryPool>(*dev_, c.host_type, true, std::min(kRingBytes, block), 0);
  LOOM_ASSIGN_OR_RETURN(ring_, host_pool_->alloc(std::min(kRingBytes, block), "the staging ring"));

  VkCommandPoolCreateInfo cpi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  cpi.queueFamilyIndex = dev_->queue_family();
  VkResult r = fn.vkCreateCommandPool(d, &cpi, nullptr, &cmd_pool_);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateCommandPool");
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = cmd_pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  r = fn.vkAllocateCommandBuffers(d, &cai, &cmd_);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkAllocateCommandBuffers");
  cmds_.push_back(cmd_);
  // GPUs run a batch's first dispatches while the host records the rest; a
  // CPU device (lavapipe) shares the host's cores, so it gets one buffer.
  gpu_device_ = dev_->info().type != "cpu";
  submit_every_ = opts.submit_every ? opts.submit_every : gpu_device_ ? kSubmitEvery : 0;
  submit_first_ = std::min(submit_every_, kSubmitFirst);
  fence_spin_us_ = opts.fence_spin_us >= 0 ? opts.fence_spin_us : gpu_device_ ? kFenceSpinUs : 0;
  keep_allowed_ = opts.keep_busy_groups > 0 && gpu_device_;
  // Decode fusion, for A/B measurements: LOOM_VK_FUSE bit 4 RoPE and the KV
  // store in the qkv matvec (default 4; 0 off).
  if (const char* e = std::getenv("LOOM_VK_FUSE")) qkv_rope_ = (std::atoi(e) & 4) != 0;
  // LOOM_VK_INT_DOT (A/B runs), bits: 1 integer dots on the norms' Q8 copies;
  // 4 also on the Q8 copies gate+up and the attention merge write of their
  // outputs, for down and o; 2 on copies quant_q8 makes for o and down (a
  // dispatch each, slower on the H200). 0: float matvecs only; default 5.
  if (const char* e = std::getenv("LOOM_VK_INT_DOT")) {
    const int bits = std::atoi(e);
    int_dot_ = (bits & 1) != 0;
    int_dot_inputs_ = (bits & 2) != 0;
    int_dot_outputs_ = (bits & 4) != 0;
  }
  // LOOM_VK_COOPMAT (A/B runs): 0 the tiled prefill matmul; 1 (the default)
  // the default cooperative-matrix kernel; 2, 3, 64 or 128 a variant of
  // set_matmul_coopmat (3: by the shape, as 2, with matmul_cm_np for 128 x 128).
  if (const char* e = std::getenv("LOOM_VK_COOPMAT")) {
    const int v = std::atoi(e);
    coopmat_ = v != 0;
    coopmat_variant_ = v == 2 || v == 3 || v == 64 || v == 128 ? static_cast<uint32_t>(v) : 0;
  }
  // LOOM_VK_CM_TILE (A/B runs): one cooperative-matrix variant by name for every
  // prefill matmul (matmul_cm_n64, ...; the table in vulkan_matmul.cpp).
  if (const char* e = std::getenv("LOOM_VK_CM_TILE")) cm_tile_name_ = e;
  // LOOM_VK_ATTN_KEYS / LOOM_VK_ATTN_GROUPS (A/B runs): decode attention's
  // keys per chunk where splits take several (up to the workgroup size), and
  // the workgroups per layer past which they do.
  if (const char* e = std::getenv("LOOM_VK_ATTN_KEYS"))
    attn_chunk_keys_ = std::clamp<uint32_t>(static_cast<uint32_t>(std::atoi(e)), 1, 256);
  if (const char* e = std::getenv("LOOM_VK_ATTN_GROUPS"))
    attn_groups_ = std::max<uint32_t>(static_cast<uint32_t>(std::atoi(e)), 1);
  // LOOM_VK_ATTN_DECODE (A/B runs): 0 decode attention on attn_split.comp
  // only; 1 (the default on GPUs) attn_decode.comp past one split's keys.
  // LOOM_VK_ATTN_DECODE_GROUPS: the workgroups its splits aim at.
  attn_decode_ = gpu_device_;
  if (const char* e = std::getenv("LOOM_VK_ATTN_DECODE")) attn_decode_ = std::atoi(e) != 0;
  if (const char* e = std::getenv("LOOM_VK_ATTN_DECODE_GROUPS"))
    attn_decode_groups_ = std::max<uint32_t>(static_cast<uint32_t>(std::atoi(e)), 1);
  // LOOM_VK_ATTN_CM=0 (A/B runs): prefill attention on the tiled kernel.
  if (const char* e = std::getenv("LOOM_VK_ATTN_CM")) attn_coopmat_ = std::atoi(e) != 0;
  // Benchmarks only (wrong results): Q4_0 plain matvecs without their arithmetic.
  probe_loads_ = std::getenv("LOOM_VK_PROBE_LOADS") != nullptr;
  keep_groups_ = std::clamp<uint32_t>(opts.keep_busy_groups, 1, c.max_groups[0]);
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  r = fn.vkCreateFence(d, &fci, nullptr, &fence_);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateFence");
  VkPipelineCacheCreateInfo pci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  r = fn.vkCreatePipelineCache(d, &pci, nullptr, &pipeline_cache_);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreatePipelineCache");

  // One set layout and pipeline layout per number of storage-buffer bindings.
  for (uint32_t n = 1; n <= kMaxBindings; ++n) {
    VkDescriptorSetLayoutBinding b[kMaxBindings];
    for (uint32_t i = 0; i < n; ++i) {
      b[i] = VkDescriptorSetLayoutBinding{i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                          VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    }
    VkDescriptorSetLayoutCreateInfo dli{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    dli.bindingCount = n;
    dli.pBindings = b;
    r = fn.vkCreateDescriptorSetLayout(d, &dli, nullptr, &set_layouts_[n]);
    if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateDescriptorSetLayout");
    VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushBytes};
    VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &set_layouts_[n];
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &pcr;
    r = fn.vkCreatePipelineLayout(d, &pli, nullptr, &pipe_layouts_[n]);
    if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreatePipelineLayout");
  }

  // Workgroups that reduce (norms, attention; attention's is also its keys per
  // split): four subgroups, so the cross-subgroup step is short (NVIDIA: 128,
  // lavapipe: 32, where every barrier is a costly coroutine switch).
  reduce_wg_ = c.subgroup_arithmetic ? std::clamp<uint32_t>(4 * c.subgroup_size, 32, 256) : 128;
  // Decode attention (attn_split): 256 threads on GPUs, eight per key of a
  // 32-key split; CPU devices keep reduce_wg_.
  attn_wg_ =
      gpu_device_ && c.subgroup_arithmetic ? std::min<uint32_t>(256, c.max_wg_threads) : reduce_wg_;
  // The merge of decode attention's splits: 32 values of a head a workgroup,
  // eight slices of the splits on GPUs; one on CPU devices.
  merge_wg_ = gpu_device_
                  ? std::max<uint32_t>(32, std::min<uint32_t>(256, c.max_wg_threads) / 32 * 32)
                  : 32;

  if (opts.matvec_rows) matvec_rows_ = std::clamp<uint32_t>(opts.matvec_rows, 1, kMatvecRowsMax);
  matvec_rows_opt_ = matvec_rows_;
  // Four 32-wide subgroups (NVIDIA) or two 64-wide ones per matvec workgroup.
  matvec_wg_ =
      std::min(std::max<uint32_t>(128, c.subgroup_size), std::max<uint32_t>(c.max_wg_threads, 1));
  // Norms of a row in one workgroup: wide on GPUs (the row stays in registers,
  // a few vec4 per thread); CPU devices keep reduce_wg_ (barriers are costly there).
  norm_wg_ = c.subgroup_arithmetic && c.subgroup_size >= 32
                 ? std::min<uint32_t>(512, c.max_wg_threads)
                 : reduce_wg_;

  profile_ = opts.profile && c.timestamp_period_ns > 0;
  if (profile_) {
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = kMaxQueries;
    r = fn.vkCreateQueryPool(d, &qi, nullptr, &query_pool_);
    if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateQueryPool");
  }
  return {};
}

VulkanBackend::~VulkanBackend() {
  if (!dev_) return;
  if (recording_) (void)flush();
  stop_keep_busy();
  const vk::Fns& fn = dev_->fn();
  const VkDevice d = dev_->device();
  fn.vkDeviceWaitIdle(d);
  if (keep_flag_) host_pool_->free(keep_flag_);
  for (auto& a : weights_) device_pool_->free(a.second.alloc);
  device_pool_->free(scratch_);
  device_pool_->free(gather_k_);
  device_pool_->free(gather_v_);
  device_pool_->free(counters_);
  device_pool_->free(xq8_buf_);
  device_pool_->free(xf16_buf_);
  device_pool_->free(wf16_buf_);
  for (auto& [k, p] : pipelines_) fn.vkDestroyPipeline(d, p.pipe, nullptr);
  for (VkDescriptorPool p : desc_pools_) fn.vkDestroyDescriptorPool(d, p, nullptr);
  for (uint32_t n = 1; n <= kMaxBindings; ++n) {
    if (pipe_layouts_[n]) fn.vkDestroyPipelineLayout(d, pipe_layouts_[n], nullptr);
    if (set_layouts_[n]) fn.vkDestroyDescriptorSetLayout(d, set_layouts_[n], nullptr);
  }
  if (query_pool_) fn.vkDestroyQueryPool(d, query_pool_, nullptr);
  if (scope_pool_) fn.vkDestroyQueryPool(d, scope_pool_, nullptr);
  if (pipeline_cache_) fn.vkDestroyPipelineCache(d, pipeline_cache_, nullptr);
  if (fence_) fn.vkDestroyFence(d, fence_, nullptr);
  if (cmd_pool_) fn.vkDestroyCommandPool(d, cmd_pool_, nullptr);
  device_pool_.reset();
  host_pool_.reset();
}

std::string VulkanBackend::name() const {
  return "vulkan (" + dev_->info().name + ")";
}

bool VulkanBackend::supports(OpKind op, DType dtype) const {
  switch (op) {
    case OpKind::kMatmul:
    case OpKind::kGetRows: return vk::packable(dtype);
    case OpKind::kKvStore:
    case OpKind::kAttention: return dtype == DType::kF16 || dtype == DType::kQ8_0;
    default: return dtype == DType::kF32;
  }
}

uint64_t VulkanBackend::device_bytes() const {
  return device_pool_->reserved_bytes();
}

std::vector<GpuOpTime> VulkanBackend::gpu_times() const {
  std::vector<GpuOpTime> v;
  for (const auto& [k, t] : times_) v.push_back(t);
  std::sort(v.begin(), v.end(), [](const GpuOpTime& a, const GpuOpTime& b) { return a.ms > b.ms; });
  return v;
}

// ---- memory -------------------------------------------------------------------

Result<std::unique_ptr<ActBuffer>> VulkanBackend::alloc_act(int64_t n_floats) {
  if (n_floats < 0) return make_error(ErrorCode::kInvalidArgument, "alloc_act: negative size");
  LOOM_ASSIGN_OR_RETURN(
      Alloc a, device_pool_->alloc(static_cast<uint64_t>(std::max<int64_t>(n_floats, 1)) * 4,
                                   "activations"));
  // The memory may be a freed act's that xq8_ still names: forget the copy.
  xq8_ = Xq8{};
  return std::unique_ptr<ActBuffer>(new VkActBuffer(this, a, n_floats));
}

VulkanBackend::Bind VulkanBackend::act_bind(const Act& a, bool write) const {
  return Bind{static_cast<Block*>(a.buffer), a.offset, static_cast<uint64_t>(a.rows * a.cols) * 4,
              write};
}

bool VulkanBackend::check_act(const Act& a, const char* op) {
  if (a.buffer && !a.data && a.offset % 4 == 0) return true;
  fail(make_error(ErrorCode::kInternal, "Vulkan %s: an activation is not in this backend's memory",
                  op));
  return false;
}

Status VulkanBackend::upload(const float* src, Act dst) {
  if (!dst.buffer)
    return make_error(ErrorCode::kInternal, "Vulkan upload: the destination is not device memory");
  const auto* p = reinterpret_cast<const uint8_t*>(src);
  uint64_t left = static_cast<uint64_t>(dst.rows * dst.cols) * 4, at = 0;
  while (left && status_.ok()) {
    const uint64_t n = std::min(left, ring_.size);
    LOOM_TRY(ring_reserve(n));
    const uint64_t off = ring_put(p + at, n);
    copy_buffer(ring_.block, off, static_cast<Block*>(dst.buffer), dst.offset + at, n);
    left -= n;
    at += n;
  }
  return status_;
}

Status VulkanBackend::download(Act src, float* dst) {
  if (!src.buffer)
    return make_error(ErrorCode::kInternal, "Vulkan download: the source is not device memory");
  auto* p = reinterpret_cast<uint8_t*>(dst);
  uint64_t left = static_cast<uint64_t>(src.rows * src.cols) * 4, at = 0;
  if (left == 0) return synchronize();
  while (left) {
    const uint64_t n = std::min(left, ring_.size);
    LOOM_TRY(ring_reserve(n));
    const uint64_t off = ring_put(nullptr, n);
    copy_buffer(static_cast<Block*>(src.buffer), src.offset + at, ring_.block, off, n);
    LOOM_TRY(flush());
    std::memcpy(p + at, ring_.block->mapped + off, n);
    left -= n;
    at += n;
  }
  return status_;
}

Status VulkanBackend::synchronize() {
  return flush();
}

Status VulkanBackend::ensure_scratch(uint64_t bytes) {
  if (scratch_.size >= bytes) return {};
  LOOM_TRY(flush());  // the old scratch may be in use by recorded work
  device_pool_->free(scratch_);
  scratch_ = Alloc{};
  LOOM_ASSIGN_OR_RETURN(
      scratch_, device_pool_->alloc(std::max<uint64_t>(bytes, 1 << 20), "attention scratch"));
  return {};
}

Result<VulkanBackend::Bind> VulkanBackend::counters(uint32_t n) {
  if (n > kCounters)
    return make_error(ErrorCode::kInternal, "Vulkan: %u arrival counters wanted, %u held", n,
                      kCounters);
  if (!counters_) {
    LOOM_ASSIGN_OR_RETURN(counters_, device_pool_->alloc(kCounters * 4, "arrival counters"));
    LOOM_TRY(begin());
    const Bind b{counters_.block, counters_.offset, counters_.size, true};
    barrier_if_needed(&b, 1);
    dev_->fn().vkCmdFillBuffer(cmd_, counters_.block->buffer, counters_.offset, counters_.size, 0);
  }
  return Bind{counters_.block, counters_.offset, uint64_t{n} * 4, true};
}

// ---- public entry points --------------------------------------------------------

bool vulkan_built() {
  return true;
}

Result<std::vector<VulkanDeviceInfo>> list_vulkan_devices() {
  return vk::Device::list();
}

Result<std::unique_ptr<Backend>> create_vulkan_backend(const VulkanOptions& opts) {
  LOOM_ASSIGN_OR_RETURN(auto be, VulkanBackend::create(opts));
  return std::unique_ptr<Backend>(std::move(be));
}

std::vector<GpuOpTime> take_vulkan_gpu_times(Backend& b) {
  auto* v = dynamic_cast<VulkanBackend*>(&b);
  if (!v || !v->profiling()) return {};
  std::vector<GpuOpTime> t = v->gpu_times();
  v->reset_gpu_times();
  return t;
}

uint64_t vulkan_submissions(Backend& b) {
  auto* v = dynamic_cast<VulkanBackend*>(&b);
  return v ? v->submissions() : 0;
}

}  // namespace loom
