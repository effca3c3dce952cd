// The NV-to-KHR cooperative-matrix rewrite (engine/backends/vulkan/spirv_coopmat.cpp)
// over every tensor-core shader variant this build embeds, checked by a
// reader of its own: no NV instruction is left, every KHR matrix type names
// a use, and each OpCooperativeMatrixMulAddKHR gets an A, a B and an
// accumulator of the right use. Runs without a device: lavapipe has no
// cooperative matrices, so the rewritten shaders run on GPUs only
// (tests/gpu, LOOM_VK_COOPMAT_KHR=1).
#ifndef LOOM_HAVE_VULKAN
#include <gtest/gtest.h>
TEST(SpirvCoopmat, NeedsVulkan) {
  GTEST_SKIP() << "built without Vulkan (LOOM_VULKAN=OFF)";
}
#else

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/backends/vulkan/spirv_coopmat.h"
#include "engine/backends/vulkan/vk_shaders.h"

namespace loom::vk {
namespace {

struct Module {
  uint32_t bound = 0;
  std::vector<std::pair<uint32_t, std::vector<uint32_t> > > insts;  // opcode, operands
};

Module parse(const std::vector<uint32_t>& w) {
  Module m;
  EXPECT_GE(w.size(), 5u);
  EXPECT_EQ(w[0], 0x07230203u);
  m.bound = w[3];
  for (size_t i = 5; i < w.size();) {
    const uint32_t n = w[i] >> 16;
    EXPECT_GT(n, 0u);
    EXPECT_LE(i + n, w.size());
    if (n == 0 || i + n > w.size()) break;
    m.insts.emplace_back(w[i] & 0xffffu,
                         std::vector<uint32_t>(w.begin() + i + 1, w.begin() + i + n));
    i += n;
  }
  return m;
}

std::string text(const std::vector<uint32_t>& w) {
  std::string s(reinterpret_cast<const char*>(w.data()), w.size() * 4);
  return s.substr(0, s.find('\0'));
}

// What the reader checks in one rewritten module.
void check_khr(const char* name, const std::vector<uint32_t>& words) {
  SCOPED_TRACE(name);
  const Module m = parse(words);
  std::map<uint32_t, uint32_t> uint_const;  // id -> value (32-bit constants)
  std::map<uint32_t, int> use_of_type;      // KHR matrix type -> use
  std::map<uint32_t, uint32_t> type_of;     // value -> type (matrix values only)
  std::set<uint32_t> declared;              // ids with a definition so far
  bool cap = false, ext = false;
  int muladds = 0, loads = 0;
  for (const auto& [op, w] : m.insts) {
    ASSERT_FALSE(op >= 5357 && op <= 5362) << "NV cooperative-matrix opcode " << op << " left";
    if (op == 17) {
      ASSERT_NE(w[0], 5357u) << "CooperativeMatrixNV capability left";
      cap |= w[0] == 6022;
    }
    if (op == 10) {
      EXPECT_NE(text(w), "SPV_NV_cooperative_matrix");
      ext |= text(w) == "SPV_KHR_cooperative_matrix";
    }
    if (op == 43 && w.size() == 3) uint_const[w[1]] = w[2];
    if (op == 4456) {
      ASSERT_EQ(w.size(), 6u) << "OpTypeCooperativeMatrixKHR takes five operands";
      for (size_t k = 1; k < 6; ++k) EXPECT_TRUE(declared.count(w[k])) << "operand " << k;
      ASSERT_TRUE(uint_const.count(w[5]));
      use_of_type[w[0]] = static_cast<int>(uint_const[w[5]]);
      EXPECT_LE(use_of_type[w[0]], 2);
    }
    if (op == 4457) {  // load: type, result, pointer, layout, stride, ...
      ++loads;
      ASSERT_GE(w.size(), 5u);
      ASSERT_TRUE(use_of_type.count(w[0]));
      ASSERT_TRUE(uint_const.count(w[3]));
      EXPECT_LE(uint_const[w[3]], 1u) << "memory layout";
      type_of[w[1]] = w[0];
    }
    if (op == 4458) {  // store: pointer, object, layout, stride, ...
      ASSERT_GE(w.size(), 4u);
      ASSERT_TRUE(uint_const.count(w[2]));
      EXPECT_LE(uint_const[w[2]], 1u);
    }
    if (op == 61 && use_of_type.count(w[0])) type_of[w[1]] = w[0];  // OpLoad of a matrix
    if (op == 4459) {                                               // MulAdd: type, result, A, B, C
      ++muladds;
      ASSERT_EQ(w.size(), 5u);
      for (int k = 0; k < 3; ++k) {
        ASSERT_TRUE(type_of.count(w[2 + k])) << "MulAdd operand " << k << " is not a matrix load";
        EXPECT_EQ(use_of_type[type_of[w[2 + k]]], k) << "MulAdd operand " << k << "'s use";
      }
      EXPECT_EQ(use_of_type[w[0]], 2);
      type_of[w[1]] = w[0];
    }
    // Types, constants and variables (and values) are defined before use by types.
    const bool defines = (op >= 19 && op <= 39) || op == 4456;
    if (defines) declared.insert(w[0]);
    if (op == 43 || op == 41 || op == 42 || op == 44 || op == 59 || op == 61) declared.insert(w[1]);
    if (op == 59 || op == 61 || op == 4457 || op == 4459) {
      EXPECT_TRUE(declared.count(w[0])) << "result type %" << w[0] << " of opcode " << op;
    }
  }
  EXPECT_TRUE(cap);
  EXPECT_TRUE(ext);
  if (!std::strstr(name, "probe_nomma")) {  // the bench's probe without products
    EXPECT_GT(muladds, 0);
    EXPECT_GT(loads, 0);
  }
  for (const auto& [op, w] : m.insts) {
    if (op == 43 && w.size() > 1) {
      EXPECT_LT(w[1], m.bound);
    }
  }
}

TEST(SpirvCoopmat, EveryTensorCoreVariantMapsToKhr) {
  int rewritten = 0;
  for (const SpirvBlob& b : all_shaders()) {
    const std::span<const uint32_t> words(b.words, b.n_words);
    if (!spirv_uses_nv_coopmat(words)) continue;
    Result<std::vector<uint32_t> > k = spirv_nv_coopmat_to_khr(words);
    ASSERT_TRUE(k.ok()) << b.name << ": " << k.error().message();
    check_khr(b.name, *k);
    EXPECT_FALSE(spirv_uses_nv_coopmat(*k)) << b.name;
    ++rewritten;
  }
  // matmul_cm and attn_cm in all their dtypes and tiles.
  EXPECT_GE(rewritten, 10);
}

TEST(SpirvCoopmat, ShadersWithoutMatricesAreLeftAlone) {
  const SpirvBlob* b = find_shader("add");
  ASSERT_NE(b, nullptr);
  const std::span<const uint32_t> words(b->words, b->n_words);
  EXPECT_FALSE(spirv_uses_nv_coopmat(words));
  Result<std::vector<uint32_t> > k = spirv_nv_coopmat_to_khr(words);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, std::vector<uint32_t>(words.begin(), words.end()));
}

TEST(SpirvCoopmat, BadModulesGiveErrors) {
  const SpirvBlob* b = find_shader("matmul_cm_q4_k");
  ASSERT_NE(b, nullptr);
  std::vector<uint32_t> w(b->words, b->words + b->n_words);
  std::vector<uint32_t> bad = w;
  bad[0] = 0x12345678;
  Result<std::vector<uint32_t> > r = spirv_nv_coopmat_to_khr(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("magic"), std::string::npos) << r.error().message();
  bad = std::vector<uint32_t>(w.begin(), w.begin() + w.size() / 2);
  bad.back() = (1000u << 16) | 61u;  // an OpLoad that claims 1000 words
  r = spirv_nv_coopmat_to_khr(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("past the end"), std::string::npos) << r.error().message();
}

// One matrix used as both A and B has no KHR type: the rewrite says so.
TEST(SpirvCoopmat, OneMatrixAsAAndBIsRefused) {
  const SpirvBlob* b = find_shader("matmul_cm_q4_k");
  ASSERT_NE(b, nullptr);
  std::vector<uint32_t> w(b->words, b->words + b->n_words);
  // Make every MulAdd take its A operand as B as well.
  int changed = 0;
  for (size_t i = 5; i < w.size(); i += w[i] >> 16) {
    if ((w[i] & 0xffffu) == 5361) {
      w[i + 4] = w[i + 3];
      ++changed;
    }
  }
  ASSERT_GT(changed, 0);
  Result<std::vector<uint32_t> > r = spirv_nv_coopmat_to_khr(w);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("more than one"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace loom::vk
#endif  // LOOM_HAVE_VULKAN
