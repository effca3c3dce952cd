#version 450
// RoPE in place on x [T, n_heads * head_dim] and, when n_heads2 > 0, on x2
// [T, n_heads2 * head_dim] (q and k in one dispatch): token t at position
// pos[t]. One thread per rotated pair, its angle from rope.glsl. Normal
// ordering rotates (2i, 2i+1); NeoX rotates (i, i + n_rot/2).
// Grid: x = ceil((n_heads + n_heads2) * n_rot / 2 / WG), y = T (rope_kv:
// n_heads + 2 n_heads2 in place of n_heads + n_heads2).
#include "common.glsl"

layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer P { int pos[]; };
layout(binding = 2) readonly buffer F { float ff[]; };
layout(binding = 3) buffer X2 { float x2[]; };
#ifdef KV_STORE
// rope_kv: x2 is k, rotated and also written as F16 into this token's row of
// the layer's K cache, and v copied into the V cache (kv_store.comp's F16
// layout); normal ordering with n_rot = head_dim only (the host checks).
// Threads past the rotated pairs copy v's pairs.
layout(binding = 4) readonly buffer V { float v[]; };
layout(binding = 5) buffer C { uint cache[]; };
#endif

layout(push_constant) uniform PC {
  uint x_off, x_ld;
  uint n_heads, head_dim, n_rot;
  uint neox;
  uint pos_off;
  uint ff_off;        // 0xFFFFFFFF: no frequency factors
  float theta_scale;  // freq_base^(-2 / n_rot)
  float freq_scale;
  float ext_factor, attn_factor;
  float corr0, corr1;  // YaRN ramp ends (pair indices)
  uint x2_off, x2_ld, n_heads2;
  uint v_off, v_ld, kc_off, vc_off, n_ctx;  // KV_STORE: v, and the caches (words)
} pc;

#include "rope.glsl"

void main() {
  const uint half_rot = pc.n_rot / 2;
  const uint g = gl_GlobalInvocationID.x;
  const uint t = gl_WorkGroupID.y;
#ifdef KV_STORE
  if (g >= (pc.n_heads + 2 * pc.n_heads2) * half_rot) return;
  if (g >= (pc.n_heads + pc.n_heads2) * half_rot) {  // v's pair (2 j, 2 j + 1) of head hv
    const uint gv = g - (pc.n_heads + pc.n_heads2) * half_rot;
    const uint hv = gv / half_rot, j = gv % half_rot;
    const uint src = pc.v_off + t * pc.v_ld + hv * pc.head_dim + 2 * j;
    const uint row = hv * pc.n_ctx + uint(pos[pc.pos_off + t]);
    cache[pc.vc_off + row * half_rot + j] = packHalf2x16(vec2(v[src], v[src + 1]));
    return;
  }
#else
  if (g >= (pc.n_heads + pc.n_heads2) * half_rot) return;
#endif
  const bool second = g >= pc.n_heads * half_rot;
  const uint h = (second ? g - pc.n_heads * half_rot : g) / half_rot, i = g % half_rot;

  const vec2 cs = rope_cs(i, pos[pc.pos_off + t]);
  const float c = cs.x, s = cs.y;

  const uint i0 = pc.neox != 0 ? i : 2 * i;
  const uint i1 = pc.neox != 0 ? i + half_rot : 2 * i + 1;
  if (second) {
    const uint base = pc.x2_off + t * pc.x2_ld + h * pc.head_dim;
    const float x0 = x2[base + i0], x1 = x2[base + i1];
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    x2[base + i0] = y0;
    x2[base + i1] = y1;
#ifdef KV_STORE
    const uint row = h * pc.n_ctx + uint(pos[pc.pos_off + t]);
    cache[pc.kc_off + row * half_rot + i] = packHalf2x16(vec2(y0, y1));
#endif
  } else {
    const uint base = pc.x_off + t * pc.x_ld + h * pc.head_dim;
    const float x0 = x[base + i0], x1 = x[base + i1];
    x[base + i0] = x0 * c - x1 * s;
    x[base + i1] = x0 * s + x1 * c;
  }
}
