// Weight dequantization for the matmul and get_rows shaders. Exactly one DT_*
// is defined per variant. Weights sit at binding 0 in the layout the backend
// repacks them into at upload (engine/backends/vulkan/vk_weights.cpp):
//
//   F32   rows padded with zeros to a multiple of 32 floats
//   F16   rows padded with zeros to a multiple of 32 halves
//   Q8_0  two arrays: quants [rows][blocks][32 x int8] at w_off, and the fp16
//         scales [rows][blocks] at w_off2 (both in uint words)
//   Q4_0  likewise: quants [rows][blocks][16 bytes], scales [rows][blocks] fp16
//   Q4_K  GGUF blocks as they are (144 bytes = 36 words)
//   Q5_K  GGUF blocks as they are (176 bytes = 44 words)
//   Q6_K  GGUF blocks padded from 210 to 212 bytes (53 words)
//
// dq_unit(r, u) gives elements [32u, 32u + 32) of row r as 8 vec4: the 32-wide
// "unit" every shader steps by. Products are taken in the order of the
// cpu/ref dequantizers (d * scale first, then the quant).

layout(binding = 0) readonly restrict buffer WU { uint wu[]; };
layout(binding = 0) readonly restrict buffer WU4 { uvec4 wu4[]; };
layout(binding = 0) readonly restrict buffer WU2 { uvec2 wu2[]; };
layout(binding = 0) readonly restrict buffer WF4 { vec4 wf4[]; };
#ifdef USE_F16_STORAGE
layout(binding = 0) readonly restrict buffer WH4 { f16vec4 wh4[]; };
#endif

// Four signed bytes of a word, lowest first.
vec4 i8x4(uint w) {
  const int s = int(w);
  return vec4(ivec4(s << 24, s << 16, s << 8, s) >> 24);
}
// Four bytes of a word shifted right by `sh` and masked.
vec4 bits4(uint w, uint sh, uint mask) {
  return vec4((uvec4(w) >> (uvec4(0, 8, 16, 24) + sh)) & mask);
}
float half_at(uint word_index, uint h) { return unpackHalf2x16(wu[word_index + h / 2])[h & 1]; }

// dq_unit in two halves: dq_load issues the unit's loads and does no
// arithmetic on them, dq_math turns them into floats. A shader can issue the
// next unit's loads, do other work (mul_mat_cm.comp: the tensor-core
// products of the current step) and only then wait for them.
struct UnitRaw {
#if defined(DT_F32)
  vec4 a[8];
#elif defined(DT_F16)
  uvec4 q[4];  // 32 halves (with or without 16-bit storage)
#elif defined(DT_Q8_0)
  uvec4 q0, q1;
  uint dw, dsh;  // the word holding the block's fp16 scale, and its shift there
#elif defined(DT_Q4_0)
  uvec4 q;
  uint dw, dsh;
#elif defined(DT_Q4_K)
  uvec4 hdr;  // d, dmin and the 12 scale bytes
  uvec4 qa, qb;
#elif defined(DT_Q5_K)
  uvec4 hdr, qa, qb, ha, hb;
#elif defined(DT_Q6_K)
  uint l[8], h[8];
  uint sc;  // the word holding the unit's two int8 scales
  uint dw;
#endif
};

UnitRaw dq_load(uint w_off, uint w_off2, uint row_units, uint r, uint u) {
  UnitRaw q;
  const uint bi = r * row_units + u;  // unit index in the whole tensor
#if defined(DT_F32)
  const uint b4 = w_off / 4 + bi * 8;
  [[unroll]] for (uint i = 0; i < 8; ++i) q.a[i] = wf4[b4 + i];
#elif defined(DT_F16)
  const uint b4 = w_off / 4 + bi * 4;
  [[unroll]] for (uint i = 0; i < 4; ++i) q.q[i] = wu4[b4 + i];
#elif defined(DT_Q8_0)
  q.dw = wu[w_off2 + bi / 2];
  q.dsh = 16 * (bi & 1);
  q.q0 = wu4[w_off / 4 + bi * 2];
  q.q1 = wu4[w_off / 4 + bi * 2 + 1];
#elif defined(DT_Q4_0)
  q.dw = wu[w_off2 + bi / 2];
  q.dsh = 16 * (bi & 1);
  q.q = wu4[w_off / 4 + bi];
#elif defined(DT_Q4_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 36;  // 36 words: bb % 4 == 0
  const uint qw = bb + 4 + 8 * ((u % 8) / 2);                  // qw % 4 == 0: two uvec4 loads
  q.hdr = wu4[bb / 4];
  q.qa = wu4[qw / 4];
  q.qb = wu4[qw / 4 + 1];
#elif defined(DT_Q5_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 44;
  const uint qw = bb + 12 + 8 * ((u % 8) / 2);  // 44-word blocks: qw and bb + 4 are 4-aligned
  q.hdr = wu4[bb / 4];
  q.qa = wu4[qw / 4];
  q.qb = wu4[qw / 4 + 1];
  q.ha = wu4[bb / 4 + 1];
  q.hb = wu4[bb / 4 + 2];
#elif defined(DT_Q6_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 53;  // 53 words: word loads only
  const uint j = u % 8, h = j / 4, k = j % 4;
  const uint lw = bb + 16 * h + 8 * (k % 2), hw = bb + 32 + 8 * h;
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    q.l[i] = wu[lw + i];
    q.h[i] = wu[hw + i];
  }
  q.sc = wu[bb + 48 + (8 * h + 2 * k) / 4];  // both scales of the unit (2k, 2k + 1) in one word
  q.dw = wu[bb + 52];
#else
#error "no DT_* defined"
#endif
  return q;
}

#if defined(DT_Q4_K) || defined(DT_Q5_K)
// scale_min_k4 from a block's first 16 bytes (d, dmin, 12 scale bytes in .y .. .w).
void scale_min_hdr(uvec4 hdr, uint j, out float sc, out float mn) {
  const uint sh = 8u * (j & 3u);
  const uint a = (hdr.y >> sh) & 0xFFu, b = (hdr.z >> sh) & 0xFFu, c = (hdr.w >> sh) & 0xFFu;
  sc = float(j < 4u ? (a & 63u) : ((c & 0xFu) | ((a >> 6) << 4)));
  mn = float(j < 4u ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4)));
}
#endif

void dq_math(const UnitRaw q, uint u, out vec4 w[8]) {
#if defined(DT_F32)
  w = q.a;
#elif defined(DT_F16)
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    w[2 * i] = vec4(unpackHalf2x16(q.q[i].x), unpackHalf2x16(q.q[i].y));
    w[2 * i + 1] = vec4(unpackHalf2x16(q.q[i].z), unpackHalf2x16(q.q[i].w));
  }
#elif defined(DT_Q8_0)
  const float d = unpackHalf2x16(q.dw >> q.dsh).x;
  w[0] = i8x4(q.q0.x) * d; w[1] = i8x4(q.q0.y) * d; w[2] = i8x4(q.q0.z) * d; w[3] = i8x4(q.q0.w) * d;
  w[4] = i8x4(q.q1.x) * d; w[5] = i8x4(q.q1.y) * d; w[6] = i8x4(q.q1.z) * d; w[7] = i8x4(q.q1.w) * d;
#elif defined(DT_Q4_0)
  const float d = unpackHalf2x16(q.dw >> q.dsh).x;
  w[0] = (bits4(q.q.x, 0, 15) - 8.0) * d; w[1] = (bits4(q.q.y, 0, 15) - 8.0) * d;
  w[2] = (bits4(q.q.z, 0, 15) - 8.0) * d; w[3] = (bits4(q.q.w, 0, 15) - 8.0) * d;
  w[4] = (bits4(q.q.x, 4, 15) - 8.0) * d; w[5] = (bits4(q.q.y, 4, 15) - 8.0) * d;
  w[6] = (bits4(q.q.z, 4, 15) - 8.0) * d; w[7] = (bits4(q.q.w, 4, 15) - 8.0) * d;
#elif defined(DT_Q4_K)
  const uint j = u % 8, sh = 4 * (j % 2);
  const vec2 dm = unpackHalf2x16(q.hdr.x);
  float sc, mn;
  scale_min_hdr(q.hdr, j, sc, mn);
  const float dl = dm.x * sc, ml = dm.y * mn;
  const uint qv[8] = uint[8](q.qa.x, q.qa.y, q.qa.z, q.qa.w, q.qb.x, q.qb.y, q.qb.z, q.qb.w);
  [[unroll]] for (uint i = 0; i < 8; ++i) w[i] = dl * bits4(qv[i], sh, 15) - ml;
#elif defined(DT_Q5_K)
  const uint j = u % 8, sh = 4 * (j % 2);
  const vec2 dm = unpackHalf2x16(q.hdr.x);
  float sc, mn;
  scale_min_hdr(q.hdr, j, sc, mn);
  const float dl = dm.x * sc, ml = dm.y * mn;
  const uint qv[8] = uint[8](q.qa.x, q.qa.y, q.qa.z, q.qa.w, q.qb.x, q.qb.y, q.qb.z, q.qb.w);
  const uint qh[8] = uint[8](q.ha.x, q.ha.y, q.ha.z, q.ha.w, q.hb.x, q.hb.y, q.hb.z, q.hb.w);
  [[unroll]] for (uint i = 0; i < 8; ++i) w[i] = dl * (bits4(qv[i], sh, 15) + 16.0 * bits4(qh[i], j, 1)) - ml;
#elif defined(DT_Q6_K)
  const uint k = (u % 8) % 4, s0 = 2 * k;  // s0 % 4: the first scale's byte in q.sc
  const float d = unpackHalf2x16(q.dw).x;
  const float d0 = d * float(int(q.sc << (24 - 8 * (s0 % 4))) >> 24);
  const float d1 = d * float(int(q.sc << (16 - 8 * (s0 % 4))) >> 24);
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const vec4 v = bits4(q.l[i], 4 * (k / 2), 15) + 16.0 * bits4(q.h[i], 2 * k, 3) - 32.0;
    w[i] = (i < 4 ? d0 : d1) * v;
  }
#endif
}

void dq_unit(uint w_off, uint w_off2, uint row_units, uint r, uint u, out vec4 w[8]) {
  dq_math(dq_load(w_off, w_off2, row_units, r, u), u, w);
}

#ifdef WANT_DOT_PART
// The single-token matvec (mul_mat_vec.comp, NC 1 with subgroups) gives each
// 32-element unit to PPU threads (parts): part s takes XV = 8 / PPU of the
// unit's vec4s, XV/2 from each half: vec4s XV/2 s + i and 4 + XV/2 s + i.
// In every layout below vec4 v pairs with the unit's quant word v (Q4_0: word
// v holds vec4s v and v + 4), so a subgroup's x loads cover whole stretches
// of x instead of one 128-byte unit per thread. K-quants take two parts per
// unit (their block scales are decoded once for 16 elements), the rest four.
// load_part does every load of row r's part (no arithmetic on it) and
// dot_part the dot with x, so a thread can issue the loads of several parts
// and rows before it waits on any of them.
//
// Quants become floats without int-to-float conversions (a quarter-rate
// instruction on NVIDIA, which made 4-bit matvecs ALU bound): a value v < 2^k
// placed in the mantissa of 2^23 (bits p..p+k-1, p+k <= 23) reads as the float
// 2^23 + v * 2^p, and fma(f, 2^-p, -(2^(23-p) + bias)) is v - bias exactly.
// Block scales multiply the integer dot products, as cpu/ref's
// dequantizers' d * q products would up to float rounding.
const uint MAGIC = 0x4B000000u;  // 2^23 as a float
#if defined(DT_Q4_K) || defined(DT_Q5_K) || defined(DT_Q6_K)
#define PPU 2
#else
#define PPU 4
#endif
#define XV (8 / PPU)  // vec4s of x per part

// The four bytes of c (each any of 0..255), as floats minus bias: exact.
vec4 bytes_f(uint c, float bias) {
  const uint hi = c >> 16;
  return vec4(uintBitsToFloat((c & 0xFFu) | MAGIC) - (8388608.0 + bias),
              fma(uintBitsToFloat((c & 0xFF00u) | MAGIC), 1.0 / 256.0, -(32768.0 + bias)),
              uintBitsToFloat((hi & 0xFFu) | MAGIC) - (8388608.0 + bias),
              fma(uintBitsToFloat((hi & 0xFF00u) | MAGIC), 1.0 / 256.0, -(32768.0 + bias)));
}
// The low nibbles of the four bytes of v, as floats minus bias: exact.
vec4 nib4_f(uint v, float bias) {
  return vec4(uintBitsToFloat((v & 0xFu) | MAGIC) - (8388608.0 + bias),
              fma(uintBitsToFloat((v & 0xF00u) | MAGIC), 1.0 / 256.0, -(32768.0 + bias)),
              fma(uintBitsToFloat((v & 0xF0000u) | MAGIC), 1.0 / 65536.0, -(128.0 + bias)),
              fma(uintBitsToFloat(((v >> 12) & 0xF000u) | MAGIC), 1.0 / 4096.0, -(2048.0 + bias)));
}

#if defined(DT_Q4_K) || defined(DT_Q5_K)
#define DOT_NEEDS_XSUM  // the sub-block minimum multiplies the sum of x
// scale_min_k4 from a block's first 16 bytes (d, dmin, 12 scale bytes); the
// 6-bit values become floats through the mantissa (as the quants do).
void k4_scale_min(uvec4 hdr, uint j, out float sc, out float mn) {
  const uint sh = 8u * (j & 3u);
  const uint a = (hdr.y >> sh) & 0xFFu, b = (hdr.z >> sh) & 0xFFu, c = (hdr.w >> sh) & 0xFFu;
  sc = uintBitsToFloat((j < 4u ? (a & 63u) : ((c & 0xFu) | ((a >> 6) << 4))) | MAGIC) - 8388608.0;
  mn = uintBitsToFloat((j < 4u ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4))) | MAGIC) - 8388608.0;
}
#endif

// One thread's part of a unit: the raw loads. q[i] / a[i] pair with x vec4 i
// of the part (load_x_part's order).
struct Part {
#if defined(DT_F32) || defined(DT_F16)
  vec4 a[XV];
#elif defined(DT_Q8_0)
  uint q[XV];
  float d;
#elif defined(DT_Q4_0)
  uint q;  // XV == 2: low nibbles pair with x vec4 0, high with 1
  float d;
#elif defined(DT_Q4_K)
  uvec4 hdr;
  uint q[XV];
#elif defined(DT_Q5_K)
  uvec4 hdr;
  uint q[XV], h[XV];
#elif defined(DT_Q6_K)
  uint l[XV], h[XV];
  uint sc;  // the word holding the unit's two int8 scales
  float d;
#endif
};

// Word / vec4 index in the unit of the part's i-th vec4.
uint part_vec(uint s, uint i) { return (i < XV / 2 ? 0 : 4 - XV / 2) + XV / 2 * s + i; }

Part load_part(uint w_off, uint w_off2, uint row_units, uint r, uint u, uint s) {
  Part p;
  const uint bi = r * row_units + u;
#if defined(DT_F32)
  const uint b4 = w_off / 4 + bi * 8;
  [[unroll]] for (uint i = 0; i < XV; ++i) p.a[i] = wf4[b4 + part_vec(s, i)];
#elif defined(DT_F16)
#ifdef USE_F16_STORAGE
  const uint b4 = w_off / 2 + bi * 8;
  [[unroll]] for (uint i = 0; i < XV; ++i) p.a[i] = vec4(wh4[b4 + part_vec(s, i)]);
#else
  [[unroll]] for (uint i = 0; i < XV; ++i) {
    const uint bw = w_off + bi * 16 + 2 * part_vec(s, i);
    p.a[i] = vec4(unpackHalf2x16(wu[bw]), unpackHalf2x16(wu[bw + 1]));
  }
#endif
#elif defined(DT_Q8_0)
  p.d = half_at(w_off2, bi);
  [[unroll]] for (uint i = 0; i < XV; ++i) p.q[i] = wu[w_off + bi * 8 + part_vec(s, i)];
#elif defined(DT_Q4_0)
  p.d = half_at(w_off2, bi);
  p.q = wu[w_off + bi * 4 + s];
#elif defined(DT_Q4_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 36;  // 36 words: bb % 4 == 0
  const uint qw = bb + 4 + 8 * ((u % 8) / 2);
  p.hdr = wu4[bb / 4];
  // Two parts per unit: words 2s, 2s + 1 and 4 + 2s, 5 + 2s, 8-byte aligned (qw is even).
  const uvec2 qa = wu2[qw / 2 + s], qb = wu2[qw / 2 + 2 + s];
  p.q[0] = qa.x; p.q[1] = qa.y; p.q[2] = qb.x; p.q[3] = qb.y;
#elif defined(DT_Q5_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 44;
  const uint qw = bb + 12 + 8 * ((u % 8) / 2);
  p.hdr = wu4[bb / 4];
  // As Q4_K: 8-byte aligned pairs of words (bb and qw are even).
  const uvec2 qa = wu2[qw / 2 + s], qb = wu2[qw / 2 + 2 + s];
  const uvec2 ha = wu2[(bb + 4) / 2 + s], hb = wu2[(bb + 4) / 2 + 2 + s];
  p.q[0] = qa.x; p.q[1] = qa.y; p.q[2] = qb.x; p.q[3] = qb.y;
  p.h[0] = ha.x; p.h[1] = ha.y; p.h[2] = hb.x; p.h[3] = hb.y;
#elif defined(DT_Q6_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 53;  // 53 words: word loads only
  const uint j = u % 8, h = j / 4, k = j % 4;
  const uint lw = bb + 16 * h + 8 * (k % 2), hw = bb + 32 + 8 * h;
  [[unroll]] for (uint i = 0; i < XV; ++i) {
    p.l[i] = wu[lw + part_vec(s, i)];
    p.h[i] = wu[hw + part_vec(s, i)];
  }
  p.sc = wu[bb + 48 + (8 * h + 2 * k) / 4];
  p.d = unpackHalf2x16(wu[bb + 52]).x;
#endif
  return p;
}

// dot(the part of row unit u, its x vec4s xv).
float dot_part(const Part p, uint u, const vec4 xv[XV]) {
#if defined(PROBE_LOADS) && defined(DT_Q4_0)
  // matvec1_probe (benchmarks only, wrong results): the loads of a part and
  // almost no arithmetic, to tell load-bound from ALU-bound matvecs.
  return p.d * xv[0].x + xv[1].y * float(p.q & 1u);
#elif defined(DT_F32) || defined(DT_F16)
  float s = 0.0;
  [[unroll]] for (uint i = 0; i < XV; ++i) s += dot(p.a[i], xv[i]);
  return s;
#elif defined(DT_Q8_0)
  float s = 0.0;
  [[unroll]] for (uint i = 0; i < XV; ++i) s += dot(bytes_f(p.q[i] ^ 0x80808080u, 128.0), xv[i]);
  return p.d * s;
#elif defined(DT_Q4_0)
  // Byte b of word s: element 4s + b in its low nibble, 16 + 4s + b in its high one.
  const uint w2 = p.q >> 12;  // bits 20..31 to 8..19 (a nibble must stay below bit 23)
  const vec4 lo = vec4(uintBitsToFloat((p.q & 0xFu) | MAGIC) - 8388616.0,
                       fma(uintBitsToFloat((p.q & 0xF00u) | MAGIC), 1.0 / 256.0, -32776.0),
                       fma(uintBitsToFloat((p.q & 0xF0000u) | MAGIC), 1.0 / 65536.0, -136.0),
                       fma(uintBitsToFloat((w2 & 0xF000u) | MAGIC), 1.0 / 4096.0, -2056.0));
  const vec4 hi = vec4(fma(uintBitsToFloat((p.q & 0xF0u) | MAGIC), 1.0 / 16.0, -524296.0),
                       fma(uintBitsToFloat((p.q & 0xF000u) | MAGIC), 1.0 / 4096.0, -2056.0),
                       fma(uintBitsToFloat((w2 & 0xF00u) | MAGIC), 1.0 / 256.0, -32776.0),
                       fma(uintBitsToFloat((w2 & 0xF0000u) | MAGIC), 1.0 / 65536.0, -136.0));
  return p.d * (dot(lo, xv[0]) + dot(hi, xv[1]));
#elif defined(DT_Q4_K)
  const uint j = u % 8, sh = 4 * (j % 2);
  const vec2 dm = unpackHalf2x16(p.hdr.x);
  float sc, mn;
  k4_scale_min(p.hdr, j, sc, mn);
  float s = 0.0;
  vec4 xs = vec4(0.0);
  [[unroll]] for (uint i = 0; i < XV; ++i) {
    s += dot(nib4_f(p.q[i] >> sh, 0.0), xv[i]);
    xs += xv[i];
  }
  return (dm.x * sc) * s - (dm.y * mn) * dot(xs, vec4(1.0));
#elif defined(DT_Q5_K)
  const uint j = u % 8, sh = 4 * (j % 2);
  const vec2 dm = unpackHalf2x16(p.hdr.x);
  float sc, mn;
  k4_scale_min(p.hdr, j, sc, mn);
  float s = 0.0;
  vec4 xs = vec4(0.0);
  [[unroll]] for (uint i = 0; i < XV; ++i) {
    const uint c = ((p.q[i] >> sh) & 0x0F0F0F0Fu) | (((p.h[i] >> j) & 0x01010101u) << 4);
    s += dot(bytes_f(c, 0.0), xv[i]);
    xs += xv[i];
  }
  return (dm.x * sc) * s - (dm.y * mn) * dot(xs, vec4(1.0));
#elif defined(DT_Q6_K)
  // Two 16-element halves with their own int8 scales: the first XV/2 vec4s
  // are in the first half, the rest in the second.
  const uint j = u % 8, k = j % 4, s0 = 2 * k;  // s0 % 4: the first scale's byte in p.sc
  // The two int8 scales, through the mantissa: byte ^ 0x80 is the scale + 128.
  const uint sb = (p.sc >> (8 * (s0 % 4))) ^ 0x8080u;
  const float d0 = p.d * (uintBitsToFloat((sb & 0xFFu) | MAGIC) - 8388736.0);
  const float d1 = p.d * (uintBitsToFloat(((sb >> 8) & 0xFFu) | MAGIC) - 8388736.0);
  const uint lsh = 4 * (k / 2), hsh = 2 * k;
  float a = 0.0, b = 0.0;
  [[unroll]] for (uint i = 0; i < XV; ++i) {
    const uint c = ((p.l[i] >> lsh) & 0x0F0F0F0Fu) | (((p.h[i] >> hsh) & 0x03030303u) << 4);
    const float t = dot(bytes_f(c, 32.0), xv[i]);
    if (i < XV / 2) a += t;
    else b += t;
  }
  return d0 * a + d1 * b;
#endif
}
#endif
