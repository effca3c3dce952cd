// Models already on the machine: a fake home with the Hugging Face hub
// cache (an HF folder and a GGUF), LM Studio, Ollama (manifest + blob) and
// llama.cpp's cache, plus a user folder with a corrupt file and a split
// GGUF's second part. Each model is listed once, with its name, architecture,
// quantization, size and source; the corrupt one with the reader's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/model/discovery.h"
#include "engine/model/hf_export.h"
#include "engine/model/synth.h"
#include "tests/test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

void synth(const fs::path& p, const std::string& name, const std::string& type,
           const std::string& arch = "llama") {
  fs::create_directories(p.parent_path());
  SynthSpec s;
  s.arch = arch;
  s.name = name;
  s.n_layer = 1;
  s.n_embd = 64;
  s.n_ff = 128;
  s.n_head = 2;
  s.n_head_kv = 1;
  s.n_ctx = 128;
  s.weight_type = type;
  ASSERT_TRUE(write_synthetic_model(s, p.string()).ok());
}

const FoundModel* by_name(const std::vector<FoundModel>& v, const std::string& name) {
  for (const auto& m : v) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

TEST(ModelDiscovery, FindsModelsWhereOtherToolsKeepThem) {
  const fs::path home = test::temp_dir("discovery_home");
  const fs::path scratch = test::temp_dir("discovery_scratch");

  // Hugging Face hub cache: an HF folder (refs/main names the snapshot) and a GGUF repo.
  const fs::path repo = home / ".cache/huggingface/hub/models--acme--tiny-chat";
  synth(scratch / "hf-src.gguf", "hf tiny", "f16", "qwen2");
  ASSERT_TRUE(
      write_hf_folder((scratch / "hf-src.gguf").string(), (repo / "snapshots/abc123").string(), {})
          .ok());
  fs::create_directories(repo / "snapshots/old000");  // an older, empty snapshot
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs/main") << "abc123";
  synth(home / ".cache/huggingface/hub/models--acme--tiny-GGUF/snapshots/r1/tiny.Q8_0.gguf",
        "hub gguf", "q8_0");

  // LM Studio and llama.cpp's cache.
  synth(home / ".lmstudio/models/acme/tiny-GGUF/tiny-Q4_0.gguf", "lmstudio tiny", "q4_0");
  synth(home / ".cache/llama.cpp/acme_tiny.gguf", "llamacpp tiny", "f32");

  // Ollama: a manifest naming its model layer's blob by digest.
  const fs::path ollama = home / ".ollama/models";
  synth(ollama / "blobs/sha256-0123abcd", "ollama blob", "q8_0");
  fs::create_directories(ollama / "manifests/registry.ollama.ai/library/tiny");
  std::ofstream(ollama / "manifests/registry.ollama.ai/library/tiny/latest")
      << R"({"schemaVersion":2,"layers":[)"
      << R"({"mediaType":"application/vnd.ollama.image.template","digest":"sha256-ffff"},)"
      << R"({"mediaType":"application/vnd.ollama.image.model","digest":"sha256:0123abcd",)"
      << R"("size":1}]})";
  // A manifest whose digest tries to leave the blobs folder is ignored.
  fs::create_directories(ollama / "manifests/registry.ollama.ai/library/evil");
  std::ofstream(ollama / "manifests/registry.ollama.ai/library/evil/latest")
      << R"({"layers":[{"mediaType":"application/vnd.ollama.image.model",)"
      << R"("digest":"sha256:../../../../etc/passwd"}]})";

  // A user folder: a truncated GGUF, a split GGUF's second part, and a link
  // to LM Studio's folder (its model is listed once).
  const fs::path mine = test::temp_dir("discovery_mine");
  synth(scratch / "whole.gguf", "whole", "q8_0");
  {
    const auto bytes = test::read_file((scratch / "whole.gguf").string());
    test::write_file((mine / "cut.gguf").string(),
                     std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() / 3));
  }
  synth(mine / "big-00002-of-00002.gguf", "second part", "q8_0");
  fs::create_directory_symlink(home / ".lmstudio/models/acme", mine / "linked");

  DiscoveryOptions o;
  o.home = home.string();
  o.extra_dirs = {mine.string()};
  const auto places = model_places(o);
  EXPECT_EQ(places.size(), 5u);  // hub, LM Studio, Ollama, llama.cpp cache, folder

  const auto found = discover_models(o);
  for (const auto& m : found)
    std::printf("%s | %s | %s | %s\n", m.name.c_str(), m.source.c_str(), m.quant.c_str(),
                m.error.c_str());

  const FoundModel* hf = by_name(found, "acme/tiny-chat");
  ASSERT_NE(hf, nullptr);
  EXPECT_EQ(hf->format, "hf");
  EXPECT_EQ(hf->source, "Hugging Face cache");
  EXPECT_EQ(hf->arch, "qwen2");
  EXPECT_NE(hf->path.find("abc123"), std::string::npos);
  EXPECT_GT(hf->size_bytes, 0u);

  const FoundModel* hub = by_name(found, "hub gguf");
  ASSERT_NE(hub, nullptr);
  EXPECT_EQ(hub->quant, "Q8_0");
  EXPECT_EQ(hub->arch, "llama");

  const FoundModel* lms = by_name(found, "lmstudio tiny");
  ASSERT_NE(lms, nullptr);
  EXPECT_EQ(lms->source, "LM Studio");
  EXPECT_EQ(lms->quant, "Q4_0");
  EXPECT_EQ(std::count_if(found.begin(), found.end(),
                          [](const FoundModel& m) { return m.name == "lmstudio tiny"; }),
            1);

  const FoundModel* cpp = by_name(found, "llamacpp tiny");
  ASSERT_NE(cpp, nullptr);
  EXPECT_EQ(cpp->source, "llama.cpp cache");
  EXPECT_EQ(cpp->quant, "F32");

  const FoundModel* oll = by_name(found, "tiny:latest");
  ASSERT_NE(oll, nullptr);
  EXPECT_EQ(oll->source, "Ollama");
  EXPECT_EQ(oll->quant, "Q8_0");
  EXPECT_TRUE(oll->error.empty()) << oll->error;
  EXPECT_EQ(by_name(found, "evil:latest"), nullptr);

  const FoundModel* cut = by_name(found, "cut");
  ASSERT_NE(cut, nullptr);
  EXPECT_FALSE(cut->error.empty());
  EXPECT_EQ(by_name(found, "second part"), nullptr);

  // Only the user's folders.
  o.standard_places = false;
  const auto only = discover_models(o);
  EXPECT_EQ(only.size(), 2u);  // cut, and the linked LM Studio model
}

TEST(ModelDiscovery, NothingThereIsAnEmptyList) {
  DiscoveryOptions o;
  o.home = test::temp_dir("discovery_empty");
  EXPECT_TRUE(model_places(o).empty() ||
              model_places(o).front().dir.rfind("/usr/share/ollama", 0) == 0);
  o.extra_dirs = {"/nonexistent/loom/models"};
  for (const auto& m : discover_models(o)) EXPECT_NE(m.source, "folder");
  EXPECT_EQ(format_model_size(3ull << 30), "3.0 GiB");
  EXPECT_EQ(format_model_size(640ull << 20), "640 MiB");
}

}  // namespace
}  // namespace loom
