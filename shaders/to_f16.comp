#version 450
// Rows of F32 activations as F16, for the tensor-core matmul (mul_mat_cm.comp
// reads its x tiles from this copy): row r's n values at a_off + r a_ld
// (floats) go to row r of the copy at o_off + r o_ld (uvec4s of 8 halves),
// zeros past n up to the row's end (o_ld 8-half pieces). One thread per piece.
// Grid: x (spilling into z) = ceil(o_ld / WG), y = rows.
#include "common.glsl"

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(binding = 1) writeonly buffer O { uvec4 o[]; };

layout(push_constant) uniform PC {
  uint a_off, a_ld, n;
  uint o_off, o_ld;
  uint v4;  // 1: a_off and a_ld multiples of 4 (vec4 loads)
} pc;

void main() {
  const uint i = linear_group() * WG + gl_LocalInvocationID.x;
  if (i >= pc.o_ld) return;
  const uint r = gl_WorkGroupID.y, k = 8 * i, base = pc.a_off + r * pc.a_ld + k;
  vec4 lo = vec4(0.0), hi = vec4(0.0);
  if (pc.v4 != 0 && k + 8 <= pc.n) {
    lo = a4[base / 4];
    hi = a4[base / 4 + 1];
  } else {
    [[unroll]] for (uint c = 0; c < 4; ++c) {
      lo[c] = k + c < pc.n ? a[base + c] : 0.0;
      hi[c] = k + 4 + c < pc.n ? a[base + 4 + c] : 0.0;
    }
  }
  o[pc.o_off + r * pc.o_ld + i] =
      uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
}
