#version 450
// Causal GQA attention for prefill, tiled (flash attention): a workgroup takes
// BR = 16 query tokens of one head and walks the keys 0 .. (largest position
// among them) in tiles of BC = 16, keeping a running max m, sum l and output
// o per query (online softmax), so no [T, n_kv] score matrix exists anywhere.
// Q, K and V tiles sit in shared memory as floats (K/V converted from the
// cache once per tile); TPQ = 8 threads serve one query row: each scores two
// keys of the tile and owns head_dim / 8 output dimensions (strided by 8, so
// a row's threads read consecutive V elements).
// Grid: x = ceil(T / BR), y = n_heads. WG must be BR * TPQ = 128.
#define BR 16
#define BC 16
#define TPQ 8
#define HD_MAX 128  // larger heads go to attn_split (checked by the host)
#define DPT (HD_MAX / TPQ)
#include "common.glsl"
#include "kv_read.glsl"

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) readonly buffer P { int pos[]; };

layout(push_constant) uniform PC {
  uint q_off, q_ld, o_off, o_ld;
  uint kc_off, kc_d_off, vc_off, vc_d_off;
  uint n_ctx, n_heads, n_kv_heads, head_dim;
  uint pos_off, T;
  float scale;
} pc;

shared float qs[BR][HD_MAX];
shared float ks[BC][HD_MAX + 1];  // +1: the row's threads read different keys' rows
shared float vs[BC][HD_MAX];
shared float ss[BR][BC];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint i = tid / TPQ, sub = tid % TPQ;
  const uint t0 = gl_WorkGroupID.x * BR, h = gl_WorkGroupID.y;
  const uint kvh = h / (pc.n_heads / pc.n_kv_heads);
  const uint hd = pc.head_dim, hp = hd / 2;
  const bool valid = t0 + i < pc.T;
  const int my_pos = valid ? pos[pc.pos_off + t0 + i] : -1;
  int kmax = 0;  // the same in every thread: the loop bound stays uniform
  for (uint r = 0; r < BR && t0 + r < pc.T; ++r) kmax = max(kmax, pos[pc.pos_off + t0 + r]);

  for (uint e = tid; e < BR * hd; e += WG) {
    const uint r = e / hd, d = e % hd;
    qs[r][d] = t0 + r < pc.T ? q[pc.q_off + (t0 + r) * pc.q_ld + h * hd + d] * pc.scale : 0.0;
  }

  float acc[DPT];
  [[unroll]] for (uint k = 0; k < DPT; ++k) acc[k] = 0.0;
  float m = NEG_BIG, l = 0.0;

  for (int kb = 0; kb <= kmax; kb += BC) {
    barrier();  // the previous tile is consumed (and, the first time, qs is written)
    for (uint e = tid; e < BC * hp; e += WG) {
      const uint j = e / hp, ip = e % hp;
      const int key = kb + int(j);
      vec2 kv = vec2(0.0), vv = vec2(0.0);
      if (key <= kmax) {
        const uint row = kvh * pc.n_ctx + uint(key);
        kv = k_pair(pc.kc_off, pc.kc_d_off, hd, row, ip);
        vv = v_pair(pc.vc_off, pc.vc_d_off, hd, row, ip);
      }
      ks[j][2 * ip] = kv.x;
      ks[j][2 * ip + 1] = kv.y;
      vs[j][2 * ip] = vv.x;
      vs[j][2 * ip + 1] = vv.y;
    }
    barrier();
    [[unroll]] for (uint jj = 0; jj < BC / TPQ; ++jj) {
      const uint j = sub * (BC / TPQ) + jj;
      float s = 0.0;
      for (uint d = 0; d < hd; ++d) s += qs[i][d] * ks[j][d];
      ss[i][j] = kb + int(j) <= my_pos ? s : NEG_BIG;
    }
    barrier();
    float mx = m;
    [[unroll]] for (uint j = 0; j < BC; ++j) mx = max(mx, ss[i][j]);
    const float alpha = exp(m - mx);
    float p[BC];
    float psum = 0.0;
    [[unroll]] for (uint j = 0; j < BC; ++j) {
      p[j] = ss[i][j] > 0.5 * NEG_BIG ? exp(ss[i][j] - mx) : 0.0;
      psum += p[j];
    }
    l = l * alpha + psum;
    m = mx;
    [[unroll]] for (uint k = 0; k < DPT; ++k) {
      const uint d = sub + TPQ * k;
      if (d < hd) {
        float a = acc[k] * alpha;
        [[unroll]] for (uint j = 0; j < BC; ++j) a += p[j] * vs[j][d];
        acc[k] = a;
      }
    }
  }

  if (valid) {
    [[unroll]] for (uint k = 0; k < DPT; ++k) {
      const uint d = sub + TPQ * k;
      if (d < hd) o[pc.o_off + (t0 + i) * pc.o_ld + h * hd + d] = acc[k] / l;
    }
  }
}
