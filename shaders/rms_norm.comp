#version 450
// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w: one workgroup per row.
// Grid: x (spilling into z) = rows.
#define RED_N 1
#include "common.glsl"

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform PC {
  uint x_off, x_ld;
  uint w_off;
  uint o_off, o_ld;
  uint n;
  uint rows;
  float eps;
} pc;

void main() {
  const uint t = linear_group();
  if (t >= pc.rows) return;  // uniform per workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint xb = pc.x_off + t * pc.x_ld;
  float s[1];
  s[0] = 0.0;
  for (uint i = tid; i < pc.n; i += WG) s[0] += x[xb + i] * x[xb + i];
  wg_sum_n(s);
  const float scale = 1.0 / sqrt(s[0] / float(pc.n) + pc.eps);
  const uint ob = pc.o_off + t * pc.o_ld;
  for (uint i = tid; i < pc.n; i += WG) o[ob + i] = (x[xb + i] * scale) * w[pc.w_off + i];
}
