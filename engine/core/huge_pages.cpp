#include "engine/core/huge_pages.h"

#include <sys/mman.h>

#include <fstream>
#include <new>
#include <string>

namespace loom {

namespace {
// GCC and Clang both define __SANITIZE_ADDRESS__ under -fsanitize=address.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMapForBuffers = false;
#else
constexpr bool kMapForBuffers = true;
#endif

size_t round_up_huge(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}
}  // namespace

uint8_t* map_huge(size_t bytes) {
  bytes = round_up_huge(bytes);
  if (bytes == 0) return nullptr;
  // Map a huge page more than needed and keep the aligned part, so that the
  // kernel can back the whole region with huge pages.
  void* raw = mmap(nullptr, bytes + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  auto* start = static_cast<uint8_t*>(raw);
  const auto addr = reinterpret_cast<uintptr_t>(start);
  const size_t head = (kHugePageBytes - addr % kHugePageBytes) % kHugePageBytes;
  if (head > 0) munmap(start, head);
  munmap(start + head + bytes, kHugePageBytes - head);
  uint8_t* base = start + head;
  (void)madvise(base, bytes, MADV_HUGEPAGE);  // a hint: 4 KiB pages still work
  return base;
}

void unmap_huge(uint8_t* p, size_t bytes) {
  if (p) munmap(p, round_up_huge(bytes));
}

bool huge_pages_enabled() {
  static const bool on = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    if (!f || !std::getline(f, s)) return false;
    return s.find("[never]") == std::string::npos;
  }();
  return on;
}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.mapped_ = false;
  }
  return *this;
}

bool HugeBuffer::would_map(size_t bytes) {
  return kMapForBuffers && bytes >= kHugePageBytes / 2 && huge_pages_enabled();
}

bool HugeBuffer::allocate(size_t bytes) {
  reset();
  if (bytes == 0) return true;
  if (would_map(bytes)) {
    data_ = map_huge(bytes);
    mapped_ = data_ != nullptr;
  }
  if (!data_) data_ = new (std::nothrow) uint8_t[bytes];
  if (!data_) return false;
  size_ = bytes;
  return true;
}

void HugeBuffer::reset() {
  if (mapped_)
    unmap_huge(data_, size_);
  else
    delete[] data_;
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

}  // namespace loom
