// The whole forward pass on the Vulkan backend: synthetic models of each
// architecture and weight type against the double-precision reference (as
// forward_test.cpp does for the CPU), greedy tokens equal to the CPU
// backend's, the CPU fallback for weights the GPU cannot take (unsupported
// type, out of device memory), and greedy generation on stories260K equal to
// the CPU's (and llama.cpp's) text. Skips without a Vulkan device.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/ref_forward.h"
#include "tests/test_util.h"
#include "tests/unit/vulkan_test_util.h"

namespace loom {
namespace {

#ifdef LOOM_HAVE_VULKAN

std::string synth(const std::string& arch, const std::string& dtype, int64_t n_embd = 256,
                  int64_t n_ff = 512) {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_embd = n_embd;
  s.n_ff = n_ff;
  s.n_head = 4;
  s.n_head_kv = arch == "phi3" ? 4 : 2;
  s.n_ctx = 64;
  s.weight_type = dtype;
  s.seed = 7;
  s.sliding_window = 4;  // gemma2: the window matters within the test's tokens
  std::string path = test::temp_dir("vk_fwd_" + arch + "_" + dtype) + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  return path;
}

struct Case {
  const char* arch;
  const char* dtype;
  double tol;  ///< normalized error of the logits vs the double reference
};

// The GPU keeps activations in f32, except that single-token Q8_0, Q4_0, Q4_K
// and Q6_K matvecs fed by a norm read its Q8 copy where the device has integer
// dot products (as the CPU converts activations to Q8 for quantized weights):
// the bounds are those of forward_test.cpp or tighter.
const Case kCases[] = {
    {"llama", "f32", 2e-3},
    {"llama", "f16", 3e-3},
    {"llama", "q8_0", 2e-2},
    {"llama", "q4_0", 3e-2},
    {"llama", "q4_k", 2e-2},
    {"llama", "q5_k", 2e-2},
    {"llama", "q6_k", 2e-2},
    {"llama", "q4_k_m", 2e-2},
    {"qwen2", "q8_0", 2e-2},
    {"phi3", "f16", 3e-3},
    {"phi3", "q4_0", 3e-2},
    // qwen3: per-head q/k norms (rms_norm over [T * heads, head_dim]) before RoPE.
    {"qwen3", "f32", 2e-3},
    {"qwen3", "q8_0", 2e-2},
    {"qwen3", "q4_k", 3e-2},
    // gemma2: the scaled embedding and the soft-capped, windowed attention on the
    // CPU; GeGLU, the post-norms and the final soft-cap with the GPU's matrices.
    {"gemma2", "f32", 2e-3},
    {"gemma2", "q8_0", 2e-2},
    {"gemma2", "q4_k", 3e-2},
};

class VulkanForward : public ::testing::TestWithParam<Case> {};

// Prefill in chunks (4 + 3 tokens, so both the matmul and the matvec shaders
// run), then single-token decode steps; every step's logits vs the reference,
// and greedy tokens equal to the CPU backend's.
TEST_P(VulkanForward, LogitsMatchReferenceAndCpu) {
  LOOM_VULKAN_OR_SKIP(be, false);
  const Case c = GetParam();
  const uint64_t msgs0 = be->validation_messages();
  auto m = load_model(synth(c.arch, c.dtype));
  ASSERT_TRUE(m.ok()) << m.message();
  const Model& model = **m;
  const std::vector<int32_t> tokens = {0, 77, 301, 5, 122, 9, 260, 33, 12, 250};
  const auto ref = test::reference_logits(model, tokens);
  const int64_t V = model.hp.n_vocab;

  KvCacheConfig kc{model.hp.n_layer, model.hp.n_head_kv, model.hp.head_dim, 64, 16, DType::kF16};
  // Also, for quantized types, with quant_q8 copies of o's and down's inputs
  // instead of the ones their producers write (off by default).
  const bool quantized = std::string(c.dtype) != "f32" && std::string(c.dtype) != "f16";
  for (const int mode : {0, 1}) {
    if (mode == 1 && !quantized) continue;
    SCOPED_TRACE(mode == 0 ? "default" : "quant_q8 copies of o's and down's inputs");
    be->set_int_dot(true, mode == 1, /*outputs=*/mode == 0);
    auto kv = KvCache::create(kc);
    ASSERT_TRUE(kv.ok());
    ForwardPass fwd(model, *be, **kv, /*max_chunk=*/4);
    const Status prep = fwd.prepare();
    ASSERT_TRUE(prep.ok()) << prep.message();
    test::expect_gpu_pass_notes(model, fwd.notes(), fwd.placement().uses(Unit::kGpu));
    std::vector<float> logits(static_cast<size_t>(7 * V));
    ASSERT_TRUE(fwd.eval(std::span<const int32_t>(tokens.data(), 7), 0, logits.data(), true).ok());
    for (int64_t t = 0; t < 7; ++t) {
      std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
      EXPECT_LT(test::normalized_error(row, ref[static_cast<size_t>(t)]), c.tol)
          << "prefill position " << t;
    }
    std::vector<float> one(static_cast<size_t>(V));
    for (size_t t = 7; t < tokens.size(); ++t) {
      ASSERT_TRUE(
          fwd.eval(std::span<const int32_t>(&tokens[t], 1), static_cast<int64_t>(t), one.data())
              .ok());
      EXPECT_LT(test::normalized_error(one, ref[t]), c.tol) << "decode position " << t;
    }
  }
  be->set_int_dot(true);
  be->release_weights();
  EXPECT_EQ(be->validation_messages(), msgs0);
}

INSTANTIATE_TEST_SUITE_P(ArchsAndDtypes, VulkanForward, ::testing::ValuesIn(kCases),
                         [](const auto& pi) {
                           return std::string(pi.param.arch) + "_" + pi.param.dtype;
                         });

// Greedy generation through Session: the same tokens on the GPU as on the CPU.
std::vector<int32_t> greedy(const Model& m, Backend& be, const std::vector<int32_t>& prompt,
                            int64_t n, DType kv) {
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.kv_dtype = kv;
  auto s = Session::create(m, be, sc);
  EXPECT_TRUE(s.ok()) << s.message();
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = n;
  gp.stop_at_eog = false;
  auto r = (*s)->generate(prompt, gp, nullptr);
  EXPECT_TRUE(r.ok()) << r.message();
  return (*s)->tokens();
}

TEST(VulkanSession, GreedyEqualsCpuWithBothKvTypes) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = load_model(synth("llama", "q8_0"));
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  CpuBackend cpu(2);
  for (DType kv : {DType::kF16, DType::kQ8_0}) {
    EXPECT_EQ(greedy(**m, *be, prompt, 24, kv), greedy(**m, cpu, prompt, 24, kv)) << dtype_name(kv);
  }
  be->release_weights();
}

// A batch split into command buffers of three dispatches each (submitted as
// recorded, the GPU path) gives the same tokens, validation-clean.
TEST(VulkanSession, GreedyEqualsCpuInSmallSubmissions) {
  LOOM_VULKAN_OR_SKIP(be, true);
  const uint64_t msgs0 = be->validation_messages();
  auto m = load_model(synth("llama", "f32"));
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  CpuBackend cpu(2);
  const uint64_t subs0 = be->submissions();
  EXPECT_EQ(greedy(**m, *be, prompt, 12, DType::kF16), greedy(**m, cpu, prompt, 12, DType::kF16));
  EXPECT_GT(be->submissions() - subs0, 12u * 4) << "batches were not split";
  be->release_weights();
  EXPECT_EQ(be->validation_messages(), msgs0);
}

// Weights the GPU cannot run stay on the CPU, with a note saying which and why,
// and the results are unchanged.
TEST(VulkanFallback, UnsupportedTypeRunsOnTheCpu) {
  LOOM_VULKAN_OR_SKIP(be, false);
  auto m = load_model(synth("llama", "q4_1"));
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> tokens = {0, 77, 301, 5};
  const auto ref = test::reference_logits(**m, tokens);
  auto kv = KvCache::create(
      {(*m)->hp.n_layer, (*m)->hp.n_head_kv, (*m)->hp.head_dim, 64, 16, DType::kF16});
  ASSERT_TRUE(kv.ok());
  ForwardPass fwd(**m, *be, **kv);
  ASSERT_TRUE(fwd.prepare().ok());
  ASSERT_FALSE(fwd.notes().empty());
  EXPECT_NE(fwd.notes()[0].find("runs on the CPU"), std::string::npos) << fwd.notes()[0];
  std::vector<float> logits(static_cast<size_t>((*m)->hp.n_vocab));
  ASSERT_TRUE(fwd.eval(tokens, 0, logits.data()).ok());
  EXPECT_LT(test::normalized_error(logits, ref.back()), 3e-2);
  be->release_weights();
}

TEST(VulkanFallback, OutOfDeviceMemoryRunsTheRestOnTheCpu) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  auto m = load_model(synth("llama", "f32", 256, 2048));  // each FFN matrix: 2 MiB
  ASSERT_TRUE(m.ok());
  VulkanOptions o;
  o.memory_limit = 6ull << 20;  // room for some weights only
  auto be = VulkanBackend::create(o);
  ASSERT_TRUE(be.ok()) << be.message();
  const std::vector<int32_t> tokens = {0, 77, 301, 5};
  const auto ref = test::reference_logits(**m, tokens);
  auto kv = KvCache::create(
      {(*m)->hp.n_layer, (*m)->hp.n_head_kv, (*m)->hp.head_dim, 32, 16, DType::kF16});
  ASSERT_TRUE(kv.ok());
  ForwardPass fwd(**m, **be, **kv);
  const Status prep = fwd.prepare();
  ASSERT_TRUE(prep.ok()) << prep.message();
  ASSERT_FALSE(fwd.notes().empty());
  EXPECT_NE(fwd.notes()[0].find("out of device memory"), std::string::npos) << fwd.notes()[0];
  std::vector<float> logits(static_cast<size_t>((*m)->hp.n_vocab));
  ASSERT_TRUE(fwd.eval(tokens, 0, logits.data()).ok());
  EXPECT_LT(test::normalized_error(logits, ref.back()), 2e-3);
}

// Also with the batch split into command buffers of 3 dispatches: the ones
// already submitted finish, the step fails with the message.
TEST(VulkanFallback, LostDeviceFailsTheStepWithAMessage) {
  std::string why;
  if (!test::vulkan_backend(&why)) GTEST_SKIP() << "no Vulkan device: " << why;
  auto m = load_model(synth("llama", "q8_0"));
  ASSERT_TRUE(m.ok());
  for (uint32_t every : {0u, 3u}) {
    SCOPED_TRACE("submit_every " + std::to_string(every));
    VulkanOptions o;
    o.submit_every = every;
    auto be = VulkanBackend::create(o);
    ASSERT_TRUE(be.ok());
    SessionConfig sc;
    sc.n_ctx = 32;
    auto s = Session::create(**m, **be, sc);
    ASSERT_TRUE(s.ok());
    (*be)->simulate_device_lost();
    GenerateParams gp;
    gp.max_tokens = 4;
    auto r = (*s)->generate(std::vector<int32_t>{0, 77, 301}, gp, nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("device was lost"), std::string::npos) << r.message();
  }
}

// ---- stories260K ---------------------------------------------------------------

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The texts in tests/data are llama.cpp's greedy output, which the CPU backend
// reproduces exactly (tests/model/stories_greedy_test.cpp): equal to them
// means equal to the CPU backend.
TEST(VulkanStories260K, GreedyEqualsCpu) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  LOOM_VULKAN_OR_SKIP(be, false);
  const uint64_t msgs0 = be->validation_messages();
  auto m = load_model(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const std::string data_dir = std::filesystem::path(__FILE__).parent_path().parent_path() / "data";
  const char* prompts[] = {"Once upon a time", "The little dog",
                           "Lily and Tom went to the park. They", "One day, a big bear"};
  for (int i = 0; i < 4; ++i) {
    SessionConfig sc;
    sc.n_ctx = 2048;
    auto s = Session::create(**m, *be, sc);
    ASSERT_TRUE(s.ok()) << s.message();
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
        read_text(data_dir + "/stories260k_greedy_" + std::to_string(i + 1) + ".txt");
    const std::string head = std::string(" ") + prompts[i];
    ASSERT_EQ(expected_all.compare(0, head.size(), head), 0) << "missing tests/data text " << i + 1;
    // llama-completion ends its output with newlines of its own: compare without trailing newlines.
    auto rstrip = [](std::string t) {
      while (!t.empty() && t.back() == '\n') t.pop_back();
      return t;
    };
    EXPECT_EQ(rstrip(expected_all.substr(head.size())), rstrip(text)) << "prompt " << i + 1;
  }
  be->release_weights();
  EXPECT_EQ(be->validation_messages(), msgs0);
}

#endif  // LOOM_HAVE_VULKAN

}  // namespace
}  // namespace loom
