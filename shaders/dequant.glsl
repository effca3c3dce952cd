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
uint ubyte(uint word_index, uint k) { return (wu[word_index + k / 4] >> (8 * (k % 4))) & 0xFFu; }
float half_at(uint word_index, uint h) { return unpackHalf2x16(wu[word_index + h / 2])[h & 1]; }

#if defined(DT_Q4_K) || defined(DT_Q5_K)
// scale_min_k4 of cpu/ref/quants.h: 6-bit scale and min of sub-block j.
void scale_min_k4(uint sc_words, uint j, out float sc, out float mn) {
  if (j < 4) {
    sc = float(ubyte(sc_words, j) & 63u);
    mn = float(ubyte(sc_words, j + 4) & 63u);
  } else {
    const uint b = ubyte(sc_words, j + 4);
    sc = float((b & 0xFu) | ((ubyte(sc_words, j - 4) >> 6) << 4));
    mn = float((b >> 4) | ((ubyte(sc_words, j) >> 6) << 4));
  }
}
#endif

void dq_unit(uint w_off, uint w_off2, uint row_units, uint r, uint u, out vec4 w[8]) {
  const uint bi = r * row_units + u;  // unit index in the whole tensor
#if defined(DT_F32)
  const uint b4 = w_off / 4 + bi * 8;
  [[unroll]] for (uint i = 0; i < 8; ++i) w[i] = wf4[b4 + i];
#elif defined(DT_F16)
#ifdef USE_F16_STORAGE
  const uint b4 = w_off / 2 + bi * 8;
  [[unroll]] for (uint i = 0; i < 8; ++i) w[i] = vec4(wh4[b4 + i]);
#else
  const uint b4 = w_off / 4 + bi * 4;
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uvec4 q = wu4[b4 + i];
    w[2 * i] = vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
    w[2 * i + 1] = vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w));
  }
#endif
#elif defined(DT_Q8_0)
  const float d = half_at(w_off2, bi);
  const uvec4 q0 = wu4[w_off / 4 + bi * 2];
  const uvec4 q1 = wu4[w_off / 4 + bi * 2 + 1];
  w[0] = i8x4(q0.x) * d; w[1] = i8x4(q0.y) * d; w[2] = i8x4(q0.z) * d; w[3] = i8x4(q0.w) * d;
  w[4] = i8x4(q1.x) * d; w[5] = i8x4(q1.y) * d; w[6] = i8x4(q1.z) * d; w[7] = i8x4(q1.w) * d;
#elif defined(DT_Q4_0)
  const float d = half_at(w_off2, bi);
  const uvec4 q = wu4[w_off / 4 + bi];
  w[0] = (bits4(q.x, 0, 15) - 8.0) * d; w[1] = (bits4(q.y, 0, 15) - 8.0) * d;
  w[2] = (bits4(q.z, 0, 15) - 8.0) * d; w[3] = (bits4(q.w, 0, 15) - 8.0) * d;
  w[4] = (bits4(q.x, 4, 15) - 8.0) * d; w[5] = (bits4(q.y, 4, 15) - 8.0) * d;
  w[6] = (bits4(q.z, 4, 15) - 8.0) * d; w[7] = (bits4(q.w, 4, 15) - 8.0) * d;
#elif defined(DT_Q4_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 36;
  const uint j = u % 8;
  const vec2 dm = unpackHalf2x16(wu[bb]);
  float sc, mn;
  scale_min_k4(bb + 1, j, sc, mn);
  const float dl = dm.x * sc, ml = dm.y * mn;
  const uint qw = bb + 4 + 8 * (j / 2), sh = 4 * (j % 2);  // qw % 4 == 0: two uvec4 loads
  const uvec4 qa = wu4[qw / 4], qb = wu4[qw / 4 + 1];
  const uint q[8] = uint[8](qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w);
  [[unroll]] for (uint i = 0; i < 8; ++i) w[i] = dl * bits4(q[i], sh, 15) - ml;
#elif defined(DT_Q5_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 44;
  const uint j = u % 8;
  const vec2 dm = unpackHalf2x16(wu[bb]);
  float sc, mn;
  scale_min_k4(bb + 1, j, sc, mn);
  const float dl = dm.x * sc, ml = dm.y * mn;
  const uint qw = bb + 12 + 8 * (j / 2), sh = 4 * (j % 2);  // 44-word blocks: qw and bb + 4 are 4-aligned
  const uvec4 qa = wu4[qw / 4], qb = wu4[qw / 4 + 1], ha = wu4[bb / 4 + 1], hb = wu4[bb / 4 + 2];
  const uint q[8] = uint[8](qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w);
  const uint qh[8] = uint[8](ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w);
  [[unroll]] for (uint i = 0; i < 8; ++i) w[i] = dl * (bits4(q[i], sh, 15) + 16.0 * bits4(qh[i], j, 1)) - ml;
#elif defined(DT_Q6_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 53;
  const uint j = u % 8, h = j / 4, k = j % 4;
  const float d = unpackHalf2x16(wu[bb + 52]).x;
  const uint lw = bb + 16 * h + 8 * (k % 2), hw = bb + 32 + 8 * h;
  const uint s0 = 8 * h + 2 * k;
  const float d0 = d * float(int(wu[bb + 48 + s0 / 4] << (24 - 8 * (s0 % 4))) >> 24);
  const uint s1 = s0 + 1;
  const float d1 = d * float(int(wu[bb + 48 + s1 / 4] << (24 - 8 * (s1 % 4))) >> 24);
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const vec4 q = bits4(wu[lw + i], 4 * (k / 2), 15) + 16.0 * bits4(wu[hw + i], 2 * k, 3) - 32.0;
    w[i] = (i < 4 ? d0 : d1) * q;
  }
#else
#error "no DT_* defined"
#endif
}

#ifdef WANT_DOT_UNIT
// dot(row r's unit u, x) for the matrix-vector shaders, with the block scales
// and offsets taken out of the inner loop: sum_e (d q_e - m) x_e is computed as
// d * sum q_e x_e - m * sum x_e (xsum = sum of the unit's 32 x values). This
// roughly halves the ALU work per weight byte, which matters on GPUs whose
// bandwidth outruns their FP32 rate for 4-bit weights (H100/H200). The sums
// differ from dq_unit's only by float rounding.
float dot_unit(uint w_off, uint w_off2, uint row_units, uint r, uint u, const vec4 xv[8], float xsum) {
  const uint bi = r * row_units + u;
#if defined(DT_F32) || defined(DT_F16)
  vec4 w[8];
  dq_unit(w_off, w_off2, row_units, r, u, w);
  float s = 0.0;
  [[unroll]] for (uint i = 0; i < 8; ++i) s += dot(w[i], xv[i]);
  return s;
#elif defined(DT_Q8_0)
  const float d = half_at(w_off2, bi);
  const uvec4 q0 = wu4[w_off / 4 + bi * 2];
  const uvec4 q1 = wu4[w_off / 4 + bi * 2 + 1];
  const float s = dot(i8x4(q0.x), xv[0]) + dot(i8x4(q0.y), xv[1]) + dot(i8x4(q0.z), xv[2]) + dot(i8x4(q0.w), xv[3]) +
                  dot(i8x4(q1.x), xv[4]) + dot(i8x4(q1.y), xv[5]) + dot(i8x4(q1.z), xv[6]) + dot(i8x4(q1.w), xv[7]);
  return d * s;
#elif defined(DT_Q4_0)
  const float d = half_at(w_off2, bi);
  const uvec4 q = wu4[w_off / 4 + bi];
  const float s = dot(bits4(q.x, 0, 15), xv[0]) + dot(bits4(q.y, 0, 15), xv[1]) + dot(bits4(q.z, 0, 15), xv[2]) +
                  dot(bits4(q.w, 0, 15), xv[3]) + dot(bits4(q.x, 4, 15), xv[4]) + dot(bits4(q.y, 4, 15), xv[5]) +
                  dot(bits4(q.z, 4, 15), xv[6]) + dot(bits4(q.w, 4, 15), xv[7]);
  return d * (s - 8.0 * xsum);
#elif defined(DT_Q4_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 36;
  const uint j = u % 8;
  const vec2 dm = unpackHalf2x16(wu[bb]);
  float sc, mn;
  scale_min_k4(bb + 1, j, sc, mn);
  const uint qw = bb + 4 + 8 * (j / 2), sh = 4 * (j % 2);
  const uvec4 qa = wu4[qw / 4], qb = wu4[qw / 4 + 1];
  const float s = dot(bits4(qa.x, sh, 15), xv[0]) + dot(bits4(qa.y, sh, 15), xv[1]) + dot(bits4(qa.z, sh, 15), xv[2]) +
                  dot(bits4(qa.w, sh, 15), xv[3]) + dot(bits4(qb.x, sh, 15), xv[4]) + dot(bits4(qb.y, sh, 15), xv[5]) +
                  dot(bits4(qb.z, sh, 15), xv[6]) + dot(bits4(qb.w, sh, 15), xv[7]);
  return (dm.x * sc) * s - (dm.y * mn) * xsum;
#elif defined(DT_Q5_K)
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 44;
  const uint j = u % 8;
  const vec2 dm = unpackHalf2x16(wu[bb]);
  float sc, mn;
  scale_min_k4(bb + 1, j, sc, mn);
  const uint qw = bb + 12 + 8 * (j / 2), sh = 4 * (j % 2);
  const uvec4 qa = wu4[qw / 4], qb = wu4[qw / 4 + 1], ha = wu4[bb / 4 + 1], hb = wu4[bb / 4 + 2];
  const uint q[8] = uint[8](qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w);
  const uint qh[8] = uint[8](ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w);
  float s = 0.0;
  [[unroll]] for (uint i = 0; i < 8; ++i) s += dot(bits4(q[i], sh, 15) + 16.0 * bits4(qh[i], j, 1), xv[i]);
  return (dm.x * sc) * s - (dm.y * mn) * xsum;
#elif defined(DT_Q6_K)
  // Two 16-element halves with their own scales: sum_half d_h * (sum q x - 32 sum x).
  const uint bb = w_off + (r * (row_units / 8) + u / 8) * 53;
  const uint j = u % 8, h = j / 4, k = j % 4;
  const float d = unpackHalf2x16(wu[bb + 52]).x;
  const uint lw = bb + 16 * h + 8 * (k % 2), hw = bb + 32 + 8 * h;
  const uint s0 = 8 * h + 2 * k, s1 = s0 + 1;
  const float d0 = d * float(int(wu[bb + 48 + s0 / 4] << (24 - 8 * (s0 % 4))) >> 24);
  const float d1 = d * float(int(wu[bb + 48 + s1 / 4] << (24 - 8 * (s1 % 4))) >> 24);
  float a = 0.0, b = 0.0, xa = 0.0;
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const vec4 q = bits4(wu[lw + i], 4 * (k / 2), 15) + 16.0 * bits4(wu[hw + i], 2 * k, 3);
    if (i < 4) {
      a += dot(q, xv[i]);
      xa += dot(vec4(1.0), xv[i]);
    } else {
      b += dot(q, xv[i]);
    }
  }
  return d0 * (a - 32.0 * xa) + d1 * (b - 32.0 * (xsum - xa));
#endif
}
#endif
