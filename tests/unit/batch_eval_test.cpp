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
#include "tests/test_util.h"
#include "tests/unit/vulkan_test_util.h"

namespace loom {
namespace {

std::unique_ptr<Model> synth(const std::string& arch, const std::string& dtype) {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 3;
  s.n_embd = 128;
  s.n_ff = 320;
  s.n_head = 4;
  s.n_head_kv = arch == "phi3" ? 4 : 2;
  s.n_ctx = 128;
  s.weight_type = dtype;
  s.seed = 11;
  const std::string path = test::temp_dir("batch_" + arch + "_" + dtype) + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  auto m = load_model(path);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Three sequences over a few steps: which tokens of each go in a step, and
// whether it wants logits. Prompt chunks of 5/4/6 rows, then 4 + a decode
// token + 7 (the rows wanting logits sit before and between others), then
// decode steps of all three.
struct Part {
  int seq;
  int64_t from, n;  ///< tokens [from, from + n) of the sequence's stream
  bool logits;
};
std::vector<std::vector<Part>> script() {
  std::vector<std::vector<Part>> steps = {
      {{0, 0, 5, false}, {1, 0, 4, true}, {2, 0, 6, false}},
      {{0, 5, 4, true}, {1, 4, 1, true}, {2, 6, 7, true}},
  };
  int64_t pos[3] = {9, 5, 13};
  for (int s = 0; s < 6; ++s) {
    std::vector<Part> step;
    for (int q = 0; q < 3; ++q) step.push_back({q, pos[q]++, 1, true});
    if (s == 3) std::swap(step[0], step[2]);  // another order
    steps.push_back(step);
  }
  return steps;
}

// The tokens of sequence q (prompt and forced "generated" ones alike).
std::vector<int32_t> stream(int q, int64_t n_vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < 32; ++i) t.push_back(static_cast<int32_t>((q * 97 + i * 31 + 1) % n_vocab));
  return t;
}

using Logits = std::vector<std::vector<float>>;  // per (step, part) that wants them

// The script batched in one shared pass (`batched`) or each sequence alone in
// its own pass; `setup` readies a pass (placement) before use.
Logits run(const Model& m, Backend& be, DType kv_dtype, bool batched,
           const std::function<void(ForwardPass&)>& setup) {
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.kv_dtype = kv_dtype;
  std::vector<std::unique_ptr<Session>> ss;
  for (int q = 0; q < 3; ++q) {
    auto s = q > 0 && batched ? Session::create_sharing(*ss[0], sc) : Session::create(m, be, sc);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return {};
    if (q == 0 || !batched) setup((*s)->forward());
    ss.push_back(std::move(s).value());
  }
  const int64_t V = m.hp.n_vocab;
  std::vector<std::vector<int32_t>> toks;
  for (int q = 0; q < 3; ++q) toks.push_back(stream(q, V));
  Logits out;
  for (const auto& step : script()) {
    std::vector<std::vector<float>> lg(step.size(), std::vector<float>(static_cast<size_t>(V)));
    std::vector<Session::BatchItem> items;
    for (size_t i = 0; i < step.size(); ++i) {
      const Part& p = step[i];
      Session::BatchItem it;
      it.session = ss[static_cast<size_t>(p.seq)].get();
      it.tokens = std::span<const int32_t>(toks[static_cast<size_t>(p.seq)].data() + p.from,
                                           static_cast<size_t>(p.n));
      it.logits = p.logits ? lg[i].data() : nullptr;
      items.push_back(it);
    }
    if (batched) {
      Session::append_batch(items);
      for (const auto& it : items) EXPECT_TRUE(it.status.ok()) << it.status.message();
    } else {
      for (auto& it : items) {
        const Status st = it.session->append(it.tokens, it.logits);
        EXPECT_TRUE(st.ok()) << st.message();
      }
    }
    for (size_t i = 0; i < step.size(); ++i)
      if (step[i].logits) out.push_back(std::move(lg[i]));
  }
  for (int q = 0; q < 3; ++q) {
    int64_t n = 0;
    for (const auto& step : script())
      for (const Part& p : step)
        if (p.seq == q) n += p.n;
    EXPECT_EQ(ss[static_cast<size_t>(q)]->kv().n_tokens(), n);
  }
  return out;
}

// max |a - b| / max |b| over all logits; and whether every argmax agrees.
void expect_close(const Logits& a, const Logits& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a[i].size(); ++j) {
      err = std::max(err, static_cast<double>(std::fabs(a[i][j] - b[i][j])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i][j])));
    }
    const auto am = std::max_element(a[i].begin(), a[i].end()) - a[i].begin();
    const auto bm = std::max_element(b[i].begin(), b[i].end()) - b[i].begin();
    EXPECT_EQ(am, bm) << what << ": logits row " << i;
  }
  EXPECT_LE(err / scale, tol) << what;
}

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
  auto m = synth(c.arch, c.dtype);
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
  auto m = synth("llama", "q8_0");
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
  auto m = synth("llama", "f32");
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  for (const Placement& p : gpu_placements(m->hp.n_layer))
    expect_take_prefix_equal(*m, *gpu, placed(cpu, p));
}

TEST(BatchEvalVulkan, EqualsSequencesRunAlone) {
  LOOM_VULKAN_OR_SKIP(gpu, false);
  auto m = synth("llama", "f32");
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
  auto m = synth("llama", "f32");
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
  auto m = synth("llama", "q8_0");
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
