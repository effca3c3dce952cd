// RoPE's rotation of pair i at position p: (cos, sin) of the angle times the
// magnitude scale, built as cpu/ref's rope builds it (p * theta_scale^i by
// repeated float multiplication, then frequency factors, linear scaling and
// YaRN), so results agree with the CPU to float rounding of cos/sin.
// The including shader's push constants hold theta_scale, freq_scale,
// ext_factor, attn_factor, corr0, corr1 and ff_off (0xFFFFFFFF: no frequency
// factors), and its buffer ff[] the factors.
vec2 rope_cs(uint i, int p) {
  precise float theta = float(p);
  for (uint k = 0; k < i; ++k) theta *= pc.theta_scale;
  const float f = pc.ff_off != 0xFFFFFFFFu ? ff[pc.ff_off + i] : 1.0;
  // (Division is not correctly rounded on every GPU: NVIDIA's may differ by
  // an ulp from the CPU's, which the conformance bound allows for.)
  const float theta_extrap = theta / f;
  const float theta_interp = pc.freq_scale * theta_extrap;
  float angle = theta_interp;
  float mscale = pc.attn_factor;
  if (pc.ext_factor != 0.0) {
    const float y = (float(i) - pc.corr0) / max(0.001, pc.corr1 - pc.corr0);
    const float mix = (1.0 - clamp(y, 0.0, 1.0)) * pc.ext_factor;
    angle = theta_interp * (1.0 - mix) + theta_extrap * mix;
    mscale *= 1.0 + 0.1 * log(1.0 / pc.freq_scale);
  }
  // Reduce to about [0, 2 pi) first: some drivers' sin/cos lose accuracy on
  // large arguments. Two-part 2 pi (Cody-Waite): k * C1 is exact (C1 has 8
  // significant bits, k < 2^16 turns), so the reduction adds ~1 ulp of angle.
  // `precise`: compilers may not refactor the two steps into angle - k * 2pi.
  const float k = floor(angle * 0.15915494309189535);
  precise float r1 = angle - k * 6.28125;
  precise float r2 = r1 - k * 0.0019353071795864769;
  angle = r2;
  return vec2(cos(angle), sin(angle)) * mscale;
}
