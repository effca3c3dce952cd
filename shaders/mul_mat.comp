#version 450
// Y[n][m] = sum_k W[m][k] * X[n][k] (+ bias[m]) for many columns (prefill):
// a tiled matrix-matrix product. A workgroup of 256 threads computes a tile
// of BM = 128 weight rows x BN columns. Each step takes one 32-wide unit of
// k: half the threads dequantize a weight row's unit each into shared memory
// and all of them load the matching activations, both stored k-major as
// vec4s of 4 rows (As4[k][m / 4]) or columns (Bs4[k][n / 4]). Then every
// thread accumulates an 8 x TN block: rows 4 ty .. 4 ty + 3 and 64 + the
// same, columns 4 tx .. 4 tx + 3 (and 64 + the same when BN is 128), with
// tx = tid % 16, ty = tid / 16: two vec4 reads of shared memory for the rows
// and one per four columns, for 8 TN multiply-adds per k.
// Grid: x = ceil(M / BM), y = ceil(N / BN).

#include "common.glsl"
#include "dequant.glsl"

#define BM 128
#ifndef BN
#define BN 64
#endif
#define NB (BN / 64)  // column vec4s per thread
// WG must be 256 (set by the host): 16 x 16 threads.

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

shared vec4 As4[32][BM / 4];
shared vec4 Bs4[32][BN / 4];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
  const uint tx = tid % 16, ty = tid / 16;

  // acc[i][c]: row (i < 4 ? 4 ty + i : 64 + 4 ty + i - 4), columns 64 c + 4 tx .. + 3
  vec4 acc[8][NB];
  [[unroll]] for (uint i = 0; i < 8; ++i) [[unroll]] for (uint c = 0; c < NB; ++c) acc[i][c] = vec4(0.0);

  for (uint u = 0; u < pc.row_units; ++u) {
    if (tid < BM) {
      // Rows past M repeat the last row (their sums are dropped) so loads stay in bounds.
      vec4 w[8];
      dq_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(m0 + tid, pc.M - 1), u, w);
      [[unroll]] for (uint i = 0; i < 8; ++i) {
        [[unroll]] for (uint c = 0; c < 4; ++c) As4[4 * i + c][tid / 4][tid % 4] = w[i][c];
      }
    }
    // Activations: thread (k4, n) loads x[n0 + n][32 u + 4 k4 .. + 3].
    [[unroll]] for (uint r = 0; r < 2 * NB; ++r) {
      const uint e = tid + 256 * r, n = e % BN, k4 = e / BN;
      const uint kk = 32 * u + 4 * k4;
      vec4 v = vec4(0.0);
      if (n0 + n < pc.N) {
        const uint base = pc.x_off + (n0 + n) * pc.x_ld + kk;
        if ((pc.flags & 2u) != 0 && kk + 4 <= pc.K) {
          v = x4[base / 4];
        } else {
          // Past K, x belongs to the next row (maybe Inf): masked.
          [[unroll]] for (uint c = 0; c < 4; ++c) v[c] = kk + c < pc.K ? x[base + c] : 0.0;
        }
      }
      [[unroll]] for (uint c = 0; c < 4; ++c) Bs4[4 * k4 + c][n / 4][n % 4] = v[c];
    }
    barrier();
    [[unroll]] for (uint k = 0; k < 32; ++k) {
      const vec4 a0 = As4[k][ty], a1 = As4[k][16 + ty];
      vec4 b[NB];
      [[unroll]] for (uint c = 0; c < NB; ++c) b[c] = Bs4[k][16 * c + tx];
      [[unroll]] for (uint i = 0; i < 4; ++i) {
        [[unroll]] for (uint c = 0; c < NB; ++c) {
          acc[i][c] += a0[i] * b[c];
          acc[4 + i][c] += a1[i] * b[c];
        }
      }
    }
    barrier();
  }

  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const uint m = m0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + i - 4);
    if (m >= pc.M) continue;
    const float bv = (pc.flags & 1u) != 0 ? bias[pc.b_off + m] : 0.0;
    [[unroll]] for (uint c = 0; c < NB; ++c) {
      [[unroll]] for (uint j = 0; j < 4; ++j) {
        const uint n = n0 + 64 * c + 4 * tx + j;
        if (n < pc.N) y[pc.y_off + n * pc.y_ld + m] = acc[i][c][j] + bv;
      }
    }
  }
}
