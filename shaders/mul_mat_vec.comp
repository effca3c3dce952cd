#version 450
// y[c][r] = sum_k W[r][k] * x[c][k] (+ bias[r]) for a few columns c (decode):
// matrix-vector products, memory bound on the weights.
//
// A workgroup owns NR consecutive rows; all its threads stride over the
// 32-element units of those rows, so each x unit is loaded once per NR rows
// and a warp reads consecutive units (coalesced). Partial sums are reduced
// across the workgroup (subgroupAdd, then shared memory) at the end.
// Grid: x (spilling into z) = row groups (NR rows, or NSG * NR with subgroups),
// y = ceil(N / NC) column blocks.

// NC: columns per workgroup, a variant define (1 for single-token decode, so
// only 2 sums are reduced; 8 for small batches).
#ifndef NC
#define NC 8
#endif
// Rows handled together (each x unit is loaded once for all of them): up to 8
// for one column, where x loads would otherwise outnumber weight loads; 2 for
// several columns (their dequantized weights stay in registers) and for the
// workgroup-reduction path.
#if NC == 1 && defined(USE_SUBGROUP)
#define NR_MAX 8
#else
#define NR_MAX 2
#endif
layout(constant_id = 1) const uint NR = 2;  // rows together, 1..NR_MAX (the host keeps to it)
#define ACC_N (NR_MAX * NC)  // accumulators per thread
#ifndef USE_SUBGROUP
#define RED_N ACC_N  // common.glsl's shared-memory reductions
#endif
#include "common.glsl"
#define WANT_DOT_UNIT
#include "dequant.glsl"

layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 3) readonly buffer B { float bias[]; };

layout(push_constant) uniform PC {
  uint w_off, w_off2;   // weight arrays (uint words)
  uint row0;            // first row of the view inside the tensor
  uint row_units;       // 32-element units per row of the tensor
  uint K, M, N;         // elements per row, rows, columns
  uint x_off, x_ld;     // floats
  uint y_off, y_ld;     // floats
  uint b_off;           // floats
  uint flags;           // 1: add bias; 2: x rows 16-byte aligned (vec4 loads)
} pc;

void load_x(uint c, uint u, out vec4 xv[8]) {
  const uint base = pc.x_off + c * pc.x_ld + 32 * u;
  if ((pc.flags & 2u) != 0 && 32 * u + 32 <= pc.K) {
    [[unroll]] for (uint i = 0; i < 8; ++i) xv[i] = x4[base / 4 + i];
  } else {
    // Tail of an F32/F16 row, or unaligned rows: weights past K are zero
    // padding, but x past K belongs to the next row (maybe Inf), so mask it.
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      vec4 v;
      [[unroll]] for (uint e = 0; e < 4; ++e) {
        const uint k = 32 * u + 4 * i + e;
        v[e] = k < pc.K ? x[base + 4 * i + e] : 0.0;
      }
      xv[i] = v;
    }
  }
}

#ifdef USE_SUBGROUP
// Subgroup per row group: each subgroup owns NR consecutive rows at a time,
// its lanes stride over the row's units, and subgroupAdd finishes the sums:
// no shared memory and no barrier. A workgroup covers NSG * NR rows; NSG is
// the host's guess of subgroups per workgroup (WG / subgroupSize), but the
// loop below is correct for any actual subgroup count.
layout(constant_id = 2) const uint NSG = 4;

void main() {
  const uint c0 = gl_WorkGroupID.y * NC;
  const uint nc = min(NC, pc.N - c0);
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  for (uint chunk = gl_SubgroupID; chunk < NSG; chunk += gl_NumSubgroups) {
    const uint r0 = (linear_group() * NSG + chunk) * NR;
    if (r0 >= pc.M) break;  // uniform in the subgroup
    float acc[ACC_N];
    [[unroll]] for (uint i = 0; i < ACC_N; ++i) acc[i] = 0.0;
    for (uint u = lane; u < pc.row_units; u += width) {
#if NC == 1
      // One column (decode): scales folded out of the inner loop (dot_unit).
      vec4 xv[8];
      load_x(c0, u, xv);
      float xsum = 0.0;
      [[unroll]] for (uint i = 0; i < 8; ++i) xsum += dot(xv[i], vec4(1.0));
      [[unroll]] for (uint r = 0; r < NR; ++r) {
        acc[r] += dot_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(r0 + r, pc.M - 1), u, xv, xsum);
      }
#else
      // Several columns: dequantize each unit once, dot it with every column.
      vec4 w[NR_MAX][8];
      [[unroll]] for (uint r = 0; r < NR; ++r) {
        dq_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(r0 + r, pc.M - 1), u, w[r]);
      }
      [[unroll]] for (uint c = 0; c < NC; ++c) {
        if (c < nc) {
          vec4 xv[8];
          load_x(c0 + c, u, xv);
          [[unroll]] for (uint r = 0; r < NR; ++r) {
            float s = 0.0;
            [[unroll]] for (uint i = 0; i < 8; ++i) s += dot(w[r][i], xv[i]);
            acc[r * NC + c] += s;
          }
        }
      }
#endif
    }
    [[unroll]] for (uint i = 0; i < ACC_N; ++i) acc[i] = subgroupAdd(acc[i]);
    [[unroll]] for (uint i = 0; i < ACC_N; ++i) {
      const uint r = i / NC, c = i % NC;
      if (lane == i % width && r < NR && c < nc && r0 + r < pc.M) {
        float v = acc[i];
        if ((pc.flags & 1u) != 0) v += bias[pc.b_off + r0 + r];
        y[pc.y_off + (c0 + c) * pc.y_ld + r0 + r] = v;
      }
    }
  }
}
#else
// Without subgroups: the whole workgroup shares NR rows; partial sums meet in
// a shared-memory tree (common.glsl).
void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r0 = linear_group() * NR;
  const uint c0 = gl_WorkGroupID.y * NC;
  const uint nc = min(NC, pc.N - c0);

  float acc[RED_N];
  [[unroll]] for (uint i = 0; i < RED_N; ++i) acc[i] = 0.0;

  for (uint u = tid; u < pc.row_units; u += WG) {
    vec4 w[NR_MAX][8];
    [[unroll]] for (uint r = 0; r < NR; ++r) {
      // Rows past M repeat the last row (their sums are dropped) so loads stay in bounds.
      dq_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(r0 + r, pc.M - 1), u, w[r]);
    }
    [[unroll]] for (uint c = 0; c < NC; ++c) {
      if (c < nc) {
        vec4 xv[8];
        load_x(c0 + c, u, xv);
        [[unroll]] for (uint r = 0; r < NR; ++r) {
          float s = 0.0;
          [[unroll]] for (uint i = 0; i < 8; ++i) s += dot(w[r][i], xv[i]);
          acc[r * NC + c] += s;
        }
      }
    }
  }

  wg_sum_n(acc);
  if (tid < NR * NC) {
    const uint r = tid / NC, c = tid % NC;
    if (c < nc && r0 + r < pc.M) {
      float v = acc[tid];
      if ((pc.flags & 1u) != 0) v += bias[pc.b_off + r0 + r];
      y[pc.y_off + (c0 + c) * pc.y_ld + r0 + r] = v;
    }
  }
}
#endif
