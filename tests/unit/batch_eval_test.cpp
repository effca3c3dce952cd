// Continuous batching in the engine: ForwardPass::eval_batch steps several
// sequences (each with its own KV cache) through one forward pass, their rows
// in the same matmuls. Each sequence's logits must equal those of the same
// sequence run alone in its own pass, through prompt chunks of odd sizes
// mixed with decode steps, on the CPU and (lavapipe or a GPU) on Vulkan under
// an all-GPU and a mixed placement; the errors of a malformed step;
// Session::append_batch falling back to one session at a time; and one
// session taking another's prompt prefix (its KV copied, not evaluated).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/batch_script.h"
#include "tests/test_util.h"
#include "tests/unit/vulkan_test_util.h"

namespace loom {
namespace {

using test::expect_close;
using test::Logits;
using test::run;
using test::stream;
using test::synth_batch_model;

struct Case {
  const char* arch;
  const char* dtype;
  DType kv;
  double tol = 1e-4;
};

class BatchEval : public ::testing::TestWithParam<Case> {};

// On the CPU a decode row batched with others goes through the matmuls'
// multi-row paths instead of the single-row ones. Quantized weights see the
// same Q8 activations either way (the logits agree to float rounding); dense
// weights above 6 rows may go to oneDNN's kernel (cpu_backend.cpp), whose
// F16 path differs more (3.7e-4 measured on qwen2 f16), hence its bound.
TEST_P(BatchEval, CpuEqualsSequencesRunAlone) {
  const Case c = GetParam();
  auto m = synth_batch_model(c.arch, c.dtype);
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  auto none = [](ForwardPass&) {};
  const Logits alone = run(*m, cpu, c.kv, false, none);
  const Logits batch = run(*m, cpu, c.kv, true, none);
  expect_close(batch, alone, c.tol, std::string(c.arch) + " " + c.dtype);
}

const Case kCases[] = {
    {"llama", "f32", DType::kF16},   {"llama", "q8_0", DType::kF16},
    {"llama", "q4_k", DType::kQ8_0}, {"qwen2", "f16", DType::kF16, 2e-3},
    {"phi3", "q4_0", DType::kF16},   {"qwen3", "f32", DType::kF16},
    {"gemma2", "f32", DType::kQ8_0},
};
INSTANTIATE_TEST_SUITE_P(Archs, BatchEval, ::testing::ValuesIn(kCases), [](const auto& i) {
  return std::string(i.param.arch) + "_" + i.param.dtype + "_kv" +
         (i.param.kv == DType::kF16 ? "f16" : "q8");
});

// Session::take_prefix: B takes A's first 15 tokens (KvCache::copy_prefix,
// from each layer's place in A to its place in B) and evaluates the rest as A
// did; the logits are the same to the bit.
void expect_take_prefix_equal(const Model& m, Backend& be,
                              const std::function<void(ForwardPass&)>& setup) {
  SessionConfig sc;
  sc.n_ctx = 64;
  auto a = Session::create(m, be, sc);
  ASSERT_TRUE(a.ok());
  setup((*a)->forward());
  auto b = Session::create_sharing(**a, sc);
  ASSERT_TRUE(b.ok());
  const std::vector<int32_t> t = stream(1, m.hp.n_vocab);
  const auto first = std::span<const int32_t>(t).first(15);
  const auto rest = std::span<const int32_t>(t).subspan(15, 9);
  std::vector<float> la(static_cast<size_t>(m.hp.n_vocab)), lb(la.size());
  ASSERT_TRUE((*a)->append(first, nullptr).ok());
  ASSERT_TRUE((*b)->append(std::span<const int32_t>(t).first(3), nullptr).ok());  // replaced
  const Status st = (*b)->take_prefix(**a, 15);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ((*b)->tokens().size(), 15u);
  ASSERT_TRUE((*a)->append(rest, la.data()).ok());
  ASSERT_TRUE((*b)->append(rest, lb.data()).ok());
  EXPECT_EQ(la, lb);
  EXPECT_FALSE((*b)->take_prefix(**a, 99).ok());  // more than A holds
}

TEST(BatchEvalPrefix, TakePrefixOnTheCpu) {
  auto m = synth_batch_model("llama", "q8_0");
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  expect_take_prefix_equal(*m, cpu, [](ForwardPass&) {});
}

#ifdef LOOM_HAVE_VULKAN
// An all-GPU placement, and a mixed one: embedding and layer 0's matmuls on
// the GPU, layer 1's attention there (its KV on the device), the rest on the CPU.
std::vector<Placement> gpu_placements(int64_t n_layer) {
  Placement mixed = Placement::uniform(n_layer, Unit::kCpu);
  mixed.strategy = "custom";
  mixed.embed.unit = Unit::kGpu;
  mixed.layers[0][OpGroup::kAttnW].unit = Unit::kGpu;
  mixed.layers[0][OpGroup::kFfn].unit = Unit::kGpu;
  mixed.layers[1][OpGroup::kAttn].unit = Unit::kGpu;
  mixed.layers[1][OpGroup::kNorm].unit = Unit::kGpu;
  mixed.output.unit = Unit::kGpu;
  return {Placement::uniform(n_layer, Unit::kGpu), mixed};
}

// Readies a pass for placement p, with `cpu` as its CPU unit.
std::function<void(ForwardPass&)> placed(CpuBackend& cpu, const Placement& p) {
  return [&cpu, p](ForwardPass& f) {
    f.set_fallback(&cpu);
    ASSERT_TRUE(f.set_placement(p).ok());
    const Status s = f.prepare();
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(f.notes().empty());
  };
}

// take_prefix with layers whose KV lies on the GPU (all of them, or layer 1's
// only: device to device, host to host).
TEST(BatchEvalPrefix, TakePrefixOnVulkan) {
  LOOM_VULKAN_OR_SKIP(gpu, false);
  auto m = synth_batch_model("llama", "f32");
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  for (const Placement& p : gpu_placements(m->hp.n_layer))
    expect_take_prefix_equal(*m, *gpu, placed(cpu, p));
}

TEST(BatchEvalVulkan, EqualsSequencesRunAlone) {
  LOOM_VULKAN_OR_SKIP(gpu, false);
  auto m = synth_batch_model("llama", "f32");
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  for (const Placement& p : gpu_placements(m->hp.n_layer)) {
    for (DType kv : {DType::kF16, DType::kQ8_0}) {
      const Logits alone = run(*m, *gpu, kv, false, placed(cpu, p));
      const Logits batch = run(*m, *gpu, kv, true, placed(cpu, p));
      expect_close(batch, alone, 2e-3, p.strategy + (kv == DType::kF16 ? " kv f16" : " kv q8_0"));
    }
  }
}
#endif

TEST(BatchEvalErrors, MalformedStepsAreRefused) {
  auto m = synth_batch_model("llama", "f32");
  ASSERT_TRUE(m);
  CpuBackend cpu(1);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.max_chunk = 16;
  auto a = Session::create(*m, cpu, sc);
  ASSERT_TRUE(a.ok());
  auto b = Session::create_sharing(**a, sc);
  ASSERT_TRUE(b.ok());
  auto lone = Session::create(*m, cpu, sc);  // its own pass
  ASSERT_TRUE(lone.ok());
  ForwardPass& f = (*a)->forward();
  KvCache& ka = const_cast<KvCache&>((*a)->kv());
  KvCache& kb = const_cast<KvCache&>((*b)->kv());
  KvCache& kl = const_cast<KvCache&>((*lone)->kv());
  const std::vector<int32_t> t(12, 3), bad = {1, 999999};
  std::vector<float> lg(static_cast<size_t>(m->hp.n_vocab));
  auto expect_error = [&](std::vector<ForwardPass::SeqStep> steps, const char* says) {
    const Status s = f.eval_batch(steps);
    ASSERT_FALSE(s.ok()) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  };
  expect_error({}, "no sequences");
  expect_error({{&ka, t, nullptr}, {&kb, t, lg.data()}}, "at most 16");
  expect_error({{&ka, std::span<const int32_t>(t).first(2), nullptr}, {&ka, t, nullptr}},
               "one cache twice");
  expect_error({{&kl, t, nullptr}}, "not attached");
  expect_error({{&ka, bad, nullptr}}, "outside the vocabulary");
  expect_error({{&ka, {}, nullptr}}, "without tokens");
  EXPECT_EQ(ka.n_tokens(), 0);
  EXPECT_EQ(kb.n_tokens(), 0);
  // A good step after them.
  ASSERT_TRUE(f.eval_batch(std::vector<ForwardPass::SeqStep>{
                               {&ka, std::span<const int32_t>(t).first(4), nullptr},
                               {&kb, std::span<const int32_t>(t).first(9), lg.data()}})
                  .ok());
  EXPECT_EQ(ka.n_tokens(), 4);
  EXPECT_EQ(kb.n_tokens(), 9);
}

// One item that cannot go (more tokens than its context has room for) sends
// the step back to one session at a time: it gets the error, the others go on.
TEST(BatchEvalErrors, AppendBatchFallsBackPerSession) {
  auto m = synth_batch_model("llama", "q8_0");
  ASSERT_TRUE(m);
  CpuBackend cpu(1);
  SessionConfig sc;
  sc.n_ctx = 16;
  auto a = Session::create(*m, cpu, sc);
  ASSERT_TRUE(a.ok());
  auto b = Session::create_sharing(**a, sc);
  ASSERT_TRUE(b.ok());
  const std::vector<int32_t> few(5, 7), many(17, 7);
  std::vector<float> la(static_cast<size_t>(m->hp.n_vocab)), lb(la.size());
  std::vector<Session::BatchItem> items(2);
  items[0].session = a->get();
  items[0].tokens = few;
  items[0].logits = la.data();
  items[1].session = b->get();
  items[1].tokens = many;
  items[1].logits = lb.data();
  Session::append_batch(items);
  EXPECT_TRUE(items[0].status.ok()) << items[0].status.message();
  ASSERT_FALSE(items[1].status.ok());
  EXPECT_NE(items[1].status.message().find("do not fit"), std::string::npos)
      << items[1].status.message();
  EXPECT_EQ((*a)->tokens().size(), 5u);
  EXPECT_EQ((*b)->tokens().size(), 0u);
  // A session gone from the shared pass leaves the others working.
  b->reset();
  std::vector<Session::BatchItem> one(1);
  one[0].session = a->get();
  one[0].tokens = std::span<const int32_t>(few).first(1);
  one[0].logits = la.data();
  Session::append_batch(one);
  EXPECT_TRUE(one[0].status.ok()) << one[0].status.message();
  EXPECT_EQ((*a)->kv().n_tokens(), 6);
}

}  // namespace
}  // namespace loom
