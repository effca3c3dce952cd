// Host memory for the KV cache's (layer, block) pairs on the CPU side: slabs
// of anonymous memory advised for transparent huge pages (2 MiB), carved into
// pairs and recycled through a free list.
//
// Why: attention at depth walks every block of a layer; blocks from new[]
// lie on 4 KiB pages, one TLB miss or more a block per head (a 4 KiB run of
// one head's rows). On huge pages a layer's 16 MiB of KV needs 8 TLB entries.
// Measured on a 2-core Xeon VM (TinyLlama, 2 threads, decode after 4096
// tokens): attention 11.0-11.3 -> 9.7-10.0 ms a token.
//
// Slabs grow 2, 4, 8 ... 64 MiB (address space; pages are touched only as
// pairs are used, so a small cache costs one huge page at most). They go
// back to the system when the arena dies, after every pair it gave out has
// come back. Under AddressSanitizer the arena gives nothing out (alloc()
// returns null and the caller falls back to new[]), so ASan keeps watching
// every block's bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace loom {

class KvHostArena {
 public:
  /// Pairs of `pair_bytes` bytes each, 64-byte aligned.
  explicit KvHostArena(size_t pair_bytes);
  ~KvHostArena();
  KvHostArena(const KvHostArena&) = delete;
  KvHostArena& operator=(const KvHostArena&) = delete;

  /// One pair's memory (contents undefined), or null when a new slab cannot
  /// be mapped (or under ASan).
  uint8_t* alloc();
  void free(uint8_t* p);
  /// Address space mapped for slabs, in bytes.
  uint64_t mapped_bytes() const;

 private:
  struct Slab {
    uint8_t* base;
    size_t bytes;
  };
  bool grow();  // with mu_ held

  size_t stride_;
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;
  std::vector<uint8_t*> free_;
};

}  // namespace loom
