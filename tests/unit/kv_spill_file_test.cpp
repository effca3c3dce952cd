// The KV cache's SSD tier (storage/kv_spill_file.h): round trips through
// io_uring, and every way a record can fail to come back (injected I/O errors,
// a full disk, short reads, real bytes flipped or cut off in the file).
#include "storage/kv_spill_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace loom::storage {
namespace {

namespace fs = std::filesystem;

class KvSpillFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom-spill-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<KvSpillFile> open_file(size_t payload, unsigned depth = 8) {
    SpillOptions o;
    o.dir = dir_.string();
    o.session = 0x5e55;
    o.payload_bytes = payload;
    o.queue_depth = depth;
    auto f = KvSpillFile::open(o);
    EXPECT_TRUE(f.ok()) << f.error().message();
    return f.ok() ? std::move(f.value()) : nullptr;
  }

  // Blocks of `payload` bytes with distinct contents.
  static std::vector<std::vector<uint8_t>> blocks(size_t n, size_t payload, uint32_t seed = 1) {
    std::mt19937 rng(seed);
    std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(payload));
    for (auto& b : out)
      for (auto& x : b) x = static_cast<uint8_t>(rng());
    return out;
  }
  static SpillBlockKey key(uint32_t layer, uint32_t block) {
    return {layer, block, int64_t{block} * 32, 32, 1 /* F16 */};
  }
  // Writes blocks as layer 3, blocks 0..n-1.
  static std::vector<uint32_t> write_all(KvSpillFile& f,
                                         const std::vector<std::vector<uint8_t>>& data) {
    std::vector<SpillWrite> w;
    for (size_t i = 0; i < data.size(); ++i)
      w.push_back({key(3, static_cast<uint32_t>(i)), data[i].data()});
    std::vector<uint32_t> slots;
    Status s = f.write(w, &slots);
    EXPECT_TRUE(s.ok()) << s.message();
    return slots;
  }
  static std::vector<Status> read_one(KvSpillFile& f, uint32_t slot, SpillBlockKey k,
                                      std::vector<uint8_t>* out) {
    out->assign(f.payload_bytes(), 0);
    SpillRead r{slot, k, out->data()};
    std::vector<Status> res;
    f.read(std::span<const SpillRead>(&r, 1), &res);
    return res;
  }
  // Changes real bytes of the file on disk.
  void poke(const KvSpillFile& f, uint64_t offset, uint8_t xor_mask) {
    const int fd = ::open(f.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
    b ^= xor_mask;
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
    ::close(fd);
  }

  fs::path dir_;
};

TEST_F(KvSpillFileTest, RoundTripInBatchesLargerThanTheQueue) {
  const size_t payload = 5000;  // not a multiple of 4 KiB: the record pads it
  auto f = open_file(payload, 8);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->record_bytes() % 4096, 0u);
  EXPECT_GE(f->record_bytes(), payload + 64);
  if (!f->direct_io()) std::printf("note: %s\n", f->direct_io_note().c_str());
  const auto data = blocks(21, payload);
  const auto slots = write_all(*f, data);
  ASSERT_EQ(slots.size(), data.size());
  EXPECT_EQ(f->slots_used(), data.size());
  EXPECT_EQ(f->file_bytes(), data.size() * f->record_bytes());
  EXPECT_EQ(f->stats().submissions, 3u);  // 8 + 8 + 5 records

  std::vector<std::vector<uint8_t>> back(data.size(), std::vector<uint8_t>(payload));
  std::vector<SpillRead> reads;
  for (size_t i = 0; i < data.size(); ++i)
    reads.push_back({slots[i], key(3, static_cast<uint32_t>(i)), back[i].data()});
  std::vector<Status> res;
  f->read(reads, &res);
  ASSERT_EQ(res.size(), data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    EXPECT_TRUE(res[i].ok()) << res[i].message();
    EXPECT_EQ(back[i], data[i]) << "block " << i;
  }
  EXPECT_EQ(f->stats().records_read, data.size());
  EXPECT_EQ(f->stats().read_failures, 0u);
}

TEST_F(KvSpillFileTest, ReleasedSlotsAreReusedAndTheFileIsDeletedAtTheEnd) {
  auto f = open_file(100);
  ASSERT_TRUE(f);
  const std::string path = f->path();
  EXPECT_TRUE(fs::exists(path));
  const auto slots = write_all(*f, blocks(4, 100));
  f->release(slots[1]);
  EXPECT_EQ(f->slots_used(), 3u);
  const auto more = write_all(*f, blocks(1, 100, 9));
  EXPECT_EQ(more[0], slots[1]);
  EXPECT_EQ(f->file_bytes(), 4 * f->record_bytes());
  f.reset();
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(KvSpillFileTest, ReadAheadCompletesAcrossInterleavedWrites) {
  auto f = open_file(3000, 4);
  ASSERT_TRUE(f);
  const auto data = blocks(4, 3000);
  const auto slots = write_all(*f, data);
  std::vector<std::vector<uint8_t>> back(4, std::vector<uint8_t>(3000));
  std::vector<SpillRead> reads;
  for (size_t i = 0; i < 4; ++i)
    reads.push_back({slots[i], key(3, static_cast<uint32_t>(i)), back[i].data()});
  ASSERT_TRUE(f->begin_reads(reads).ok());
  EXPECT_TRUE(f->reads_in_flight());
  EXPECT_FALSE(f->begin_reads(reads).ok());  // one batch at a time
  write_all(*f, blocks(6, 3000, 5));         // the step's own spills meanwhile
  std::vector<Status> res;
  f->finish_reads(&res);
  ASSERT_EQ(res.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(res[i].ok()) << res[i].message();
    EXPECT_EQ(back[i], data[i]);
  }
  EXPECT_FALSE(f->reads_in_flight());
}

// Write-behind: a batch of writes in flight beside a read batch; either
// completion may be reaped while waiting for the other.
TEST_F(KvSpillFileTest, WriteBehindCompletesBesideAReadBatch) {
  auto f = open_file(3000, 4);
  ASSERT_TRUE(f);
  const auto data = blocks(4, 3000);
  const auto slots = write_all(*f, data);
  const auto more = blocks(4, 3000, 9);
  std::vector<SpillWrite> w;
  for (size_t i = 0; i < more.size(); ++i)
    w.push_back({key(5, static_cast<uint32_t>(i)), more[i].data()});
  std::vector<uint32_t> wslots;
  ASSERT_TRUE(f->begin_writes(w, &wslots).ok());
  ASSERT_EQ(wslots.size(), 4u);
  EXPECT_TRUE(f->writes_in_flight());
  EXPECT_FALSE(f->begin_writes(w, &wslots).ok());  // one batch at a time
  std::vector<SpillWrite> too_many(5, w[0]);
  std::vector<uint32_t> none;
  EXPECT_FALSE(f->begin_writes(too_many, &none).ok());
  std::vector<std::vector<uint8_t>> back(4, std::vector<uint8_t>(3000));
  std::vector<SpillRead> reads;
  for (size_t i = 0; i < 4; ++i)
    reads.push_back({slots[i], key(3, static_cast<uint32_t>(i)), back[i].data()});
  ASSERT_TRUE(f->begin_reads(reads).ok());
  std::vector<Status> res;
  f->finish_reads(&res);  // may reap the writes' completions too
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(res[i].ok()) << res[i].message();
    EXPECT_EQ(back[i], data[i]);
  }
  const Status s = f->finish_writes();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(f->writes_in_flight());
  EXPECT_EQ(f->slots_used(), 8u);
  for (size_t i = 0; i < 4; ++i) {
    std::vector<uint8_t> out;
    const auto r = read_one(*f, wslots[i], key(5, static_cast<uint32_t>(i)), &out);
    EXPECT_TRUE(r[0].ok()) << r[0].message();
    EXPECT_EQ(out, more[i]);
  }
  // The payloads were staged: changing them after begin_writes changes nothing.
  auto copy = blocks(1, 3000, 11);
  const auto want = copy[0];
  std::vector<SpillWrite> one{{key(6, 0), copy[0].data()}};
  ASSERT_TRUE(f->begin_writes(one, &wslots).ok());
  std::fill(copy[0].begin(), copy[0].end(), uint8_t{0});
  ASSERT_TRUE(f->finish_writes().ok());
  std::vector<uint8_t> out;
  EXPECT_TRUE(read_one(*f, wslots[0], key(6, 0), &out)[0].ok());
  EXPECT_EQ(out, want);
}

TEST_F(KvSpillFileTest, AFailedWriteBehindBatchTakesNoSlot) {
  auto f = open_file(200, 4);
  ASSERT_TRUE(f);
  const auto data = blocks(3, 200);
  std::vector<SpillWrite> w;
  for (size_t i = 0; i < data.size(); ++i)
    w.push_back({key(0, static_cast<uint32_t>(i)), data[i].data()});
  std::vector<uint32_t> slots;
  f->set_faults({.no_space_write = 2});
  ASSERT_TRUE(f->begin_writes(w, &slots).ok());  // the failure shows when it completes
  EXPECT_EQ(f->slots_used(), 3u);
  const Status s = f->finish_writes();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNoSpace);
  EXPECT_NE(s.message().find("disk is full"), std::string::npos) << s.message();
  EXPECT_EQ(f->slots_used(), 0u);
  EXPECT_TRUE(f->finish_writes().ok());  // nothing in flight any more
}

// Slots come per layer from extents, lowest first, so each layer's blocks lie
// side by side however the layers' spills interleave; a read of them is one
// request, and a fault in the middle splits it without touching the rest.
TEST_F(KvSpillFileTest, ALayersBlocksLieSideBySideAndTravelInOneRequest) {
  const size_t payload = 3000;
  auto f = open_file(payload, 16);
  ASSERT_TRUE(f);
  constexpr uint32_t kLayers = 3, kBlocks = 10;
  std::vector<std::vector<uint8_t>> data = blocks(kLayers * kBlocks, payload);
  std::vector<SpillWrite> w;  // block by block, the layers interleaved
  for (uint32_t b = 0; b < kBlocks; ++b)
    for (uint32_t l = 0; l < kLayers; ++l) w.push_back({key(l, b), data[b * kLayers + l].data()});
  std::vector<uint32_t> slots;
  ASSERT_TRUE(f->write(w, &slots).ok());
  auto slot_of = [&](uint32_t l, uint32_t b) { return slots[b * kLayers + l]; };
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t b = 1; b < kBlocks; ++b) EXPECT_EQ(slot_of(l, b), slot_of(l, b - 1) + 1);

  // Layer 1's blocks, read back: one request.
  auto read_layer = [&](uint32_t l, std::vector<std::vector<uint8_t>>* back) {
    back->assign(kBlocks, std::vector<uint8_t>(payload, 0));
    std::vector<SpillRead> reads;
    for (uint32_t b = 0; b < kBlocks; ++b)
      reads.push_back({slot_of(l, b), key(l, b), (*back)[b].data()});
    std::vector<Status> res;
    f->read(reads, &res);
    return res;
  };
  std::vector<std::vector<uint8_t>> back;
  uint64_t before = f->stats().read_requests;
  std::vector<Status> res = read_layer(1, &back);
  EXPECT_EQ(f->stats().read_requests - before, 1u);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    EXPECT_TRUE(res[b].ok()) << res[b].message();
    EXPECT_EQ(back[b], data[b * kLayers + 1]) << "block " << b;
  }

  // The 5th record of the next read fails: the run splits around it.
  f->set_faults({.fail_read = static_cast<int>(f->stats().records_read) + 5});
  before = f->stats().read_requests;
  res = read_layer(2, &back);
  EXPECT_EQ(f->stats().read_requests - before, 2u);  // blocks 0-3 and 5-9 (block 4: a nop)
  for (uint32_t b = 0; b < kBlocks; ++b) {
    if (b == 4) {
      EXPECT_FALSE(res[b].ok());
      EXPECT_EQ(back[b], std::vector<uint8_t>(payload, 0));
    } else {
      EXPECT_TRUE(res[b].ok()) << "block " << b << ": " << res[b].message();
      EXPECT_EQ(back[b], data[b * kLayers + 2]) << "block " << b;
    }
  }
  f->set_faults({});

  // A freed slot goes back to its layer: the layer's next block takes it.
  f->release(slot_of(0, 3));
  std::vector<uint32_t> again;
  const auto extra = blocks(1, payload, 7);
  const SpillWrite one{key(0, kBlocks), extra[0].data()};
  ASSERT_TRUE(f->write(std::span<const SpillWrite>(&one, 1), &again).ok());
  EXPECT_EQ(again[0], slot_of(0, 3));

  // A layer's blocks written together are one request.
  before = f->stats().write_requests;
  std::vector<SpillWrite> run;
  for (uint32_t b = 0; b < 6; ++b) run.push_back({key(kLayers, b), data[b].data()});
  ASSERT_TRUE(f->write(run, &again).ok());
  EXPECT_EQ(f->stats().write_requests - before, 1u);
}

TEST_F(KvSpillFileTest, InjectedWriteFailuresTakeNoSlot) {
  auto f = open_file(200, 4);
  ASSERT_TRUE(f);
  const auto data = blocks(6, 200);
  std::vector<SpillWrite> w;
  for (size_t i = 0; i < data.size(); ++i)
    w.push_back({key(0, static_cast<uint32_t>(i)), data[i].data()});
  std::vector<uint32_t> slots;

  f->set_faults({.fail_write = 5});
  Status s = f->write(w, &slots);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIo);
  EXPECT_NE(s.message().find("writing slot"), std::string::npos) << s.message();
  EXPECT_TRUE(slots.empty());
  EXPECT_EQ(f->slots_used(), 0u);

  f->set_faults({.no_space_write = 8});  // counts on from the 6 writes above
  s = f->write(w, &slots);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNoSpace);
  EXPECT_NE(s.message().find("disk is full"), std::string::npos) << s.message();
  EXPECT_EQ(f->slots_used(), 0u);
}

TEST_F(KvSpillFileTest, EveryBadReadIsReportedAndLeavesTheOutputAlone) {
  auto f = open_file(1000, 4);
  ASSERT_TRUE(f);
  const auto data = blocks(3, 1000);
  const auto slots = write_all(*f, data);
  std::vector<uint8_t> out;

  f->set_faults({.fail_read = 1});
  auto r = read_one(*f, slots[0], key(3, 0), &out);
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("reading slot"), std::string::npos) << r[0].message();
  EXPECT_EQ(out, std::vector<uint8_t>(1000, 0));

  f->set_faults({.short_read = 2});
  r = read_one(*f, slots[0], key(3, 0), &out);
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("short read"), std::string::npos) << r[0].message();
  f->set_faults({});

  // The block asked for is not the one in the slot.
  r = read_one(*f, slots[1], key(3, 7), &out);
  ASSERT_FALSE(r[0].ok());
  EXPECT_EQ(r[0].error().code(), ErrorCode::kFormat);
  EXPECT_NE(r[0].message().find("holds layer 3 block 1, expected layer 3 block 7"),
            std::string::npos)
      << r[0].message();

  // A flipped bit in the payload on disk.
  poke(*f, slots[1] * f->record_bytes() + 64 + 123, 0x10);
  r = read_one(*f, slots[1], key(3, 1), &out);
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("checksum mismatch in slot"), std::string::npos) << r[0].message();
  EXPECT_EQ(out, std::vector<uint8_t>(1000, 0));

  // A flipped byte in the header's magic.
  poke(*f, slots[2] * f->record_bytes() + 1, 0xff);
  r = read_one(*f, slots[2], key(3, 2), &out);
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("bad header"), std::string::npos) << r[0].message();

  // The untouched block still reads.
  r = read_one(*f, slots[0], key(3, 0), &out);
  EXPECT_TRUE(r[0].ok()) << r[0].message();
  EXPECT_EQ(out, data[0]);
  EXPECT_EQ(f->stats().read_failures, 5u);
}

TEST_F(KvSpillFileTest, ATruncatedFileGivesShortReads) {
  auto f = open_file(1000, 4);
  ASSERT_TRUE(f);
  const auto slots = write_all(*f, blocks(3, 1000));
  fs::resize_file(f->path(), f->record_bytes() + 100);  // cuts slot 1, drops slot 2
  std::vector<uint8_t> out;
  auto r = read_one(*f, slots[1], key(3, 1), &out);
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("short read of slot 1"), std::string::npos) << r[0].message();
  r = read_one(*f, slots[2], key(3, 2), &out);
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].message().find("truncated"), std::string::npos) << r[0].message();
}

TEST_F(KvSpillFileTest, StaleFilesOfDeadSessionsAreRemovedLiveOnesKept) {
  auto live = open_file(100);
  ASSERT_TRUE(live);
  const fs::path stale = dir_ / "loom-kv-00000000deadbeef.spill";
  {
    std::FILE* fp = std::fopen(stale.c_str(), "w");
    ASSERT_TRUE(fp);
    std::fclose(fp);
  }
  const fs::path other = dir_ / "notes.txt";
  {
    std::FILE* fp = std::fopen(other.c_str(), "w");
    ASSERT_TRUE(fp);
    std::fclose(fp);
  }
  EXPECT_EQ(remove_stale_spill_files(dir_.string()), 1);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live->path()));
  EXPECT_TRUE(fs::exists(other));
}

TEST_F(KvSpillFileTest, BadOptionsAndUnwritableFoldersAreErrors) {
  SpillOptions o;
  o.dir = dir_.string();
  o.payload_bytes = 0;
  auto f = KvSpillFile::open(o);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), ErrorCode::kInvalidArgument);

  fs::create_directories(dir_);
  const fs::path file = dir_ / "a-file";
  {
    std::FILE* fp = std::fopen(file.c_str(), "w");
    ASSERT_TRUE(fp);
    std::fclose(fp);
  }
  o.payload_bytes = 64;
  o.dir = (file / "sub").string();  // a folder under a plain file
  f = KvSpillFile::open(o);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), ErrorCode::kIo);
  EXPECT_NE(f.error().message().find("cannot be created"), std::string::npos);

  // Two sessions with one id cannot share a file.
  o.dir = dir_.string();
  o.session = 42;
  auto a = KvSpillFile::open(o);
  ASSERT_TRUE(a.ok());
  auto b = KvSpillFile::open(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message().find("cannot be created"), std::string::npos);
}

}  // namespace
}  // namespace loom::storage
