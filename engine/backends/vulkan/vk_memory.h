// Device memory in large blocks, sub-allocated. Each block is one
// VkDeviceMemory with one VkBuffer over all of it; shaders bind the whole
// buffer and find their data by offsets in push constants, so the number of
// distinct descriptor sets stays small and cacheable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "engine/backends/vulkan/vk_device.h"

namespace loom::vk {

/// One memory block: its memory, a buffer spanning it, and its free ranges.
struct Block {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t size = 0;
  uint8_t* mapped = nullptr;           ///< host pointer (host-visible pools only)
  std::map<uint64_t, uint64_t> free_;  ///< offset -> bytes, coalesced
  uint64_t used = 0;
};

/// A sub-allocation: bytes [offset, offset + size) of block->buffer.
struct Alloc {
  Block* block = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
  explicit operator bool() const { return block != nullptr; }
};

/// Sub-allocator over blocks of one memory type.
class MemoryPool {
 public:
  /// `limit`: most bytes this pool may hold in blocks (0: no limit of its own).
  MemoryPool(const Device& dev, uint32_t memory_type, bool host_visible, uint64_t block_size,
             uint64_t limit);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  /// `size` bytes aligned to kAlign. Requests larger than the block size get
  /// a block of their own. kOutOfMemory (with the sizes in the message) when
  /// the device or the limit says no, or when one binding could not span it.
  Result<Alloc> alloc(uint64_t size, const char* what);
  /// Returns a sub-allocation. Blocks are kept (and reused) until the pool dies.
  void free(const Alloc& a);
  /// Bytes held in blocks now.
  uint64_t reserved_bytes() const { return reserved_; }
  /// The most bytes it may hold (0: no limit of its own).
  uint64_t limit() const { return limit_; }

  static constexpr uint64_t kAlign = 256;
  /// The bytes alloc() takes for a request of `size`.
  static uint64_t aligned(uint64_t size) {
    return size ? (size + kAlign - 1) / kAlign * kAlign : kAlign;
  }

 private:
  Result<Block*> new_block(uint64_t size, const char* what);
  void destroy_block(Block* b);

  const Device& dev_;
  uint32_t type_;
  bool host_;
  uint64_t block_size_;
  uint64_t limit_;
  uint64_t reserved_ = 0;
  std::vector<std::unique_ptr<Block>> blocks_;
};

}  // namespace loom::vk
