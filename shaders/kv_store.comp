#version 450
// Writes T tokens' K and V ([T, n_kv_heads * head_dim] floats) into one
// layer's device KV cache at rows pos[t]: a copy with conversion.
// Cache layout (engine/backends/vulkan/vk_kv.cpp), per layer, K and V alike:
//   KV_F16   [n_kv_heads][n_ctx][head_dim] halves, two to a word
//   KV_Q8_0  quants [n_kv_heads][n_ctx][head_dim] int8 (four to a word), then
//            at d_off the scales [n_kv_heads][n_ctx][head_dim / 32] as floats
//            (rounded to fp16 values, as the CPU's Q8_0 blocks hold them)
// Grid: x = ceil(n_kv_heads * items / WG), y = T; an item is a pair of halves
// (F16) or a 32-element block (Q8_0).
#include "common.glsl"

layout(binding = 0) readonly buffer K { float k[]; };
layout(binding = 1) readonly buffer V { float v[]; };
layout(binding = 2) buffer KC { uint kc[]; };
layout(binding = 2) buffer KCF { float kcf[]; };
layout(binding = 3) buffer VC { uint vc[]; };
layout(binding = 3) buffer VCF { float vcf[]; };
layout(binding = 4) readonly buffer P { int pos[]; };

layout(push_constant) uniform PC {
  uint k_off, k_ld, v_off, v_ld;  // floats
  uint kc_off, kc_d_off;          // words
  uint vc_off, vc_d_off;          // words
  uint n_ctx, n_kv_heads, head_dim;
  uint pos_off;
} pc;

#ifdef KV_Q8_0
// quantize_row_q8_0 of cpu/ref: d = amax / 127, q = round-half-away(x / d).
void q8_block(uint src, bool is_k, out uint q[8], out float d) {
  float amax = 0.0;
  [[unroll]] for (uint e = 0; e < 32; ++e) amax = max(amax, abs(is_k ? k[src + e] : v[src + e]));
  d = amax / 127.0;
  const float id = d != 0.0 ? 1.0 / d : 0.0;
  [[unroll]] for (uint w = 0; w < 8; ++w) {
    uint word = 0;
    [[unroll]] for (uint e = 0; e < 4; ++e) {
      const float xv = (is_k ? k[src + 4 * w + e] : v[src + 4 * w + e]) * id;
      const int qi = int(sign(xv) * floor(abs(xv) + 0.5));
      word |= (uint(qi) & 0xFFu) << (8 * e);
    }
    q[w] = word;
  }
  d = unpackHalf2x16(packHalf2x16(vec2(d, 0.0))).x;
}
#endif

void main() {
  const uint t = gl_WorkGroupID.y;
  const uint g = gl_GlobalInvocationID.x;
#ifdef KV_F16
  const uint items = pc.head_dim / 2;
#else
  const uint items = pc.head_dim / 32;
#endif
  if (g >= pc.n_kv_heads * items) return;
  const uint h = g / items, it = g % items;
  const uint row = h * pc.n_ctx + uint(pos[pc.pos_off + t]);  // row of the cache
  const uint ks = pc.k_off + t * pc.k_ld + h * pc.head_dim;
  const uint vs = pc.v_off + t * pc.v_ld + h * pc.head_dim;
#ifdef KV_F16
  kc[pc.kc_off + row * items + it] = packHalf2x16(vec2(k[ks + 2 * it], k[ks + 2 * it + 1]));
  vc[pc.vc_off + row * items + it] = packHalf2x16(vec2(v[vs + 2 * it], v[vs + 2 * it + 1]));
#else
  uint q[8];
  float d;
  q8_block(ks + 32 * it, true, q, d);
  [[unroll]] for (uint w = 0; w < 8; ++w) kc[pc.kc_off + row * (pc.head_dim / 4) + 8 * it + w] = q[w];
  kcf[pc.kc_d_off + row * items + it] = d;
  q8_block(vs + 32 * it, false, q, d);
  [[unroll]] for (uint w = 0; w < 8; ++w) vc[pc.vc_off + row * (pc.head_dim / 4) + 8 * it + w] = q[w];
  vcf[pc.vc_d_off + row * items + it] = d;
#endif
}
