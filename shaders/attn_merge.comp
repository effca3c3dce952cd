#version 450
// Merges the partial softmax results of attn_split.comp / attn_decode.comp:
// for query token t and head h, with split maxima m_s, sums l_s and outputs
// o_s,
//   M = max m_s,  out = sum e^(m_s - M) o_s / sum e^(m_s - M) l_s.
// A workgroup takes 32 values of one head (x: head, y: token, z: which 32).
// Its threads find M and the sum over the splits together; then thread tid
// takes value tid % 32 of the splits s = tid / 32 (mod WG / 32), UN loads in
// flight, and the WG / 32 slices' sums meet in shared memory. (Before, a
// workgroup per head walked every split with a thread per value: 32
// workgroups for an 8B llama's decode, on a GPU of 132 SMs.)
//
// Q8_OUT (attn_merge_q8, one token): also the output's Q8 copy (q8.glsl) for
// the integer-dot o matrix; the workgroup's 32 values are one block
// (head_dim a multiple of 32), quantized by its first eight threads.
// WG: a multiple of 32.
#define RED_N 1
#define UN 4
#include "common.glsl"

layout(binding = 0) readonly buffer PART { float part[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
#ifdef Q8_OUT
#include "q8.glsl"
layout(binding = 2) writeonly buffer QO { uint qo[]; };
layout(binding = 2) writeonly buffer QD { vec2 qdo[]; };
#endif

layout(push_constant) uniform PC {
  uint part_off;
  uint o_off, o_ld;
  uint n_heads, head_dim, n_splits;
  uint qo_off, qdo_off;  // Q8_OUT: words, vec2s
} pc;

const uint NW = WG / 32;  // slices of the splits
shared float osh[NW][32];

void main() {
  const uint tid = gl_LocalInvocationID.x, lane = tid % 32, w = tid / 32;
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, d = gl_WorkGroupID.z * 32 + lane;
  const uint hd = pc.head_dim, ns = pc.n_splits, stride = hd + 2;
  const uint pb = pc.part_off + (t * pc.n_heads + h) * ns * stride;
  float mx[1] = {NEG_BIG};
  for (uint s = tid; s < ns; s += WG) mx[0] = max(mx[0], part[pb + s * stride]);
  wg_max_n(mx);
  const float M = mx[0];
  float l[1] = {0.0};
  for (uint s = tid; s < ns; s += WG) l[0] += exp(part[pb + s * stride] - M) * part[pb + s * stride + 1];
  wg_sum_n(l);
  float acc = 0.0;
  if (d < hd) {
    uint s = w;
    for (; s + (UN - 1) * NW < ns; s += UN * NW) {
      float m[UN], v[UN];
      [[unroll]] for (uint c = 0; c < UN; ++c) {
        m[c] = part[pb + (s + c * NW) * stride];
        v[c] = part[pb + (s + c * NW) * stride + 2 + d];
      }
      [[unroll]] for (uint c = 0; c < UN; ++c) acc += exp(m[c] - M) * v[c];
    }
    for (; s < ns; s += NW) acc += exp(part[pb + s * stride] - M) * part[pb + s * stride + 2 + d];
  }
  osh[w][lane] = acc;
  barrier();
  float v = 0.0;
  if (w == 0) {
    for (uint k = 0; k < NW; ++k) v += osh[k][lane];
    v = l[0] > 0.0 ? v / l[0] : 0.0;
    if (d < hd) o[pc.o_off + t * pc.o_ld + h * hd + d] = v;
  }
#ifdef Q8_OUT
  barrier();
  if (w == 0) osh[0][lane] = v;
  barrier();
  const vec4 x = tid < 8 ? vec4(osh[0][4 * tid], osh[0][4 * tid + 1], osh[0][4 * tid + 2], osh[0][4 * tid + 3]) : vec4(0.0);
  vec2 ds;
  const uint q = q8_quant(x, ds);
  const uint i0 = (h * hd + gl_WorkGroupID.z * 32) / 4;  // the block's first word
  if (tid < 8) {
    qo[pc.qo_off + i0 + tid] = q;
    if (tid == 0) qdo[pc.qdo_off + i0 / 8] = ds;
  }
#endif
}
