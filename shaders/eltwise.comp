#version 450
// Element-wise ops on [rows, n] activations, one thread per element:
//   OP_ADD       out = a + b
//   OP_SILU_MUL  out = silu(a) * b, silu(g) = g / (1 + exp(-g))
//   OP_COPY      out = a
// Rows are `*_ld` floats apart, so row views of wider matrices work.
// Grid: x (spilling into z) = ceil(n / WG), y = rows.
#include "common.glsl"

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform PC {
  uint a_off, a_ld;
  uint b_off, b_ld;
  uint o_off, o_ld;
  uint n;
} pc;

void main() {
  const uint i = linear_group() * WG + gl_LocalInvocationID.x;
  const uint t = gl_WorkGroupID.y;
  if (i >= pc.n) return;
  const float av = a[pc.a_off + t * pc.a_ld + i];
#if defined(OP_ADD)
  o[pc.o_off + t * pc.o_ld + i] = av + b[pc.b_off + t * pc.b_ld + i];
#elif defined(OP_SILU_MUL)
  o[pc.o_off + t * pc.o_ld + i] = av / (1.0 + exp(-av)) * b[pc.b_off + t * pc.b_ld + i];
#elif defined(OP_COPY)
  o[pc.o_off + t * pc.o_ld + i] = av;
#else
#error "no OP_* defined"
#endif
}
