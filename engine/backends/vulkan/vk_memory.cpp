#include "engine/backends/vulkan/vk_memory.h"

#include <algorithm>

namespace loom::vk {

namespace {
double mib(uint64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024.0);
}
}  // namespace

MemoryPool::MemoryPool(const Device& dev, uint32_t memory_type, bool host_visible,
                       uint64_t block_size, uint64_t limit)
    : dev_(dev), type_(memory_type), host_(host_visible), block_size_(block_size), limit_(limit) {}

MemoryPool::~MemoryPool() {
  for (auto& b : blocks_) destroy_block(b.get());
}

void MemoryPool::destroy_block(Block* b) {
  const Fns& fn = dev_.fn();
  if (b->mapped) fn.vkUnmapMemory(dev_.device(), b->memory);
  if (b->buffer) fn.vkDestroyBuffer(dev_.device(), b->buffer, nullptr);
  if (b->memory) fn.vkFreeMemory(dev_.device(), b->memory, nullptr);
  reserved_ -= b->size;
  b->mapped = nullptr;
  b->buffer = VK_NULL_HANDLE;
  b->memory = VK_NULL_HANDLE;
}

Result<Block*> MemoryPool::new_block(uint64_t size, const char* what) {
  const DeviceCaps& c = dev_.caps();
  if (size > c.max_storage_range || size > c.max_allocation) {
    return make_error(
        ErrorCode::kOutOfMemory,
        "Vulkan: %s needs %.1f MiB in one buffer, more than this device binds at once (%.1f MiB)",
        what, mib(size), mib(std::min(c.max_storage_range, c.max_allocation)));
  }
  if (limit_ && reserved_ + size > limit_) {
    return make_error(
        ErrorCode::kOutOfMemory,
        "Vulkan: out of device memory for %s (%.1f MiB more; %.1f of %.1f MiB in use)", what,
        mib(size), mib(reserved_), mib(limit_));
  }
  const Fns& fn = dev_.fn();
  auto b = std::make_unique<Block>();
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
             VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkResult r = fn.vkCreateBuffer(dev_.device(), &bi, nullptr, &b->buffer);
  if (r != VK_SUCCESS) return vk_error(r, "vkCreateBuffer");
  VkMemoryRequirements req;
  fn.vkGetBufferMemoryRequirements(dev_.device(), b->buffer, &req);
  if (!(req.memoryTypeBits & (1u << type_))) {
    fn.vkDestroyBuffer(dev_.device(), b->buffer, nullptr);
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: storage buffers cannot live in memory type %u", type_);
  }
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type_;
  r = fn.vkAllocateMemory(dev_.device(), &ai, nullptr, &b->memory);
  if (r != VK_SUCCESS) {
    fn.vkDestroyBuffer(dev_.device(), b->buffer, nullptr);
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
      return make_error(
          ErrorCode::kOutOfMemory,
          "Vulkan: out of device memory for %s (a block of %.1f MiB; %.1f MiB in use)", what,
          mib(req.size), mib(reserved_));
    }
    return vk_error(r, "vkAllocateMemory");
  }
  r = fn.vkBindBufferMemory(dev_.device(), b->buffer, b->memory, 0);
  if (r != VK_SUCCESS) {
    fn.vkDestroyBuffer(dev_.device(), b->buffer, nullptr);
    fn.vkFreeMemory(dev_.device(), b->memory, nullptr);
    return vk_error(r, "vkBindBufferMemory");
  }
  if (host_) {
    void* p = nullptr;
    r = fn.vkMapMemory(dev_.device(), b->memory, 0, VK_WHOLE_SIZE, 0, &p);
    if (r != VK_SUCCESS) {
      fn.vkDestroyBuffer(dev_.device(), b->buffer, nullptr);
      fn.vkFreeMemory(dev_.device(), b->memory, nullptr);
      return vk_error(r, "vkMapMemory");
    }
    b->mapped = static_cast<uint8_t*>(p);
  }
  b->size = size;
  b->free_[0] = size;
  reserved_ += size;
  blocks_.push_back(std::move(b));
  return blocks_.back().get();
}

Result<Alloc> MemoryPool::alloc(uint64_t size, const char* what) {
  size = aligned(size);
  auto take = [&](Block* b) -> Alloc {
    for (auto it = b->free_.begin(); it != b->free_.end(); ++it) {
      if (it->second < size) continue;
      Alloc a{b, it->first, size};
      const uint64_t rest = it->second - size, at = it->first + size;
      b->free_.erase(it);
      if (rest) b->free_[at] = rest;
      b->used += size;
      return a;
    }
    return Alloc{};
  };
  for (auto& b : blocks_) {
    if (!b->memory) continue;
    if (Alloc a = take(b.get())) return a;
  }
  // A new block: the usual size, but no more than the limit leaves (so a small
  // request still fits under a small limit), and never less than the request.
  uint64_t want = block_size_;
  if (limit_)
    want = std::min(want, limit_ > reserved_ ? (limit_ - reserved_) / kAlign * kAlign : 0);
  LOOM_ASSIGN_OR_RETURN(Block * b, new_block(std::max(size, want), what));
  return take(b);
}

void MemoryPool::free(const Alloc& a) {
  if (!a.block) return;
  Block* b = a.block;
  auto next = b->free_.lower_bound(a.offset);
  uint64_t off = a.offset, len = a.size;
  if (next != b->free_.begin()) {  // merge with the range before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      b->free_.erase(prev);
    }
  }
  if (next != b->free_.end() && off + len == next->first) {  // and the one after
    len += next->second;
    b->free_.erase(next);
  }
  b->free_[off] = len;
  b->used -= a.size;
  // Empty blocks stay: cached descriptor sets and recorded commands may still
  // name their buffer. They are reused by later allocations.
}

}  // namespace loom::vk
