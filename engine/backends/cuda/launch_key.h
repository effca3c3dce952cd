// Launch arguments as words of a step's hash (CudaBackend::launch): each
// op mixes its tag and its arguments, so that two steps with the same hash
// launch the same kernels on the same addresses.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine/backends/cuda/matmul/cuda_matmul.h"

namespace loom::launch_key {

inline uint64_t u(const void* p) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}
inline uint64_t u(int64_t v) {
  return static_cast<uint64_t>(v);
}
inline uint64_t u(float f) {
  uint32_t b = 0;
  std::memcpy(&b, &f, 4);
  return b;
}
inline uint64_t u(const cuda::DevMatrix& m) {
  return u(m.data) ^ (static_cast<uint64_t>(m.dtype) << 56) ^ (u(m.n_out) << 28) ^ u(m.n_in) ^
         (m.row_bytes << 40);
}

// Op tags, so that two ops with the same arguments hash apart.
enum : uint64_t {
  kOpPut = 1,
  kOpGetRows,
  kOpNorm,
  kOpNormQ8,
  kOpMatmul,
  kOpMatmulAdd,
  kOpGlu,
  kOpQkv,
  kOpRope,
  kOpKvStore,
  kOpRopeKv,
  kOpAttention,
  kOpSiluMul,
  kOpGeluMul,
  kOpAdd,
  // The device KV tier (cuda_kv_tier.cpp).
  kOpAttentionSlots,
  kOpStageCopy,
};

}  // namespace loom::launch_key
