// safetensors reader: files written by the writer read back, and every kind of
// corrupt file (made by changing real bytes) gives an error naming the file,
// the tensor and the offset, never a crash.
#include "engine/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/model/safetensors_writer.h"
#include "tests/test_util.h"

namespace loom {
namespace {

SafetensorsEntry entry(std::string name, std::string dtype, std::vector<int64_t> shape,
                       size_t elem_size, uint8_t seed) {
  SafetensorsEntry e;
  e.name = std::move(name);
  e.dtype = std::move(dtype);
  e.shape = std::move(shape);
  size_t n = elem_size;
  for (int64_t d : e.shape) n *= static_cast<size_t>(d);
  e.owned.resize(n);
  for (size_t k = 0; k < n; ++k) e.owned[k] = static_cast<uint8_t>(k * 13 + seed);
  return e;
}

std::vector<SafetensorsEntry> reference_entries() {
  std::vector<SafetensorsEntry> v;
  v.push_back(entry("model.embed_tokens.weight", "F32", {5, 8}, 4, 1));
  v.push_back(entry("model.norm.weight", "BF16", {8}, 2, 2));
  v.push_back(entry("lm_head.weight", "F16", {5, 8}, 2, 3));
  v.push_back(entry("position_ids", "I64", {1, 3}, 8, 4));
  v.push_back(entry("empty", "F32", {0, 8}, 4, 5));
  return v;
}

std::string write_reference(const std::string& dir) {
  const std::string path = dir + "/model.safetensors";
  EXPECT_TRUE(write_safetensors(path, reference_entries(), {{"format", "pt"}}).ok());
  return path;
}

// Replaces the header with `header` (length rewritten), keeping the data.
std::vector<uint8_t> with_header(const std::vector<uint8_t>& file, const std::string& header) {
  uint64_t old_len = 0;
  std::memcpy(&old_len, file.data(), 8);
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + file.size());
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i)));
  for (char c : header) out.push_back(static_cast<uint8_t>(c));
  for (size_t i = 8 + old_len; i < file.size(); ++i) out.push_back(file[i]);
  return out;
}

std::string header_of(const std::vector<uint8_t>& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return std::string(file.begin() + 8, file.begin() + 8 + static_cast<ptrdiff_t>(n));
}

void replace(std::string* s, const std::string& from, const std::string& to) {
  const size_t pos = s->find(from);
  ASSERT_NE(pos, std::string::npos) << from;
  s->replace(pos, from.size(), to);
}

Result<std::unique_ptr<SafetensorsFile>> parse(const std::vector<uint8_t>& bytes) {
  return SafetensorsFile::from_memory(bytes.data(), bytes.size(), "bad.safetensors");
}

void expect_error(const std::vector<uint8_t>& bytes, const std::vector<std::string>& parts) {
  auto r = parse(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kFormat) << r.message();
  EXPECT_NE(r.message().find("bad.safetensors"), std::string::npos) << r.message();
  for (const std::string& p : parts) {
    EXPECT_NE(r.message().find(p), std::string::npos) << "'" << p << "' not in: " << r.message();
  }
}

TEST(Safetensors, RoundTrip) {
  const std::string dir = test::temp_dir("st_roundtrip");
  auto f = SafetensorsFile::open(write_reference(dir));
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ((*f)->data_offset() % 8, 0u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  ASSERT_EQ((*f)->tensors().size(), 5u);
  for (const SafetensorsEntry& e : reference_entries()) {
    const SafetensorsTensor* t = (*f)->find_tensor(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    EXPECT_EQ(t->dtype_name, e.dtype);
    EXPECT_EQ(t->shape, e.shape);
    ASSERT_EQ(t->n_bytes, e.owned.size());
    // (A tensor with no elements has no bytes to compare, nor a data pointer.)
    if (!e.owned.empty()) {
      EXPECT_EQ(std::memcmp(t->data, e.owned.data(), e.owned.size()), 0) << e.name;
    }
  }
  EXPECT_EQ((*f)->find_tensor("model.norm.weight")->dtype, DType::kBF16);
  EXPECT_EQ((*f)->find_tensor("lm_head.weight")->dtype, DType::kF16);
  EXPECT_FALSE((*f)->find_tensor("position_ids")->dtype.has_value());
  EXPECT_EQ((*f)->find_tensor("missing"), nullptr);
}

TEST(Safetensors, TruncatedFiles) {
  const std::string dir = test::temp_dir("st_trunc");
  const std::vector<uint8_t> good = test::read_file(write_reference(dir));
  expect_error({good.begin(), good.begin() + 5}, {"too short", "truncated"});
  // Header cut off.
  expect_error({good.begin(), good.begin() + 40}, {"runs past the end", "truncated"});
  // Data cut off: the last tensor with bytes ends beyond the file.
  std::vector<uint8_t> cut(good.begin(), good.end() - 3);
  expect_error(cut, {"data section", "truncated"});
}

TEST(Safetensors, HeaderThatLies) {
  const std::string dir = test::temp_dir("st_lies");
  const std::vector<uint8_t> good = test::read_file(write_reference(dir));
  const std::string h = header_of(good);
  {  // Header length larger than the file.
    std::vector<uint8_t> b = good;
    const uint64_t huge = good.size();
    std::memcpy(b.data(), &huge, 8);
    expect_error(b, {"runs past the end"});
  }
  {  // Absurd header length.
    std::vector<uint8_t> b = good;
    const uint64_t huge = ~uint64_t{0};
    std::memcpy(b.data(), &huge, 8);
    expect_error(b, {"header length", "offset 0"});
  }
  {  // Shape x dtype != bytes.
    std::string s = h;
    replace(&s, "\"shape\":[5,8]", "\"shape\":[5,9]");
    expect_error(with_header(good, s), {"model.embed_tokens.weight", "[5, 9]", "160"});
  }
  {  // A dtype of the wrong size for the range.
    std::string s = h;
    replace(&s, "\"dtype\":\"F16\"", "\"dtype\":\"F32\"");
    expect_error(with_header(good, s), {"lm_head.weight", "F32"});
  }
  {  // Offsets out of range.
    std::string s = h;
    replace(&s, "[0,160]", "[1000000,1000160]");
    expect_error(with_header(good, s), {"model.embed_tokens.weight", "1000160", "truncated"});
  }
  {  // begin > end.
    std::string s = h;
    replace(&s, "[0,160]", "[160,0]");
    expect_error(with_header(good, s), {"model.embed_tokens.weight"});
  }
  {  // Overlapping tensors: the norm (16 bytes) moved onto the embedding.
    std::string s = h;
    replace(&s, "[160,176]", "[8,24]");
    expect_error(with_header(good, s),
                 {"overlap", "model.embed_tokens.weight", "model.norm.weight"});
  }
  {  // Unknown dtype.
    std::string s = h;
    replace(&s, "\"BF16\"", "\"Q4Z\"");
    expect_error(with_header(good, s), {"model.norm.weight", "unknown dtype 'Q4Z'"});
  }
  {  // Negative and non-integer dimensions.
    std::string s = h;
    replace(&s, "\"shape\":[8]", "\"shape\":[-8]");
    expect_error(with_header(good, s), {"model.norm.weight", "-8"});
    s = h;
    replace(&s, "\"shape\":[8]", "\"shape\":[\"8\"]");
    expect_error(with_header(good, s), {"model.norm.weight"});
  }
  {  // Overflowing element count.
    std::string s = h;
    replace(&s, "\"shape\":[5,8]", "\"shape\":[1099511627776,1099511627776]");
    expect_error(with_header(good, s), {"model.embed_tokens.weight", "too many elements"});
  }
  {  // Missing fields, wrong types.
    std::string s = h;
    replace(&s, "\"data_offsets\":[0,160]", "\"data_offsets\":[0]");
    expect_error(with_header(good, s), {"model.embed_tokens.weight", "data_offsets"});
    s = h;
    replace(&s, "\"format\":\"pt\"", "\"format\":3");
    expect_error(with_header(good, s), {"__metadata__"});
  }
  {  // Not JSON; not an object.
    std::string s = h;
    s[s.size() / 2] = '\x01';
    expect_error(with_header(good, s), {"does not parse"});
    expect_error(with_header(good, "[1,2]"), {"does not start with '{'"});
  }
}

TEST(Safetensors, FuzzLikeByteFlipsNeverCrash) {
  const std::string dir = test::temp_dir("st_flips");
  const std::vector<uint8_t> good = test::read_file(write_reference(dir));
  uint64_t state = 12345;
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> b = good;
    const int n = 1 + i % 4;
    for (int k = 0; k < n; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const size_t pos = (state >> 33) % std::min<size_t>(b.size(), 400);
      b[pos] = static_cast<uint8_t>(state >> 16);
    }
    auto r = parse(b);
    if (!r.ok()) {
      EXPECT_FALSE(r.message().empty());
      continue;
    }
    for (const SafetensorsTensor& t : (*r)->tensors()) {
      EXPECT_GE(t.data, b.data());
      EXPECT_LE(t.data + t.n_bytes, b.data() + b.size());
    }
  }
}

TEST(Safetensors, ShardedFolder) {
  const std::string dir = test::temp_dir("st_sharded");
  std::vector<SafetensorsEntry> all = reference_entries();
  std::vector<SafetensorsEntry> a(all.begin(), all.begin() + 2), b(all.begin() + 2, all.end());
  ASSERT_TRUE(write_safetensors(dir + "/model-00001-of-00002.safetensors", a).ok());
  ASSERT_TRUE(write_safetensors(dir + "/model-00002-of-00002.safetensors", b).ok());
  std::string index = "{\"metadata\": {}, \"weight_map\": {";
  for (size_t i = 0; i < all.size(); ++i) {
    index += (i ? ", \"" : "\"") + all[i].name + "\": \"model-0000" + (i < 2 ? "1" : "2") +
             "-of-00002.safetensors\"";
  }
  index += "}}";
  test::write_file(dir + "/model.safetensors.index.json", {index.begin(), index.end()});
  auto set = SafetensorsSet::open_folder(dir);
  ASSERT_TRUE(set.ok()) << set.message();
  EXPECT_EQ(set->files().size(), 2u);
  EXPECT_EQ(set->tensor_names().size(), 5u);
  ASSERT_NE(set->find_tensor("lm_head.weight"), nullptr);
  EXPECT_NE(set->file_of("lm_head.weight")->path().find("00002"), std::string::npos);

  // A shard missing from the folder.
  std::filesystem::rename(dir + "/model-00002-of-00002.safetensors", dir + "/moved");
  auto missing = SafetensorsSet::open_folder(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("model-00002-of-00002.safetensors"), std::string::npos)
      << missing.message();
  EXPECT_NE(missing.message().find("missing"), std::string::npos) << missing.message();
  std::filesystem::rename(dir + "/moved", dir + "/model-00002-of-00002.safetensors");

  // The index names a tensor its shard does not have.
  std::string lying = index;
  replace(&lying, "\"empty\": \"model-00002", "\"ghost\": \"model-00002");
  test::write_file(dir + "/model.safetensors.index.json", {lying.begin(), lying.end()});
  auto ghost = SafetensorsSet::open_folder(dir);
  ASSERT_FALSE(ghost.ok());
  EXPECT_NE(ghost.message().find("'ghost'"), std::string::npos) << ghost.message();

  // A shard path leaving the folder.
  std::string escape = index;
  replace(&escape, "\"empty\": \"model-00002-of-00002.safetensors\"",
          "\"empty\": \"../model-00002-of-00002.safetensors\"");
  test::write_file(dir + "/model.safetensors.index.json", {escape.begin(), escape.end()});
  auto esc = SafetensorsSet::open_folder(dir);
  ASSERT_FALSE(esc.ok());
  EXPECT_NE(esc.message().find("not a file name"), std::string::npos) << esc.message();

  // No weights at all.
  const std::string empty_dir = test::temp_dir("st_none");
  auto none = SafetensorsSet::open_folder(empty_dir);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("no *.safetensors"), std::string::npos) << none.message();
}

}  // namespace
}  // namespace loom
