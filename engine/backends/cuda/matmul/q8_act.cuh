// The layout of the Q8 activations the decode matvecs read (device side;
// sizes for the host in cuda_matmul.h: q8_token_bytes).
//
// Per token, 32-value groups g with a scale pair xd[t][g] = (d, d * the sum
// of the group's quants) and 32 int8 quants. The second half is what the
// products of formats with a min (Q4_K, Q5_K, Q4_1, Q5_1) need: with it
// precomputed, a matvec does not sum the quants again for every row.
//
// The quants are stored in chunks of 32 groups (1024 bytes): first the 32
// groups' bytes 0..15, then their bytes 16..31. A warp whose lane l takes
// group 32c + l then reads the chunk with two fully coalesced 128-bit loads
// (512 contiguous bytes each) instead of two loads spread over 1024 bytes. A
// token's quants take whole chunks (q8_token_bytes), so the last, partial
// chunk keeps the same addressing.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace loom::cuda {

/// Byte offset of quant j (0..31) of group g within a token's quants.
__host__ __device__ __forceinline__ int64_t q8_byte(int64_t g, int j) {
  return (g >> 5) * 1024 + (j >> 4) * 512 + (g & 31) * 16 + (j & 15);
}

/// The eight words of group g's quants (token base xq_t, 16-byte aligned).
__device__ __forceinline__ void q8_load(const int8_t* xq_t, int64_t g, int (&xw)[8]) {
  const int8_t* c = xq_t + (g >> 5) * 1024 + (g & 31) * 16;
  const int4 p = *reinterpret_cast<const int4*>(c);
  const int4 q = *reinterpret_cast<const int4*>(c + 512);
  xw[0] = p.x, xw[1] = p.y, xw[2] = p.z, xw[3] = p.w;
  xw[4] = q.x, xw[5] = q.y, xw[6] = q.z, xw[7] = q.w;
}

/// Quantizes value v, lane j of the warp's 32-value group g (all 32 lanes
/// take part): the scale d = amax / 127 rounded to F16 (as the CPU's Q8_0
/// activations keep it) and d * the sum of the quants into xd_t[g], the
/// quant round(v / d) into xq_t.
__device__ __forceinline__ void q8_store_lane(float v, int64_t g, int lane, int8_t* xq_t,
                                              float2* xd_t) {
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float q = fminf(fmaxf(roundf(v * id), -127.0f), 127.0f);
  xq_t[q8_byte(g, lane)] = static_cast<int8_t>(q);
  const int sum = __reduce_add_sync(0xFFFFFFFFu, static_cast<int>(q));
  if (lane == 0) {
    const float dh = __half2float(__float2half_rn(d));
    xd_t[g] = make_float2(dh, dh * static_cast<float>(sum));
  }
}

}  // namespace loom::cuda
