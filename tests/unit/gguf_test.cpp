// GGUF reader and writer: round trips of every value type, and corrupt files.
// Every corruption is made by changing real bytes of a file the writer produced.
#include "engine/model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <new>
#include <random>

#include "engine/model/gguf_writer.h"
#include "tests/alloc_probe.h"
#include "tests/test_util.h"

namespace loom {
namespace {

GgufValue scalar(GgufType t, int64_t i = 0, double f = 0.0) {
  GgufValue v;
  v.type = t;
  v.i = i;
  v.f = f;
  return v;
}

// A file with one key of every scalar type, arrays of several kinds, and
// three tensors of different dtypes whose bytes follow a known pattern.
std::vector<uint8_t> make_reference_file(const std::string& dir, uint32_t alignment = 32) {
  GgufWriter w(alignment);
  w.set_string("general.architecture", "llama");
  w.set_value("t.u8", scalar(GgufType::kU8, 200));
  w.set_value("t.i8", scalar(GgufType::kI8, -100));
  w.set_value("t.u16", scalar(GgufType::kU16, 60000));
  w.set_value("t.i16", scalar(GgufType::kI16, -30000));
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_u64("t.u64", 18000000000000000000ull);
  w.set_value("t.i64", scalar(GgufType::kI64, -9000000000000000000ll));
  w.set_f32("t.f32", 1.5f);
  w.set_value("t.f64", scalar(GgufType::kF64, 0, 2.25));
  w.set_bool("t.bool", true);
  w.set_string("t.str", "héllo ▁ wörld");
  w.set_string("t.empty", "");
  w.set_string_array("t.astr", {"a", "", "ccc", "<0x0A>"});
  w.set_i32_array("t.ai32", {1, -2, 3});
  w.set_f32_array("t.af32", {0.5f, -1.0f});
  GgufValue au8;
  au8.type = GgufType::kArray;
  au8.elem_type = GgufType::kU8;
  au8.ints = {1, 2, 255};
  w.set_value("t.au8", au8);
  EXPECT_TRUE(w.add_tensor("a", {64, 3}, DType::kF32).ok());
  EXPECT_TRUE(w.add_tensor("b", {64}, DType::kQ8_0).ok());
  EXPECT_TRUE(w.add_tensor("c", {256, 2}, DType::kQ4_K).ok());
  std::string path = dir + "/ref.gguf";
  EXPECT_TRUE(w.open(path).ok());
  for (size_t t = 0; t < w.tensor_count(); ++t) {
    std::vector<uint8_t> bytes(w.tensor_bytes(t));
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<uint8_t>(k * 7 + t);
    // Written in two pieces to exercise streaming.
    size_t half = bytes.size() / 2;
    EXPECT_TRUE(w.write_data(bytes.data(), half).ok());
    EXPECT_TRUE(w.write_data(bytes.data() + half, bytes.size() - half).ok());
  }
  EXPECT_TRUE(w.close().ok());
  return test::read_file(path);
}

Result<std::unique_ptr<GgufFile>> parse(const std::vector<uint8_t>& b) {
  return GgufFile::from_memory(b.data(), b.size(), "mem.gguf");
}

// Byte offset just past the name of tensor `name` in the tensor-info table
// (the last match: the info table follows the metadata).
size_t tensor_info_at(const std::vector<uint8_t>& b, const std::string& name) {
  std::string needle(8, '\0');
  needle[0] = static_cast<char>(name.size());
  needle += name;
  auto it = std::find_end(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << name;
  return static_cast<size_t>(it - b.begin()) + needle.size();
}

// Byte offset of the first occurrence of `needle` in the file.
size_t find_bytes(const std::vector<uint8_t>& b, const std::string& needle) {
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << needle;
  return static_cast<size_t>(it - b.begin());
}

template <typename T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

void expect_error(const std::vector<uint8_t>& b, const std::string& fragment) {
  auto r = parse(b);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << fragment;
  EXPECT_NE(r.message().find(fragment), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("mem.gguf"), std::string::npos) << r.message();
}

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override { file_ = make_reference_file(test::temp_dir("gguf_test")); }
  std::vector<uint8_t> file_;
};

TEST_F(GgufTest, RoundTripsEveryValueType) {
  auto r = parse(file_);
  ASSERT_TRUE(r.ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(*f.get_int("t.u8").value(), 200);
  EXPECT_EQ(*f.get_int("t.i8").value(), -100);
  EXPECT_EQ(*f.get_int("t.u16").value(), 60000);
  EXPECT_EQ(*f.get_int("t.i16").value(), -30000);
  EXPECT_EQ(*f.get_int("t.u32").value(), 4000000000ll);
  EXPECT_EQ(*f.get_int("t.i32").value(), -2000000000);
  EXPECT_FALSE(f.get_int("t.u64").ok());  // above INT64_MAX: a clear error, not a wrap
  EXPECT_EQ(static_cast<uint64_t>(f.find("t.u64")->i), 18000000000000000000ull);
  EXPECT_EQ(*f.get_int("t.i64").value(), -9000000000000000000ll);
  EXPECT_EQ(*f.get_float("t.f32").value(), 1.5);
  EXPECT_EQ(*f.get_float("t.f64").value(), 2.25);
  EXPECT_EQ(*f.get_bool("t.bool").value(), true);
  EXPECT_EQ(*f.get_string("t.str").value(), "héllo ▁ wörld");
  EXPECT_EQ(*f.get_string("t.empty").value(), "");
  EXPECT_EQ(*f.get_string_array("t.astr").value(),
            (std::vector<std::string>{"a", "", "ccc", "<0x0A>"}));
  EXPECT_EQ(*f.get_int_array("t.ai32").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f.get_float_array("t.af32").value(), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(*f.get_int_array("t.au8").value(), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_FALSE(f.get_string("missing").value().has_value());
  EXPECT_EQ(f.get_string_array("missing").value(), nullptr);
}

TEST_F(GgufTest, WrongTypeIsAnErrorNamingTheKey) {
  auto r = parse(file_);
  ASSERT_TRUE(r.ok());
  auto s = (*r)->get_string("t.u32");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("t.u32"), std::string::npos);
  EXPECT_FALSE((*r)->get_int("t.str").ok());
  EXPECT_FALSE((*r)->get_string_array("t.ai32").ok());
  EXPECT_FALSE((*r)->get_float_array("t.astr").ok());
}

TEST_F(GgufTest, TensorsPointIntoTheDataAtAlignedOffsets) {
  auto r = parse(file_);
  ASSERT_TRUE(r.ok());
  const GgufFile& f = **r;
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  const GgufTensor* c = f.find_tensor("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::kQ4_K);
  EXPECT_EQ(c->n_bytes, 2u * 144u);
  EXPECT_EQ(c->shape_string(), "[256, 2]");
  EXPECT_EQ(c->offset % 32, 0u);
  for (size_t t = 0; t < 3; ++t) {
    const GgufTensor& ten = f.tensors()[t];
    for (size_t k = 0; k < ten.n_bytes; ++k) {
      ASSERT_EQ(ten.data[k], static_cast<uint8_t>(k * 7 + t)) << ten.name << " byte " << k;
    }
  }
}

TEST(Gguf, CustomAlignmentAndOpenFromDisk) {
  std::string dir = test::temp_dir("gguf_align");
  auto bytes = make_reference_file(dir, 128);
  auto r = GgufFile::open(dir + "/ref.gguf");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ((*r)->alignment(), 128u);
  EXPECT_EQ((*r)->data_offset() % 128, 0u);
  for (const auto& t : (*r)->tensors()) EXPECT_EQ(t.offset % 128, 0u);
  EXPECT_EQ((*r)->file_size(), bytes.size());
}

// copy_out reads the file itself (not the mapping), and release_pages only
// unmaps: the tensor's bytes read the same afterwards.
TEST(Gguf, CopyOutAndReleasedPagesReadTheFilesBytes) {
  std::string dir = test::temp_dir("gguf_copy_out");
  auto bytes = make_reference_file(dir, 4096);
  auto r = GgufFile::open(dir + "/ref.gguf");
  ASSERT_TRUE(r.ok()) << r.message();
  const GgufFile& f = **r;
  for (const GgufTensor& t : f.tensors()) {
    std::vector<uint8_t> out(t.n_bytes + 3, 0xAA);
    ASSERT_TRUE(f.copy_out(t.data + 1, t.n_bytes - 1, out.data())) << t.name;
    EXPECT_EQ(0, std::memcmp(out.data(), t.data + 1, t.n_bytes - 1)) << t.name;
    EXPECT_EQ(out[t.n_bytes - 1], 0xAA) << t.name << ": wrote past the end";
    f.release_pages(t.data, t.n_bytes);
    for (size_t k = 0; k < t.n_bytes; ++k) {
      ASSERT_EQ(t.data[k], bytes[f.data_offset() + t.offset + k]) << t.name << " byte " << k;
    }
  }
  // Outside the mapping: memcpy, and release_pages leaves the memory alone.
  std::vector<uint8_t> heap(5000, 7), out(5000, 0);
  ASSERT_TRUE(f.copy_out(heap.data(), heap.size(), out.data()));
  EXPECT_EQ(out, heap);
  f.release_pages(heap.data(), heap.size());
  EXPECT_EQ(heap, std::vector<uint8_t>(5000, 7));
}

TEST(Gguf, OpenErrorsNameThePath) {
  auto r = GgufFile::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kIo);
  EXPECT_NE(r.message().find("/nonexistent/dir/model.gguf"), std::string::npos);
  std::string dir = test::temp_dir("gguf_empty");
  test::write_file(dir + "/empty.gguf", {});
  auto e = GgufFile::open(dir + "/empty.gguf");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("empty"), std::string::npos);
  auto d = GgufFile::open(dir);
  ASSERT_FALSE(d.ok());
}

TEST_F(GgufTest, Version2IsRead) {
  poke<uint32_t>(file_, 4, 2);
  auto r = parse(file_);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ((*r)->version(), 2u);
}

TEST_F(GgufTest, BadMagic) {
  file_[0] = 'X';
  expect_error(file_, "bad magic");
}

TEST_F(GgufTest, UnknownVersion) {
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    poke<uint32_t>(file_, 4, v);
    expect_error(file_, "version");
  }
}

TEST_F(GgufTest, TruncationAnywhereIsAnErrorNeverACrash) {
  // Every prefix shorter than the whole file fails: inside the header, the
  // metadata, the tensor infos, the padding and the tensor data.
  for (size_t n = 0; n < file_.size(); ++n) {
    std::vector<uint8_t> cut(file_.begin(), file_.begin() + static_cast<long>(n));
    auto r = parse(cut);
    ASSERT_FALSE(r.ok()) << "a prefix of " << n << " bytes parsed";
    ASSERT_NE(r.message().find("truncated"), std::string::npos) << n << ": " << r.message();
  }
}

TEST_F(GgufTest, TensorDataPastTheEnd) {
  auto r = parse(file_);
  ASSERT_TRUE(r.ok());
  file_.resize(file_.size() - 1);
  expect_error(file_, "tensor 'c'");
  expect_error(file_, "truncated download?");
}

TEST_F(GgufTest, OverflowingCounts) {
  auto a = file_;
  poke<uint64_t>(a, 8, 1ull << 62);  // tensor count
  expect_error(a, "tensor count");
  auto b = file_;
  poke<uint64_t>(b, 16, ~0ull);  // metadata count
  expect_error(b, "metadata count");
}

TEST_F(GgufTest, HugeStringLength) {
  // The length field of the value of "t.str" sits right after its type.
  size_t key = find_bytes(file_, "t.str");
  poke<uint64_t>(file_, key + 5 + 4, 1ull << 60);
  expect_error(file_, "claims");
}

TEST_F(GgufTest, HugeArrayLength) {
  size_t key = find_bytes(file_, "t.astr");
  // key | u32 type (array) | u32 elem type | u64 count
  poke<uint64_t>(file_, key + 6 + 4 + 4, 1ull << 40);
  expect_error(file_, "t.astr");
}

TEST_F(GgufTest, DuplicateTensorNames) {
  // Rename tensor "b" to "a": same length, so the rest of the file is unchanged.
  size_t at = tensor_info_at(file_, "b");
  file_[at - 1] = 'a';
  expect_error(file_, "duplicate tensor name 'a'");
}

TEST_F(GgufTest, DuplicateKeys) {
  size_t at = find_bytes(file_, "t.i16");
  file_[at + 2] = 'u';  // "t.u16" twice
  expect_error(file_, "duplicate metadata key 't.u16'");
}

TEST_F(GgufTest, UnknownDtype) {
  // Tensor "a": name | n_dims=2 | 64 | 3 | dtype | offset
  size_t at = tensor_info_at(file_, "a");
  poke<uint32_t>(file_, at + 4 + 16, 99);
  expect_error(file_, "unknown dtype id 99");
}

TEST_F(GgufTest, BadDimensions) {
  size_t at = tensor_info_at(file_, "a");
  auto a = file_;
  poke<uint32_t>(a, at, 5);
  expect_error(a, "5 dimensions");
  auto b = file_;
  poke<uint32_t>(b, at, 0);
  expect_error(b, "0 dimensions");
  auto c = file_;
  poke<uint64_t>(c, at + 4, 1ull << 40);
  poke<uint64_t>(c, at + 12, 1ull << 40);
  expect_error(c, "overflow");
}

TEST_F(GgufTest, ElementCountNotABlockMultiple) {
  size_t at = tensor_info_at(file_, "b");
  poke<uint64_t>(file_, at + 4, 48);  // Q8_0 needs multiples of 32
  expect_error(file_, "block size 32");
}

TEST_F(GgufTest, MisalignedTensorOffset) {
  size_t at = tensor_info_at(file_, "b");
  // n_dims=1 | ne | dtype | offset
  poke<uint64_t>(file_, at + 4 + 8 + 4, 800 + 4);
  expect_error(file_, "not a multiple of the alignment");
}

TEST_F(GgufTest, UnknownValueType) {
  size_t key = find_bytes(file_, "t.f32");
  poke<uint32_t>(file_, key + 5, 77);
  expect_error(file_, "unknown value type 77");
}

TEST_F(GgufTest, BadAlignment) {
  std::string dir = test::temp_dir("gguf_badalign");
  auto b = make_reference_file(dir, 64);
  size_t key = find_bytes(b, "general.alignment");
  poke<uint32_t>(b, key + 17 + 4, 48);
  expect_error(b, "general.alignment");
}

TEST_F(GgufTest, RandomByteFlipsNeverCrash) {
  std::mt19937 rng(1234);
  size_t ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = file_;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    auto r = parse(b);
    if (r.ok()) {
      ++ok;
      for (const auto& t : (*r)->tensors()) {
        ASSERT_LE(t.data + t.n_bytes, b.data() + b.size());  // data stays inside the file
      }
    } else {
      ASSERT_FALSE(r.message().empty());
    }
  }
  SUCCEED() << ok << " of 3000 mutated files still parsed";
}

TEST_F(GgufTest, CorruptCountsNeverDriveAllocation) {
  // Counts and lengths that claim 2^33..2^40 items are refused before anything
  // proportional to them is allocated: the largest allocation stays small.
  std::vector<std::vector<uint8_t>> files;
  auto a = file_;
  poke<uint64_t>(a, 8, (1ull << 40));
  files.push_back(a);
  auto b = file_;
  poke<uint64_t>(b, 16, (1ull << 40));
  files.push_back(b);
  auto c = file_;
  poke<uint64_t>(c, find_bytes(c, "t.astr") + 14, 1ull << 33);
  files.push_back(c);
  auto d = file_;
  poke<uint64_t>(d, find_bytes(d, "t.str") + 9, 1ull << 33);
  files.push_back(d);
  for (const auto& f : files) {
    test::AllocProbe probe;
    auto r = parse(f);
    EXPECT_FALSE(r.ok());
    EXPECT_LE(probe.peak_single(), 64u * 1024u) << r.message();
  }
}

}  // namespace
}  // namespace loom
