#version 450
// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w: one workgroup per row.
// Grid: x (spilling into z) = rows.
//
// Decode normalizes one row, so the workgroup is wide (up to 512 threads on
// GPUs) and latency is what counts: with 16-byte aligned rows every thread
// loads its VPT vec4 of x and w up front, keeps them in registers through the
// reduction, and scales them without reading x again. Longer rows (more than
// VPT vec4 per thread) and unaligned ones take the plain loops for the rest.
#define RED_N 1
#if defined(Q8_OUT) && !defined(USE_SUBGROUP)
#undef Q8_OUT  // the variants without subgroups are plain rms_norm (never used)
#undef Q8_ONLY
#endif
#include "common.glsl"
#ifdef Q8_OUT
// rms_norm_q8: also a Q8 copy of the row (q8.glsl) for the integer-dot
// matvecs. The host keeps to one row with every vec4 in registers, WG a
// multiple of 8. quant_q8 (Q8_ONLY): the Q8 copy of a row as it is (an input
// of o or down), up to VPT = 8 vec4 per thread.
#include "q8.glsl"
#endif

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 1) readonly buffer W4 { vec4 w4[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(binding = 2) writeonly buffer O4 { vec4 o4[]; };

layout(push_constant) uniform PC {
  uint x_off, x_ld;
  uint w_off;
  uint o_off, o_ld;
  uint n;
  uint rows;
  float eps;
  uint vec4_ok;  // 1: every offset, stride and n a multiple of 4
  uint xq_off, xd_off;  // rms_norm_q8: words, vec2s
} pc;

#ifdef Q8_OUT
layout(binding = 3) writeonly buffer XQ { uint xq[]; };
layout(binding = 3) writeonly buffer XD { vec2 xd[]; };
#endif

#ifndef VPT
#define VPT 4  // vec4 per thread kept in registers
#endif

void main() {
  const uint t = linear_group();
  if (t >= pc.rows) return;  // uniform per workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint xb = pc.x_off + t * pc.x_ld;
  const uint ob = pc.o_off + t * pc.o_ld;
  float s[1];
  s[0] = 0.0;
  if (pc.vec4_ok != 0) {
    const uint n4 = pc.n / 4, xb4 = xb / 4, wb4 = pc.w_off / 4, ob4 = ob / 4;
    vec4 xv[VPT], wv[VPT];
    [[unroll]] for (uint i = 0; i < VPT; ++i) {
      const uint j = tid + i * WG;
      xv[i] = j < n4 ? x4[xb4 + j] : vec4(0.0);
#ifndef Q8_ONLY
      wv[i] = j < n4 ? w4[wb4 + j] : vec4(0.0);
#endif
    }
#ifndef Q8_ONLY
    float a = 0.0;
    [[unroll]] for (uint i = 0; i < VPT; ++i) a += dot(xv[i], xv[i]);
    for (uint j = tid + VPT * WG; j < n4; j += WG) a += dot(x4[xb4 + j], x4[xb4 + j]);
    s[0] = a;
    wg_sum_n(s);
    const float scale = 1.0 / sqrt(s[0] / float(pc.n) + pc.eps);
#endif
    [[unroll]] for (uint i = 0; i < VPT; ++i) {
      const uint j = tid + i * WG;
#ifdef Q8_ONLY
      const vec4 ov = xv[i];  // quant_q8: the row as it is, no norm, no float output
#else
      const vec4 ov = (xv[i] * scale) * wv[i];
      if (j < n4) o4[ob4 + j] = ov;
#endif
#ifdef Q8_OUT
      vec2 ds;
      const uint qw = q8_quant(ov, ds);
      if (j < n4) {
        xq[pc.xq_off + j] = qw;
        if (j % 8 == 0) xd[pc.xd_off + j / 8] = ds;
      }
#endif
    }
#ifndef Q8_ONLY
    for (uint j = tid + VPT * WG; j < n4; j += WG) o4[ob4 + j] = (x4[xb4 + j] * scale) * w4[wb4 + j];
#endif
  } else {
    for (uint i = tid; i < pc.n; i += WG) s[0] += x[xb + i] * x[xb + i];
    wg_sum_n(s);
    const float scale = 1.0 / sqrt(s[0] / float(pc.n) + pc.eps);
    for (uint i = tid; i < pc.n; i += WG) o[ob + i] = (x[xb + i] * scale) * w[pc.w_off + i];
  }
}
