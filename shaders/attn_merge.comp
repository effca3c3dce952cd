#version 450
// Merges the partial softmax results of attn_split.comp: for query token t and
// head h, with split maxima m_s, sums l_s and outputs o_s,
//   M = max m_s,  out = sum e^(m_s - M) o_s / sum e^(m_s - M) l_s.
// The threads find M and the sum over the splits together, then, WG splits at
// a time, put the weights e^(m_s - M) in shared memory, and threads over the
// head dimension sum the weighted o_s, UN splits' loads issued together.
// Grid: x = n_heads, y = T.
//
// Q8_OUT (attn_merge_q8, one token): also the output's Q8 copy (q8.glsl) for
// the integer-dot o matrix; the head's outputs meet in shared memory, then
// eight threads hold each 32-element block (head_dim a multiple of 32).
#define RED_N 1
#define UN 8
#include "common.glsl"

layout(binding = 0) readonly buffer PART { float part[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
#ifdef Q8_OUT
#include "q8.glsl"
layout(binding = 2) writeonly buffer QO { uint qo[]; };
layout(binding = 2) writeonly buffer QD { vec2 qdo[]; };
#define HD_MAX 256  // attn_split's
shared float osh[HD_MAX];
#endif

layout(push_constant) uniform PC {
  uint part_off;
  uint o_off, o_ld;
  uint n_heads, head_dim, n_splits;
  uint qo_off, qdo_off;  // Q8_OUT: words, vec2s
} pc;

shared float wsh[WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
  const uint hd = pc.head_dim, ns = pc.n_splits, stride = hd + 2;
  const uint pb = pc.part_off + (t * pc.n_heads + h) * ns * stride;
  float mx[1] = {NEG_BIG};
  for (uint s = tid; s < ns; s += WG) mx[0] = max(mx[0], part[pb + s * stride]);
  wg_max_n(mx);
  float l[1] = {0.0};
  for (uint s = tid; s < ns; s += WG) l[0] += exp(part[pb + s * stride] - mx[0]) * part[pb + s * stride + 1];
  wg_sum_n(l);
  // Threads over the head dimension (hd <= HD_MAX of attn_split: a few per thread).
  const uint nd = (hd + WG - 1) / WG;
  float acc[8];
  [[unroll]] for (uint k = 0; k < 8; ++k) acc[k] = 0.0;
  for (uint s0 = 0; s0 < ns; s0 += WG) {
    const uint n = min(WG, ns - s0);
    if (tid < n) wsh[tid] = exp(part[pb + (s0 + tid) * stride] - mx[0]);
    barrier();
    [[unroll]] for (uint k = 0; k < 8; ++k) {
      const uint d = tid + k * WG;
      if (k < nd && d < hd) {
        uint s = 0;
        for (; s + UN <= n; s += UN) {
          float v[UN];
          [[unroll]] for (uint c = 0; c < UN; ++c) v[c] = part[pb + (s0 + s + c) * stride + 2 + d];
          [[unroll]] for (uint c = 0; c < UN; ++c) acc[k] += wsh[s + c] * v[c];
        }
        for (; s < n; ++s) acc[k] += wsh[s] * part[pb + (s0 + s) * stride + 2 + d];
      }
    }
    barrier();
  }
  [[unroll]] for (uint k = 0; k < 8; ++k) {
    const uint d = tid + k * WG;
    if (k < nd && d < hd) {
      o[pc.o_off + t * pc.o_ld + h * hd + d] = acc[k] / l[0];
#ifdef Q8_OUT
      osh[d] = acc[k] / l[0];
#endif
    }
  }
#ifdef Q8_OUT
  barrier();
  const uint n4 = hd / 4;
  for (uint i0 = 0; i0 < n4; i0 += WG) {  // uniform
    const uint i = i0 + tid;
    const vec4 v = i < n4 ? vec4(osh[4 * i], osh[4 * i + 1], osh[4 * i + 2], osh[4 * i + 3]) : vec4(0.0);
    vec2 ds;
    const uint w = q8_quant(v, ds);
    if (i < n4) {
      qo[pc.qo_off + h * n4 + i] = w;
      if (i % 8 == 0) qdo[pc.qdo_off + (h * n4 + i) / 8] = ds;
    }
  }
#endif
}
