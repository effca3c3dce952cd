// Continuous batching on CUDA: ForwardPass::eval_batch steps three sequences
// (each with its own KV cache on the device) through one all-GPU pass. The
// decode steps' single rows take the backend's *_rows ops (RoPE, KV store
// and attention of all sequences in one launch each: cuda_rows.cpp).
#include <gtest/gtest.h>

#include "engine/backends/cpu/cpu_backend.h"
#include "tests/batch_script.h"
#include "tests/cuda/backend_test_util.h"

namespace loom {
namespace {

// The decode steps' rows in one launch each (the *_rows ops) against one
// sequence at a time, in the same batched pass: the same matmuls, so the
// logits differ only by the attention's split plan (planned for the longest
// of the sequences). Against each sequence run alone the batched prompt steps
// (9 rows and more) take the tensor-core GEMMs on F16 activations where alone
// their chunks take the matvecs, hence the looser bound there.
TEST(CudaBatch, RowsInOneLaunchEqualOneSequenceAtATime) {
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
      const std::string what = std::string(dtype) + (kv == DType::kF16 ? " kv f16" : " kv q8_0");
      gpu->set_row_ops(false);
      const test::Logits apart = test::run(*m, *gpu, kv, true, placed);
      gpu->set_row_ops(true);
      const test::Logits rows = test::run(*m, *gpu, kv, true, placed);
      test::expect_close(rows, apart, 1e-4, what);
      const test::Logits alone = test::run(*m, *gpu, kv, false, placed);
      test::expect_close(rows, alone, 5e-2, what + " against alone", /*argmax=*/false);
    }
  }
}

}  // namespace
}  // namespace loom
