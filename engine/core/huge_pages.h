// Anonymous memory advised for transparent huge pages (2 MiB).
//
// Why: the CPU streams every weight of a layer each decode step and walks
// every KV block at depth. On 4 KiB pages that is one TLB miss per page; in a
// virtual machine each miss walks two page tables. After a long prefill (or
// any pause) those walks miss the caches too: on the AMD development VM the
// first decode step after a 512-token prompt took 27-50 ms against a steady
// 16-17 with the weights on 4 KiB pages, and 18-19 on huge pages
// (docs/PERFORMANCE.md). Whether the kernel backs the region with huge pages
// is its choice: MADV_HUGEPAGE is a hint, and 4 KiB pages still work.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

/// `bytes` (rounded up to whole huge pages) of zero-filled anonymous memory
/// at a 2 MiB-aligned address, advised for huge pages; null when the mapping
/// fails. Release with unmap_huge(p, bytes).
uint8_t* map_huge(size_t bytes);
void unmap_huge(uint8_t* p, size_t bytes);

/// False where transparent huge pages are off ("[never]" in
/// /sys/kernel/mm/transparent_hugepage/enabled) or unknown.
bool huge_pages_enabled();

/// An owned byte buffer: on huge pages where it can be (map_huge), else from
/// new[]. Under AddressSanitizer always new[], so ASan keeps watching its
/// bounds.
class HugeBuffer {
 public:
  HugeBuffer() = default;
  ~HugeBuffer() { reset(); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  HugeBuffer(HugeBuffer&& o) noexcept { *this = static_cast<HugeBuffer&&>(o); }
  HugeBuffer& operator=(HugeBuffer&& o) noexcept;

  /// Replaces the contents with `bytes` uninitialised bytes; false when out
  /// of memory (the buffer is then empty).
  bool allocate(size_t bytes);
  /// Whether allocate(bytes) would ask for huge pages (large enough, THP on,
  /// not under AddressSanitizer).
  static bool would_map(size_t bytes);
  void reset();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  /// The memory came from map_huge (not new[]).
  bool huge() const { return mapped_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace loom
