// GGUF reader on real files from ../shared/fixtures: every file parses, and
// corrupting their real bytes gives errors, never crashes.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/model/gguf.h"
#include "tests/alloc_probe.h"
#include "tests/test_util.h"

namespace loom {
namespace {

TEST(GgufFixtures, Stories260kLayout) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(*f.get_int("llama.embedding_length").value(), 64);
  EXPECT_EQ(*f.get_int("llama.block_count").value(), 5);
  EXPECT_EQ(*f.get_int("llama.attention.head_count_kv").value(), 4);
  EXPECT_EQ(*f.get_string("tokenizer.ggml.model").value(), "llama");
  EXPECT_EQ((*f.get_string_array("tokenizer.ggml.tokens").value()).size(), 512u);
  const GgufTensor* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape_string(), "[64, 512]");
  EXPECT_EQ(emb->dtype, DType::kF32);
  uint64_t params = 0;
  for (const auto& t : f.tensors()) params += t.n_elements();
  EXPECT_EQ(params, 292800u);
}

TEST(GgufFixtures, EveryFixtureParses) {
  auto dir = test::fixtures_dir();
  if (!dir) GTEST_SKIP() << "../shared/fixtures not found (set LOOM_FIXTURES)";
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(*dir)) {
    if (e.path().extension() != ".gguf") continue;
    auto r = GgufFile::open(e.path().string());
    EXPECT_TRUE(r.ok()) << e.path() << ": " << (r.ok() ? "" : r.message());
    ++n;
  }
  EXPECT_GT(n, 10);
}

TEST(GgufFixtures, TruncatedRealFilesGiveErrors) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/llama-2-tiny-random.gguf");
  auto bytes = test::read_file(path);
  auto whole = GgufFile::from_memory(bytes.data(), bytes.size(), "tiny.gguf");
  ASSERT_TRUE(whole.ok()) << whole.message();
  // Cut points spread across the header, the 32k-token vocabulary, the tensor
  // infos and the tensor data.
  for (size_t n = 0; n < bytes.size(); n += 1 + n / 3) {
    test::AllocProbe probe;
    auto r = GgufFile::from_memory(bytes.data(), n, "tiny.gguf");
    ASSERT_FALSE(r.ok()) << "prefix " << n;
    // Nothing allocated in one piece is larger than the whole file.
    EXPECT_LE(probe.peak_single(), bytes.size()) << "prefix " << n;
    EXPECT_NE(r.message().find("truncated"), std::string::npos) << r.message();
  }
}

TEST(GgufFixtures, BadMagicOnARealFile) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  auto bytes = test::read_file(path);
  bytes[3] = 'X';
  auto r = GgufFile::from_memory(bytes.data(), bytes.size(), "stories.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("bad magic"), std::string::npos);
}

}  // namespace
}  // namespace loom
