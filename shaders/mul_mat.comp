#version 450
// Y[n][m] = sum_k W[m][k] * X[n][k] (+ bias[m]) for many columns (prefill):
// a tiled matrix-matrix product. A workgroup of 256 threads computes a tile
// of BM = 64 rows x BN = 64 columns; each step dequantizes one 32-wide unit of
// its 64 weight rows into shared memory (As [BM][32]) next to the matching
// activations (Bs [BN][32]), then every thread accumulates a 4 x 4 block whose
// rows and columns are 16 apart (so shared-memory reads hit distinct banks).
// Grid: x = ceil(M / BM), y = ceil(N / BN).

#include "common.glsl"
#include "dequant.glsl"

#define BM 64
#define BN 64
#define TM 4
#define TN 4
// WG must be (BM / TM) * (BN / TN) = 256 (set by the host).

layout(binding = 1) readonly buffer X { float x[]; };
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

shared float As[BM][33];  // +1 column: row-wise stores hit distinct banks
shared float Bs[BN][33];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
  const uint tx = tid % (BN / TN), ty = tid / (BN / TN);

  float acc[TM][TN];
  [[unroll]] for (uint i = 0; i < TM; ++i) [[unroll]] for (uint j = 0; j < TN; ++j) acc[i][j] = 0.0;

  for (uint u = 0; u < pc.row_units; ++u) {
    if (tid < BM) {
      vec4 w[8];
      dq_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(m0 + tid, pc.M - 1), u, w);
      [[unroll]] for (uint i = 0; i < 8; ++i) {
        As[tid][4 * i] = w[i].x;
        As[tid][4 * i + 1] = w[i].y;
        As[tid][4 * i + 2] = w[i].z;
        As[tid][4 * i + 3] = w[i].w;
      }
    }
    [[unroll]] for (uint e = tid; e < BN * 32; e += WG) {
      const uint n = e / 32, k = e % 32;
      const uint kk = 32 * u + k;
      Bs[n][k] = (n0 + n < pc.N && kk < pc.K) ? x[pc.x_off + (n0 + n) * pc.x_ld + kk] : 0.0;
    }
    barrier();
    [[unroll]] for (uint k = 0; k < 32; ++k) {
      float a[TM], b[TN];
      [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = As[ty + 16 * i][k];
      [[unroll]] for (uint j = 0; j < TN; ++j) b[j] = Bs[tx + 16 * j][k];
      [[unroll]] for (uint i = 0; i < TM; ++i) [[unroll]] for (uint j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    barrier();
  }

  [[unroll]] for (uint i = 0; i < TM; ++i) {
    const uint m = m0 + ty + 16 * i;
    if (m >= pc.M) continue;
    const float bv = (pc.flags & 1u) != 0 ? bias[pc.b_off + m] : 0.0;
    [[unroll]] for (uint j = 0; j < TN; ++j) {
      const uint n = n0 + tx + 16 * j;
      if (n < pc.N) y[pc.y_off + n * pc.y_ld + m] = acc[i][j] + bv;
    }
  }
}
