#version 450
// Rows of a quantized weight matrix as F16 rows in the F16 upload layout (the
// "pre" tiles of the tensor-core matmul run mul_mat_cm.comp's F16 variant on
// them; engine/backends/vulkan/vulkan_matmul.cpp): weight rows row0 .. row0 +
// rows - 1, each of row_units 32-wide units (dequant.glsl's layout at binding
// 0), go to rows 0 .. rows - 1 of the copy at o_off (uvec4s of 8 halves, 4
// per unit). One thread per unit.
// Grid: x (spilling into z) = ceil(rows row_units / WG).
#include "common.glsl"
#include "dequant.glsl"

layout(binding = 1) writeonly buffer O { uvec4 o[]; };

layout(push_constant) uniform PC {
  uint w_off, w_off2;
  uint row0, row_units, rows;
  uint o_off;
} pc;

void main() {
  const uint i = linear_group() * WG + gl_LocalInvocationID.x;
  if (i >= pc.rows * pc.row_units) return;
  const uint r = i / pc.row_units, u = i % pc.row_units;
  vec4 w[8];
  dq_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + r, u, w);
  [[unroll]] for (uint q = 0; q < 4; ++q) {
    o[pc.o_off + 4 * i + q] = uvec4(packHalf2x16(w[2 * q].xy), packHalf2x16(w[2 * q].zw),
                                    packHalf2x16(w[2 * q + 1].xy), packHalf2x16(w[2 * q + 1].zw));
  }
}
