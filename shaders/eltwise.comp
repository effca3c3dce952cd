#version 450
// Element-wise ops on [rows, n] activations, one thread per element (or vec4):
//   OP_ADD       out = a + b
//   OP_SILU_MUL  out = silu(a) * b, silu(g) = g / (1 + exp(-g))
//   OP_GELU_MUL  out = gelu(a) * b, GELU's tanh form written as
//                a / (1 + exp(-2u)), u = sqrt(2/pi) (a + 0.044715 a^3): finite for any a
//   OP_COPY      out = a
// Rows are `*_ld` floats apart, so row views of wider matrices work. Where
// every offset, stride and n is a multiple of 4, a thread does one vec4.
// Grid: x (spilling into z) = ceil(n / WG) (ceil(n / 4 / WG) with vec4), y = rows.
#include "common.glsl"

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 1) readonly buffer B4 { vec4 b4[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(binding = 2) writeonly buffer O4 { vec4 o4[]; };

layout(push_constant) uniform PC {
  uint a_off, a_ld;
  uint b_off, b_ld;
  uint o_off, o_ld;
  uint n;
  uint v4;  // 1: every offset, stride and n a multiple of 4: one vec4 per thread
} pc;

#if defined(OP_ADD)
float op(float av, float bv) { return av + bv; }
vec4 op(vec4 av, vec4 bv) { return av + bv; }
#elif defined(OP_SILU_MUL)
float op(float av, float bv) { return av / (1.0 + exp(-av)) * bv; }
vec4 op(vec4 av, vec4 bv) { return av / (1.0 + exp(-av)) * bv; }
#elif defined(OP_GELU_MUL)
float op(float av, float bv) {
  return av / (1.0 + exp(-1.5957691216057308 * (av + 0.044715 * av * av * av))) * bv;
}
vec4 op(vec4 av, vec4 bv) {
  return av / (1.0 + exp(-1.5957691216057308 * (av + 0.044715 * av * av * av))) * bv;
}
#elif defined(OP_COPY)
float op(float av, float bv) { return av; }
vec4 op(vec4 av, vec4 bv) { return av; }
#else
#error "no OP_* defined"
#endif

void main() {
  const uint i = linear_group() * WG + gl_LocalInvocationID.x;
  const uint t = gl_WorkGroupID.y;
  if (pc.v4 != 0) {
    if (i >= pc.n / 4) return;
#ifdef OP_COPY
    const vec4 bv = vec4(0.0);
#else
    const vec4 bv = b4[(pc.b_off + t * pc.b_ld) / 4 + i];
#endif
    o4[(pc.o_off + t * pc.o_ld) / 4 + i] = op(a4[(pc.a_off + t * pc.a_ld) / 4 + i], bv);
    return;
  }
  if (i >= pc.n) return;
#ifdef OP_COPY
  const float bv = 0.0;
#else
  const float bv = b[pc.b_off + t * pc.b_ld + i];
#endif
  o[pc.o_off + t * pc.o_ld + i] = op(a[pc.a_off + t * pc.a_ld + i], bv);
}
