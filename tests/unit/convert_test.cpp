// loom convert (engine/model/convert.h): a Hugging Face folder converted to
// GGUF gives the same greedy tokens as the folder; GGUF to GGUF in another
// precision; per-group precisions from a placement; bad input and a failing
// output give errors that name the file and leave nothing behind; memory
// stays far below the model's size.
#include "engine/model/convert.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_export.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/placement/placement.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string synth_gguf(const std::string& dir, const std::string& arch, const std::string& dtype,
                       int64_t n_ff = 128, int64_t n_embd = 64, int64_t n_layer = 2) {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = n_layer;
  s.n_embd = n_embd;
  s.n_ff = n_ff;
  s.n_head_kv = arch == "phi3" ? 4 : 2;
  s.weight_type = dtype;
  s.seed = 5;
  const std::string path = dir + "/m.gguf";
  auto r = write_synthetic_model(s, path);
  EXPECT_TRUE(r.ok()) << r.message();
  return path;
}

std::vector<int32_t> greedy(const Model& m, int n) {
  CpuBackend be(2);
  SessionConfig sc;
  sc.n_ctx = 128;
  auto s = Session::create(m, be, sc);
  EXPECT_TRUE(s.ok()) << s.message();
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_tokens = n;
  gp.stop_at_eog = false;
  std::vector<int32_t> out;
  gp.on_token = [&](int32_t id) { out.push_back(id); };
  auto r = (*s)->generate((*s)->tokenize_raw("Once upon a time"), gp,
                          [](std::string_view) { return true; });
  EXPECT_TRUE(r.ok()) << r.message();
  return out;
}

std::map<std::string, DType> dtypes_of(const std::string& path) {
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.message();
  std::map<std::string, DType> out;
  if (f.ok()) {
    for (const auto& t : (*f)->tensors()) out[t.name] = t.dtype;
  }
  return out;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct FolderCase {
  const char* arch;
  const char* dtype;
};

class ConvertFolder : public ::testing::TestWithParam<FolderCase> {};

TEST_P(ConvertFolder, GivesTheFoldersGreedyTokens) {
  const FolderCase c = GetParam();
  const std::string dir = test::temp_dir(std::string("convert_hf_") + c.arch + "_" + c.dtype);
  const std::string gguf = synth_gguf(dir, c.arch, c.dtype);
  ASSERT_TRUE(write_hf_folder(gguf, dir + "/hf").ok());
  ConvertOptions o;
  o.input = dir + "/hf";
  o.output = dir + "/out.gguf";
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_GT(r->n_tensors, 0);

  auto folder = load_model(dir + "/hf");
  ASSERT_TRUE(folder.ok()) << folder.message();
  auto converted = load_model(dir + "/out.gguf");
  ASSERT_TRUE(converted.ok()) << converted.message();
  // The tokenizer and template came along.
  const char* text = "Hello world, once upon a time.";
  EXPECT_EQ((*folder)->tokenizer->encode(text, true, false),
            (*converted)->tokenizer->encode(text, true, false));
  EXPECT_EQ((*folder)->tokenizer->vocab().n_tokens(), (*converted)->tokenizer->vocab().n_tokens());
  EXPECT_EQ((*folder)->chat_template.family(), (*converted)->chat_template.family());
  // Matrices kept their precision (F16 stays F16), vectors are F32.
  for (const auto& [name, d] : dtypes_of(dir + "/out.gguf")) {
    if (name.find("norm") != std::string::npos)
      EXPECT_EQ(d, DType::kF32) << name;
    else
      EXPECT_EQ(std::string(dtype_name(d)), std::string(dtype_name(*dtype_from_name(c.dtype))))
          << name;
  }
  const auto a = greedy(**folder, 24), b = greedy(**converted, 24);
  EXPECT_EQ(a.size(), 24u);
  EXPECT_EQ(a, b);
  // The original GGUF too (the folder was exported from it).
  auto orig = load_model(gguf);
  ASSERT_TRUE(orig.ok());
  EXPECT_EQ(greedy(**orig, 24), b);
}

INSTANTIATE_TEST_SUITE_P(Archs, ConvertFolder,
                         ::testing::Values(FolderCase{"llama", "f32"}, FolderCase{"llama", "f16"},
                                           FolderCase{"qwen2", "f32"}, FolderCase{"phi3", "f16"},
                                           FolderCase{"qwen3", "f32"}, FolderCase{"gemma2", "f16"}),
                         [](const auto& i) {
                           return std::string(i.param.arch) + "_" + i.param.dtype;
                         });

TEST(Convert, GgufToQ8_0AndPlan) {
  const std::string dir = test::temp_dir("convert_q8");
  const std::string gguf = synth_gguf(dir, "llama", "f32");
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/q8.gguf";
  o.dtype = DType::kQ8_0;
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  for (const auto& [name, d] : dtypes_of(o.output)) {
    EXPECT_EQ(d, name.find("norm") != std::string::npos ? DType::kF32 : DType::kQ8_0) << name;
  }
  auto a = load_model(gguf), b = load_model(o.output);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->tokenizer->encode("a cat", true, false),
            (*b)->tokenizer->encode("a cat", true, false));
  EXPECT_EQ(greedy(**b, 8).size(), 8u);

  // A plan: layer 0's FFN in Q4_0, the output matrix in Q8_0, the rest F16.
  Placement p = Placement::uniform(2, Unit::kCpu);
  p.layers[0][OpGroup::kFfn].dtype = DType::kQ4_0;
  p.output.dtype = DType::kQ8_0;
  ConvertOptions po;
  po.input = gguf;
  po.output = dir + "/plan.gguf";
  po.dtype = DType::kF16;
  po.dtype_for = [&p](const std::string& name) { return placement_dtype_for_tensor(p, name); };
  ASSERT_TRUE(convert_model(po).ok());
  auto t = dtypes_of(po.output);
  EXPECT_EQ(t["blk.0.ffn_down.weight"], DType::kQ4_0);
  EXPECT_EQ(t["blk.0.ffn_up.weight"], DType::kQ4_0);
  EXPECT_EQ(t["blk.1.ffn_down.weight"], DType::kF16);
  EXPECT_EQ(t["blk.0.attn_q.weight"], DType::kF16);
  EXPECT_EQ(t["output.weight"], DType::kQ8_0);
  EXPECT_EQ(t["token_embd.weight"], DType::kF16);
  EXPECT_EQ(t["blk.0.ffn_norm.weight"], DType::kF32);
  EXPECT_TRUE(load_model(po.output).ok());
}

TEST(Convert, RowsThatFitNoBlockKeepTheirType) {
  const std::string dir = test::temp_dir("convert_fallback");
  const std::string gguf = synth_gguf(dir, "llama", "f32", /*n_ff=*/172);
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/q4.gguf";
  o.dtype = DType::kQ4_0;
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_FALSE(r->notes.empty());
  EXPECT_NE(r->notes[0].find("ffn_down"), std::string::npos) << r->notes[0];
  auto t = dtypes_of(o.output);
  EXPECT_EQ(t["blk.0.ffn_down.weight"], DType::kF32);
  EXPECT_EQ(t["blk.0.ffn_up.weight"], DType::kQ4_0);
  EXPECT_TRUE(load_model(o.output).ok());
}

TEST(Convert, BadInputNamesTheFileAndWritesNothing) {
  const std::string dir = test::temp_dir("convert_bad_in");
  const std::string gguf = synth_gguf(dir, "llama", "f32");
  auto bytes = test::read_file(gguf);
  bytes.resize(bytes.size() / 2);
  test::write_file(dir + "/cut.gguf", bytes);
  ConvertOptions o;
  o.input = dir + "/cut.gguf";
  o.output = dir + "/out.gguf";
  auto r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("cut.gguf"), std::string::npos) << r.message();
  EXPECT_FALSE(fs::exists(o.output));

  // A folder whose shard is cut short.
  ASSERT_TRUE(write_hf_folder(gguf, dir + "/hf").ok());
  auto shard = test::read_file(dir + "/hf/model.safetensors");
  shard.resize(shard.size() - 100);
  test::write_file(dir + "/hf/model.safetensors", shard);
  o.input = dir + "/hf";
  r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("model.safetensors"), std::string::npos) << r.message();
  EXPECT_FALSE(fs::exists(o.output));

  o.input = dir + "/missing.gguf";
  r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("missing.gguf"), std::string::npos) << r.message();
  // The input as the output.
  o.input = gguf;
  o.output = gguf;
  r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("overwrite the input"), std::string::npos) << r.message();
}

TEST(Convert, FailingOutputLeavesNoFile) {
  const std::string dir = test::temp_dir("convert_bad_out");
  const std::string gguf = synth_gguf(dir, "llama", "f32");
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/no/such/folder/out.gguf";
  auto r = convert_model(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find(o.output), std::string::npos) << r.message();

  // A disk that fills up: the file size limit makes writes fail (EFBIG) past 64 KiB.
  o.output = dir + "/full.gguf";
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  r = convert_model(o);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, prev);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("full.gguf"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("nothing was kept"), std::string::npos) << r.message();
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"m.gguf"});
}

uint64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key)));
  }
  return 0;
}

// Peak resident memory while converting a 72 MiB F32 model to Q8_0 stays a
// small fraction of it (VmHWM reset through /proc/self/clear_refs).
TEST(Convert, MemoryStaysFarBelowTheModel) {
  const std::string dir = test::temp_dir("convert_rss");
  const std::string gguf = synth_gguf(dir, "llama", "f32", /*n_ff=*/2048, /*n_embd=*/768,
                                      /*n_layer=*/4);
  const uint64_t model_bytes = fs::file_size(gguf);
  ASSERT_GT(model_bytes, 60ull << 20);
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    if (!clear.good()) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
  }
  const uint64_t rss0 = status_kib("VmRSS:") << 10;
  ConvertOptions o;
  o.input = gguf;
  o.output = dir + "/q8.gguf";
  o.dtype = DType::kQ8_0;
  auto r = convert_model(o);
  ASSERT_TRUE(r.ok()) << r.message();
  const uint64_t peak = status_kib("VmHWM:") << 10;
  const uint64_t grew = peak > rss0 ? peak - rss0 : 0;
  std::printf("convert %.1f MiB F32 -> Q8_0: peak RSS grew by %.1f MiB\n",
              static_cast<double>(model_bytes) / 1048576.0, static_cast<double>(grew) / 1048576.0);
  EXPECT_LT(grew, model_bytes / 4);
}

}  // namespace
}  // namespace loom
