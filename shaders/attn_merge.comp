#version 450
// Merges the partial softmax results of attn_split.comp: for query token t and
// head h, with split maxima m_s, sums l_s and outputs o_s,
//   M = max m_s,  out = sum e^(m_s - M) o_s / sum e^(m_s - M) l_s.
// Grid: x = n_heads, y = T; threads over the head dimension.
#include "common.glsl"

layout(binding = 0) readonly buffer PART { float part[]; };
layout(binding = 1) writeonly buffer O { float o[]; };

layout(push_constant) uniform PC {
  uint part_off;
  uint o_off, o_ld;
  uint n_heads, head_dim, n_splits;
} pc;

void main() {
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
  const uint hd = pc.head_dim;
  const uint pb = pc.part_off + (t * pc.n_heads + h) * pc.n_splits * (hd + 2);
  float mx = NEG_BIG;
  for (uint s = 0; s < pc.n_splits; ++s) mx = max(mx, part[pb + s * (hd + 2)]);
  float l = 0.0;
  for (uint s = 0; s < pc.n_splits; ++s) l += exp(part[pb + s * (hd + 2)] - mx) * part[pb + s * (hd + 2) + 1];
  for (uint d = gl_LocalInvocationID.x; d < hd; d += WG) {
    float acc = 0.0;
    for (uint s = 0; s < pc.n_splits; ++s) acc += exp(part[pb + s * (hd + 2)] - mx) * part[pb + s * (hd + 2) + 2 + d];
    o[pc.o_off + t * pc.o_ld + h * hd + d] = acc / l;
  }
}
