// Tensor-core and shared-memory primitives of the CUDA kernels (sm_80+
// PTX): ldmatrix, mma.sync.m16n8k16 on F16 with F32 accumulators, packed
// halves, cp.async. Used by the flash prefill (attention/flash_prefill.cu),
// the quantized GEMM (matmul/gemm_q.cu) and the staged matvecs.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace loom::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8,
// and receives of matrix i row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                        uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// The same, each matrix transposed: lane l receives column l / 4, rows
// 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                          uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// c[16x8] += a[16x16] b[16x8]. With g = lane / 4, i = lane % 4: a = {(g, 2i..2i+1),
// (g + 8, 2i..), (g, 2i + 8..), (g + 8, 2i + 8..)}, b = {(k 2i..2i+1, n g),
// (k 2i + 8.., n g)}, c = {(g, 2i), (g, 2i + 1), (g + 8, 2i), (g + 8, 2i + 1)}.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (lo, hi) rounded to F16, lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

__device__ __forceinline__ float2 unpack_half2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof(u));
  return __half22float2(h);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most n of this thread's committed groups are in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

}  // namespace loom::cuda
