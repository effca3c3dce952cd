#include "tests/test_util.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/runtime/session.h"

namespace fs = std::filesystem;

// Under AddressSanitizer, Mesa's lavapipe (22.3.6) leaves a 128-byte block that only
// its own data points at: once the Vulkan loader unloads it after the last instance,
// LeakSanitizer reports that block for every test that made a Vulkan device (seen on
// a 6.18 kernel; a bare vkCreateInstance + vkCreateDevice program shows the same).
// Loaded here once with RTLD_NODELETE, the driver stays mapped and the block
// reachable. Only in sanitizer builds; no effect where lavapipe is absent.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_TEST_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_TEST_UNDER_ASAN 1
#endif
#ifdef LOOM_TEST_UNDER_ASAN
namespace {
[[maybe_unused]] const bool kLavapipeKept =
    dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE) != nullptr;
}  // namespace
#endif

namespace loom::test {

std::string greedy_chat(const Model& m, const std::vector<ChatMessage>& messages,
                        int64_t max_tokens) {
  CpuBackend be(1);
  SessionConfig c;
  c.n_ctx = std::min<int64_t>(m.hp.n_ctx_train, 1024);
  auto s = Session::create(m, be, c);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return {};
  auto prompt = (*s)->tokenize_chat(messages);
  EXPECT_TRUE(prompt.ok()) << prompt.message();
  if (!prompt.ok()) return {};
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = max_tokens;
  std::string text;
  auto r = (*s)->generate(*prompt, gp, [&](std::string_view p) {
    text += p;
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.message();
  return text;
}

std::optional<std::string> fixtures_dir() {
  if (const char* env = std::getenv("LOOM_FIXTURES"); env && *env) {
    if (fs::is_directory(env)) return std::string(env);
    return std::nullopt;
  }
  if (fs::is_directory(LOOM_FIXTURES_DEFAULT)) return std::string(LOOM_FIXTURES_DEFAULT);
  return std::nullopt;
}

std::optional<std::string> fixture_path(const std::string& relative) {
  auto dir = fixtures_dir();
  if (!dir) return std::nullopt;
  fs::path p = fs::path(*dir) / relative;
  if (!fs::exists(p)) return std::nullopt;
  return p.string();
}

std::string temp_dir(const std::string& name) {
  // One folder per test: ctest runs tests as parallel processes, so folders
  // shared between tests would be removed under each other's feet.
  // Outside a test (a suite's SetUpTestSuite) the folder is per process:
  // ctest starts one process per test of the suite, each running that set-up,
  // and a file one of them has mapped must not be rewritten by another.
  auto* unit = ::testing::UnitTest::GetInstance();
  std::string owner;
  if (const auto* info = unit->current_test_info()) {
    owner = std::string(info->test_suite_name()) + "." + info->name();
  } else {
    const auto* suite = unit->current_test_suite();
    owner = std::string(suite ? suite->name() : "no-test") + ".pid" + std::to_string(::getpid());
  }
  for (char& c : owner) {
    if (c == '/') c = '_';
  }
  fs::path p = fs::path(LOOM_BINARY_DIR) / "test-tmp" / owner / name;
  std::error_code ec;
  fs::remove_all(p, ec);
  fs::create_directories(p);
  return p.string();
}

std::unique_ptr<Model> synth_model(const SynthSpec& spec, const std::string& name) {
  const std::string path = temp_dir(name) + "/m.gguf";
  auto w = write_synthetic_model(spec, path);
  EXPECT_TRUE(w.ok()) << w.message();
  if (!w.ok()) return nullptr;
  auto m = load_model(path);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void expect_gpu_pass_notes(const Model& m, const std::vector<std::string>& notes, bool uses_gpu) {
  if (m.host_attention_reason().empty()) {
    EXPECT_TRUE(notes.empty()) << notes.front();
    return;
  }
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("attention runs on the CPU: " + m.hp.arch), std::string::npos)
      << notes[0];
  EXPECT_TRUE(uses_gpu);
}

}  // namespace loom::test
