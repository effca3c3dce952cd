// Greedy generation on the real stories260K model gives exactly the text
// llama.cpp gives (tests/data/stories260k_greedy_N.txt, 256 tokens each).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Stories260K, GreedyMatchesLlamaCpp) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const char* prompts[] = {"Once upon a time", "The little dog",
                           "Lily and Tom went to the park. They", "One day, a big bear"};
  for (int threads : {1, 2}) {
    CpuBackend be(threads);
    for (int i = 0; i < 4; ++i) {
      SessionConfig sc;
      sc.n_ctx = 2048;
      auto s = Session::create(**m, be, sc);
      ASSERT_TRUE(s.ok());
      GenerateParams gp;
      gp.sampling.temperature = 0;
      gp.max_tokens = 256;
      gp.stop_at_eog = false;
      std::string text;
      auto r = (*s)->generate((*s)->tokenize_raw(prompts[i]), gp, [&](std::string_view p) {
        text += p;
        return true;
      });
      ASSERT_TRUE(r.ok()) << r.message();
      EXPECT_EQ(r->n_generated, 256);
      const std::string expected_all =
          read_text(std::string(LOOM_SOURCE_DIR) + "/tests/data/stories260k_greedy_" +
                    std::to_string(i + 1) + ".txt");
      const std::string head = std::string(" ") + prompts[i];
      ASSERT_EQ(expected_all.compare(0, head.size(), head), 0);
      // llama-completion ends its output with newlines of its own: compare
      // both texts without trailing newlines.
      auto rstrip = [](std::string t) {
        while (!t.empty() && t.back() == '\n') t.pop_back();
        return t;
      };
      EXPECT_EQ(rstrip(expected_all.substr(head.size())), rstrip(text))
          << "prompt " << i + 1 << ", " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace loom
