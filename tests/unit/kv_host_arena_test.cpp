// The KV cache's huge-page arena for host (layer, block) pairs.
#include "engine/runtime/kv_host_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

namespace loom {
namespace {

TEST(KvHostArenaTest, GivesDistinctAlignedPairsAndTakesThemBack) {
  // An odd size: the arena rounds each pair up to 64 bytes.
  const size_t pair = 2 * 2176 + 8;
  KvHostArena arena(pair);
  uint8_t* first = arena.alloc();
  if (!first) GTEST_SKIP() << "the arena gives nothing out under AddressSanitizer";
  std::vector<uint8_t*> got{first};
  // More than the first slab (2 MiB) holds, so that it grows.
  const size_t n = (size_t{5} << 20) / pair;
  for (size_t i = 1; i < n; ++i) got.push_back(arena.alloc());
  std::set<uint8_t*> distinct;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NE(got[i], nullptr) << "pair " << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got[i]) % 64, 0u) << "pair " << i;
    distinct.insert(got[i]);
    std::memset(got[i], static_cast<int>(i & 0xFF), pair);  // every byte is usable
  }
  EXPECT_EQ(distinct.size(), got.size());
  // No pair overlaps the next one given out (each kept its own bytes).
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i][0], static_cast<uint8_t>(i & 0xFF));
    EXPECT_EQ(got[i][pair - 1], static_cast<uint8_t>(i & 0xFF));
  }
  // Slabs double from one huge page: 2 + 4 MiB hold the 5 MiB asked for.
  EXPECT_EQ(arena.mapped_bytes(), uint64_t{6} << 20);

  // A pair given back is the next one given out; nothing new is mapped.
  uint8_t* back = got[got.size() / 2];
  arena.free(back);
  EXPECT_EQ(arena.alloc(), back);
  EXPECT_EQ(arena.mapped_bytes(), uint64_t{6} << 20);
  for (uint8_t* p : got) arena.free(p);
}

TEST(KvHostArenaTest, APairLargerThanAHugePageGetsASlabOfItsOwnSize) {
  const size_t pair = (size_t{3} << 20) + 100;
  KvHostArena arena(pair);
  uint8_t* p = arena.alloc();
  if (!p) GTEST_SKIP() << "the arena gives nothing out under AddressSanitizer";
  std::memset(p, 0x5A, pair);
  EXPECT_EQ(p[pair - 1], 0x5A);
  EXPECT_EQ(arena.mapped_bytes(), uint64_t{4} << 20);
  arena.free(p);
}

}  // namespace
}  // namespace loom
