// Reads of the device KV cache (layout in kv_store.comp), for attention.
// The K cache is bound at binding 1, the V cache at binding 2.
layout(binding = 1) readonly buffer KC { uint kc[]; };
layout(binding = 1) readonly buffer KCF { float kcf[]; };
layout(binding = 2) readonly buffer VC { uint vc[]; };
layout(binding = 2) readonly buffer VCF { float vcf[]; };
#if defined(KV_F16) && defined(USE_F16_STORAGE)
layout(binding = 1) readonly buffer KCH { f16vec2 kch[]; };
layout(binding = 2) readonly buffer VCH { f16vec2 vch[]; };
#endif

// Elements 2i, 2i+1 of cache row `row` (row = kv_head * n_ctx + position).
// off/d_off: word offsets of the quants and (Q8_0) scales of this layer.
vec2 k_pair(uint off, uint d_off, uint head_dim, uint row, uint i) {
#if defined(KV_F16)
#ifdef USE_F16_STORAGE
  return vec2(kch[off + row * (head_dim / 2) + i]);
#else
  return unpackHalf2x16(kc[off + row * (head_dim / 2) + i]);
#endif
#else
  const uint e = 2 * i;
  const int w = int(kc[off + row * (head_dim / 4) + e / 4]);
  const uint sh = 8 * (e % 4);
  const float d = kcf[d_off + row * (head_dim / 32) + e / 32];
  return vec2(float((w << (24 - sh)) >> 24), float((w << (16 - sh)) >> 24)) * d;
#endif
}

vec2 v_pair(uint off, uint d_off, uint head_dim, uint row, uint i) {
#if defined(KV_F16)
#ifdef USE_F16_STORAGE
  return vec2(vch[off + row * (head_dim / 2) + i]);
#else
  return unpackHalf2x16(vc[off + row * (head_dim / 2) + i]);
#endif
#else
  const uint e = 2 * i;
  const int w = int(vc[off + row * (head_dim / 4) + e / 4]);
  const uint sh = 8 * (e % 4);
  const float d = vcf[d_off + row * (head_dim / 32) + e / 32];
  return vec2(float((w << (24 - sh)) >> 24), float((w << (16 - sh)) >> 24)) * d;
#endif
}
