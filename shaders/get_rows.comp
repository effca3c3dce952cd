#version 450
// out[t][k] = W[ids[t]][k]: embedding lookup, one thread per 32-wide unit.
// Grid: x = ceil(row_units / WG), y = T.
#include "common.glsl"
#include "dequant.glsl"

layout(binding = 1) readonly buffer I { int ids[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform PC {
  uint w_off, w_off2;
  uint row_units;
  uint K;        // elements per row
  uint n_rows;   // rows of the tensor (ids are clamped to it: never read out of bounds)
  uint ids_off;  // ints
  uint o_off, o_ld;  // floats
} pc;

void main() {
  const uint u = gl_GlobalInvocationID.x;
  const uint t = gl_WorkGroupID.y;
  if (u >= pc.row_units) return;
  const uint r = uint(clamp(ids[pc.ids_off + t], 0, int(pc.n_rows) - 1));
  vec4 w[8];
  dq_unit(pc.w_off, pc.w_off2, pc.row_units, r, u, w);
  const uint base = pc.o_off + t * pc.o_ld + 32 * u;
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    [[unroll]] for (uint e = 0; e < 4; ++e) {
      if (32 * u + 4 * i + e < pc.K) o[base + 4 * i + e] = w[i][e];
    }
  }
}
