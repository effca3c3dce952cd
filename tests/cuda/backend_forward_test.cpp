// The whole forward pass on the CUDA backend: synthetic models of each
// architecture and weight type against the double-precision reference (as
// tests/unit/forward_test.cpp does for the CPU), greedy tokens equal to the
// CPU backend's with both KV types, the CPU fallback for a weight type CUDA
// has no kernel for and for a memory limit, and greedy generation on
// stories260K equal to the CPU's (llama.cpp's) text. Skips without a device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/cuda/cuda_util.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/cuda/backend_test_util.h"
#include "tests/ref_forward.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::string synth(const std::string& arch, const std::string& dtype, int64_t n_embd = 256,
                  int64_t n_ff = 512, int64_t n_ctx = 64) {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_embd = n_embd;
  s.n_ff = n_ff;
  s.n_head = 4;
  s.n_head_kv = arch == "phi3" ? 4 : 2;
  s.n_ctx = n_ctx;
  s.weight_type = dtype;
  s.seed = 7;
  s.sliding_window = 4;  // gemma2: the window matters within the test's tokens
  std::string path = test::temp_dir("cuda_fwd_" + arch + "_" + dtype) + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  return path;
}

struct Case {
  const char* arch;
  const char* dtype;
  double tol;  ///< normalized error of the logits vs the double reference
};

// Q8 activations in the quantized decode matvecs (the bounds of
// tests/unit/vulkan_forward_test.cpp); F16-rounded weights and activations
// in the prefill GEMMs, hence the looser bounds of the float types.
const Case kCases[] = {
    {"llama", "f32", 3e-3},
    {"llama", "f16", 3e-3},
    {"llama", "bf16", 5e-3},
    {"llama", "q8_0", 2e-2},
    {"llama", "q4_0", 3e-2},
    {"llama", "q4_k", 2e-2},
    {"llama", "q5_k", 2e-2},
    {"llama", "q6_k", 2e-2},
    {"llama", "q4_k_m", 2e-2},
    {"qwen2", "q8_0", 2e-2},
    {"phi3", "f16", 1e-2},
    {"phi3", "q4_0", 3e-2},
    {"qwen3", "f32", 3e-3},
    {"qwen3", "q8_0", 2e-2},
    {"qwen3", "q4_k", 3e-2},
    // gemma2: attention and the scaled embedding on the CPU, the rest on the GPU.
    {"gemma2", "f32", 3e-3},
    {"gemma2", "q8_0", 2e-2},
    {"gemma2", "q4_k", 3e-2},
};

class CudaForward : public ::testing::TestWithParam<Case> {};

// Prefill of 12 tokens in one chunk (GEMMs and the tiled attention), then
// single-token decode steps (matvecs and split-K attention); every step's
// logits against the reference.
TEST_P(CudaForward, LogitsMatchReference) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  const Case c = GetParam();
  auto m = load_model(synth(c.arch, c.dtype));
  ASSERT_TRUE(m.ok()) << m.message();
  const Model& model = **m;
  const std::vector<int32_t> tokens = {0,   77, 301, 5,  122, 9, 260, 33, 12,
                                       250, 17, 44,  90, 101, 2, 3,   199};
  const auto ref = test::reference_logits(model, tokens);
  const int64_t V = model.hp.n_vocab;
  KvCacheConfig kc{model.hp.n_layer, model.hp.n_head_kv, model.hp.head_dim, 64, 16, DType::kF16};
  auto kv = KvCache::create(kc);
  ASSERT_TRUE(kv.ok());
  ForwardPass fwd(model, *be, **kv, /*max_chunk=*/12);
  const Status prep = fwd.prepare();
  ASSERT_TRUE(prep.ok()) << prep.message();
  test::expect_gpu_pass_notes(model, fwd.notes(), fwd.placement().uses(Unit::kGpu));
  const int64_t P = 12;
  std::vector<float> logits(static_cast<size_t>(P * V));
  ASSERT_TRUE(fwd.eval(std::span<const int32_t>(tokens.data(), P), 0, logits.data(), true).ok());
  for (int64_t t = 0; t < P; ++t) {
    std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
    EXPECT_LT(test::normalized_error(row, ref[static_cast<size_t>(t)]), c.tol)
        << "prefill position " << t;
  }
  std::vector<float> one(static_cast<size_t>(V));
  for (size_t t = P; t < tokens.size(); ++t) {
    ASSERT_TRUE(
        fwd.eval(std::span<const int32_t>(&tokens[t], 1), static_cast<int64_t>(t), one.data())
            .ok());
    EXPECT_LT(test::normalized_error(one, ref[t]), c.tol) << "decode position " << t;
  }
  be->release_weights();
}

INSTANTIATE_TEST_SUITE_P(ArchsAndDtypes, CudaForward, ::testing::ValuesIn(kCases),
                         [](const auto& pi) {
                           return std::string(pi.param.arch) + "_" + pi.param.dtype;
                         });

std::vector<int32_t> greedy(const Model& m, Backend& be, const std::vector<int32_t>& prompt,
                            int64_t n, DType kv, int64_t n_ctx = 64) {
  SessionConfig sc;
  sc.n_ctx = n_ctx;
  sc.kv_dtype = kv;
  auto s = Session::create(m, be, sc);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return {};
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = n;
  gp.stop_at_eog = false;
  auto r = (*s)->generate(prompt, gp, nullptr);
  EXPECT_TRUE(r.ok()) << r.message();
  return (*s)->tokens();
}

TEST(CudaSession, GreedyEqualsCpuWithBothKvTypes) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  // Q8_0 weights, as the Vulkan suite: the CPU and CUDA then both multiply
  // Q8 activations at decode (F16 weights would compare the CPU's F16-rounded
  // activations with CUDA's float ones, near-ties apart).
  for (const char* dt : {"q8_0"}) {
    auto m = load_model(synth("llama", dt));
    ASSERT_TRUE(m.ok());
    const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
    CpuBackend cpu(2);
    for (DType kv : {DType::kF16, DType::kQ8_0}) {
      EXPECT_EQ(greedy(**m, *be, prompt, 24, kv), greedy(**m, cpu, prompt, 24, kv))
          << dt << " weights, " << dtype_name(kv) << " KV";
    }
    be->release_weights();
  }
}

// Decode steps wholly on the GPU are captured into CUDA graphs and replayed
// (cuda_step.cpp). Over a context that crosses the attention's first plan
// bucket (256 keys) the tokens equal those of the same backend op by op
// (LOOM_CUDA_GRAPHS=0: the same kernels, launched one by one).
TEST(CudaSession, GraphReplayEqualsOpByOp) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  auto m = load_model(synth("llama", "q8_0", 256, 512, 400));
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  for (DType kv : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(std::string(dtype_name(kv)) + " KV");
    const auto before = be->graph_stats();
    const std::vector<int32_t> graphed = greedy(**m, *be, prompt, 300, kv, 400);
    const auto after = be->graph_stats();
    EXPECT_GT(after.replays, before.replays + 250);
    EXPECT_GE(after.captures, before.captures + 2);  // one per plan bucket (256, 512)
    EXPECT_EQ(after.capture_failures, before.capture_failures);
    ASSERT_EQ(setenv("LOOM_CUDA_GRAPHS", "0", 1), 0);
    const std::vector<int32_t> op_by_op = greedy(**m, *be, prompt, 300, kv, 400);
    ASSERT_EQ(unsetenv("LOOM_CUDA_GRAPHS"), 0);
    EXPECT_EQ(be->graph_stats().replays, after.replays);
    EXPECT_EQ(graphed, op_by_op);
  }
  be->release_weights();
}

// Chained launches (pdl.cuh): each kernel of a step may start while the one
// before it finishes, and waits for it before touching what it wrote. Over
// 300 tokens, replayed and op by op, the tokens equal those of plain launches.
TEST(CudaSession, ChainedLaunchesEqualPlain) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  auto m = load_model(synth("llama", "q4_0", 256, 512, 400));
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> prompt = {0, 77, 301, 5, 122};
  struct Restore {
    bool was = cuda::chained_launches();
    ~Restore() {
      cuda::set_chained_launches(was);
      unsetenv("LOOM_CUDA_GRAPHS");
    }
  } restore;
  for (const char* graphs : {"1", "0"}) {
    SCOPED_TRACE(std::string("LOOM_CUDA_GRAPHS=") + graphs);
    ASSERT_EQ(setenv("LOOM_CUDA_GRAPHS", graphs, 1), 0);
    cuda::set_chained_launches(true);
    const std::vector<int32_t> chained = greedy(**m, *be, prompt, 300, DType::kF16, 400);
    cuda::set_chained_launches(false);
    const std::vector<int32_t> plain = greedy(**m, *be, prompt, 300, DType::kF16, 400);
    EXPECT_EQ(chained.size(), prompt.size() + 299);  // the last token drawn is not yet evaluated
    EXPECT_EQ(chained, plain);
  }
  be->release_weights();
}

TEST(CudaFallback, UnsupportedTypeRunsOnTheCpu) {
  LOOM_CUDA_BACKEND_OR_SKIP(be);
  auto m = load_model(synth("llama", "q2_k"));
  if (!m.ok()) GTEST_SKIP() << "synth has no q2_k: " << m.message();
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
  EXPECT_LT(test::normalized_error(logits, ref.back()), 5e-2);
  be->release_weights();
}

TEST(CudaFallback, MemoryLimitRunsTheRestOnTheCpu) {
  std::string why = test::cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
  auto m = load_model(synth("llama", "f32", 256, 2048));  // each FFN matrix: 2 MiB
  ASSERT_TRUE(m.ok());
  CudaOptions o;
  o.memory_limit = 6ull << 20;  // room for some weights only
  auto be = CudaBackend::create(o);
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
  std::vector<float> logits(static_cast<size_t>((*m)->hp.n_vocab));
  ASSERT_TRUE(fwd.eval(tokens, 0, logits.data()).ok());
  EXPECT_LT(test::normalized_error(logits, ref.back()), 1e-2);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// tests/data holds llama.cpp's greedy text, which the CPU backend reproduces
// exactly (tests/model/stories_greedy_test.cpp).
TEST(CudaStories260K, GreedyEqualsCpu) {
  LOOM_FIXTURE_OR_SKIP(path, "gguf/stories260K.gguf");
  LOOM_CUDA_BACKEND_OR_SKIP(be);
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
    const std::string expected_all =
        read_text(data_dir + "/stories260k_greedy_" + std::to_string(i + 1) + ".txt");
    const std::string head = std::string(" ") + prompts[i];
    ASSERT_EQ(expected_all.compare(0, head.size(), head), 0) << "missing tests/data text " << i + 1;
    auto rstrip = [](std::string t) {
      while (!t.empty() && t.back() == '\n') t.pop_back();
      return t;
    };
    EXPECT_EQ(rstrip(expected_all.substr(head.size())), rstrip(text)) << "prompt " << i + 1;
  }
  be->release_weights();
}

}  // namespace
}  // namespace loom
