#include "engine/backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cpu/ref/blocks.h"
#include "cpu/ref/fp16.h"
#include "cpu/ref/ops_ref.h"
#include "engine/backends/vulkan/vk_shaders.h"
#include "engine/backends/vulkan/vk_weights.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

using vk::Alloc;
using vk::Block;

namespace {

// A submission that has not finished after this long is treated as a lost
// device: the user gets an error instead of a hang.
constexpr uint64_t kFenceTimeoutNs = 120ull * 1000 * 1000 * 1000;
constexpr int kFenceSpinUs = 3000;  // polling before blocking on a fence (GPUs)
// The ring for op inputs and transfers (staging), and the device block size.
constexpr uint64_t kRingBytes = 32ull << 20;
constexpr uint64_t kBlockBytes = 256ull << 20;
constexpr uint32_t kMaxQueries = 4096;  // two per dispatch
// Scope timestamps per submission: the pool starts with this many and doubles
// (up to the most) whenever a submission fills it, which then flushes early.
constexpr uint32_t kScopeQueries = 1024;
constexpr uint32_t kMaxScopeQueries = 65536;
constexpr uint32_t kDescSetsPerPool = 256;
constexpr uint32_t kPushBytes = 128;  // push constants every device takes
// Dispatches per command buffer on GPUs (VulkanOptions::submit_every): a
// short first one so the GPU starts early, then longer ones (each submission
// costs the host some microseconds).
constexpr uint32_t kSubmitEvery = 64;
constexpr uint32_t kSubmitFirst = 16;

// Workgroup sizes (specialization constant 0) and rows per matvec workgroup.
constexpr uint32_t kWgMatvec = 64;
constexpr uint32_t kMatvecRows = 2;
constexpr uint32_t kMatvecCols = 8;  // NC of the "matvec" variants; up to this many tokens use them
// Single-token matvecs (matvec1_*_sg): rows per row group up to NR_MAX, unit
// parts per thread and step for 4 parts per unit (UNROLL in mul_mat_vec.comp;
// a part is a quarter of a 32-element unit, half for K-quants), and the
// workgroup count that fills a large GPU (H200: 132 SMs, 16 workgroups each).
constexpr uint32_t kMatvecRowsMax = 4;
constexpr uint32_t kMatvecUnroll = 4;
constexpr uint32_t kMatvecUnrollMax = 8;  // UNROLL_MAX in mul_mat_vec.comp
// Parts per 32-element unit (PPU in dequant.glsl): K-quants 2, the rest 4.
constexpr uint32_t kMatvecPartsMax = 4;
uint32_t matvec_parts(DType t) {
  return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ? 2 : kMatvecPartsMax;
}
constexpr uint32_t kManyGroups = 2048;
constexpr uint32_t kWgMatmul = 256;  // mul_mat.comp's tile needs exactly 256
// BM and BN of mul_mat.comp's "matmul" ("matmul_n64": half the BN).
constexpr uint32_t kMatmulTileM = 128;
constexpr uint32_t kMatmulTileN = 128;
constexpr uint32_t kMatmulWideShared = 32768;  // the 128-column tiles' shared memory
// mul_mat_cm.comp (cooperative matrices): 128 rows x 128 tokens per
// workgroup of eight subgroups ("matmul_cm") or four ("matmul_cm4"), or 128 x
// 64 ("matmul_cm_n64", eight), in double-buffered F16 tiles of 40 and 30 KiB.
constexpr uint32_t kMatmulCmShared[2] = {30720, 40960};  // 64, 128 tokens
// Variant 2 (eight subgroups by the shape): matrices whose 128 x 128 grid
// has fewer workgroups than this take 128 x 64 tiles (k and v at 512 tokens:
// 32 workgroups for the H200's 132 SMs).
constexpr uint32_t kMatmulCmNarrowBelow = 66;
// The default variant (set_matmul_coopmat): 2. H200, pp512 in one run
// (Q4_0 / Q4_K_M t/s): four subgroups 3545.6 / 3462.8, eight with 128
// tokens always 4484.9 / 4108.4, eight by the shape 4509.0 / 4146.2.
constexpr uint32_t kMatmulCmDefault = 2;
constexpr uint32_t kWgSmall = 64;
constexpr uint32_t kWgElt = 256;
constexpr uint32_t kAttnHeadsPerGroup = 8;   // GM in attn_split.comp
constexpr uint32_t kNormVec4PerThread = 4;   // VPT in rms_norm.comp
constexpr uint32_t kQuantVec4PerThread = 8;  // VPT of quant_q8 (shaders/variants.txt)
constexpr int64_t kAttnMaxHeadDim = 256;     // HD_MAX in attn_split.comp
constexpr uint32_t kAttnSplitKeys = 32;      // keys per split past kAttnOneSplitKeys (GPUs)
constexpr uint32_t kAttnOneSplitKeys = 128;  // up to this many keys in one split (GPUs)
constexpr uint64_t kAttnGroupScratch = 64ull
                                       << 20;  // partials of one group of query rows (device tier)
constexpr int64_t kAttnTileMaxHeadDim = 128;   // HD_MAX in attn_tile.comp
constexpr uint32_t kAttnTileRows = 16;         // BR in attn_tile.comp
constexpr uint32_t kWgAttnTile = 128;          // BR * TPQ in attn_tile.comp

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

uint32_t u32(uint64_t v) {
  return static_cast<uint32_t>(v);
}

uint64_t round256(uint64_t v) {
  return (v + 255) / 256 * 256;
}

// An op on a layer whose K/V are in host blocks (or a layer that does not
// exist): the forward pass placed it wrong, and the shader must not run on
// memory that is not there.
Status not_resident(int64_t layer, const char* op) {
  return make_error(ErrorCode::kInternal,
                    "Vulkan %s: layer %" PRId64 " of the KV cache is not resident on the GPU", op,
                    layer);
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

// ---- activations and KV storage ---------------------------------------------

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

/// One KV cache's layers in device memory: per resident layer a K and a V
/// allocation of [n_kv_heads][rows][head_dim] (F16 words, or Q8_0 quants
/// then scales), rows = n_ctx (row = position), or, under the device tier,
/// slots * block_size (row = slot * block_size + position % block_size, the
/// KvCache says which block is in which slot). Layers not resident hold
/// nothing (the KvCache keeps them in host blocks).
class VkKvStorage final : public KvStorage {
 public:
  VkKvStorage(VulkanBackend* owner, const KvCacheConfig& cfg)
      : owner_(owner),
        cfg_(cfg),
        k_(static_cast<size_t>(cfg.n_layer)),
        v_(static_cast<size_t>(cfg.n_layer)),
        slots_(static_cast<size_t>(cfg.n_layer), 0) {}
  ~VkKvStorage() override {
    for (auto& a : k_) owner_->device_pool_->free(a);
    for (auto& a : v_) owner_->device_pool_->free(a);
  }
  Status reserve(int64_t n) override {
    // Resident layers hold n_ctx rows from the start (set_layer_resident).
    if (n > cfg_.n_ctx)
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache: %" PRId64 " tokens exceed %" PRId64, n, cfg_.n_ctx);
    return {};
  }
  uint64_t allocated_bytes() const override {
    uint64_t b = 0;
    for (const auto& a : k_) b += a.size;
    for (const auto& a : v_) b += a.size;
    return b;
  }
  bool layer_resident(int64_t layer) const override {
    return layer >= 0 && layer < cfg_.n_layer && k_[static_cast<size_t>(layer)];
  }
  Status set_layer_resident(int64_t layer, bool resident) override {
    LOOM_TRY(check_layer(layer, "set_layer_resident"));
    const auto l = static_cast<size_t>(layer);
    if (resident == static_cast<bool>(k_[l])) return {};
    if (!resident) {
      // Recorded work may still read or write the layer: run it first.
      Status st = owner_->flush();
      owner_->device_pool_->free(k_[l]);
      owner_->device_pool_->free(v_[l]);
      k_[l] = v_[l] = Alloc{};
      slots_[l] = 0;
      return st;
    }
    slots_[l] = new_slots_;
    LOOM_ASSIGN_OR_RETURN(Alloc k, owner_->device_pool_->alloc(layer_bytes(l), "the KV cache"));
    auto v = owner_->device_pool_->alloc(layer_bytes(l), "the KV cache");
    if (!v.ok()) {
      owner_->device_pool_->free(k);
      slots_[l] = 0;
      return v.status();
    }
    k_[l] = k;
    v_[l] = *v;
    return {};
  }
  Status set_block_slots(int64_t block_size, int64_t n_slots) override {
    if (block_size <= 0 || n_slots <= 0 || n_slots * block_size > cfg_.n_ctx + block_size)
      return make_error(ErrorCode::kInvalidArgument,
                        "Vulkan KV cache: %" PRId64 " slots of %" PRId64
                        " rows do not fit a context of %" PRId64,
                        n_slots, block_size, cfg_.n_ctx);
    block_size_ = block_size;
    new_slots_ = n_slots;
    return {};
  }
  int64_t layer_slots(int64_t layer) const override {
    return layer_resident(layer) ? slots_[static_cast<size_t>(layer)] : 0;
  }
  Status export_rows(int64_t layer, int64_t row0, int64_t n, uint8_t* k, uint8_t* v) override {
    LOOM_TRY(check_rows(layer, row0, n, "export_rows"));
    return owner_->kv_transfer(*this, layer, row0, n, k, v, nullptr, nullptr);
  }
  Status import_rows(int64_t layer, int64_t row0, int64_t n, const uint8_t* k,
                     const uint8_t* v) override {
    LOOM_TRY(check_rows(layer, row0, n, "import_rows"));
    return owner_->kv_transfer(*this, layer, row0, n, nullptr, nullptr, k, v);
  }
  Status check_rows(int64_t layer, int64_t row0, int64_t n, const char* op) const {
    LOOM_TRY(check_transfer(layer, 0, op));
    if (row0 < 0 || n < 0 || row0 + n > rows(static_cast<size_t>(layer))) {
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache %s: rows %" PRId64 "..%" PRId64 " of a layer of %" PRId64,
                        op, row0, row0 + n, rows(static_cast<size_t>(layer)));
    }
    return {};
  }
  /// Rows per KV head of layer l: its row stride in the shaders.
  int64_t rows(size_t l) const { return slots_[l] ? slots_[l] * block_size_ : cfg_.n_ctx; }
  Status export_layer(int64_t layer, int64_t n, uint8_t* k, uint8_t* v) override {
    LOOM_TRY(check_transfer(layer, n, "export_layer"));
    return owner_->kv_transfer(*this, layer, 0, n, k, v, nullptr, nullptr);
  }
  Status import_layer(int64_t layer, int64_t n, const uint8_t* k, const uint8_t* v) override {
    LOOM_TRY(check_transfer(layer, n, "import_layer"));
    return owner_->kv_transfer(*this, layer, 0, n, nullptr, nullptr, k, v);
  }

  Status check_layer(int64_t layer, const char* op) const {
    if (layer < 0 || layer >= cfg_.n_layer) {
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache %s: layer %" PRId64 " does not exist (%" PRId64 " layers)",
                        op, layer, cfg_.n_layer);
    }
    return {};
  }
  Status check_transfer(int64_t layer, int64_t n, const char* op) const {
    LOOM_TRY(check_layer(layer, op));
    if (!k_[static_cast<size_t>(layer)]) {
      return make_error(ErrorCode::kInternal,
                        "Vulkan KV cache %s: layer %" PRId64 " is not resident on the GPU", op,
                        layer);
    }
    if (n < 0 || n > rows(static_cast<size_t>(layer))) {
      return make_error(ErrorCode::kOutOfRange,
                        "Vulkan KV cache %s: %" PRId64 " tokens (the cache holds %" PRId64 ")", op,
                        n, cfg_.n_ctx);
    }
    return {};
  }
  /// Bytes of the quants of layer l's K (or V); the Q8_0 scales follow at this offset.
  uint64_t quant_bytes(size_t l) const {
    const auto rows = static_cast<uint64_t>(cfg_.n_kv_heads * this->rows(l));
    const auto hd = static_cast<uint64_t>(cfg_.head_dim);
    return cfg_.dtype == DType::kF16 ? rows * hd * 2 : (rows * hd + 255) / 256 * 256;
  }
  uint64_t layer_bytes(size_t l) const {
    const auto rows = static_cast<uint64_t>(cfg_.n_kv_heads * this->rows(l));
    return cfg_.dtype == DType::kF16
               ? quant_bytes(l)
               : quant_bytes(l) + rows * static_cast<uint64_t>(cfg_.head_dim / 32) * 4;
  }

  VulkanBackend* owner_;
  KvCacheConfig cfg_;
  std::vector<Alloc> k_, v_;                ///< per layer; empty when the layer is not resident
  std::vector<int64_t> slots_;              ///< per resident layer: its slots (0: n_ctx rows)
  int64_t block_size_ = 0, new_slots_ = 0;  ///< set_block_slots()
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
  // the default cooperative-matrix kernel; 2, 4, 64 or 128 a variant of
  // set_matmul_coopmat.
  if (const char* e = std::getenv("LOOM_VK_COOPMAT")) {
    const int v = std::atoi(e);
    coopmat_ = v != 0;
    coopmat_variant_ = v == 2 || v == 4 || v == 64 || v == 128 ? static_cast<uint32_t>(v) : 0;
  }
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
  // kAttnSplitKeys split; CPU devices keep reduce_wg_.
  attn_wg_ =
      gpu_device_ && c.subgroup_arithmetic ? std::min<uint32_t>(256, c.max_wg_threads) : reduce_wg_;

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
  device_pool_->free(counters_);
  device_pool_->free(xq8_buf_);
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

// ---- scope timing -----------------------------------------------------------------

Status VulkanBackend::make_scope_pool(uint32_t n) {
  const vk::Fns& fn = dev_->fn();
  VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = n;
  VkQueryPool pool = VK_NULL_HANDLE;
  const VkResult r = fn.vkCreateQueryPool(dev_->device(), &qi, nullptr, &pool);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateQueryPool");
  if (scope_pool_) fn.vkDestroyQueryPool(dev_->device(), scope_pool_, nullptr);
  scope_pool_ = pool;
  scope_cap_ = n;
  return {};
}

void VulkanBackend::set_scope_timing(bool on) {
  if (on == scope_on_) return;
  if (!on) {
    mark_scope(-1);  // the open scope ends here
    scope_on_ = false;
    return;
  }
  // No timestamps on this queue: stays off (the caller sees device_timing() false).
  if (!device_timing()) return;
  if (!scope_pool_) {
    scope_want_ = kScopeQueries;
    if (!make_scope_pool(scope_want_).ok()) return;
  }
  scope_on_ = true;
}

void VulkanBackend::write_scope_mark(int32_t starts, bool ends) {
  const vk::Fns& fn = dev_->fn();
  if (!scope_reset_) {
    fn.vkCmdResetQueryPool(cmd_, scope_pool_, 0, scope_cap_);
    scope_reset_ = true;
  }
  // Bottom of pipe: the time when every command recorded before has finished,
  // so consecutive marks split the submission's time with no gap or overlap.
  fn.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, scope_pool_,
                         u32(scope_marks_.size()));
  scope_marks_.push_back(ScopeMark{starts, ends});
}

void VulkanBackend::mark_scope(int32_t id) {
  if (id < 0) id = -1;
  // Keep one query for the pause mark of flush(); a full pool flushes early
  // and the next submission gets a bigger one.
  if (recording_ && scope_marks_.size() + 2 > scope_cap_) {
    (void)flush();  // an error stays in status_ for the next synchronize()
    scope_want_ = std::min(scope_cap_ * 2, kMaxScopeQueries);
  }
  if (!recording_) {
    // Nothing queued since the last flush: the open scope's time is all in the carry.
    if (scope_open_ >= 0) scope_done_.push_back(ScopeTime{scope_open_, ticks_to_ns(scope_carry_)});
    scope_carry_ = 0;
    scope_open_ = id;
    return;
  }
  write_scope_mark(id, true);
  scope_open_ = id;
}

void VulkanBackend::resolve_scopes() {
  if (scope_marks_.empty()) return;
  const size_t n = scope_marks_.size();
  std::vector<uint64_t> ts(n);
  const VkResult r = dev_->fn().vkGetQueryPoolResults(
      dev_->device(), scope_pool_, 0, u32(n), n * sizeof(uint64_t), ts.data(), sizeof(uint64_t),
      VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  const uint32_t bits = dev_->caps().timestamp_bits;
  // The counter wraps at its valid bits.
  const uint64_t mask = bits >= 64 ? ~0ull : (1ull << bits) - 1;
  uint64_t acc = scope_carry_;  // ticks of the scope of the current interval
  for (size_t i = 0; i + 1 < n; ++i) {
    const int32_t id = scope_marks_[i].starts;
    if (id < 0) {
      acc = 0;
      continue;
    }
    if (r == VK_SUCCESS) acc += (ts[i + 1] - ts[i]) & mask;
    if (scope_marks_[i + 1].ends) {
      scope_done_.push_back(ScopeTime{id, ticks_to_ns(acc)});
      acc = 0;
    }
  }
  // The pause mark closes the submission with the scope still open: carry its time.
  scope_carry_ = scope_open_ >= 0 ? acc : 0;
  scope_marks_.clear();
}

void VulkanBackend::take_scope_times(std::vector<ScopeTime>* out) {
  out->insert(out->end(), scope_done_.begin(), scope_done_.end());
  scope_done_.clear();
}

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
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = blob->n_words * 4;
  mi.pCode = blob->words;
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
  ci.layout = pipe_layouts_[n_bindings];
  Pipeline p;
  p.n_bindings = n_bindings;
  p.name = std::string(shader);
  r = fn.vkCreateComputePipelines(d, pipeline_cache_, 1, &ci, nullptr, &p.pipe);
  fn.vkDestroyShaderModule(d, mod, nullptr);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateComputePipelines");
  return &pipelines_.emplace(key, p).first->second;
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

const VulkanBackend::Resident* VulkanBackend::find_weight(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  auto it = weights_.upper_bound(b);
  if (it == weights_.begin()) return nullptr;
  --it;
  return b < it->second.end ? &it->second : nullptr;
}

bool VulkanBackend::has_weight(OpKind op, const Weight& w) const {
  return supports(op, w.dtype) && find_weight(w.data) != nullptr;
}

namespace {
// FNV-1a over the shape and 16 evenly spaced 64-byte samples of the tensor:
// tells a tensor from another one later mapped at the same address (another
// model), without reading gigabytes.
uint64_t fingerprint(const Weight& w, const uint8_t* begin, uint64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  const uint64_t shape[4] = {static_cast<uint64_t>(w.dtype), static_cast<uint64_t>(w.n_in),
                             w.row_bytes, bytes};
  mix(shape, sizeof(shape));
  for (uint64_t i = 0; i < 16; ++i) {
    const uint64_t at = bytes > 64 ? (bytes - 64) / 15 * i : 0;
    mix(begin + at, static_cast<size_t>(std::min<uint64_t>(64, bytes)));
  }
  return h;
}
}  // namespace

void VulkanBackend::release_weights() {
  (void)flush();  // recorded work may still read them
  for (auto& [b, r] : weights_) device_pool_->free(r.alloc);
  weights_.clear();
  weight_bytes_ = 0;
}

void VulkanBackend::release_weight(const Weight& w) {
  // The resident tensor whose host range holds w (w may be a row range of it).
  const auto* p = static_cast<const uint8_t*>(w.data);
  auto it = weights_.upper_bound(p);
  if (!p || it == weights_.begin()) return;
  --it;
  if (p >= it->second.end) return;
  (void)flush();  // recorded work may still read it; an error stays in status_
  weight_bytes_ -= it->second.alloc.size;
  device_pool_->free(it->second.alloc);
  weights_.erase(it);
}

VulkanBackend::Source VulkanBackend::weight_source(const Weight& w) const {
  // The whole tensor (fused tensors are used as row ranges: one upload serves all).
  Source src;
  src.begin = static_cast<const uint8_t*>(w.data);
  src.n_rows = w.n_out;
  if (w.tensor && w.tensor->data && w.row_bytes) {
    src.begin = w.tensor->data;
    src.n_rows = static_cast<int64_t>(w.tensor->n_bytes / w.row_bytes);
  }
  src.bytes = static_cast<uint64_t>(src.n_rows) * w.row_bytes;
  src.fingerprint = fingerprint(w, src.begin, src.bytes);
  auto same = weights_.find(src.begin);
  src.resident = same != weights_.end() && same->second.fingerprint == src.fingerprint &&
                 same->second.end == src.begin + src.bytes;
  return src;
}

Status VulkanBackend::check_packable(const Weight& w, const vk::PackedLayout& l) const {
  if (!vk::packable(w.dtype)) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: tensor '%s' has type %s, which no shader reads", w.name().c_str(),
                      std::string(dtype_name(w.dtype)).c_str());
  }
  if (l.bytes == 0) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: tensor '%s' of type %s has rows of %" PRId64
                      " elements, which its blocks do not divide",
                      w.name().c_str(), std::string(dtype_name(w.dtype)).c_str(), w.n_in);
  }
  return {};
}

void VulkanBackend::drop_stale(const Source& src) {
  // Anything resident over these bytes is a stale copy of an unloaded tensor.
  bool stale = false;
  for (auto it = weights_.begin(); it != weights_.end();) {
    if (it->first < src.begin + src.bytes && src.begin < it->second.end) {
      if (!stale) (void)flush();  // recorded work may still read it; an error stays in status_
      stale = true;
      weight_bytes_ -= it->second.alloc.size;
      device_pool_->free(it->second.alloc);
      it = weights_.erase(it);
    } else {
      ++it;
    }
  }
}

Status VulkanBackend::upload_weight(const Weight& w) {
  if (!w.present()) return {};
  const Source src = weight_source(w);
  if (src.resident) return {};
  const vk::PackedLayout l = vk::packed_layout(w.dtype, w.n_in, src.n_rows);
  LOOM_TRY(check_packable(w, l));
  drop_stale(src);
  const std::string what = w.name().empty() ? std::string("a weight") : "tensor '" + w.name() + "'";
  LOOM_ASSIGN_OR_RETURN(Alloc a, device_pool_->alloc(l.bytes, what.c_str()));
  return upload_into(w, src, l, a);
}

Status VulkanBackend::upload_weights(const std::vector<const Weight*>& ws) {
  // The tensors not resident yet get one allocation, cut in pieces, so they
  // share a memory block (matmul_qkv and matmul_glu fuse only within one);
  // when that does not fit, each goes wherever it fits.
  struct Item {
    const Weight* w;
    Source src;
    vk::PackedLayout l;
    uint64_t size;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  for (const Weight* w : ws) {
    if (!w->present()) continue;
    const Source src = weight_source(*w);
    if (src.resident || std::any_of(items.begin(), items.end(),
                                    [&](const Item& i) { return i.src.begin == src.begin; }))
      continue;
    const vk::PackedLayout l = vk::packed_layout(w->dtype, w->n_in, src.n_rows);
    LOOM_TRY(check_packable(*w, l));
    const uint64_t size = vk::MemoryPool::aligned(l.bytes);
    items.push_back(Item{w, src, l, size});
    total += size;
  }
  if (items.size() < 2) return Backend::upload_weights(ws);
  for (const Item& i : items) drop_stale(i.src);
  auto group = device_pool_->alloc(total, "a layer's weights");
  if (!group.ok()) return Backend::upload_weights(ws);
  uint64_t at = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const Item& i = items[k];
    Status st = upload_into(*i.w, i.src, i.l, Alloc{group->block, group->offset + at, i.size});
    at += i.size;
    if (!st.ok()) {  // upload_into freed its piece; free the ones not used yet
      if (at < total) device_pool_->free(Alloc{group->block, group->offset + at, total - at});
      return st;
    }
  }
  return {};
}

Status VulkanBackend::upload_into(const Weight& w, const Source& src, const vk::PackedLayout& l,
                                  Alloc a) {
  std::vector<uint8_t> packed;
  try {
    packed.resize(l.bytes);
  } catch (const std::bad_alloc&) {
    device_pool_->free(a);
    return make_error(ErrorCode::kOutOfMemory,
                      "out of host memory repacking tensor '%s' for the GPU", w.name().c_str());
  }
  vk::pack_weight(w.dtype, src.begin, w.row_bytes, w.n_in, src.n_rows, l, packed.data());
  for (uint64_t at = 0; at < l.bytes && status_.ok();) {
    const uint64_t n = std::min(l.bytes - at, ring_.size);
    Status st = ring_reserve(n);
    if (!st.ok()) break;
    const uint64_t off = ring_put(packed.data() + at, n);
    copy_buffer(ring_.block, off, a.block, a.offset + at, n);
    at += n;
  }
  Status st = flush();
  if (!st.ok()) {
    device_pool_->free(a);
    return st;
  }
  Resident r;
  r.fingerprint = src.fingerprint;
  r.end = src.begin + src.bytes;
  r.alloc = a;
  r.dtype = w.dtype;
  r.src_row_bytes = w.row_bytes;
  r.n_in = w.n_in;
  r.n_rows = src.n_rows;
  r.row_units = l.row_units;
  r.off2 = l.off2;
  weights_.emplace(src.begin, r);
  weight_bytes_ += a.size;
  return {};
}

Result<std::unique_ptr<KvStorage>> VulkanBackend::create_kv_storage(const KvCacheConfig& cfg) {
  if (cfg.dtype != DType::kF16 && cfg.dtype != DType::kQ8_0) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: KV cache type %s is not supported (f16, q8_0)",
                      std::string(dtype_name(cfg.dtype)).c_str());
  }
  if (cfg.head_dim % 2 || cfg.head_dim > kAttnMaxHeadDim ||
      (cfg.dtype == DType::kQ8_0 && cfg.head_dim % 32)) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: head size %" PRId64 " is not supported for a %s KV cache",
                      cfg.head_dim, std::string(dtype_name(cfg.dtype)).c_str());
  }
  // No layer is resident yet: the KvCache decides which live here (set_layer_resident).
  auto s = std::make_unique<VkKvStorage>(this, cfg);
  return std::unique_ptr<KvStorage>(std::move(s));
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

// ---- KV transfers -----------------------------------------------------------------

// Rows go through the staging ring in chunks of whole rows of one head; the
// conversion between the host row format and the device layout is done on
// the host while staged. F16 rows are the same bytes on both sides. A Q8_0
// host row is head_dim / 32 blocks of (fp16 d, 32 int8); the device keeps the
// quants of a row contiguous and the scales apart as floats holding fp16
// values, so fp16 -> float -> fp16 gives back the same bits.
Status VulkanBackend::kv_transfer(VkKvStorage& s, int64_t layer, int64_t row0, int64_t n,
                                  uint8_t* k_out, uint8_t* v_out, const uint8_t* k_in,
                                  const uint8_t* v_in) {
  LOOM_TRY(status_);
  const bool out = k_out != nullptr;
  const KvCacheConfig& c = s.cfg_;
  const bool f16 = c.dtype == DType::kF16;
  const auto hd = static_cast<uint64_t>(c.head_dim);
  const uint64_t nb = hd / 32;  // Q8_0 blocks per row
  const uint64_t host_row = f16 ? hd * 2 : nb * sizeof(ref::BlockQ8_0);
  const uint64_t q_row = f16 ? hd * 2 : hd;  // device bytes of a row's values
  const uint64_t d_row = f16 ? 0 : nb * 4;   // and of its scales
  const uint64_t limit = transfer_chunk_ ? std::min(transfer_chunk_, ring_.size) : ring_.size;
  const uint64_t chunk = std::max<uint64_t>(1, (limit > 512 ? limit - 512 : 0) / (q_row + d_row));
  const auto l = static_cast<size_t>(layer);
  const auto ctx = static_cast<uint64_t>(s.rows(l)), un = static_cast<uint64_t>(n);
  const auto r0 = static_cast<uint64_t>(row0);

  // Export: chunks copied into the ring, converted once their submission ran.
  struct Staged {
    uint64_t q_off, d_off, n_tok;
    uint8_t* dst;
  };
  std::vector<Staged> staged;
  auto drain = [&]() -> Status {
    LOOM_TRY(flush());
    const uint8_t* m = ring_.block->mapped;
    for (const Staged& g : staged) {
      if (f16) {
        std::memcpy(g.dst, m + g.q_off, g.n_tok * host_row);
        continue;
      }
      for (uint64_t r = 0; r < g.n_tok; ++r) {
        for (uint64_t b = 0; b < nb; ++b) {
          float d;
          std::memcpy(&d, m + g.d_off + (r * nb + b) * 4, 4);
          ref::BlockQ8_0 blk;
          blk.d = ref::fp32_to_fp16(d);
          std::memcpy(blk.qs, m + g.q_off + r * hd + b * 32, 32);
          std::memcpy(g.dst + r * host_row + b * sizeof(blk), &blk, sizeof(blk));
        }
      }
    }
    staged.clear();
    return {};
  };

  for (int which = 0; which < 2; ++which) {
    const Alloc& a = which == 0 ? s.k_[l] : s.v_[l];
    for (uint64_t h = 0; h < static_cast<uint64_t>(c.n_kv_heads); ++h) {
      for (uint64_t t0 = 0; t0 < un; t0 += chunk) {
        const uint64_t m = std::min(chunk, un - t0);
        const uint64_t row = h * ctx + r0 + t0;  // device row of token t0
        const uint64_t host = (h * un + t0) * host_row;
        const uint64_t qb = m * q_row, db = m * d_row;
        const uint64_t q_dev = a.offset + row * q_row,
                       d_dev = a.offset + s.quant_bytes(l) + row * d_row;
        if (out) {
          if (ring_used_ + round256(qb) + round256(db) > ring_.size) LOOM_TRY(drain());
          const uint64_t qo = ring_put(nullptr, qb), d_o = db ? ring_put(nullptr, db) : 0;
          copy_buffer(a.block, q_dev, ring_.block, qo, qb);
          if (db) copy_buffer(a.block, d_dev, ring_.block, d_o, db);
          staged.push_back(Staged{qo, d_o, m, (which == 0 ? k_out : v_out) + host});
        } else {
          // A flush here runs the copies out of the ring staged before.
          LOOM_TRY(ring_reserve(round256(qb) + round256(db)));
          const uint64_t qo = ring_put(nullptr, qb), d_o = db ? ring_put(nullptr, db) : 0;
          const uint8_t* src = (which == 0 ? k_in : v_in) + host;
          uint8_t* mp = ring_.block->mapped;
          if (f16) {
            std::memcpy(mp + qo, src, qb);
          } else {
            for (uint64_t r = 0; r < m; ++r) {
              for (uint64_t b = 0; b < nb; ++b) {
                ref::BlockQ8_0 blk;
                std::memcpy(&blk, src + r * host_row + b * sizeof(blk), sizeof(blk));
                const float d = ref::fp16_to_fp32(blk.d);
                std::memcpy(mp + d_o + (r * nb + b) * 4, &d, 4);
                std::memcpy(mp + qo + r * hd + b * 32, blk.qs, 32);
              }
            }
          }
          copy_buffer(ring_.block, qo, a.block, q_dev, qb);
          if (db) copy_buffer(ring_.block, d_o, a.block, d_dev, db);
        }
        LOOM_TRY(status_);
      }
    }
  }
  if (out && !staged.empty()) LOOM_TRY(drain());
  return status_;
}

// ---- ops ----------------------------------------------------------------------

bool VulkanBackend::positions_in_range(const int32_t* pos, int64_t n, int64_t n_ctx,
                                       const char* op) {
  // A position past the cache would make the shader write outside its layer.
  for (int64_t t = 0; t < n; ++t) {
    if (pos[t] < 0 || pos[t] >= n_ctx) {
      fail(make_error(ErrorCode::kOutOfRange,
                      "Vulkan %s: position %d is outside the KV cache (0..%lld)", op, pos[t],
                      static_cast<long long>(n_ctx - 1)));
      return false;
    }
  }
  return true;
}

void VulkanBackend::get_rows(const Weight& w, const int32_t* ids, Act out) {
  if (!status_.ok() || !check_act(out, "get_rows")) return;
  const Resident* r = find_weight(w.data);
  if (!r)
    return fail(make_error(ErrorCode::kInternal, "Vulkan get_rows: tensor '%s' is not on the GPU",
                           w.name().c_str()));
  auto io = put_ints(ids, out.rows);
  if (!io.ok()) return fail(io.status());
  // Embeddings are whole tensors: ids index the tensor's rows.
  struct {
    uint32_t w_off, w_off2, row_units, K, n_rows, ids_off, o_off, o_ld;
  } pc{u32(r->alloc.offset / 4),
       u32((r->alloc.offset + r->off2) / 4),
       r->row_units,
       u32(w.n_in),
       u32(r->n_rows),
       *io,
       u32(out.offset / 4),
       u32(out.cols)};
  const Bind wb{r->alloc.block, r->alloc.offset, r->alloc.size, false};
  const Bind ib{ring_.block, 0, 0, false};
  dispatch(typed("get_rows", r->dtype, false, true), Spec{kWgSmall}, {wb, ib, act_bind(out, true)},
           &pc, sizeof(pc), (r->row_units + kWgSmall - 1) / kWgSmall, u32(out.rows), 1);
}

namespace {
// Push constants of rms_norm.comp (rms_norm, rms_norm_q8, quant_q8).
struct NormPush {
  uint32_t x_off, x_ld, w_off, o_off, o_ld, n, rows;
  float eps;
  uint32_t vec4_ok, xq_off, xd_off;
};
}  // namespace

uint64_t VulkanBackend::q8_bytes(uint64_t n) {
  return n + n / 32 * 8;
}

Status VulkanBackend::ensure_xq8(uint64_t n) {
  const uint64_t bytes = (q8_bytes(n) + 255) & ~uint64_t{255};  // slots 256-byte aligned
  if (xq8_slot_ >= bytes) return {};
  LOOM_TRY(flush());  // the old copies may be in use by recorded work
  device_pool_->free(xq8_buf_);
  xq8_buf_ = Alloc{};
  xq8_ = Xq8{};
  xq8_slot_ = 0;
  const uint64_t slot = std::max<uint64_t>(bytes, 32 << 10);
  LOOM_ASSIGN_OR_RETURN(xq8_buf_, device_pool_->alloc(2 * slot, "Q8 activations"));
  xq8_slot_ = slot;
  return {};
}

void VulkanBackend::quantize_q8(Act x) {
  // One row, 16-byte aligned, all of it in registers (VPT of quant_q8).
  const uint32_t wg = norm_wg_;
  if (!status_.ok() || x.rows != 1 || x.cols % 32 || x.offset % 16 ||
      static_cast<uint64_t>(x.cols) > uint64_t{4} * kQuantVec4PerThread * wg || wg % 8 ||
      !check_act(x, "quantize_q8"))
    return;
  const uint32_t n = u32(x.cols);
  Xq8 copy;
  auto qb = xq8_out(x, &copy);
  if (!qb.ok()) return fail(qb.status());
  NormPush pc{u32(x.offset / 4), n, 0, 0, n, n, 1, 0.0f, 1, copy.xq_off, copy.xd_off};
  const Bind none{static_cast<Block*>(x.buffer), 0, 0, false};
  dispatch(plain("quant_q8", true), Spec{wg}, {act_bind(x, false), none, none, *qb}, &pc,
           sizeof(pc), 1, 1, 1);
  if (status_.ok()) xq8_ = copy;
}

Result<VulkanBackend::Bind> VulkanBackend::xq8_out(const Act& row, Xq8* copy) {
  const auto n = static_cast<uint64_t>(row.cols);
  LOOM_TRY(ensure_xq8(n));
  // The slot the current copy is not in (a dispatch may read that one).
  const uint64_t base =
      xq8_buf_.offset + (xq8_.buffer && xq8_.base == xq8_buf_.offset ? xq8_slot_ : 0);
  *copy = Xq8{row.buffer, row.offset, row.cols, u32(base / 4), u32((base + n) / 8), base};
  return Bind{xq8_buf_.block, base, q8_bytes(n), true};
}

void VulkanBackend::rms_norm(Act x, const Weight& w, float eps, Act out) {
  if (!status_.ok() || !check_act(x, "rms_norm") || !check_act(out, "rms_norm")) return;
  const Resident* r = find_weight(w.data);
  if (!r)
    return fail(make_error(ErrorCode::kInternal, "Vulkan rms_norm: tensor '%s' is not on the GPU",
                           w.name().c_str()));
  const uint64_t w_off = r->device_offset(w.data);
  NormPush pc{u32(x.offset / 4),
              u32(x.cols),
              u32(w_off / 4),
              u32(out.offset / 4),
              u32(out.cols),
              u32(x.cols),
              u32(x.rows),
              eps,
              0,
              0,
              0};
  pc.vec4_ok = (pc.x_off | pc.x_ld | pc.w_off | pc.o_off | pc.o_ld | pc.n) % 4 == 0 ? 1 : 0;
  uint32_t gx, gz;
  grid_1d(static_cast<uint64_t>(x.rows), &gx, &gz);
  const Bind wb{r->alloc.block, r->alloc.offset, r->alloc.size, false};
  // Narrower workgroups for short rows: at least a vec4 per thread.
  uint32_t wg = norm_wg_;
  while (wg > reduce_wg_ && wg / 2 * 4 >= pc.n) wg /= 2;
  // One token's row, all in registers: also its Q8 copy for the integer-dot
  // matvecs that read it next (rms_norm_q8; see xq8_).
  const vk::DeviceCaps& c = dev_->caps();
  if (c.int_dot && int_dot_ && x.rows == 1 && pc.vec4_ok && pc.n % 32 == 0 &&
      pc.n <= 4 * kNormVec4PerThread * wg && wg % 8 == 0) {
    Xq8 copy;
    auto qb = xq8_out(out, &copy);
    if (!qb.ok()) return fail(qb.status());
    pc.xq_off = copy.xq_off;
    pc.xd_off = copy.xd_off;
    dispatch(plain("rms_norm_q8", true), Spec{wg},
             {act_bind(x, false), wb, act_bind(out, true), *qb}, &pc, sizeof(pc), gx, 1, gz);
    if (status_.ok()) xq8_ = copy;
    return;
  }
  dispatch(plain("rms_norm", true), Spec{wg}, {act_bind(x, false), wb, act_bind(out, true)}, &pc,
           sizeof(pc), gx, 1, gz);
}

bool VulkanBackend::int_dot_type(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ6_K;
}

const VulkanBackend::Xq8* VulkanBackend::xq8_for(const Act& x, int64_t K, DType t) const {
  return xq8_.buffer && int_dot_type(t) && x.rows == 1 && x.buffer == xq8_.buffer &&
                 x.offset == xq8_.offset && K == xq8_.n
             ? &xq8_
             : nullptr;
}

VulkanBackend::MatvecShape VulkanBackend::matvec1_shape(uint32_t M, uint32_t row_units, DType dtype,
                                                        bool int_dot) const {
  // Two rows per row group (each x load serves both; measured on the H200,
  // this beats one row with twice the workgroups, and four rows run out of
  // registers), UNROLL parts of 32 elements in all per thread and step (K-quant
  // parts are twice as long as the others), then the row split over more
  // threads while the grid is short of kManyGroups workgroups and each thread
  // still gets one whole step. The K-quants' integer-dot variants take one part
  // per step (on the H200 their matvecs took 10-15% less time than with two).
  // set_matvec_tuning() fixes any of these instead.
  const uint32_t S = std::max<uint32_t>(1, dev_->caps().subgroup_size);
  const uint32_t parts = matvec_parts(dtype);
  MatvecShape s;
  s.wg = mv_tune_.wg ? std::max(mv_tune_.wg, S) : matvec_wg_;
  s.unroll = mv_tune_.unroll         ? std::min(mv_tune_.unroll, kMatvecUnrollMax)
             : int_dot && parts == 2 ? 1
                                     : kMatvecUnroll * parts / kMatvecPartsMax;
  s.nr = matvec_rows_ ? matvec_rows_ : kMatvecRowsMax / 2;
  s.tpr = matvec_tpr_ ? matvec_tpr_ : std::min(S, s.wg);
  const uint32_t many = mv_tune_.groups ? mv_tune_.groups : kManyGroups;
  auto groups = [&] { return (M + s.wg / s.tpr * s.nr - 1) / (s.wg / s.tpr * s.nr); };
  if (!matvec_tpr_) {
    while (groups() < many && s.tpr * 2 <= s.wg && parts * row_units >= 2 * s.tpr * s.unroll)
      s.tpr *= 2;
  }
  return s;
}

void VulkanBackend::matmul(const Weight& w, Act x, Act out, const Weight* bias) {
  matmul_impl(w, x, out, bias, false);
}

void VulkanBackend::matmul_add(const Weight& w, Act x, Act y, Act tmp) {
  if (x.rows == 1 && dev_->caps().subgroup_arithmetic) {
    // Optionally (int_dot_inputs_) a Q8 copy of x first, for the integer-dot matvec.
    if (int_dot_inputs_ && int_dot_ && dev_->caps().int_dot) {
      const Resident* r = find_weight(w.data);
      if (r && int_dot_type(r->dtype) && !xq8_for(x, w.n_in, r->dtype)) quantize_q8(x);
    }
    return matmul_impl(w, x, y, nullptr, true);
  }
  Backend::matmul_add(w, x, y, tmp);
}

namespace {
// " MxK", appended to a matvec's profile label so each weight shape is timed apart.
std::string shape_tag(uint32_t M, int64_t K) {
  char b[48];
  std::snprintf(b, sizeof b, " %ux%lld", M, static_cast<long long>(K));
  return b;
}

// Push constants of mul_mat_vec.comp and mul_mat.comp (PC there). The last
// three are the up matrix of matvec1_glu; the other variants ignore them.
struct MatvecPush {
  uint32_t w_off, w_off2, row0, row_units, K, M, N, x_off, x_ld, y_off, y_ld, b_off, flags;
  uint32_t w_off_b = 0, w_off2_b = 0, row0_b = 0;
  uint32_t w_off_c = 0, w_off2_c = 0, m_a = 0, m_b = 0, y_off_b = 0, y_off_c = 0;
  uint32_t cnt_off = 0;              // matvec1x_glu_q8: the blocks' arrival counters
  uint32_t qo_off = 0, qdo_off = 0;  // matvec1x_glu_q8: y's Q8 copy (words, vec2s)
  uint32_t pad[5] = {0, 0, 0, 0, 0};
  uint32_t xq_off = 0, xd_off = 0;  // matvec1x: x's Q8 copy (words, vec2s)
};
static_assert(sizeof(MatvecPush) <= kPushBytes);
// matvec1_qkv_rope: MatvecPush up to y_off_c (N, y_ld, b_off and row0_b
// holding head_dim, n_ctx and the K and V caches' word offsets), then these.
struct MatvecRopePush {
  uint32_t w_off, w_off2, row0, row_units, K, M, head_dim, x_off, x_ld, y_off, n_ctx, kc_off, flags;
  uint32_t w_off_b, w_off2_b, vc_off;
  uint32_t w_off_c, w_off2_c, m_a, m_b, y_off_b, y_off_c;
  int32_t pos;
  uint32_t ff_off;
  float theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1;
  uint32_t xq_off = 0, xd_off = 0;
};
static_assert(sizeof(MatvecRopePush) <= kPushBytes);
static_assert(offsetof(MatvecRopePush, xq_off) == offsetof(MatvecPush, xq_off));
static_assert(offsetof(MatvecRopePush, y_off_c) == offsetof(MatvecPush, y_off_c));
}  // namespace

void VulkanBackend::matvec1_grid(const MatvecShape& s, uint32_t M, uint32_t* gx,
                                 uint32_t* gz) const {
  const uint32_t rows_per_group = s.wg / s.tpr * s.nr;
  grid_1d((M + rows_per_group - 1) / rows_per_group, gx, gz);
}

void VulkanBackend::matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) {
  const Resident* rg = whole_tensor(gate);
  const Resident* ru = whole_tensor(up);
  // One dispatch when both are whole tensors of one type in one memory block.
  const bool fused = status_.ok() && x.rows == 1 && dev_->caps().subgroup_arithmetic && rg && ru &&
                     rg->alloc.block == ru->alloc.block && rg->dtype == ru->dtype &&
                     rg->row_units == ru->row_units && gate.n_out == up.n_out &&
                     gate.n_in == up.n_in && check_act(x, "matmul_glu") &&
                     check_act(out, "matmul_glu");
  if (!fused) return Backend::matmul_glu(gate, up, x, out, tmp);
  const uint32_t M = 2 * u32(gate.n_out);  // interleaved gate and up rows
  const uint32_t x_off = u32(x.offset / 4), x_ld = u32(x.cols);
  MatvecPush pc{u32(rg->alloc.offset / 4),
                u32((rg->alloc.offset + rg->off2) / 4),
                0,
                rg->row_units,
                u32(gate.n_in),
                M,
                1,
                x_off,
                x_ld,
                u32(out.offset / 4),
                u32(out.cols),
                0,
                (x_off % 4 == 0 && x_ld % 4 == 0) ? 2u : 0u,
                u32(ru->alloc.offset / 4),
                u32((ru->alloc.offset + ru->off2) / 4),
                0};
  // Room for out's Q8 copy first: making room drops the copies there are.
  if (int_dot_outputs_ && xq8_.buffer) {
    Status st = ensure_xq8(static_cast<uint64_t>(std::max(gate.n_in, gate.n_out)));
    if (!st.ok()) return fail(st);
  }
  const Xq8* xq = xq8_for(x, gate.n_in, rg->dtype);  // integer dots on x's Q8 copy
  MatvecShape s = matvec1_shape(M, rg->row_units, rg->dtype, xq != nullptr);
  s.nr = std::max<uint32_t>(2, s.nr & ~1u);  // whole (gate, up) pairs per row group
  uint32_t gx, gz;
  matvec1_grid(s, M, &gx, &gz);
  const Bind wg{rg->alloc.block, rg->alloc.offset, rg->alloc.size, false};
  // Binding 4 (not read by the shader) puts the up tensor's range in the hazard tracking.
  const Bind wu{ru->alloc.block, ru->alloc.offset, ru->alloc.size, false};
  if (profile_) prof_shape_ = shape_tag(M, gate.n_in);
  // With integer dots on x's Q8 copy, and where each workgroup's outputs lie
  // in one 32-element block, also out's Q8 copy (matvec1x_glu_q8) for down.
  const uint32_t per_group = s.wg / s.tpr * s.nr / 2;
  const uint32_t n_blocks = u32(gate.n_out / 32);
  if (xq) {
    pc.xq_off = xq->xq_off;
    pc.xd_off = xq->xd_off;
    if (int_dot_outputs_ && gate.n_out % 32 == 0 && out.offset % 16 == 0 && 32 % per_group == 0 &&
        s.wg % 8 == 0 && n_blocks <= kCounters) {
      Xq8 copy;
      auto qo = xq8_out(out, &copy);
      if (!qo.ok()) return fail(qo.status());
      auto cnt = counters(n_blocks);
      if (!cnt.ok()) return fail(cnt.status());
      pc.cnt_off = u32(cnt->offset / 4);
      pc.qo_off = copy.xq_off;
      pc.qdo_off = copy.xd_off;
      dispatch(typed("matvec1x_glu_q8", rg->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
               {wg, act_bind(x, false), act_bind(out, true), wg, wu, *qo, xq8_bind(), *cnt}, &pc,
               sizeof(pc), gx, 1, gz);
      if (status_.ok()) xq8_ = copy;
      return;
    }
    dispatch(typed("matvec1x_glu", rg->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wg, act_bind(x, false), act_bind(out, true), wg, wu,
              Bind{rg->alloc.block, 0, 0, false}, xq8_bind()},
             &pc, sizeof(pc), gx, 1, gz);
    return;
  }
  dispatch(typed("matvec1_glu", rg->dtype, true, true), Spec{s.wg, s.nr, s.tpr, s.unroll},
           {wg, act_bind(x, false), act_bind(out, true), wg, wu}, &pc, sizeof(pc), gx, 1, gz);
}

VulkanBackend::Bind VulkanBackend::xq8_bind() {
  ++int_dot_dispatches_;
  return Bind{xq8_buf_.block, xq8_.base, q8_bytes(static_cast<uint64_t>(xq8_.n)), false};
}

const VulkanBackend::Resident* VulkanBackend::whole_tensor(const Weight& w) const {
  const Resident* r = find_weight(w.data);
  return r && r->n_rows == w.n_out && r->n_in == w.n_in &&
                 static_cast<const uint8_t*>(w.data) == r->begin()
             ? r
             : nullptr;
}

void VulkanBackend::matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv,
                               const Weight& bq, const Weight& bk, const Weight& bv, Act x, Act q,
                               Act k, Act v) {
  (void)qkv_impl(wq, wk, wv, bq, bk, bv, x, q, k, v, nullptr);
}

void VulkanBackend::matmul_qkv_rope_kv(const Weight& wq, const Weight& wk, const Weight& wv,
                                       const Weight& bq, const Weight& bk, const Weight& bv, Act x,
                                       Act q, Act k, Act v, KvCache& kv, int64_t layer,
                                       int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                       const int32_t* pos, const cpu::RopeParams& p) {
  // One dispatch (matvec1_qkv_rope) where rope_kv's conditions hold (an F16
  // cache with K and V in one block, normal ordering over whole heads) and q,
  // k and v fuse into one matvec; otherwise matmul_qkv, then rope_qk_kv.
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  const bool ok =
      status_.ok() && x.rows == 1 && qkv_rope_ && s && s->owner_ == this &&
      s->layer_resident(layer) && s->layer_slots(layer) == 0 && s->cfg_.dtype == DType::kF16 &&
      !p.neox && p.n_rot == head_dim && head_dim % 2 == 0 && s->cfg_.head_dim == head_dim &&
      s->cfg_.n_kv_heads == n_kv_heads && wq.n_out == n_heads * head_dim &&
      wk.n_out == n_kv_heads * head_dim && wv.n_out == n_kv_heads * head_dim &&
      s->k_[static_cast<size_t>(layer)].block == s->v_[static_cast<size_t>(layer)].block;
  if (ok) {
    if (!positions_in_range(pos, 1, s->cfg_.n_ctx, "kv_store")) return;
    const RopeKv rk{v, &s->k_[static_cast<size_t>(layer)], &s->v_[static_cast<size_t>(layer)],
                    u32(s->cfg_.n_ctx)};
    const QkvRope r{&rk, pos, &p, u32(head_dim)};
    if (qkv_impl(wq, wk, wv, bq, bk, bv, x, q, k, v, &r)) return;
  }
  Backend::matmul_qkv_rope_kv(wq, wk, wv, bq, bk, bv, x, q, k, v, kv, layer, n_heads, n_kv_heads,
                              head_dim, pos, p);
}

bool VulkanBackend::qkv_impl(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                             const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v,
                             const QkvRope* rope) {
  // One dispatch for q and k, and v with them, when they are whole tensors of
  // one type in one memory block without a bias, writing into one block.
  const Resident* rq = whole_tensor(wq);
  auto joins = [&](const Weight& w, const Weight& b, const Act& out) -> const Resident* {
    const Resident* r = whole_tensor(w);
    return r && rq && !b.present() && r->alloc.block == rq->alloc.block && r->dtype == rq->dtype &&
                   r->row_units == rq->row_units && out.buffer == q.buffer && out.rows == 1 &&
                   out.offset % 4 == 0
               ? r
               : nullptr;
  };
  const Resident* rk = joins(wk, bk, k);
  const Resident* rv = joins(wv, bv, v);
  const bool fused = status_.ok() && x.rows == 1 && dev_->caps().subgroup_arithmetic && rq && rk &&
                     !bq.present() && (rv || !rope) && check_act(x, "matmul_qkv") &&
                     check_act(q, "matmul_qkv");
  if (!fused) {
    if (rope) return false;  // the caller runs the ops apart
    Backend::matmul_qkv(wq, wk, wv, bq, bk, bv, x, q, k, v);
    return true;
  }
  const uint32_t mq = u32(wq.n_out), mk = u32(wk.n_out), M = mq + mk + (rv ? u32(wv.n_out) : 0);
  const uint32_t x_off = u32(x.offset / 4), x_ld = u32(x.cols);
  auto w_off = [](const Resident* r) { return u32(r->alloc.offset / 4); };
  auto w_off2 = [](const Resident* r) { return u32((r->alloc.offset + r->off2) / 4); };
  MatvecPush pc{w_off(rq),
                w_off2(rq),
                0,
                rq->row_units,
                u32(wq.n_in),
                M,
                1,
                x_off,
                x_ld,
                u32(q.offset / 4),
                u32(q.cols),
                0,
                (x_off % 4 == 0 && x_ld % 4 == 0) ? 2u : 0u};
  pc.w_off_b = w_off(rk);
  pc.w_off2_b = w_off2(rk);
  pc.w_off_c = rv ? w_off(rv) : 0;
  pc.w_off2_c = rv ? w_off2(rv) : 0;
  pc.m_a = mq;
  pc.m_b = mk;
  pc.y_off_b = u32(k.offset / 4);
  pc.y_off_c = u32(v.offset / 4);
  const Xq8* xq = xq8_for(x, wq.n_in, rq->dtype);  // integer dots on x's Q8 copy
  MatvecShape s = matvec1_shape(M, rq->row_units, rq->dtype, xq != nullptr);
  if (rope) s.nr = std::max<uint32_t>(2, s.nr & ~1u);  // whole rotated pairs per row group
  uint32_t gx, gz;
  matvec1_grid(s, M, &gx, &gz);
  // The hazard ranges span the fused matrices and outputs (each in one block).
  uint64_t wlo = UINT64_MAX, whi = 0, ylo = UINT64_MAX, yhi = 0;
  for (const Resident* r : {rq, rk, rv}) {
    if (r)
      wlo = std::min(wlo, r->alloc.offset), whi = std::max(whi, r->alloc.offset + r->alloc.size);
  }
  for (const Act* a : {&q, &k, rv ? &v : &q}) {
    ylo = std::min(ylo, a->offset);
    yhi = std::max(yhi, a->offset + static_cast<uint64_t>(a->rows * a->cols) * 4);
  }
  const Bind wb{rq->alloc.block, wlo, whi - wlo, false};
  const Bind ob{static_cast<Block*>(q.buffer), ylo, yhi - ylo, true};
  if (profile_) prof_shape_ = shape_tag(M, wq.n_in);
  if (rope) {
    const cpu::RopeParams& p = *rope->p;
    const vk::Alloc &ka = *rope->kv->k_cache, &va = *rope->kv->v_cache;
    MatvecRopePush rp{pc.w_off,
                      pc.w_off2,
                      0,
                      pc.row_units,
                      pc.K,
                      pc.M,
                      rope->head_dim,
                      pc.x_off,
                      pc.x_ld,
                      pc.y_off,
                      rope->kv->n_ctx,
                      u32(ka.offset / 4),
                      pc.flags,
                      pc.w_off_b,
                      pc.w_off2_b,
                      u32(va.offset / 4),
                      pc.w_off_c,
                      pc.w_off2_c,
                      pc.m_a,
                      pc.m_b,
                      pc.y_off_b,
                      pc.y_off_c,
                      rope->pos[0],
                      0xFFFFFFFFu,
                      std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot)),
                      p.freq_scale,
                      p.ext_factor,
                      p.attn_factor,
                      0,
                      0};
    float corr[2];
    ref::rope_yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
    rp.corr0 = corr[0];
    rp.corr1 = corr[1];
    // Frequency factors: the resident tensor (rope_freqs), or a copy in the ring.
    Bind fb{ring_.block, 0, 0, false};
    if (p.freq_factors) {
      if (const Resident* rf = find_weight(p.freq_factors); rf && rf->dtype == DType::kF32) {
        fb = Bind{rf->alloc.block, rf->alloc.offset, rf->alloc.size, false};
        rp.ff_off = u32(rf->device_offset(p.freq_factors) / 4);
      } else {
        const uint64_t bytes = static_cast<uint64_t>(p.n_rot / 2) * 4;
        Status st = ring_reserve(bytes);
        if (!st.ok()) {
          fail(st);
          return true;
        }
        rp.ff_off = u32(ring_put(p.freq_factors, bytes) / 4);
      }
    }
    const uint64_t lo = std::min(ka.offset, va.offset),
                   hi = std::max(ka.offset + ka.size, va.offset + va.size);
    const Bind cb{ka.block, lo, hi - lo, true};
    if (xq) {
      rp.xq_off = xq->xq_off;
      rp.xd_off = xq->xd_off;
      dispatch(typed("matvec1x_qkv_rope", rq->dtype, true, false),
               Spec{s.wg, s.nr, s.tpr, s.unroll},
               {wb, act_bind(x, false), ob, wb, fb, cb, xq8_bind()}, &rp, sizeof(rp), gx, 1, gz);
      return true;
    }
    dispatch(typed("matvec1_qkv_rope", rq->dtype, true, true), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wb, act_bind(x, false), ob, wb, fb, cb}, &rp, sizeof(rp), gx, 1, gz);
    return true;
  }
  if (xq) {
    pc.xq_off = xq->xq_off;
    pc.xd_off = xq->xd_off;
    const Bind none{rq->alloc.block, 0, 0, false};
    dispatch(typed("matvec1x_qkv", rq->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wb, act_bind(x, false), ob, wb, none, none, xq8_bind()}, &pc, sizeof(pc), gx, 1, gz);
  } else {
    dispatch(typed("matvec1_qkv", rq->dtype, true, true), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wb, act_bind(x, false), ob, wb}, &pc, sizeof(pc), gx, 1, gz);
  }
  if (!rv) matmul(wv, x, v, bv.present() ? &bv : nullptr);
  return true;
}

void VulkanBackend::matmul_impl(const Weight& w, Act x, Act out, const Weight* bias,
                                bool accumulate) {
  if (!status_.ok() || !check_act(x, "matmul") || !check_act(out, "matmul")) return;
  const Resident* r = find_weight(w.data);
  if (!r)
    return fail(make_error(ErrorCode::kInternal, "Vulkan matmul: tensor '%s' is not on the GPU",
                           w.name().c_str()));
  const auto row0 = static_cast<uint64_t>((static_cast<const uint8_t*>(w.data) - r->begin()) /
                                          static_cast<ptrdiff_t>(r->src_row_bytes));
  const Resident* rb = nullptr;
  uint64_t b_off = 0;
  if (bias && bias->present()) {
    rb = find_weight(bias->data);
    if (!rb)
      return fail(make_error(ErrorCode::kInternal, "Vulkan matmul: bias '%s' is not on the GPU",
                             bias->name().c_str()));
    b_off = rb->device_offset(bias->data) / 4;
  }
  const uint32_t T = u32(x.rows), M = u32(w.n_out);
  const uint32_t x_off = u32(x.offset / 4), x_ld = u32(x.cols);
  MatvecPush pc{u32(r->alloc.offset / 4),
                u32((r->alloc.offset + r->off2) / 4),
                u32(row0),
                r->row_units,
                u32(w.n_in),
                M,
                T,
                x_off,
                x_ld,
                u32(out.offset / 4),
                u32(out.cols),
                u32(b_off),
                0};
  if (rb) pc.flags |= 1;
  if (x_off % 4 == 0 && x_ld % 4 == 0) pc.flags |= 2;
  if (accumulate) pc.flags |= 4;
  const Bind wb{r->alloc.block, r->alloc.offset, r->alloc.size, false};
  const Bind bb = rb ? Bind{rb->alloc.block, rb->alloc.offset, rb->alloc.size, false}
                     : Bind{r->alloc.block, 0, 0, false};
  if (T == 1 && dev_->caps().subgroup_arithmetic) {
    // Decode: row groups of TPR threads own NR rows each (mul_mat_vec.comp).
    const Xq8* xq = probe_loads_ ? nullptr : xq8_for(x, w.n_in, r->dtype);
    const MatvecShape s = matvec1_shape(M, r->row_units, r->dtype, xq != nullptr);
    uint32_t gx, gz;
    matvec1_grid(s, M, &gx, &gz);
    if (profile_) prof_shape_ = shape_tag(M, w.n_in);
    if (xq) {  // integer dots on x's Q8 copy
      pc.xq_off = xq->xq_off;
      pc.xd_off = xq->xd_off;
      const Bind none{r->alloc.block, 0, 0, false};
      dispatch(typed("matvec1x", r->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
               {wb, act_bind(x, false), act_bind(out, true), bb, none, none, xq8_bind()}, &pc,
               sizeof(pc), gx, 1, gz);
      return;
    }
    dispatch(typed(probe_loads_ && r->dtype == DType::kQ4_0 ? "matvec1_probe" : "matvec1", r->dtype,
                   true, true),
             Spec{s.wg, s.nr, s.tpr, s.unroll}, {wb, act_bind(x, false), act_bind(out, true), bb},
             &pc, sizeof(pc), gx, 1, gz);
  } else if (T <= kMatvecCols) {
    // With subgroups a workgroup covers (subgroups per workgroup) x kMatvecRows rows.
    const vk::DeviceCaps& c = dev_->caps();
    const uint32_t nsg =
        c.subgroup_arithmetic ? std::max<uint32_t>(1, kWgMatvec / c.subgroup_size) : 1;
    const uint32_t rows_per_group = nsg * kMatvecRows;
    uint32_t gx, gz;
    grid_1d((M + rows_per_group - 1) / rows_per_group, &gx, &gz);
    dispatch(typed(T == 1 ? "matvec1" : "matvec", r->dtype, true, true),
             Spec{kWgMatvec, kMatvecRows, nsg}, {wb, act_bind(x, false), act_bind(out, true), bb},
             &pc, sizeof(pc), gx, (T + kMatvecCols - 1) / kMatvecCols, gz);
  } else if (coopmat_ && dev_->caps().coopmat && r->dtype != DType::kF32 &&
             dev_->caps().max_shared_bytes >= kMatmulCmShared[0]) {
    // Tensor cores: F16 tiles, F32 sums (F32 weights stay on the exact kernel).
    // 128 x 128 tiles where the shared memory has room, else 128 x 64.
    const uint32_t grid_m = (M + kMatmulTileM - 1) / kMatmulTileM;
    uint32_t v = coopmat_variant_ ? coopmat_variant_ : kMatmulCmDefault;
    if (v == 2) v = grid_m * ((T + 127) / 128) < kMatmulCmNarrowBelow ? 64 : 128;
    if (dev_->caps().max_shared_bytes < kMatmulCmShared[1]) v = 64;
    const uint32_t bn = v == 64 ? 64 : 128;
    dispatch(typed(v == 64  ? "matmul_cm_n64"
                   : v == 4 ? "matmul_cm4"
                            : "matmul_cm",
                   r->dtype, false, true),
             Spec{v == 4 ? 128u : 256u}, {wb, act_bind(x, false), act_bind(out, true), bb}, &pc,
             sizeof(pc), grid_m, (T + bn - 1) / bn, 1);
  } else {
    // 128 x 128 tiles (32 KiB of shared memory) where the device has room,
    // else 128 x 64 (24 KiB).
    const bool wide = dev_->caps().max_shared_bytes >= kMatmulWideShared && !matmul_n64_;
    const uint32_t bn = wide ? kMatmulTileN : kMatmulTileN / 2;
    dispatch(typed(wide ? "matmul" : "matmul_n64", r->dtype, false, true), Spec{kWgMatmul},
             {wb, act_bind(x, false), act_bind(out, true), bb}, &pc, sizeof(pc),
             (M + kMatmulTileM - 1) / kMatmulTileM, (T + bn - 1) / bn, 1);
  }
}

void VulkanBackend::rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                         const cpu::RopeParams& p) {
  rope_impl(x, n_heads, x, 0, head_dim, pos, p);
}

void VulkanBackend::rope_qk(Act q, Act k, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                            const int32_t* pos, const cpu::RopeParams& p) {
  rope_impl(q, n_heads, k, n_kv_heads, head_dim, pos, p);
}

void VulkanBackend::rope_qk_kv(Act q, Act k, Act v, KvCache& kv, int64_t layer, int64_t n_heads,
                               int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                               const cpu::RopeParams& p) {
  // One dispatch (rope_kv) for an F16 cache with K and V in one block, normal
  // ordering over the whole head; rope_qk then kv_store otherwise.
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  const bool fused =
      status_.ok() && s && s->owner_ == this && s->layer_resident(layer) &&
      s->layer_slots(layer) == 0 && s->cfg_.dtype == DType::kF16 && !p.neox &&
      p.n_rot == head_dim && s->cfg_.head_dim == head_dim && s->cfg_.n_kv_heads == n_kv_heads &&
      k.rows == q.rows && v.rows == q.rows &&
      s->k_[static_cast<size_t>(layer)].block == s->v_[static_cast<size_t>(layer)].block &&
      check_act(v, "rope_qk_kv");
  if (!fused) return Backend::rope_qk_kv(q, k, v, kv, layer, n_heads, n_kv_heads, head_dim, pos, p);
  if (!positions_in_range(pos, k.rows, s->cfg_.n_ctx, "kv_store")) return;
  const RopeKv rk{v, &s->k_[static_cast<size_t>(layer)], &s->v_[static_cast<size_t>(layer)],
                  u32(s->cfg_.n_ctx)};
  rope_impl(q, n_heads, k, n_kv_heads, head_dim, pos, p, &rk);
}

Status VulkanBackend::put_rope_inputs(const int32_t* pos, int64_t n, const cpu::RopeParams& p,
                                      uint32_t* pos_off, uint32_t* ff_off) {
  auto po = put_ints(pos, n);
  LOOM_TRY(po.status());
  *ff_off = 0xFFFFFFFFu;
  if (p.freq_factors) {
    const uint64_t bytes = static_cast<uint64_t>(p.n_rot / 2) * 4;
    LOOM_TRY(ring_reserve(bytes));
    if (!ints_memo_valid_) {  // the flush dropped the positions: put them again
      po = put_ints(pos, n);
      LOOM_TRY(po.status());
      LOOM_TRY(ring_reserve(bytes));
    }
    *ff_off = u32(ring_put(p.freq_factors, bytes) / 4);
  }
  *pos_off = *po;
  return {};
}

void VulkanBackend::rope_impl(Act x, int64_t n_heads, Act x2, int64_t n_heads2, int64_t head_dim,
                              const int32_t* pos, const cpu::RopeParams& p, const RopeKv* kv) {
  if (!status_.ok() || !check_act(x, "rope") || (n_heads2 && !check_act(x2, "rope"))) return;
  if (n_heads2 && x2.rows != x.rows)
    return fail(make_error(ErrorCode::kInternal, "Vulkan rope: q and k differ in rows"));
  uint32_t pos_off = 0, ff_off = 0;
  Status rs = put_rope_inputs(pos, x.rows, p, &pos_off, &ff_off);
  if (!rs.ok()) return fail(rs);
  float corr[2];
  ref::rope_yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
  struct {
    uint32_t x_off, x_ld, n_heads, head_dim, n_rot, neox, pos_off, ff_off;
    float theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1;
    uint32_t x2_off, x2_ld, n_heads2;
    uint32_t v_off = 0, v_ld = 0, kc_off = 0, vc_off = 0, n_ctx = 0;
  } pc{u32(x.offset / 4), u32(x.cols),  u32(n_heads),
       u32(head_dim),     u32(p.n_rot), p.neox ? 1u : 0u,
       pos_off,           ff_off,       std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot)),
       p.freq_scale,      p.ext_factor, p.attn_factor,
       corr[0],           corr[1],      u32(x2.offset / 4),
       u32(x2.cols),      u32(n_heads2)};
  const Bind rb{ring_.block, 0, 0, false};
  const uint64_t pairs = static_cast<uint64_t>((n_heads + n_heads2) * (p.n_rot / 2));
  // Without a second tensor, binding 3 repeats x's buffer with no range (no hazard).
  const Bind b2 = n_heads2 ? act_bind(x2, true) : Bind{static_cast<Block*>(x.buffer), 0, 0, false};
  if (kv) {
    pc.v_off = u32(kv->v.offset / 4);
    pc.v_ld = u32(kv->v.cols);
    pc.kc_off = u32(kv->k_cache->offset / 4);
    pc.vc_off = u32(kv->v_cache->offset / 4);
    pc.n_ctx = kv->n_ctx;
    const vk::Alloc &ka = *kv->k_cache, &va = *kv->v_cache;
    const uint64_t lo = std::min(ka.offset, va.offset),
                   hi = std::max(ka.offset + ka.size, va.offset + va.size);
    const uint64_t all = pairs + static_cast<uint64_t>(n_heads2 * (p.n_rot / 2));  // + v's pairs
    dispatch(
        plain("rope_kv"), Spec{kWgSmall},
        {act_bind(x, true), rb, rb, b2, act_bind(kv->v, false), Bind{ka.block, lo, hi - lo, true}},
        &pc, sizeof(pc), u32((all + kWgSmall - 1) / kWgSmall), u32(x.rows), 1);
    return;
  }
  dispatch(plain("rope"), Spec{kWgSmall}, {act_bind(x, true), rb, rb, b2}, &pc, sizeof(pc),
           u32((pairs + kWgSmall - 1) / kWgSmall), u32(x.rows), 1);
}

void VulkanBackend::kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) {
  if (!status_.ok() || !check_act(k, "kv_store") || !check_act(v, "kv_store")) return;
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  if (!s || s->owner_ != this)
    return fail(
        make_error(ErrorCode::kInternal, "Vulkan kv_store: the KV cache is not on this GPU"));
  if (!s->layer_resident(layer)) return fail(not_resident(layer, "kv_store"));
  if (!positions_in_range(pos, k.rows, s->cfg_.n_ctx, "kv_store")) return;
  if (s->layer_slots(layer) == 0) return kv_store_rows(*s, layer, k, v, pos);
  // Device tier: tokens whose block has a slot go there; those whose block
  // is a host block (a recompute of a block lost on the SSD) are stored
  // by the cache, and while recomputing, blocks on the device stay as they are.
  std::vector<int32_t> rows(static_cast<size_t>(k.rows));
  bool to_host = false;
  for (int64_t t = 0; t < k.rows; ++t) {
    const int64_t r = kv.device_row(layer, pos[t]);
    rows[static_cast<size_t>(t)] = r < 0 ? -1 : kv.recomputing() ? -2 : static_cast<int32_t>(r);
    to_host |= r < 0;
  }
  for (int64_t t0 = 0; t0 < k.rows;) {  // runs of tokens stored on the device
    int64_t t1 = t0;
    while (t1 < k.rows && rows[static_cast<size_t>(t1)] >= 0) ++t1;
    if (t1 > t0)
      kv_store_rows(*s, layer, k.rows_view(t0, t1 - t0), v.rows_view(t0, t1 - t0),
                    rows.data() + t0);
    t0 = std::max(t1, t0 + 1);
  }
  if (!to_host) return;
  std::vector<float> kh(static_cast<size_t>(k.rows * k.cols)), vh(kh.size());
  Status st = download(k, kh.data());
  if (st.ok()) st = download(v, vh.data());
  if (!st.ok()) return fail(st);
  for (int64_t t = 0; t < k.rows; ++t) {
    if (rows[static_cast<size_t>(t)] == -1)
      kv.store(layer, pos[t], kh.data() + t * k.cols, vh.data() + t * k.cols);
  }
}

void VulkanBackend::kv_store_rows(VkKvStorage& s, int64_t layer, Act k, Act v,
                                  const int32_t* rows) {
  const KvCacheConfig& c = s.cfg_;
  const auto l = static_cast<size_t>(layer);
  if (!positions_in_range(rows, k.rows, s.rows(l), "kv_store")) return;
  auto po = put_ints(rows, k.rows);
  if (!po.ok()) return fail(po.status());
  const Alloc& ka = s.k_[l];
  const Alloc& va = s.v_[l];
  struct {
    uint32_t k_off, k_ld, v_off, v_ld, kc_off, kc_d_off, vc_off, vc_d_off, n_ctx, n_kv_heads,
        head_dim, pos_off;
  } pc{u32(k.offset / 4),  u32(k.cols),
       u32(v.offset / 4),  u32(v.cols),
       u32(ka.offset / 4), u32((ka.offset + s.quant_bytes(l)) / 4),
       u32(va.offset / 4), u32((va.offset + s.quant_bytes(l)) / 4),
       u32(s.rows(l)),     u32(c.n_kv_heads),
       u32(c.head_dim),    *po};
  const bool f16 = c.dtype == DType::kF16;
  const uint64_t items =
      static_cast<uint64_t>(c.n_kv_heads * (f16 ? c.head_dim / 2 : c.head_dim / 32));
  dispatch(typed("kv_store", c.dtype, false, false), Spec{kWgSmall},
           {act_bind(k, false), act_bind(v, false), Bind{ka.block, ka.offset, ka.size, true},
            Bind{va.block, va.offset, va.size, true}, Bind{ring_.block, 0, 0, false}},
           &pc, sizeof(pc), u32((items + kWgSmall - 1) / kWgSmall), u32(k.rows), 1);
}

void VulkanBackend::attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos,
                              int64_t n_heads, float scale, Act out) {
  if (!status_.ok() || !check_act(q, "attention") || !check_act(out, "attention")) return;
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  if (!s || s->owner_ != this)
    return fail(
        make_error(ErrorCode::kInternal, "Vulkan attention: the KV cache is not on this GPU"));
  if (!s->layer_resident(layer)) return fail(not_resident(layer, "attention"));
  const KvCacheConfig& c = s->cfg_;
  const int64_t T = q.rows, hd = c.head_dim;
  if (!positions_in_range(pos, T, c.n_ctx, "attention")) return;
  const auto l = static_cast<size_t>(layer);
  if (s->layer_slots(layer) > 0) {
    // Device tier: one split per slot, causal by each slot's position; the
    // query rows in groups whose partials fit the scratch (prefill too).
    const std::vector<int32_t> map = kv.slot_positions(layer);
    const int64_t tn = attn_rows_per_group(n_heads, hd, map.size() + 1);
    for (int64_t t0 = 0; t0 < T && status_.ok(); t0 += tn) {
      const int64_t n = std::min(tn, T - t0);
      attention_decode(*s, layer, q.rows_view(t0, n), pos + t0, n_heads, scale,
                       out.rows_view(t0, n), &map, 0, false);
    }
    return;
  }
  const Alloc& ka = s->k_[l];
  const Alloc& va = s->v_[l];
  if (T > 1 && hd <= kAttnTileMaxHeadDim) {  // prefill: tiled flash attention
    auto po = put_ints(pos, T);
    if (!po.ok()) return fail(po.status());
    struct {
      uint32_t q_off, q_ld, o_off, o_ld, kc_off, kc_d_off, vc_off, vc_d_off, n_ctx, n_heads,
          n_kv_heads, head_dim, pos_off, T;
      float scale;
    } pc{u32(q.offset / 4),
         u32(q.cols),
         u32(out.offset / 4),
         u32(out.cols),
         u32(ka.offset / 4),
         u32((ka.offset + s->quant_bytes(l)) / 4),
         u32(va.offset / 4),
         u32((va.offset + s->quant_bytes(l)) / 4),
         u32(c.n_ctx),
         u32(n_heads),
         u32(c.n_kv_heads),
         u32(hd),
         *po,
         u32(T),
         scale};
    dispatch(typed("attn_tile", c.dtype, false, true), Spec{kWgAttnTile},
             {act_bind(q, false), Bind{ka.block, ka.offset, ka.size, false},
              Bind{va.block, va.offset, va.size, false}, act_bind(out, true),
              Bind{ring_.block, 0, 0, false}},
             &pc, sizeof(pc), u32((T + kAttnTileRows - 1) / kAttnTileRows), u32(n_heads), 1);
    return;
  }
  attention_decode(*s, layer, q, pos, n_heads, scale, out, nullptr, 0, false);
}

int64_t VulkanBackend::attn_rows_per_group(int64_t n_heads, int64_t hd, size_t n_splits) const {
  const uint64_t per_row =
      static_cast<uint64_t>(n_heads) * n_splits * static_cast<uint64_t>(hd + 2) * 4;
  return static_cast<int64_t>(
      std::max<uint64_t>(1, kAttnGroupScratch / std::max<uint64_t>(per_row, 1)));
}

uint32_t VulkanBackend::attention_decode(VkKvStorage& s, int64_t layer, Act q, const int32_t* pos,
                                         int64_t n_heads, float scale, Act out,
                                         const std::vector<int32_t>* map, uint32_t extra_splits,
                                         bool keep_splits) {
  const KvCacheConfig& c = s.cfg_;
  const auto l = static_cast<size_t>(layer);
  const int64_t T = q.rows, hd = c.head_dim;
  const Alloc& ka = s.k_[l];
  const Alloc& va = s.v_[l];
  const uint32_t wg = attn_wg_;
  uint32_t n_keys = 0, kps = 0;
  const std::vector<int32_t> no_block{-1};  // a layer with no block in a slot yet
  if (map && map->empty()) map = &no_block;
  if (map) {
    // One split per slot: its (m, l) is the slot's block's share (attention mass).
    kps = u32(c.block_size);
    n_keys = u32(map->size()) * kps;
  } else {
    int32_t max_pos = 0;
    for (int64_t t = 0; t < T; ++t) max_pos = std::max(max_pos, pos[t]);
    // Keys per split: all of them up to kAttnOneSplitKeys (or a workgroup's
    // worth on CPU devices, where barriers are costly), else kAttnSplitKeys, so
    // the splits fill the GPU and each walks few V rows (on the H200, 32-key
    // splits and their merge took longer than one split at 65-192 keys, less at
    // 512-640). Threads per key: as many as the workgroup has for each key of a
    // split (up to one per dimension pair).
    n_keys = static_cast<uint32_t>(max_pos) + 1;
    kps = attn_split_keys_                              ? std::min(attn_split_keys_, wg)
          : n_keys <= kAttnOneSplitKeys || !gpu_device_ ? std::min(n_keys, wg)
                                                        : kAttnSplitKeys;
  }
  kps = std::max<uint32_t>(kps, 1);
  const uint32_t n_dev = std::max<uint32_t>((n_keys + kps - 1) / kps, 1);
  const uint32_t n_splits = n_dev + extra_splits;
  uint32_t tpk = 1;
  while (tpk * 2 * std::min(kps, std::max<uint32_t>(n_keys, 1)) <= wg && tpk * 2 <= u32(hd / 2))
    tpk *= 2;
  const uint64_t part_bytes = n_splits > 1 ? static_cast<uint64_t>(T * n_heads) * n_splits *
                                                 static_cast<uint64_t>(hd + 2) * 4
                                           : 0;
  if (part_bytes) {
    Status st = ensure_scratch(part_bytes);
    if (!st.ok()) {
      fail(st);
      return n_dev;
    }
  }
  // Positions, then the slot map, in one put (a second put may flush the ring).
  std::vector<int32_t> ints(pos, pos + T);
  if (map) ints.insert(ints.end(), map->begin(), map->end());
  auto po = put_ints(ints.data(), static_cast<int64_t>(ints.size()));
  if (!po.ok()) {
    fail(po.status());
    return n_dev;
  }
  struct {
    uint32_t q_off, q_ld, o_off, o_ld, part_off, kc_off, kc_d_off, vc_off, vc_d_off, n_ctx, n_heads,
        n_kv_heads, head_dim, pos_off, n_splits;
    float scale;
    uint32_t kps, tpk, qo_off, qdo_off, map_off, map_keys, map_bs;
  } pc{u32(q.offset / 4),
       u32(q.cols),
       u32(out.offset / 4),
       u32(out.cols),
       u32(scratch_.offset / 4),
       u32(ka.offset / 4),
       u32((ka.offset + s.quant_bytes(l)) / 4),
       u32(va.offset / 4),
       u32((va.offset + s.quant_bytes(l)) / 4),
       u32(s.rows(l)),
       u32(n_heads),
       u32(c.n_kv_heads),
       u32(hd),
       *po,
       n_splits,
       scale,
       kps,
       tpk,
       0,
       0,
       *po + u32(T),
       n_keys,
       map ? kps : 0};
  static_assert(sizeof(pc) <= kPushBytes);
  const uint32_t group = u32(n_heads / c.n_kv_heads);
  const uint32_t n_gchunks = (group + kAttnHeadsPerGroup - 1) / kAttnHeadsPerGroup;
  const uint32_t gy = u32(c.n_kv_heads) * n_gchunks;
  const Bind part = part_bytes ? Bind{scratch_.block, scratch_.offset, part_bytes, true}
                               : Bind{ka.block, 0, 0, false};
  // One token with integer dots on: the output's Q8 copy for o, written by
  // whichever kernel writes the output (attn_split with one split, else attn_merge).
  const bool q8_out = attn_q8_out(out, n_heads, hd);
  if (q8_out && !part_bytes && wg % 8 == 0) {
    Xq8 copy;
    auto qo = xq8_out(out, &copy);
    if (!qo.ok()) {
      fail(qo.status());
      return n_dev;
    }
    pc.qo_off = copy.xq_off;
    pc.qdo_off = copy.xd_off;
    dispatch(typed("attn_split_q8", c.dtype, true, true), Spec{wg},
             {act_bind(q, false), Bind{ka.block, ka.offset, ka.size, false},
              Bind{va.block, va.offset, va.size, false}, act_bind(out, true),
              Bind{ring_.block, 0, 0, false}, part, *qo},
             &pc, sizeof(pc), n_dev, gy, u32(T));
    if (status_.ok()) xq8_ = copy;
    return n_dev;
  }
  dispatch(typed("attn_split", c.dtype, true, true), Spec{wg},
           {act_bind(q, false), Bind{ka.block, ka.offset, ka.size, false},
            Bind{va.block, va.offset, va.size, false},
            part_bytes ? Bind{static_cast<Block*>(out.buffer), out.offset, 0, false}
                       : act_bind(out, true),
            Bind{ring_.block, 0, 0, false}, part},
           &pc, sizeof(pc), n_dev, gy, u32(T));
  if (part_bytes && !keep_splits) attn_merge(out, n_heads, hd, n_splits, part_bytes, q8_out);
  return n_dev;
}

bool VulkanBackend::attn_q8_out(const Act& out, int64_t n_heads, int64_t hd) const {
  return int_dot_outputs_ && int_dot_ && dev_->caps().int_dot && out.rows == 1 && hd % 32 == 0 &&
         out.cols == n_heads * hd;
}

void VulkanBackend::attn_merge(Act out, int64_t n_heads, int64_t hd, uint32_t n_splits,
                               uint64_t part_bytes, bool q8_out) {
  struct {
    uint32_t part_off, o_off, o_ld, n_heads, head_dim, n_splits, qo_off, qdo_off;
  } mp{u32(scratch_.offset / 4),
       u32(out.offset / 4),
       u32(out.cols),
       u32(n_heads),
       u32(hd),
       n_splits,
       0,
       0};
  const Bind pb{scratch_.block, scratch_.offset, part_bytes, false};
  if (q8_out && reduce_wg_ % 8 == 0) {
    Xq8 copy;
    auto qo = xq8_out(out, &copy);
    if (!qo.ok()) return fail(qo.status());
    mp.qo_off = copy.xq_off;
    mp.qdo_off = copy.xd_off;
    dispatch(plain("attn_merge_q8", true), Spec{reduce_wg_}, {pb, act_bind(out, true), *qo}, &mp,
             sizeof(mp), u32(n_heads), 1, 1);
    if (status_.ok()) xq8_ = copy;
    return;
  }
  dispatch(plain("attn_merge", true), Spec{reduce_wg_}, {pb, act_bind(out, true)}, &mp, sizeof(mp),
           u32(n_heads), u32(out.rows), 1);
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

// The device's splits stay in the scratch ([row][split][m, l, o]; row = token
// x head); their (m, l) and q come to the host, which attends over the host
// blocks; its partial goes in as the last split, and attn_merge merges all.
Status VulkanBackend::attention_split(KvCache& kv, int64_t layer, Act q, const int32_t* pos,
                                      int64_t n_heads, float scale, Act out,
                                      const HostAttentionFn& host) {
  LOOM_TRY(status_);
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  if (!s || s->owner_ != this || s->layer_slots(layer) == 0)
    return make_error(ErrorCode::kInternal,
                      "Vulkan attention_split: layer %" PRId64 " is not in device slots here",
                      layer);
  if (!check_act(q, "attention") || !check_act(out, "attention")) return status_;
  const KvCacheConfig& c = s->cfg_;
  const int64_t T = q.rows, hd = c.head_dim, bs = c.block_size;
  if (!positions_in_range(pos, T, c.n_ctx, "attention")) return status_;
  int32_t max_pos = 0;
  for (int64_t t = 0; t < T; ++t) max_pos = std::max(max_pos, pos[t]);
  const int64_t n_blocks = max_pos / bs + 1;
  if (!kv.has_host_blocks(layer, n_blocks)) {  // all on the device: no host part
    attention(kv, layer, q, pos, n_heads, scale, out);
    return status_;
  }
  const std::vector<int32_t> map = kv.slot_positions(layer);
  const bool mass = kv.wants_mass(layer);
  std::vector<float> block_mass(mass ? static_cast<size_t>(n_blocks) : 0, 0.0f);
  const int64_t stride = hd + 2;
  const int64_t tn = attn_rows_per_group(n_heads, hd, map.size() + 1);
  std::vector<float> qh, dev_ml, host_ml, hpart;
  for (int64_t t0 = 0; t0 < T; t0 += tn) {
    const int64_t n = std::min(tn, T - t0), rows = n * n_heads;
    const Act qc = q.rows_view(t0, n), oc = out.rows_view(t0, n);
    const uint32_t S = attention_decode(*s, layer, qc, pos + t0, n_heads, scale, oc, &map, 1, true);
    const uint32_t ns = S + 1;
    // q, and where the policy measures attention mass the (m, l) of each
    // device split, come to the host in one submission where the ring holds both.
    const uint64_t ml_bytes = mass ? static_cast<uint64_t>(rows) * S * 8 : 0;
    const uint64_t q_bytes = static_cast<uint64_t>(n * q.cols) * 4;
    std::vector<float> split_ml(static_cast<size_t>(ml_bytes / 4));
    qh.resize(static_cast<size_t>(n * q.cols));
    auto copy_ml = [&](uint64_t ml_off) {
      std::vector<VkBufferCopy> regions;
      regions.reserve(static_cast<size_t>(rows) * S);
      for (int64_t r = 0; r < rows; ++r) {
        for (uint32_t sp = 0; sp < S; ++sp) {
          const uint64_t src =
              scratch_.offset +
              ((static_cast<uint64_t>(r) * ns + sp) * static_cast<uint64_t>(stride)) * 4;
          regions.push_back(VkBufferCopy{src, ml_off + (static_cast<uint64_t>(r) * S + sp) * 8, 8});
        }
      }
      copy_regions(scratch_.block, ring_.block, regions);
    };
    if (round256(ml_bytes) + round256(q_bytes) <= ring_.size) {
      LOOM_TRY(ring_reserve(round256(ml_bytes) + round256(q_bytes)));
      const uint64_t q_off = ring_put(nullptr, q_bytes);
      copy_buffer(static_cast<Block*>(qc.buffer), qc.offset, ring_.block, q_off, q_bytes);
      const uint64_t ml_off = ml_bytes ? ring_put(nullptr, ml_bytes) : 0;
      if (ml_bytes) copy_ml(ml_off);
      LOOM_TRY(flush());
      std::memcpy(qh.data(), ring_.block->mapped + q_off, q_bytes);
      if (ml_bytes) std::memcpy(split_ml.data(), ring_.block->mapped + ml_off, ml_bytes);
    } else {
      if (ml_bytes) {
        LOOM_TRY(ring_reserve(ml_bytes));
        const uint64_t ml_off = ring_put(nullptr, ml_bytes);
        copy_ml(ml_off);
        LOOM_TRY(flush());
        std::memcpy(split_ml.data(), ring_.block->mapped + ml_off, ml_bytes);
      }
      LOOM_TRY(download(qc, qh.data()));
    }
    // The device part's totals per row: M = max m_s, L = sum l_s e^(m_s - M)
    // (for the attention mass only).
    dev_ml.assign(mass ? static_cast<size_t>(rows) * 2 : 0, 0.0f);
    for (int64_t r = 0; mass && r < rows; ++r) {
      const float* sm = split_ml.data() + r * S * 2;
      float M = cpu::kAttnEmptyMax, L = 0.0f;
      for (uint32_t sp = 0; sp < S; ++sp) M = std::max(M, sm[2 * sp]);
      for (uint32_t sp = 0; sp < S; ++sp) L += sm[2 * sp + 1] * std::exp(sm[2 * sp] - M);
      dev_ml[static_cast<size_t>(2 * r)] = M;
      dev_ml[static_cast<size_t>(2 * r + 1)] = L;
    }
    hpart.assign(static_cast<size_t>(rows * stride), 0.0f);
    host(qh.data(), n, pos + t0, mass ? dev_ml.data() : nullptr, hpart.data(),
         mass ? block_mass.data() : nullptr);
    if (mass) {  // each slot's share of the row's total, at its block
      for (int64_t r = 0; r < rows; ++r) {
        const float* h = hpart.data() + r * stride;
        const float Md = dev_ml[static_cast<size_t>(2 * r)],
                    Ld = dev_ml[static_cast<size_t>(2 * r + 1)];
        const float M = std::max(Md, h[0]);
        const float L = Ld * std::exp(Md - M) + h[1] * std::exp(h[0] - M);
        if (!(L > 0.0f)) continue;
        const float* sm = split_ml.data() + r * S * 2;
        for (uint32_t sp = 0; sp < S; ++sp) {
          if (map[sp] < 0) continue;
          const auto b = static_cast<size_t>(map[sp] / bs);
          if (b < block_mass.size()) block_mass[b] += sm[2 * sp + 1] * std::exp(sm[2 * sp] - M) / L;
        }
      }
    }
    // The host's partial as split S.
    const uint64_t hbytes = static_cast<uint64_t>(rows * stride) * 4;
    LOOM_TRY(ring_reserve(hbytes));
    const uint64_t h_off = ring_put(hpart.data(), hbytes);
    std::vector<VkBufferCopy> regions;
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t dst =
          scratch_.offset +
          ((static_cast<uint64_t>(r) * ns + S) * static_cast<uint64_t>(stride)) * 4;
      regions.push_back(VkBufferCopy{h_off + static_cast<uint64_t>(r * stride) * 4, dst,
                                     static_cast<uint64_t>(stride) * 4});
    }
    copy_regions(ring_.block, scratch_.block, regions);
    // (With the Q8 copy for o that the all-device path would write.)
    attn_merge(oc, n_heads, hd, ns,
               static_cast<uint64_t>(rows) * ns * static_cast<uint64_t>(stride) * 4,
               attn_q8_out(oc, n_heads, hd));
    LOOM_TRY(status_);
  }
  if (mass) kv.add_mass(layer, block_mass.data(), n_blocks);
  return status_;
}

namespace {
struct EltPush {
  uint32_t a_off, a_ld, b_off, b_ld, o_off, o_ld, n, v4;
};
}  // namespace

// Element-wise ops: one vec4 per thread where alignment allows.
void VulkanBackend::eltwise(const char* op, Act a, Act b, Act out) {
  EltPush pc{u32(a.offset / 4),   u32(a.cols),   u32(b.offset / 4), u32(b.cols),
             u32(out.offset / 4), u32(out.cols), u32(a.cols),       0};
  pc.v4 = (pc.a_off | pc.a_ld | pc.b_off | pc.b_ld | pc.o_off | pc.o_ld | pc.n) % 4 == 0 ? 1 : 0;
  const uint64_t items = pc.v4 ? pc.n / 4 : pc.n;
  uint32_t gx, gz;
  grid_1d((items + kWgElt - 1) / kWgElt, &gx, &gz);
  dispatch(plain(op), Spec{kWgElt}, {act_bind(a, false), act_bind(b, false), act_bind(out, true)},
           &pc, sizeof(pc), gx, u32(a.rows), gz);
}

void VulkanBackend::silu_mul(Act gate, Act up, Act out) {
  if (!status_.ok() || !check_act(gate, "silu_mul") || !check_act(up, "silu_mul") ||
      !check_act(out, "silu_mul"))
    return;
  eltwise("silu_mul", gate, up, out);
}

void VulkanBackend::add(Act a, Act b, Act out) {
  if (!status_.ok() || !check_act(a, "add") || !check_act(b, "add") || !check_act(out, "add"))
    return;
  eltwise("add", a, b, out);
}

void VulkanBackend::copy(Act src, Act dst) {
  if (!status_.ok() || !check_act(src, "copy") || !check_act(dst, "copy")) return;
  eltwise("copy", src, src, dst);
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
