#version 450
// Causal GQA attention, split over the KV length (flash-decoding):
// workgroup (s, kv head group, t) takes query token t, up to GM query heads
// that share one KV head, and the keys [s * kps * cps, (s + 1) * kps * cps)
// ∩ [0, pos[t]], in cps chunks of kps <= WG keys (the host takes fewer than WG
// keys per chunk for long contexts, and more than one chunk per split past a
// few thousand keys, so the splits fill the GPU and the merge stays short).
// TPK threads (a power of two, kps * TPK <= WG) score one key against every
// query head of the group (the K row is read once for all of them), each over
// every TPK-th dimension pair, and their partial scores are summed in shared
// memory; the workgroup reduces max and sum, then threads over (head,
// dimension pair) accumulate the weighted V rows.
// With one split the normalized output is written directly; otherwise the
// partial (max m, sum l, unnormalized o[head_dim]) goes to `part`, and
// attn_merge.comp combines the splits.
// Q8_OUT (attn_split_q8_*, one token, one split): also the output's Q8 copy
// (q8.glsl) for the integer-dot o matrix, through shared memory (qsh, free
// once the scores are summed); head_dim a multiple of 32.
// Device tier (map_bs > 0): the layer's rows are slots of map_bs rows, and
// pos[map_off + slot] is the first position of the block in each slot (-1:
// free). Then keys are rows [0, map_keys), one split per slot (kps = map_bs),
// and key j counts for token t when its slot holds a block and its position
// is at most pos[t] (softmax does not care about the order of the keys). A
// split whose keys all fail gives (NEG_BIG, 0, 0). n_splits may exceed the
// grid's x: the splits past it are the caller's (the host's part).
// Grid: x = n_splits, y = n_kv_heads * ceil(group / GM), z = T.
#define GM 8         // query heads per workgroup
#define HD_MAX 256   // largest head_dim (checked by the host)
#define UN 8         // K pairs loaded together
#define UNV 16       // V rows loaded together
#define RED_N GM
#include "common.glsl"
#include "kv_read.glsl"

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) readonly buffer P { int pos[]; };
layout(binding = 5) writeonly buffer PART { float part[]; };
#ifdef Q8_OUT
#include "q8.glsl"
layout(binding = 6) writeonly buffer QO { uint qo[]; };
layout(binding = 6) writeonly buffer QD { vec2 qdo[]; };
#endif

layout(push_constant) uniform PC {
  uint q_off, q_ld;   // floats; row t of q is [n_heads * head_dim]
  uint o_off, o_ld;
  uint part_off;      // floats
  uint kc_off, kc_d_off, vc_off, vc_d_off;  // words
  uint n_ctx, n_heads, n_kv_heads, head_dim;
  uint pos_off;
  uint n_splits;
  float scale;
  uint kps;           // keys per split, at most WG
  uint tpk;           // threads per key, kps * tpk <= WG
  uint qo_off, qdo_off;  // Q8_OUT: words, vec2s
  uint map_off, map_keys, map_bs;  // device tier: the slot map (ints, in P); 0: no map
  uint cps;           // chunks of kps keys per split
} pc;

// (Head, dimension pair)s of the output per thread.
const uint NPT = (GM * HD_MAX / 2 + WG - 1) / WG;

shared float qsh[GM][HD_MAX];

// Whether key j (a row) counts for token t: always without a map (the host
// bounds the keys by position), else by its slot's block position.
bool key_ok(uint j, uint t) {
  if (pc.map_bs == 0) return true;
  const int b0 = pos[pc.map_off + j / pc.map_bs];
  return b0 >= 0 && b0 + int(j % pc.map_bs) <= pos[pc.pos_off + t];
}
shared float psh[GM][WG];

// Split s of query token t, heads h0 .. h0 + gn - 1 (KV head kvh): keys
// [start, end), at least one, walked in chunks of kps keys with a running
// max and sum per head (online softmax; one chunk unless the host asks for
// cps > 1 chunks per split, on long contexts).
void split(uint t, uint s, uint kvh, uint h0, uint gn, uint hd, uint start, uint end) {
  const uint tid = gl_LocalInvocationID.x, hp = hd / 2;
  for (uint e = tid; e < gn * hd; e += WG) {
    const uint g = e / hd, d = e % hd;
    qsh[g][d] = q[pc.q_off + t * pc.q_ld + (h0 + g) * hd + d] * pc.scale;
  }
  barrier();

  float m[GM], l[GM];
  [[unroll]] for (uint g = 0; g < GM; ++g) {
    m[g] = NEG_BIG;
    l[g] = 0.0;
  }
  // Thread tid owns the (head, dimension pair)s tid + WG k of the output.
  vec2 acc[NPT];
  [[unroll]] for (uint k = 0; k < NPT; ++k) acc[k] = vec2(0.0);
  const uint tpk = pc.tpk, sub = tid % tpk;
  for (uint c0 = start; c0 < end; c0 += pc.kps) {  // uniform
    const uint cend = min(c0 + pc.kps, end);
    // Thread tid scores part `sub` of key c0 + tid / TPK.
    const uint j = c0 + tid / tpk;
    float sc[GM];
    [[unroll]] for (uint g = 0; g < GM; ++g) sc[g] = 0.0;
    if (j < cend) {
      const uint row = kvh * pc.n_ctx + j;
      // UN pairs' loads are issued before any is used (latency, not bandwidth, bounds short contexts).
      uint i = sub;
      for (; i + (UN - 1) * tpk < hp; i += UN * tpk) {
        vec2 kv[UN];
        [[unroll]] for (uint c = 0; c < UN; ++c) kv[c] = k_pair(pc.kc_off, pc.kc_d_off, hd, row, i + c * tpk);
        [[unroll]] for (uint c = 0; c < UN; ++c) {
          const uint e = 2 * (i + c * tpk);
          [[unroll]] for (uint g = 0; g < GM; ++g) {
            if (g < gn) sc[g] += qsh[g][e] * kv[c].x + qsh[g][e + 1] * kv[c].y;
          }
        }
      }
      for (; i < hp; i += tpk) {
        const vec2 kv = k_pair(pc.kc_off, pc.kc_d_off, hd, row, i);
        [[unroll]] for (uint g = 0; g < GM; ++g) {
          if (g < gn) sc[g] += qsh[g][2 * i] * kv.x + qsh[g][2 * i + 1] * kv.y;
        }
      }
    }
    // From here thread tid owns key jk = c0 + tid (tid < kps): the sum of its parts.
    const uint jk = c0 + tid;
    const bool ok = jk < cend && key_ok(jk, t);
    if (tpk > 1) {
      [[unroll]] for (uint g = 0; g < GM; ++g) psh[g][tid] = sc[g];
      barrier();
      [[unroll]] for (uint g = 0; g < GM; ++g) {
        float a = 0.0;
        if (jk < cend) {
          for (uint u = 0; u < tpk; ++u) a += psh[g][tid * tpk + u];
        }
        sc[g] = a;
      }
      barrier();  // psh holds the probabilities next
    }
    if (!ok) {
      [[unroll]] for (uint g = 0; g < GM; ++g) sc[g] = NEG_BIG;
    }
    float mc[GM];
    [[unroll]] for (uint g = 0; g < GM; ++g) mc[g] = sc[g];
    wg_max_n(mc);
    float alpha[GM], lc[GM];
    [[unroll]] for (uint g = 0; g < GM; ++g) {
      const float mn = max(m[g], mc[g]);
      alpha[g] = exp(m[g] - mn);
      m[g] = mn;
      const float p = ok ? exp(sc[g] - mn) : 0.0;
      psh[g][tid] = p;
      lc[g] = p;
    }
    wg_sum_n(lc);  // its barriers also publish psh
    [[unroll]] for (uint g = 0; g < GM; ++g) l[g] = l[g] * alpha[g] + lc[g];

    const uint nk = cend - c0, vrow = kvh * pc.n_ctx + c0;
    [[unroll]] for (uint k = 0; k < NPT; ++k) {
      const uint e = tid + k * WG;
      if (e < gn * hp) {
        const uint g = e / hp, i = e % hp;
        float al = 1.0;
        [[unroll]] for (uint gg = 0; gg < GM; ++gg) al = gg == g ? alpha[gg] : al;
        vec2 a = acc[k] * al;
        uint jj = 0;
        for (; jj + UNV <= nk; jj += UNV) {
          vec2 vv[UNV];
          [[unroll]] for (uint c = 0; c < UNV; ++c) vv[c] = v_pair(pc.vc_off, pc.vc_d_off, hd, vrow + jj + c, i);
          // (A key that does not count has p = 0, and its row may hold anything:
          // the device tier's free slots and unwritten rows are never multiplied.)
          [[unroll]] for (uint c = 0; c < UNV; ++c) a += psh[g][jj + c] != 0.0 ? psh[g][jj + c] * vv[c] : vec2(0.0);
        }
        for (; jj < nk; ++jj) {
          const vec2 vv = v_pair(pc.vc_off, pc.vc_d_off, hd, vrow + jj, i);
          a += psh[g][jj] != 0.0 ? psh[g][jj] * vv : vec2(0.0);
        }
        acc[k] = a;
      }
    }
    barrier();  // psh is free for the next chunk
  }

  [[unroll]] for (uint k = 0; k < NPT; ++k) {
    const uint e = tid + k * WG;
    if (e < gn * hp) {
      const uint g = e / hp, i = e % hp, h = h0 + g;
      if (pc.n_splits == 1) {
        const uint ob = pc.o_off + t * pc.o_ld + h * hd + 2 * i;
        o[ob] = acc[k].x / l[g];
        o[ob + 1] = acc[k].y / l[g];
#ifdef Q8_OUT
        qsh[g][2 * i] = acc[k].x / l[g];
        qsh[g][2 * i + 1] = acc[k].y / l[g];
#endif
      } else {
        const uint pb = pc.part_off + ((t * pc.n_heads + h) * pc.n_splits + s) * (hd + 2);
        if (i == 0) { part[pb] = m[g]; part[pb + 1] = l[g]; }
        part[pb + 2 + 2 * i] = acc[k].x;
        part[pb + 3 + 2 * i] = acc[k].y;
      }
    }
  }
#ifdef Q8_OUT
  if (pc.n_splits == 1) {  // uniform: the group's outputs, eight threads per 32-element block
    barrier();
    const uint n4 = gn * hd / 4, w0 = h0 * hd / 4;
    for (uint i0 = 0; i0 < n4; i0 += WG) {  // uniform
      const uint e = i0 + tid, g = min(4 * e / hd, GM - 1), d = 4 * e % hd;
      const vec4 v = e < n4 ? vec4(qsh[g][d], qsh[g][d + 1], qsh[g][d + 2], qsh[g][d + 3]) : vec4(0.0);
      vec2 ds;
      const uint w = q8_quant(v, ds);
      if (e < n4) {
        qo[pc.qo_off + w0 + e] = w;
        if (e % 8 == 0) qdo[pc.qdo_off + (w0 + e) / 8] = ds;
      }
    }
  }
#endif
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint s = gl_WorkGroupID.x, t = gl_WorkGroupID.z;
  const uint group = pc.n_heads / pc.n_kv_heads;
  const uint n_gchunks = (group + GM - 1) / GM;
  const uint kvh = gl_WorkGroupID.y / n_gchunks;
  const uint h0 = kvh * group + (gl_WorkGroupID.y % n_gchunks) * GM;
  const uint gn = min(GM, kvh * group + group - h0);
  const uint hd = pc.head_dim;

  const uint n_keys = pc.map_bs > 0 ? pc.map_keys : uint(pos[pc.pos_off + t]) + 1;
  const uint start = s * pc.kps * pc.cps;
  if (start >= n_keys) {  // a split past this token's last key: an empty partial
    for (uint g = 0; g < gn; ++g) {
      const uint pb = pc.part_off + ((t * pc.n_heads + h0 + g) * pc.n_splits + s) * (hd + 2);
      if (tid == 0) { part[pb] = NEG_BIG; part[pb + 1] = 0.0; }
      for (uint d = tid; d < hd; d += WG) part[pb + 2 + d] = 0.0;
    }
  } else {
    split(t, s, kvh, h0, gn, hd, start, min(start + pc.kps * pc.cps, n_keys));
  }
}
