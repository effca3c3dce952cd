// Q8 copies of activations for the integer-dot matvecs (mul_mat_vec.comp's
// XQ8): per 32-element block, 32 int8 q = round(v / d) with d = max|v| / 127
// (four to a word), and (d, d * sum q) per block. Eight consecutive threads
// (the block's first at a multiple of 8) hold a block, a vec4 each, and meet
// in shared memory. Every thread of the workgroup calls q8_quant (it has
// barriers); one holding nothing passes vec4(0). It returns the thread's
// packed word and sets ds to its block's (d, d * sum q); the caller writes
// them (the word by every thread of a block, ds by its first).
// Needs WG (a multiple of 8).
shared float q8_max_sh[WG];
shared int q8_sum_sh[WG];

// v's quants in a block whose largest magnitude is amax, and four of them packed.
ivec4 q8_round(vec4 v, float amax) { return ivec4(roundEven(v * (amax > 0.0 ? 127.0 / amax : 0.0))); }
uint q8_pack(ivec4 qi) {
  return uint(qi.x & 0xFF) | (uint(qi.y & 0xFF) << 8) | (uint(qi.z & 0xFF) << 16) | (uint(qi.w & 0xFF) << 24);
}

uint q8_quant(vec4 v, out vec2 ds) {
  const uint tid = gl_LocalInvocationID.x, b0 = tid & ~7u;
  q8_max_sh[tid] = max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w)));
  barrier();
  float amax = 0.0;
  [[unroll]] for (uint k = 0; k < 8; ++k) amax = max(amax, q8_max_sh[b0 + k]);
  const ivec4 qi = q8_round(v, amax);
  q8_sum_sh[tid] = qi.x + qi.y + qi.z + qi.w;
  barrier();
  int qsum = 0;
  [[unroll]] for (uint k = 0; k < 8; ++k) qsum += q8_sum_sh[b0 + k];
  barrier();  // a next call overwrites both
  const float d = amax / 127.0;
  ds = vec2(d, d * float(qsum));
  return q8_pack(qi);
}
