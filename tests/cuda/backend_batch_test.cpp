// Continuous batching on CUDA: ForwardPass::eval_batch steps three sequences
// (each with its own KV cache on the device) through one all-GPU pass; each
// sequence's logits must equal those of the same sequence run alone. The
// decode steps' single rows take the backend's *_rows ops (RoPE, KV store
// and attention of all sequences in one launch each: cuda_rows.cpp).
#include <gtest/gtest.h>

#include "engine/backends/cpu/cpu_backend.h"
#include "tests/batch_script.h"
#include "tests/cuda/backend_test_util.h"

namespace loom {
namespace {

TEST(CudaBatch, EqualsSequencesRunAlone) {
  LOOM_CUDA_BACKEND_OR_SKIP(gpu);
  CpuBackend cpu(2);
  for (const char* dtype : {"f32", "q4_k"}) {
    auto m = test::synth_batch_model("llama", dtype);
    ASSERT_TRUE(m);
    const Placement all = Placement::uniform(m->hp.n_layer, Unit::kGpu);
    auto placed = [&](ForwardPass& f) {
      f.set_fallback(&cpu);
      ASSERT_TRUE(f.set_placement(all).ok());
      const Status s = f.prepare();
      ASSERT_TRUE(s.ok()) << s.message();
    };
    for (DType kv : {DType::kF16, DType::kQ8_0}) {
      const test::Logits alone = test::run(*m, *gpu, kv, false, placed);
      const test::Logits batch = test::run(*m, *gpu, kv, true, placed);
      test::expect_close(batch, alone, 2e-3,
                         std::string(dtype) + (kv == DType::kF16 ? " kv f16" : " kv q8_0"));
    }
  }
}

}  // namespace
}  // namespace loom
