#version 450
// Y[n][m] = sum_k W[m][k] * X[n][k] (+ bias[m]) for many columns (prefill),
// on the tensor cores through GL_NV_cooperative_matrix: F16 inputs, F32
// accumulators. The tiled fallback for devices without cooperative matrices
// is mul_mat.comp; the host picks (engine/backends/vulkan/vulkan_matmul.cpp).
//
// A workgroup of NSG subgroups of 32 threads (4: 2 x 2, or 8: 2 x 4)
// computes a tile of BM = 128 weight rows x BN tokens. Each step takes one
// 32-wide unit of k: each of the first 128 threads dequantizes one weight
// row's unit (dq_load / dq_math of dequant.glsl) and every thread loads its
// share of the activations; both are stored as F16, k contiguous, in shared
// memory (rows SK halves apart, so the 16 rows a matrix load reads fall in
// distinct banks). Subgroup (sm, sn) owns rows 64 sm .. + 63 and tokens
// BN/SG_N sn .. + BN/SG_N - 1: 4 x TN accumulators of 16 x 16, each
// updated by two 16x16x16 products per step. (Eight subgroups: twice the
// warps per workgroup with half the accumulators each, for the grids of
// about one workgroup per SM.)
//
// Shared memory is double-buffered: step u's products read one buffer while
// the threads write step u + 1's tile into the other, so one barrier per
// step suffices. That tile's loads are issued before the products and used
// (dequantized, converted, stored) only after them, so the products hide
// their latency.
// Outputs go through shared memory (one 16 x 16 block per subgroup at a
// time) for the bias, the bounds and y's layout.
// Grid: x = ceil(M / BM), y = ceil(N / BN).

#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require

#include "common.glsl"
#include "dequant.glsl"

#define BM 128
#ifndef BN
#define BN 128
#endif
#ifndef NSG
#define NSG 4
#endif
#define NT (32 * NSG)        // threads; WG must be this (set by the host)
#define SG_N (NSG / 2)       // subgroups along the tokens
#define TM 4                 // 16-row blocks per subgroup (64 rows)
#define TN (BN / 16 / SG_N)  // 16-token blocks per subgroup
#define SK 40                // shared row stride in halves: 32 + 8 (80 bytes)
#define SKV (SK / 8)         // the same in uvec4s (8 halves each)

layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 3) readonly buffer B { float bias[]; };

layout(push_constant) uniform PC {
  uint w_off, w_off2;
  uint row0;
  uint row_units;
  uint K, M, N;
  uint x_off, x_ld;
  uint y_off, y_ld;
  uint b_off;
  uint flags;  // 1: add bias; 2: x rows 16-byte aligned (vec4 loads)
} pc;

// [buffer][row][k / 8]: row r's 32 halves of the step's unit at r * SKV .. + 3.
shared uvec4 Ws[2][BM * SKV];
shared uvec4 Xs[2][BN * SKV];

#define XR (4 * BN / NT)  // pieces of 8 activations per thread and step

uvec4 pack8(vec4 a, vec4 b) {
  return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

// This thread's part of step u's tile: weight row tid's unit and XR pieces
// of 8 activations, as loaded (load_tile), then as F16 in shared memory
// (store_tile). Between the two the loads are in flight.
struct Tile {
  UnitRaw w;
  vec4 xa[XR], xb[XR];
};

Tile load_tile(uint u, uint m0, uint n0) {
  const uint tid = gl_LocalInvocationID.x;
  Tile t;
  // Rows past M repeat the last row (their sums are dropped) so loads stay in bounds.
  if (NT == BM || tid < BM)
    t.w = dq_load(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(m0 + tid, pc.M - 1), u);
  // Piece e = tid + NT r: token e / 4, activations 32 u + 8 (e % 4) .. + 7.
  [[unroll]] for (uint r = 0; r < XR; ++r) {
    const uint e = tid + NT * r, n = e / 4, kk = 32 * u + 8 * (e % 4);
    t.xa[r] = vec4(0.0);
    t.xb[r] = vec4(0.0);
    if (n0 + n < pc.N) {
      const uint base = pc.x_off + (n0 + n) * pc.x_ld + kk;
      if ((pc.flags & 2u) != 0 && kk + 8 <= pc.K) {
        t.xa[r] = x4[base / 4];
        t.xb[r] = x4[base / 4 + 1];
      } else {
        // Past K, x belongs to the next row (maybe Inf): masked.
        [[unroll]] for (uint c = 0; c < 4; ++c) {
          t.xa[r][c] = kk + c < pc.K ? x[base + c] : 0.0;
          t.xb[r][c] = kk + 4 + c < pc.K ? x[base + 4 + c] : 0.0;
        }
      }
    }
  }
  return t;
}

void store_tile(uint buf, uint u, const Tile t) {
  const uint tid = gl_LocalInvocationID.x;
  if (NT == BM || tid < BM) {
    vec4 w[8];
    dq_math(t.w, u, w);
    [[unroll]] for (uint i = 0; i < 4; ++i) Ws[buf][tid * SKV + i] = pack8(w[2 * i], w[2 * i + 1]);
  }
  [[unroll]] for (uint r = 0; r < XR; ++r) {
    const uint e = tid + NT * r;
    Xs[buf][(e / 4) * SKV + e % 4] = pack8(t.xa[r], t.xb[r]);
  }
}

void main() {
  const uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
  const uint sg = gl_SubgroupID, sm = sg % 2, sn = sg / 2;

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[TN][TM];
  [[unroll]] for (uint j = 0; j < TN; ++j) {
    [[unroll]] for (uint i = 0; i < TM; ++i) acc[j][i] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
  }

  Tile t = load_tile(0, m0, n0);
  store_tile(0, 0, t);
  barrier();
  const uint units = pc.row_units;
  for (uint u = 0; u < units; ++u) {
    const uint cur = u & 1u;
    const bool next = u + 1 < units;
    if (next) t = load_tile(u + 1, m0, n0);
    [[unroll]] for (uint kh = 0; kh < 2; ++kh) {
      // A: 16 tokens x 16 k, row-major; B: 16 k x 16 rows, i.e. W's rows read column-major.
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[TN], b[TM];
      [[unroll]] for (uint j = 0; j < TN; ++j) {
        coopMatLoadNV(a[j], Xs[cur], (sn * (BN / SG_N) + 16 * j) * SKV + 2 * kh, SKV, false);
      }
      [[unroll]] for (uint i = 0; i < TM; ++i) {
        coopMatLoadNV(b[i], Ws[cur], (64 * sm + 16 * i) * SKV + 2 * kh, SKV, true);
      }
      [[unroll]] for (uint j = 0; j < TN; ++j) {
        [[unroll]] for (uint i = 0; i < TM; ++i) acc[j][i] = coopMatMulAddNV(a[j], b[i], acc[j][i]);
      }
    }
    if (next) store_tile(cur ^ 1u, u + 1, t);
    barrier();
  }

  // Each subgroup stages one 16 x 16 block at a time in its own 1 KiB of Ws[0]
  // (free now), then lane l writes row l / 2, columns 8 (l % 2) .. + 7.
  const uint lane = gl_SubgroupInvocationID, stage = sg * 64;  // uvec4s: 256 floats
  const bool has_bias = (pc.flags & 1u) != 0;
  [[unroll]] for (uint j = 0; j < TN; ++j) {
    [[unroll]] for (uint i = 0; i < TM; ++i) {
      coopMatStoreNV(acc[j][i], Ws[0], stage, 4, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      const uint n = n0 + sn * (BN / SG_N) + 16 * j + lane / 2;
      const uint mb = m0 + 64 * sm + 16 * i + 8 * (lane % 2);
      const uvec4 c0 = Ws[0][stage + 4 * (lane / 2) + 2 * (lane % 2)];
      const uvec4 c1 = Ws[0][stage + 4 * (lane / 2) + 2 * (lane % 2) + 1];
      const float v[8] = float[8](uintBitsToFloat(c0.x), uintBitsToFloat(c0.y), uintBitsToFloat(c0.z),
                                  uintBitsToFloat(c0.w), uintBitsToFloat(c1.x), uintBitsToFloat(c1.y),
                                  uintBitsToFloat(c1.z), uintBitsToFloat(c1.w));
      if (n < pc.N) {
        [[unroll]] for (uint c = 0; c < 8; ++c) {
          const uint m = mb + c;
          if (m < pc.M) y[pc.y_off + n * pc.y_ld + m] = v[c] + (has_bias ? bias[pc.b_off + m] : 0.0);
        }
      }
      subgroupBarrier();  // every lane has read the block before the next store
    }
  }
}
