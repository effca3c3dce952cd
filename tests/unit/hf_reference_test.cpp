// Loom's logits for Hugging Face folders against transformers' own
// (tests/data/hf_reference.json): the same synthetic folders that
// tools/hf_reference/make_models.sh wrote for hf_logits.py, where transformers
// ran them in float32. Each entry names the `loom synth` options of its model
// and the config.json keys set on top (mistral: the llama folder under
// Mistral's class); the test writes the same folder, loads it as a user's
// folder is loaded and compares every position's logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cpu/ref/quants.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/hf_export.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/kv_cache.h"
#include "tests/ref_forward.h"
#include "tests/test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// `loom synth` options (those make_models.sh uses) -> the spec the CLI would build.
SynthSpec spec_of(const std::string& args) {
  SynthSpec s;
  std::istringstream in(args);
  std::string flag, v;
  while (in >> flag) {
    if (flag == "--tied") {
      s.tied_output = true;
      continue;
    }
    in >> v;
    if (flag == "--arch")
      s.arch = v;
    else if (flag == "--dtype")
      s.weight_type = v;
    else if (flag == "--seed")
      s.seed = std::stoull(v);
    else if (flag == "--kv-heads")
      s.n_head_kv = std::stoll(v);
    else if (flag == "--sliding-window")
      s.sliding_window = std::stoll(v);
    else
      ADD_FAILURE() << "hf_reference.json: synth option " << flag << " is not known here";
  }
  return s;
}

double embedding_sum(const Weight& w) {
  std::vector<float> row(static_cast<size_t>(w.n_in));
  double sum = 0;
  for (int64_t r = 0; r < w.n_out; ++r) {
    const auto* p = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes;
    EXPECT_TRUE(ref::dequantize_row(w.dtype, p, row.data(), w.n_in).ok());
    for (float x : row) sum += x;
  }
  return sum;
}

TEST(HfReference, LogitsMatchTransformers) {
  const json ref = read_json(std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_reference.json");
  ASSERT_TRUE(ref.contains("models")) << "tests/data/hf_reference.json has no models";
  const std::vector<int32_t> tokens = ref.at("tokens").get<std::vector<int32_t>>();
  std::vector<std::string> seen;
  for (const json& e : ref.at("models")) {
    const std::string name = e.at("name");
    SCOPED_TRACE(name + " (" + ref.value("generator", std::string()) + ")");
    seen.push_back(name);
    const std::string dir = test::temp_dir("hfref_" + name);
    const std::string gguf = dir + "/m.gguf", folder = dir + "/hf";
    auto w = write_synthetic_model(spec_of(e.at("synth")), gguf);
    ASSERT_TRUE(w.ok()) << w.message();
    ASSERT_TRUE(write_hf_folder(gguf, folder).ok());
    if (!e.at("config").empty()) {
      json config = read_json(folder + "/config.json");
      config.update(e.at("config"));
      std::ofstream(folder + "/config.json") << config.dump(2);
    }
    auto m = load_model(folder);
    ASSERT_TRUE(m.ok()) << m.message();
    const Model& model = **m;

    // The weights are those transformers ran: else `loom synth` changed, and
    // tools/hf_reference/ must make the reference again.
    const double sum = embedding_sum(model.tok_embd), want = e.at("embedding_sum");
    ASSERT_NEAR(sum, want, 1e-6 * (1 + std::abs(want)))
        << "the synthetic weights differ from those of the reference: run "
           "tools/hf_reference/make_models.sh and hf_logits.py again";

    CpuBackend be(2);
    auto kv = KvCache::create(
        {model.hp.n_layer, model.hp.n_head_kv, model.hp.head_dim, 64, 16, DType::kF16});
    ASSERT_TRUE(kv.ok()) << kv.message();
    ForwardPass fwd(model, be, **kv, /*max_chunk=*/5);  // chunks of 5: the cache is read too
    const size_t V = static_cast<size_t>(model.hp.n_vocab);
    std::vector<float> logits(tokens.size() * V);
    Status s = fwd.eval(std::span<const int32_t>(tokens), 0, logits.data(), true);
    ASSERT_TRUE(s.ok()) << s.message();

    // F16 keys and values (the cache's precision) against float32 throughout; with
    // BF16 weights the CPU also rounds the activations to BF16 for its dot products
    // (as llama.cpp does), which costs about 2^-9 of each.
    const double bound = model.layers[0].wq.dtype == DType::kBF16 ? 1e-2 : 2e-3;
    const json& want_logits = e.at("logits");
    ASSERT_EQ(want_logits.size(), tokens.size());
    double worst = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const std::vector<double> r = want_logits[t].get<std::vector<double>>();
      ASSERT_EQ(r.size(), V) << "position " << t;
      const std::vector<float> got(logits.begin() + t * V, logits.begin() + (t + 1) * V);
      const double err = test::normalized_error(got, r);
      worst = std::max(worst, err);
      EXPECT_LT(err, bound) << "position " << t;
      const size_t a = std::max_element(r.begin(), r.end()) - r.begin();
      std::vector<double> sorted = r;
      std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] > 1e-2 * (1 + std::abs(sorted[0]))) {
        EXPECT_EQ(static_cast<size_t>(std::max_element(got.begin(), got.end()) - got.begin()), a)
            << "position " << t;
      }
    }
    std::printf("[hf reference] %-16s worst normalized error %.2e (bound %.0e)\n", name.c_str(),
                worst, bound);
  }
  // Every architecture the folders support has a reference.
  for (const char* want : {"llama", "mistral", "qwen2", "phi3", "qwen3", "gemma2"}) {
    EXPECT_TRUE(std::any_of(seen.begin(), seen.end(), [&](const std::string& n) {
      return n.starts_with(want);
    })) << want;
  }
}

}  // namespace
}  // namespace loom
