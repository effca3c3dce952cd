#version 450
// Y[n][m] = sum_k W[m][k] * X[n][k] (+ bias[m]) for many columns (prefill),
// on the tensor cores through GL_NV_cooperative_matrix: F16 inputs, F32
// accumulators. The tiled fallback for devices without cooperative matrices
// is mul_mat.comp; the host picks (engine/backends/vulkan/vulkan_matmul.cpp).
// X comes as an F16 copy (to_f16.comp): rows of x_ld uvec4s (8 halves each),
// zeros past K up to a whole number of 32-wide units.
//
// A workgroup of SGM x SGN subgroups of 32 threads computes a tile of BM
// weight rows x BN tokens. Each step takes one 32-wide unit of k: threads
// dequantize weight rows' units (dq_load / dq_math of dequant.glsl; thread t
// takes rows t, t + NT, ...) and copy their share of the activations; both
// are stored as F16, k contiguous, in shared memory (rows SK = 40 halves
// apart, so the 16 rows a matrix load reads fall in distinct banks).
// Subgroup (sm, sn) owns BM / SGM rows and BN / SGN tokens: TM x TN
// accumulators of 16 x 16, each updated by two 16x16x16 products per step.
// The host's table of tiles (vulkan_matmul.cpp) names each variant's BM, BN,
// SGM and SGN, and checks its shared memory.
//
// Shared memory is double-buffered: step u's products read one buffer while
// the threads write step u + 1's tile into the other, so one barrier per
// step suffices. That tile's loads are issued before the products and used
// (dequantized, stored) only after them, so the products hide their latency;
// with PREFETCH2 they are issued a step earlier still (two tiles in
// registers); with NO_PREFETCH only after the products (none held across them).
// Outputs go through shared memory (one 16 x 16 block per subgroup at a
// time) for the bias, the bounds and y's layout.
// Grid: x = ceil(M / BM), y = ceil(N / BN).
//
// Benchmarks only (wrong results): PROBE_NO_LOADS leaves out the steps'
// loads and shared-memory stores, PROBE_NO_PRODUCTS the tensor-core part, so
// loom_vulkan_gemm_bench can tell the two costs apart.

#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require

#include "common.glsl"
#include "dequant.glsl"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef SGM
#define SGM 2
#endif
#ifndef SGN
#define SGN 4
#endif
#define NSG (SGM * SGN)
#define NT (32 * NSG)           // threads; WG must be this (set by the host)
#define TM (BM / SGM / 16)      // 16-row blocks per subgroup
#define TN (BN / SGN / 16)      // 16-token blocks per subgroup
#define WR ((BM + NT - 1) / NT)  // weight rows per thread and step
#define SK 40                   // shared row stride in halves: 32 + 8
#define SKV (SK / 8)            // the same in uvec4s (8 halves each)
#define BUF ((BM + BN) * SKV)   // one buffer: BM weight rows, then BN tokens
#if TM * SGM * 16 != BM || TN * SGN * 16 != BN
#error "BM and BN must be multiples of 16 SGM and 16 SGN"
#endif
#if NSG * 64 > 2 * BUF
#error "the output staging needs 1 KiB a subgroup"
#endif

layout(binding = 1) readonly buffer XH { uvec4 xh[]; };  // the F16 copy of X
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
  uint flags;  // 1: add bias
} pc;

// Two buffers of BUF uvec4s: row r's step (weights, then tokens) at
// r * SKV .. + SKV - 2, k / 8 within.
shared uvec4 Sh[2 * BUF];

#define XR (4 * BN / NT)  // pieces of 8 activations per thread and step
#if XR * NT != 4 * BN
#error "the threads must divide the step's activation pieces"
#endif

uvec4 pack8(vec4 a, vec4 b) {
  return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

// This thread's part of step u's tile: its weight rows' units and XR pieces
// of 8 activations, as loaded (load_tile), then as F16 in shared memory
// (store_tile). Between the two the loads are in flight.
struct Tile {
  UnitRaw w[WR];
  uvec4 xp[XR];
};

Tile load_tile(uint u, uint m0, uint n0) {
  const uint tid = gl_LocalInvocationID.x;
  Tile t;
  // Rows past M repeat the last row (their sums are dropped) so loads stay in bounds.
  [[unroll]] for (uint i = 0; i < WR; ++i) {
    const uint r = tid + NT * i;
    if (WR * NT == BM || r < BM)
      t.w[i] = dq_load(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(m0 + r, pc.M - 1), u);
  }
  // Piece e = tid + NT r: token e / 4, activations 32 u + 8 (e % 4) .. + 7.
  [[unroll]] for (uint r = 0; r < XR; ++r) {
    const uint e = tid + NT * r, n = e / 4;
    t.xp[r] = n0 + n < pc.N ? xh[pc.x_off + (n0 + n) * pc.x_ld + 4 * u + e % 4] : uvec4(0);
  }
  return t;
}

// b0: the buffer's first uvec4 (0 or BUF).
void store_tile(uint b0, uint u, const Tile t) {
  const uint tid = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0; i < WR; ++i) {
    const uint r = tid + NT * i;
    if (WR * NT == BM || r < BM) {
#if defined(DT_F16)
      [[unroll]] for (uint q = 0; q < 4; ++q) Sh[b0 + r * SKV + q] = t.w[i].q[q];
#else
      vec4 w[8];
      dq_math(t.w[i], u, w);
      [[unroll]] for (uint q = 0; q < 4; ++q) Sh[b0 + r * SKV + q] = pack8(w[2 * q], w[2 * q + 1]);
#endif
    }
  }
  [[unroll]] for (uint r = 0; r < XR; ++r) {
    const uint e = tid + NT * r;
    Sh[b0 + BM * SKV + (e / 4) * SKV + e % 4] = t.xp[r];
  }
}

void main() {
  const uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
  const uint sg = gl_SubgroupID, sm = sg % SGM, sn = sg / SGM;

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[TN][TM];
  [[unroll]] for (uint j = 0; j < TN; ++j) {
    [[unroll]] for (uint i = 0; i < TM; ++i) acc[j][i] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
  }

// Step products from the buffer at CUR: A is 16 tokens x 16 k, row-major; B
// 16 k x 16 rows, i.e. W's rows read column-major.
#ifndef PROBE_NO_PRODUCTS
#define PRODUCTS(CUR)                                                                              \
  [[unroll]] for (uint kh = 0; kh < 2; ++kh) {                                                     \
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[TN], b[TM];                                         \
    [[unroll]] for (uint j = 0; j < TN; ++j)                                                       \
      coopMatLoadNV(a[j], Sh, (CUR) + (BM + sn * (BN / SGN) + 16 * j) * SKV + 2 * kh, SKV, false); \
    [[unroll]] for (uint i = 0; i < TM; ++i)                                                       \
      coopMatLoadNV(b[i], Sh, (CUR) + ((BM / SGM) * sm + 16 * i) * SKV + 2 * kh, SKV, true);      \
    [[unroll]] for (uint j = 0; j < TN; ++j) {                                                     \
      [[unroll]] for (uint i = 0; i < TM; ++i) acc[j][i] = coopMatMulAddNV(a[j], b[i], acc[j][i]); \
    }                                                                                              \
  }
#else
#define PRODUCTS(CUR)
#endif
#ifdef PROBE_NO_LOADS
#define LOAD(T, U)
#define STORE(B0, U, T)
#else
#define LOAD(T, U) T = load_tile(U, m0, n0)
#define STORE(B0, U, T) store_tile(B0, U, T)
#endif

  const uint steps = pc.row_units;
  Tile ta = load_tile(0, m0, n0);
  store_tile(0, 0, ta);
#ifdef PREFETCH2
  // Two steps ahead: tile u + 1 waits in registers (ta or tb) while tile u + 2's
  // loads are in flight, so each load has two steps' products to arrive.
  // Unrolled by two so that neither tile is ever copied (a copy would wait
  // for its loads).
  Tile tb;
  if (steps > 1) ta = load_tile(1, m0, n0);
  barrier();
  for (uint u = 0; u < steps; u += 2) {
    if (u + 2 < steps) LOAD(tb, u + 2);
    PRODUCTS(0)
    if (u + 1 < steps) STORE(BUF, u + 1, ta);
    barrier();
    if (u + 1 >= steps) break;
    if (u + 3 < steps) LOAD(ta, u + 3);
    PRODUCTS(BUF)
    if (u + 2 < steps) STORE(0, u + 2, tb);
    barrier();
  }
#elif defined(NO_PREFETCH)
  // The next tile's loads after the products, stored at once: fewer
  // registers held across the products (occupancy), their latency hidden only
  // by other workgroups.
  barrier();
  for (uint u = 0; u < steps; ++u) {
    const uint cur = (u & 1u) * BUF;
    PRODUCTS(cur)
    if (u + 1 < steps) {
      LOAD(ta, u + 1);
      STORE(BUF - cur, u + 1, ta);
    }
    barrier();
  }
#else
  barrier();
  for (uint u = 0; u < steps; ++u) {
    const uint cur = (u & 1u) * BUF;
    const bool next = u + 1 < steps;
    if (next) LOAD(ta, u + 1);
    PRODUCTS(cur)
    if (next) STORE(BUF - cur, u + 1, ta);
    barrier();
  }
#endif

  // Each subgroup stages one 16 x 16 block at a time in its own 1 KiB of the
  // shared memory (free now), then lane l writes row l / 2, columns 8 (l % 2) .. + 7.
  const uint lane = gl_SubgroupInvocationID, stage = sg * 64;  // uvec4s: 256 floats
  const bool has_bias = (pc.flags & 1u) != 0;
  [[unroll]] for (uint j = 0; j < TN; ++j) {
    [[unroll]] for (uint i = 0; i < TM; ++i) {
      coopMatStoreNV(acc[j][i], Sh, stage, 4, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      const uint n = n0 + sn * (BN / SGN) + 16 * j + lane / 2;
      const uint mb = m0 + (BM / SGM) * sm + 16 * i + 8 * (lane % 2);
      const uvec4 c0 = Sh[stage + 4 * (lane / 2) + 2 * (lane % 2)];
      const uvec4 c1 = Sh[stage + 4 * (lane / 2) + 2 * (lane % 2) + 1];
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
