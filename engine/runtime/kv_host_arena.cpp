#include "engine/runtime/kv_host_arena.h"

#include <algorithm>

#include "engine/core/huge_pages.h"

namespace loom {

namespace {

constexpr size_t kHugePage = kHugePageBytes;
constexpr size_t kMaxSlab = size_t{64} << 20;

// GCC and Clang both define __SANITIZE_ADDRESS__ under -fsanitize=address.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kArenaOn = false;
#else
constexpr bool kArenaOn = true;
#endif

}  // namespace

KvHostArena::KvHostArena(size_t pair_bytes) : stride_((pair_bytes + 63) / 64 * 64) {}

KvHostArena::~KvHostArena() {
  for (const Slab& s : slabs_) unmap_huge(s.base, s.bytes);
}

bool KvHostArena::grow() {
  if (!kArenaOn || stride_ == 0) return false;
  // Double the last slab, from one huge page up to kMaxSlab, and at least one pair.
  size_t bytes = slabs_.empty() ? kHugePage : std::min(2 * slabs_.back().bytes, kMaxSlab);
  bytes = std::max(bytes, (stride_ + kHugePage - 1) / kHugePage * kHugePage);
  uint8_t* base = map_huge(bytes);
  if (!base) return false;
  slabs_.push_back({base, bytes});
  // Hand out the slab's pairs lowest address first (pop_back takes the last).
  const size_t n = bytes / stride_;
  for (size_t i = n; i-- > 0;) free_.push_back(base + i * stride_);
  return true;
}

uint8_t* KvHostArena::alloc() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty() && !grow()) return nullptr;
  uint8_t* p = free_.back();
  free_.pop_back();
  return p;
}

void KvHostArena::free(uint8_t* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(p);
}

uint64_t KvHostArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const Slab& s : slabs_) total += s.bytes;
  return total;
}

}  // namespace loom
