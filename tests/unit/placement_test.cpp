// Placements: JSON, validation, byte accounting, the strategies, the cost
// model, requantized groups, moving a layer's KV, and live re-placement on
// the CPU. (Mixed CPU/GPU placements: vulkan_placement_test.cpp.)
#include "engine/placement/placement.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/synth.h"
#include "engine/placement/cost_model.h"
#include "engine/placement/requant.h"
#include "engine/placement/strategy.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::unique_ptr<Model> synth_model(const std::string& dtype, int64_t n_layer = 4,
                                   int64_t n_embd = 256, uint64_t seed = 11,
                                   const std::string& arch = "llama") {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = n_layer;
  s.n_embd = n_embd;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ctx = 128;
  s.weight_type = dtype;
  s.seed = seed;
  const std::string path =
      test::temp_dir("placement_" + arch + dtype + std::to_string(n_layer)) + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  auto m = load_model(path);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

TEST(Placement, JsonRoundTripAndErrors) {
  Placement p = Placement::uniform(3, Unit::kCpu);
  p.strategy = "custom";
  p.layers[1][OpGroup::kFfn] = GroupPlace{Unit::kGpu, DType::kQ4_0};
  p.output = GroupPlace{Unit::kGpu, DType::kQ8_0};
  auto back = Placement::from_json(p.to_json(), 3);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_TRUE(back->same_as(p));
  EXPECT_EQ(back->strategy, "custom");

  auto wrong_layers = Placement::from_json(p.to_json(), 4);
  ASSERT_FALSE(wrong_layers.ok());
  EXPECT_NE(wrong_layers.message().find("3 layers, but the model has 4"), std::string::npos)
      << wrong_layers.message();
  std::string bad_unit = p.to_json();
  bad_unit.replace(bad_unit.find("\"gpu\""), 5, "\"tpu\"");
  auto u = Placement::from_json(bad_unit, 3);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.message().find("unknown unit 'tpu'"), std::string::npos) << u.message();
  std::string bad_dtype = p.to_json();
  bad_dtype.replace(bad_dtype.find("Q4_0"), 4, "Q9_9");
  auto d = Placement::from_json(bad_dtype, 3);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.message().find("layer 1 ffn: unknown dtype 'Q9_9'"), std::string::npos)
      << d.message();
  EXPECT_FALSE(Placement::from_json("{not json", 3).ok());
  auto missing = Placement::load(test::temp_dir("placement_missing") + "/none.json", 3);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("cannot open"), std::string::npos);
}

TEST(Placement, ValidationNamesTheTensor) {
  auto m = synth_model("f32", 2, 64);  // rows of 64: no K-quant block fits
  ASSERT_TRUE(m);
  Placement p = Placement::uniform(2, Unit::kCpu);
  p.layers[1][OpGroup::kAttnW].dtype = DType::kQ4_K;
  Status s = validate_placement(*m, p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer 1 attn_w"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("blk.1.attn_q.weight"), std::string::npos) << s.message();
  p.layers[1][OpGroup::kAttnW].dtype = DType::kQ8_0;
  EXPECT_TRUE(validate_placement(*m, p).ok());
}

TEST(Placement, BytesFollowUnitsAndPrecision) {
  auto m = synth_model("f32");
  ASSERT_TRUE(m);
  const uint64_t kv_layer = kv_bytes_per_layer(*m, 128, DType::kF16);
  EXPECT_EQ(kv_layer, 2ull * 128 * 2 * 64 * 2);  // K and V, 128 tokens, 2 heads of 64 F16
  Placement cpu = Placement::uniform(4, Unit::kCpu);
  const PlacementBytes a = placement_bytes(*m, cpu, kv_layer);
  EXPECT_EQ(a.on(Unit::kGpu), 0u);
  EXPECT_EQ(a.weights[0], m->weight_bytes());
  EXPECT_EQ(a.kv[0], 4 * kv_layer);
  Placement mixed = cpu;
  mixed.layers[0][OpGroup::kFfn] = GroupPlace{Unit::kGpu, DType::kQ8_0};
  const PlacementBytes b = placement_bytes(*m, mixed, kv_layer);
  // Three FFN matrices of 256 x 512 in Q8_0: 34 bytes per 32 values.
  EXPECT_EQ(b.weights[1], 3ull * 256 * 512 / 32 * 34);
}

TEST(Strategy, ParseSize) {
  EXPECT_EQ(parse_size("8G"), 8ull << 30);
  EXPECT_EQ(parse_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_size("1.5g"), 3ull << 29);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_FALSE(parse_size("lots"));
  EXPECT_FALSE(parse_size("8Q"));
}

// The prefill chunk: the longest whose working memory takes at most 1/16 of
// the GPU's, the CPU's without a GPU or with too little memory.
TEST(Strategy, DefaultPrefillChunkFollowsTheGpusMemory) {
  auto m = synth_model("f32");
  ASSERT_TRUE(m);
  EXPECT_EQ(default_prefill_chunk(*m, 0), kCpuPrefillChunk);
  EXPECT_EQ(default_prefill_chunk(*m, 80ull << 30), kGpuPrefillChunk);
  EXPECT_EQ(default_prefill_chunk(*m, 16 * gpu_overhead_bytes(*m, 1024)), 1024);
  EXPECT_EQ(default_prefill_chunk(*m, 16 * gpu_overhead_bytes(*m, 1024) - 1), 512);
  EXPECT_EQ(default_prefill_chunk(*m, 16 * gpu_overhead_bytes(*m, 512) - 1), kCpuPrefillChunk);
  // The prompt GEMMs' scratch is counted: at least the FFN's up product in F32.
  EXPECT_GE(gpu_overhead_bytes(*m, 1024) - gpu_overhead_bytes(*m, 512),
            512u * 4 * static_cast<uint64_t>(m->hp.n_ff));
}

// Without --kv-gpu: no limit while the GPU layers' KV fits beside the
// weights; else what is left of the device, less a margin.
TEST(Strategy, DefaultDeviceKvBudgetComesFromTheDevicesMemory) {
  auto m = synth_model("f32");
  ASSERT_TRUE(m);
  StrategyOptions o;
  o.n_ctx = 4096;
  o.max_chunk = 16;
  const Placement gpu = Placement::uniform(4, Unit::kGpu);
  const PlacementBytes b = placement_bytes(*m, gpu, kv_bytes_per_layer(*m, o.n_ctx, o.kv_dtype));
  const uint64_t w =
      b.weights[static_cast<size_t>(Unit::kGpu)] + gpu_overhead_bytes(*m, o.max_chunk);
  const uint64_t kv = b.kv[static_cast<size_t>(Unit::kGpu)];
  ASSERT_GT(kv, 0u);
  EXPECT_EQ(default_kv_device_budget(*m, gpu, o, w + kv), 0u);  // it all fits
  EXPECT_EQ(default_kv_device_budget(*m, gpu, o, 0), 0u);       // no GPU memory known
  const uint64_t half = default_kv_device_budget(*m, gpu, o, w + kv / 2);
  EXPECT_EQ(half, kv / 2 - kv / 2 / 16);                       // what is left, less 1/16
  EXPECT_EQ(default_kv_device_budget(*m, gpu, o, w / 2), 1u);  // nothing left: too small
  EXPECT_EQ(default_kv_device_budget(*m, Placement::uniform(4, Unit::kCpu), o, w), 0u);
}

TEST(Strategy, EachStrategyMakesTheDocumentedPlacement) {
  auto m = synth_model("f32");
  ASSERT_TRUE(m);
  const CostModel cost = CostModel::defaults();
  StrategyOptions o;
  o.n_ctx = 128;
  o.max_chunk = 16;
  o.strategy = "cpu";
  auto cpu = make_placement(*m, o, cost);
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->uses(Unit::kGpu));

  o.strategy = "gpu";
  auto gpu = make_placement(*m, o, cost);
  ASSERT_TRUE(gpu.ok());
  EXPECT_FALSE(gpu->uses(Unit::kCpu));

  o.strategy = "layers:2";
  auto l2 = make_placement(*m, o, cost);
  ASSERT_TRUE(l2.ok());
  for (int64_t l = 0; l < 4; ++l) {
    for (const auto& g : l2->layers[static_cast<size_t>(l)].g)
      EXPECT_EQ(g.unit, l < 2 ? Unit::kGpu : Unit::kCpu);
  }
  EXPECT_EQ(l2->output.unit, Unit::kCpu);
  o.strategy = "layers:x";
  EXPECT_FALSE(make_placement(*m, o, cost).ok());

  // attn-gpu under a budget: attention everywhere, FFNs from layer 0 while they fit.
  const uint64_t kv_layer = kv_bytes_per_layer(*m, 128, DType::kF16);
  Placement attn_only = Placement::uniform(4, Unit::kCpu);
  for (auto& lp : attn_only.layers) {
    for (OpGroup g : {OpGroup::kAttnW, OpGroup::kAttn, OpGroup::kNorm}) lp[g].unit = Unit::kGpu;
  }
  const uint64_t attn_bytes = placement_bytes(*m, attn_only, kv_layer).on(Unit::kGpu);
  const uint64_t ffn_bytes =
      placement_bytes(*m, attn_only, kv_layer).layer[0][static_cast<size_t>(OpGroup::kFfn)];
  o.strategy = "attn-gpu";
  o.vram_budget = attn_bytes + 2 * ffn_bytes + ffn_bytes / 2 + gpu_overhead_bytes(*m, 16);
  auto ag = make_placement(*m, o, cost);
  ASSERT_TRUE(ag.ok());
  for (int64_t l = 0; l < 4; ++l) {
    const LayerPlace& lp = ag->layers[static_cast<size_t>(l)];
    EXPECT_EQ(lp[OpGroup::kAttn].unit, Unit::kGpu);
    EXPECT_EQ(lp[OpGroup::kFfn].unit, l < 2 ? Unit::kGpu : Unit::kCpu) << "layer " << l;
  }
  EXPECT_LE(placement_bytes(*m, *ag, kv_layer).on(Unit::kGpu) + gpu_overhead_bytes(*m, 16),
            o.vram_budget);

  // auto: within the budget, and no slower (by its own model) than the others
  // that fit, but for the margin it gives two-switch runs of whole layers.
  o.strategy = "auto";
  auto au = make_placement(*m, o, cost);
  ASSERT_TRUE(au.ok());
  EXPECT_EQ(au->strategy, "auto");
  EXPECT_LE(placement_bytes(*m, *au, kv_layer).on(Unit::kGpu) + gpu_overhead_bytes(*m, 16),
            o.vram_budget);
  const double t_auto = cost.predict(*m, *au, 64, DType::kF16).step_ms;
  EXPECT_LE(t_auto, 1.15 * cost.predict(*m, *ag, 64, DType::kF16).step_ms + 1e-9);
  EXPECT_LE(t_auto, 1.15 * cost.predict(*m, *cpu, 64, DType::kF16).step_ms + 1e-9);
  // ... nor than the most whole layers that fit (layers:N), at the context auto plans for.
  const int64_t n_past = std::max<int64_t>(1, o.n_ctx / 2);
  for (int64_t n = 4; n >= 0; --n) {
    StrategyOptions ol = o;
    ol.strategy = "layers:" + std::to_string(n);
    auto ln = make_placement(*m, ol, cost);
    ASSERT_TRUE(ln.ok());
    if (placement_bytes(*m, *ln, kv_layer).on(Unit::kGpu) + gpu_overhead_bytes(*m, 16) >
        o.vram_budget)
      continue;
    EXPECT_LE(cost.predict(*m, *au, n_past, DType::kF16).step_ms,
              cost.predict(*m, *ln, n_past, DType::kF16).step_ms + 1e-9)
        << ol.strategy;
    break;
  }
  // With room for everything, auto puts everything on the (much faster) GPU.
  o.vram_budget = 0;
  auto all = make_placement(*m, o, cost);
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(all->uses(Unit::kCpu) && all->layers[0][OpGroup::kFfn].unit == Unit::kCpu);

  o.has_gpu = false;
  auto none = make_placement(*m, o, cost);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("needs a GPU"), std::string::npos);
  o.strategy = "fastest";
  o.has_gpu = true;
  EXPECT_FALSE(make_placement(*m, o, cost).ok());
}

// gemma2's attention stays on the CPU (keep_host_ops_on_cpu): auto plans with
// it there (its KV not counted against the budget), and is, by its own
// model, no slower than any whole-layers placement that fits.
TEST(Strategy, AutoPlansGemma2WithItsAttentionOnTheCpu) {
  auto m = synth_model("f32", 4, 256, 11, "gemma2");
  ASSERT_TRUE(m);
  ASSERT_FALSE(m->host_attention_reason().empty());
  const CostModel cost = CostModel::defaults();
  StrategyOptions o;
  o.n_ctx = 128;
  o.max_chunk = 16;
  const uint64_t kv_layer = kv_bytes_per_layer(*m, 128, DType::kF16);
  const uint64_t all =
      placement_bytes(*m, Placement::uniform(4, Unit::kGpu), kv_layer).on(Unit::kGpu);
  const int64_t n_past = 64;
  for (const uint64_t budget : {all / 3, all / 2, 3 * all / 4}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    o.vram_budget = budget + gpu_overhead_bytes(*m, 16);
    o.strategy = "auto";
    auto au = make_placement(*m, o, cost);
    ASSERT_TRUE(au.ok()) << au.message();
    for (const LayerPlace& lp : au->layers) EXPECT_EQ(lp[OpGroup::kAttn].unit, Unit::kCpu);
    EXPECT_LE(placement_bytes(*m, *au, kv_layer).on(Unit::kGpu), budget);
    const double t_auto = cost.predict(*m, *au, n_past, DType::kF16).step_ms;
    for (int64_t n = 0; n <= 4; ++n) {
      StrategyOptions ol = o;
      ol.strategy = "layers:" + std::to_string(n);
      auto ln = make_placement(*m, ol, cost);
      ASSERT_TRUE(ln.ok());
      if (placement_bytes(*m, *ln, kv_layer).on(Unit::kGpu) > budget) continue;
      EXPECT_LE(t_auto, cost.predict(*m, *ln, n_past, DType::kF16).step_ms + 1e-9) << ol.strategy;
    }
  }
}

TEST(CostModel, TransfersCountedWhereUnitsChange) {
  auto m = synth_model("f32");
  ASSERT_TRUE(m);
  const CostModel cost = CostModel::defaults();
  auto p = Placement::uniform(4, Unit::kCpu);
  EXPECT_EQ(cost.predict(*m, p, 10, DType::kF16).transfers, 0);
  p.layers[2][OpGroup::kFfn].unit = Unit::kGpu;  // xb there, xb back
  EXPECT_EQ(cost.predict(*m, p, 10, DType::kF16).transfers, 2);
  auto g = Placement::uniform(4, Unit::kGpu);
  EXPECT_EQ(cost.predict(*m, g, 10, DType::kF16).transfers, 1);  // the logits
}

TEST(CostModel, CalibrationMeasuresTheCpu) {
  auto m = synth_model("q8_0");
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  auto c = calibrate(*m, cpu, nullptr);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(c->measured);
  EXPECT_GT(c->unit[0].bytes_per_s, 1e8);
  EXPECT_GE(c->unit[0].op_s, 0.0);
}

// Requantizing a group at load gives the weights a file of that type holds:
// an F32 model run as Q8_0 equals the Q8_0 model written from the same values.
TEST(Requant, F32GroupsAsQ8_0EqualTheQ8_0File) {
  auto f32 = synth_model("f32", 2, 256, 5);
  auto q8 = synth_model("q8_0", 2, 256, 5);
  ASSERT_TRUE(f32 && q8);
  CpuBackend cpu(2);
  const std::vector<int32_t> tokens = {1, 40, 200, 7, 99};
  auto logits_of = [&](const Model& m, const Placement* p) {
    auto kv = KvCache::create({m.hp.n_layer, m.hp.n_head_kv, m.hp.head_dim, 64, 16, DType::kF16});
    EXPECT_TRUE(kv.ok());
    ForwardPass fwd(m, cpu, **kv);
    if (p) {
      EXPECT_TRUE(fwd.set_placement(*p).ok());
    }
    std::vector<float> out(static_cast<size_t>(m.hp.n_vocab));
    const Status s = fwd.eval(tokens, 0, out.data());
    EXPECT_TRUE(s.ok()) << s.message();
    if (p) {
      EXPECT_GT(fwd.requant_bytes(), 0u);
    }
    return out;
  };
  Placement p = Placement::uniform(2, Unit::kCpu);
  for (auto& lp : p.layers) lp[OpGroup::kAttnW].dtype = lp[OpGroup::kFfn].dtype = DType::kQ8_0;
  p.embed.dtype = p.output.dtype = DType::kQ8_0;
  EXPECT_EQ(logits_of(*f32, &p), logits_of(*q8, nullptr));
}

TEST(Requant, StoreKeepsOneCopyPerTensorAndType) {
  auto m = synth_model("q8_0", 2, 256);
  ASSERT_TRUE(m);
  RequantStore store;
  const Weight& wq = m->layers[0].wq;
  auto a = store.get(wq, DType::kQ4_0);
  auto b = store.get(wq, DType::kQ4_0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->data, b->data);
  EXPECT_EQ(a->dtype, DType::kQ4_0);
  EXPECT_EQ(a->name(), "blk.0.attn_q.weight@Q4_0");
  EXPECT_EQ(store.bytes(), static_cast<uint64_t>(wq.n_out) * (wq.n_in / 32) * 18);
  auto same = store.get(wq, DType::kQ8_0);  // its own type: the file's bytes
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->data, wq.data);
  auto k_quant = store.get(m->layers[0].wq, DType::kQ2_K);  // rows of 256: fine
  EXPECT_TRUE(k_quant.ok()) << k_quant.message();
  store.retain({});
  EXPECT_EQ(store.bytes(), 0u);
}

// Resident copies (what the CPU streams, on huge pages): the file's bytes,
// one copy per tensor that its row ranges share, none where the copy fails,
// and gone when no placement keeps them. (Tensors under 1 MiB are not
// copied: most of a huge page would go unused.)
TEST(Requant, ResidentCopiesHoldTheFilesBytes) {
  auto m = synth_model("q8_0", 2, 1024);  // 1.1 MB a projection: smaller ones stay in the file
  ASSERT_TRUE(m);
  RequantStore store;
  const Weight& wq = m->layers[0].wq;
  const uint64_t tensor_bytes = wq.tensor->n_bytes;
  // What a copy would take: nothing where none would be on huge pages.
  const bool huge = HugeBuffer::would_map(static_cast<size_t>(tensor_bytes));
  EXPECT_EQ(store.resident_cost(wq), huge ? tensor_bytes : 0u);
  // k (512 rows, 557 KB) is under 1 MiB: no copy, no cost.
  const Weight& wk = m->layers[0].wk;
  EXPECT_EQ(store.resident_cost(wk), 0u);
  EXPECT_EQ(store.resident(wk).data, wk.data);
  const Weight r = store.resident(wq);
  if (r.data == wq.data) {
    GTEST_SKIP() << "no huge pages here (transparent huge pages off, or AddressSanitizer): "
                    "weights stay in the file's mapping";
  }
  EXPECT_EQ(r.dtype, wq.dtype);
  EXPECT_EQ(r.name(), wq.name());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data) % kHugePageBytes, 0u);
  EXPECT_EQ(0, std::memcmp(r.data, wq.data, tensor_bytes));
  EXPECT_EQ(store.resident(wq).data, r.data);
  EXPECT_EQ(store.resident_cost(wq), 0u);
  const Weight part = store.resident(wq.rows(16, 32));
  EXPECT_EQ(part.data, static_cast<const uint8_t*>(r.data) + 16 * wq.row_bytes);
  EXPECT_EQ(part.n_out, 32);
  EXPECT_EQ(store.bytes(), tensor_bytes);
  // A copy that fails leaves the weight in the file.
  const Weight& wo = m->layers[0].wo;
  EXPECT_EQ(store.resident_cost(wo), wo.tensor->n_bytes);
  const Weight failed = store.resident(wo, [](uint8_t*, const uint8_t*, size_t) { return false; });
  EXPECT_EQ(failed.data, wo.data);
  EXPECT_EQ(store.bytes(), tensor_bytes);
  store.retain({{wq.tensor_begin(), wq.dtype}});
  EXPECT_EQ(store.bytes(), tensor_bytes);
  store.retain({});
  EXPECT_EQ(store.bytes(), 0u);
}

// The CPU gives the same logits from resident copies as from the file's
// mapping, and moving a layer to another placement drops or makes copies.
TEST(Requant, ResidentWeightsGiveTheFilesLogits) {
  auto m = synth_model("q4_0", 3, 2048, 21);  // q and o projections of 2.4 MB
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  const std::vector<int32_t> tokens = {3, 17, 250, 9};
  auto run = [&](bool resident, uint64_t* copies) {
    auto kv =
        KvCache::create({m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, 64, 16, DType::kF16});
    EXPECT_TRUE(kv.ok());
    ForwardPass fwd(*m, cpu, **kv);
    fwd.set_resident_weights(resident);
    std::vector<float> out(static_cast<size_t>(m->hp.n_vocab));
    const Status s = fwd.eval(tokens, 0, out.data());
    EXPECT_TRUE(s.ok()) << s.message();
    *copies = fwd.requant_bytes();
    return out;
  };
  uint64_t with = 0, without = 0;
  const auto a = run(true, &with);
  const auto b = run(false, &without);
  EXPECT_EQ(a, b);
  EXPECT_EQ(without, 0u);
  HugeBuffer probe;  // huge pages here (THP on, not under AddressSanitizer)?
  if (probe.allocate(kHugePageBytes) && probe.huge())
    EXPECT_GT(with, 0u);
  else
    EXPECT_EQ(with, 0u);
}

// A KvStorage in host memory, holding rows in the transfer format, to test
// the cache's side of moving a layer.
class HostKvStorage final : public KvStorage {
 public:
  explicit HostKvStorage(const KvCacheConfig& c) : c_(c) {}
  Status reserve(int64_t) override { return {}; }
  uint64_t allocated_bytes() const override { return 0; }
  bool layer_resident(int64_t l) const override { return k_.count(l) > 0; }
  Status set_layer_resident(int64_t l, bool r) override {
    if (r)
      k_[l], v_[l];
    else
      k_.erase(l), v_.erase(l);
    return {};
  }
  Status export_layer(int64_t l, int64_t n, uint8_t* k, uint8_t* v) override {
    std::memcpy(k, k_[l].data(), bytes(n));
    std::memcpy(v, v_[l].data(), bytes(n));
    return {};
  }
  Status import_layer(int64_t l, int64_t n, const uint8_t* k, const uint8_t* v) override {
    k_[l].assign(k, k + bytes(n));
    v_[l].assign(v, v + bytes(n));
    return {};
  }
  size_t bytes(int64_t n) const {
    return static_cast<size_t>(n * c_.n_kv_heads) *
           *dtype_row_bytes(c_.dtype, static_cast<uint64_t>(c_.head_dim));
  }
  KvCacheConfig c_;
  std::map<int64_t, std::vector<uint8_t>> k_, v_;
};

TEST(KvMove, LayerRoundTripKeepsEveryByte) {
  for (DType dt : {DType::kF16, DType::kQ8_0}) {
    KvCacheConfig c{3, 2, 64, 100, 16, dt};
    auto kv = KvCache::create(c);
    ASSERT_TRUE(kv.ok());
    const int64_t n = 37;  // two full blocks and a tail
    ASSERT_TRUE((*kv)->reserve(n).ok());
    std::vector<float> k(128), v(128);
    for (int64_t t = 0; t < n; ++t) {
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = std::sin(static_cast<float>(t * 131 + static_cast<int64_t>(i)));
        v[i] = std::cos(static_cast<float>(t * 71 + static_cast<int64_t>(i)));
      }
      for (int64_t l = 0; l < 3; ++l) (*kv)->store(l, t, k.data(), v.data());
    }
    (*kv)->set_n_tokens(n);
    auto snapshot = [&](int64_t l) {
      const cpu::KvView view = (*kv)->view(l);
      std::vector<uint8_t> out;
      const size_t row = view.head_stride_bytes / static_cast<size_t>(view.block_size);
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t t = 0; t < n; ++t) {
          for (const void* const* blocks : {view.k_blocks, view.v_blocks}) {
            const auto* b = static_cast<const uint8_t*>(blocks[t / 16]) +
                            static_cast<size_t>(h) * view.head_stride_bytes +
                            static_cast<size_t>(t % 16) * row;
            out.insert(out.end(), b, b + row);
          }
        }
      }
      return out;
    };
    const auto before = snapshot(1);
    auto* st = new HostKvStorage(c);
    ASSERT_TRUE((*kv)->attach_storage(std::unique_ptr<KvStorage>(st)).ok());
    const uint64_t host_bytes = (*kv)->allocated_bytes();
    ASSERT_TRUE((*kv)->move_layer(1, true).ok());
    EXPECT_TRUE((*kv)->on_device(1));
    EXPECT_FALSE((*kv)->on_device(0));
    EXPECT_EQ((*kv)->allocated_bytes(), host_bytes * 2 / 3);  // layer 1's host blocks are gone
    ASSERT_TRUE((*kv)->move_layer(1, false).ok());
    EXPECT_FALSE((*kv)->on_device(1));
    EXPECT_EQ(snapshot(1), before) << dtype_name(dt);
    EXPECT_FALSE((*kv)->move_layer(5, true).ok());
  }
}

std::vector<int32_t> greedy(Session& s, const std::vector<int32_t>& prompt, int64_t n,
                            const std::function<void(Session&, int64_t)>& at_token = {}) {
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = n;
  gp.stop_at_eog = false;
  int64_t i = 0;
  auto r = s.generate(prompt, gp, [&](std::string_view) {
    if (at_token) at_token(s, i);
    ++i;
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.message();
  return s.tokens();
}

// Re-placing between two tokens (here: requantizing the FFNs and back, on the
// CPU) moves weights while generation goes on; with the same precision at the
// end, the tokens after the switch are computed by the same weights.
TEST(LivePlacement, SwitchMidGenerationOnTheCpu) {
  auto m = synth_model("q8_0", 3, 256);
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  const std::vector<int32_t> prompt = {1, 50, 60, 70};
  auto a = Session::create(*m, cpu, sc);
  ASSERT_TRUE(a.ok());
  const auto plain = greedy(**a, prompt, 20);

  auto b = Session::create(*m, cpu, sc);
  ASSERT_TRUE(b.ok());
  Placement layers_split = Placement::uniform(3, Unit::kCpu);
  layers_split.strategy = "cpu-again";
  std::vector<Status> outcomes;
  const auto switched = greedy(**b, prompt, 20, [&](Session& s, int64_t i) {
    if (i == 8)
      s.request_placement(layers_split, [&](const Status& st) { outcomes.push_back(st); });
  });
  EXPECT_EQ(plain, switched);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].ok());
  EXPECT_EQ((*b)->forward().placement().strategy, "cpu-again");

  // A placement that cannot run (GPU without one) is refused; generation goes on unchanged.
  auto c = Session::create(*m, cpu, sc);
  ASSERT_TRUE(c.ok());
  outcomes.clear();
  const auto refused = greedy(**c, prompt, 20, [&](Session& s, int64_t i) {
    if (i == 5)
      s.request_placement(Placement::uniform(3, Unit::kGpu),
                          [&](const Status& st) { outcomes.push_back(st); });
  });
  EXPECT_EQ(plain, refused);
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].ok());
  EXPECT_NE(outcomes[0].message().find("no GPU backend"), std::string::npos)
      << outcomes[0].message();
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(LivePlacement, ProgressIsReportedAndCancelKeepsThePlacement) {
  auto m = synth_model("q8_0", 3, 256);
  ASSERT_TRUE(m);
  CpuBackend cpu(2);
  auto kv = KvCache::create({3, 2, 64, 64, 16, DType::kF16});
  ASSERT_TRUE(kv.ok());
  ForwardPass fwd(*m, cpu, **kv);
  std::vector<double> seen;
  fwd.set_progress([&](double f) {
    seen.push_back(f);
    return true;
  });
  ASSERT_TRUE(fwd.prepare().ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), 1.0);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]);

  std::vector<float> before(static_cast<size_t>(m->hp.n_vocab)), after(before.size());
  ASSERT_TRUE(fwd.eval(std::vector<int32_t>{1, 2, 3}, 0, before.data()).ok());
  Placement q4 = Placement::uniform(3, Unit::kCpu);
  for (auto& lp : q4.layers) lp[OpGroup::kFfn].dtype = DType::kQ4_0;
  fwd.set_progress([](double f) { return f < 0.3; });  // cancel on the way
  const Status s = fwd.set_placement(q4);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kCancelled);
  EXPECT_FALSE(fwd.placement().layers[0][OpGroup::kFfn].dtype.has_value());
  (*kv)->clear();
  ASSERT_TRUE(fwd.eval(std::vector<int32_t>{1, 2, 3}, 0, after.data()).ok());
  EXPECT_EQ(before, after);
}

}  // namespace
}  // namespace loom
