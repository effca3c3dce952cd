#version 450
// Decode attention in one pass over F16 or Q8_0 K/V rows (flash decoding), for
// contexts long enough to split: workgroup (s, kv head group, t) takes query
// token t, up to GM query heads that share one KV head, and the keys
// [s * chunk, (s + 1) * chunk) ∩ [0, pos[t]]. It writes the split's partial
// (max m, sum l, unnormalized o[head_dim]) for attn_merge.comp.
//
// Within a subgroup, P lanes (pc.lanes: a power of two, at most the subgroup
// size) take one key: lane c holds values [NV c, NV c + NV) of the row (VS
// 16-byte loads of K, and of V: 8 values each for F16 rows, 16 for Q8_0's
// quants, KV_Q8, with the one scale of their 32-value block), so a subgroup takes SG / P keys at a
// time, KU of them per lane group in flight. The partial dots are summed
// across the P lanes by shuffles, and each lane group keeps its own running
// max, sum and p * v (online softmax, in base 2: q is scaled by log2 e). No
// barrier separates reading K from reading V, so both are in flight
// together. At the end the lane groups are merged by shuffles, then the
// subgroups through shared memory. (attn_split.comp, which this replaces
// for F16 rows on GPUs, scores a chunk, reduces its softmax across the
// workgroup and only then reads V, with barriers between.)
// Device tier (map_bs > 0): the layer's rows are slots of map_bs rows, and
// pos[map_off + slot] is the first position of the block in each slot (-1:
// free); keys are rows [0, map_keys), and key j counts for token t when its
// slot holds a block and its position is at most pos[t] (as in
// attn_split.comp). A split whose keys all fail gives (NEG_BIG, 0, 0).
// n_splits may exceed the grid's x: the splits past it are the caller's.
// Grid: x = the device's splits, y = n_kv_heads * ceil(group / GM), z = T.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

#ifndef VS
#define VS 1  // 16-byte segments of a row per lane
#endif
#define GM 4                 // query heads per workgroup
#define KU (VS > 1 ? 2 : 4)  // keys per lane group in flight
#ifdef KV_Q8
#define NPU 16  // values per 16-byte load: int8 quants
#else
#define NPU 8  // halves
#endif
#define NV (NPU * VS)  // values of a row per lane
#define HD_MAX 256           // largest head_dim (checked by the host)
#define NSG_MAX 64           // subgroups per workgroup at most (WG <= 256, subgroups >= 4)
#include "common.glsl"

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer K { uvec4 k4[]; };
layout(binding = 2) readonly buffer V { uvec4 v4[]; };
#ifdef KV_Q8
// Q8_0 rows: the layer's quants [rows][head_dim] int8, then its scales
// [rows][head_dim / 32] (kv_store.comp).
layout(binding = 1) readonly buffer KD { float kd[]; };
layout(binding = 2) readonly buffer VD { float vd[]; };
#endif
layout(binding = 3) writeonly buffer PART { float part[]; };
layout(binding = 4) readonly buffer P { int pos[]; };

layout(push_constant) uniform PC {
  uint q_off, q_ld;  // floats; row t of q is [n_heads * head_dim]
  uint part_off;     // floats
  uint k_off, v_off;  // uvec4s (16 bytes); row r at + r * head_dim / NPU
  uint kd_off, vd_off;  // KV_Q8: floats; row r's scales at + r * head_dim / 32
  uint n_ctx, n_heads, n_kv_heads, head_dim;
  uint pos_off;
  uint n_splits;
  float scale;
  uint chunk;  // keys per split
  uint lanes;  // P
  uint map_off, map_keys, map_bs;  // device tier: the slot map (ints, in P); 0: no map
} pc;

shared float o_sh[GM][HD_MAX];
shared vec2 ml_sh[NSG_MAX][GM];

const float LOG2E = 1.4426950408889634;

// Whether key j (a row) counts for token t: always without a map (the splits
// end at the token's position), else by its slot's block position.
bool key_ok(uint j, uint t) {
  if (pc.map_bs == 0) return true;
  const int b0 = pos[pc.map_off + j / pc.map_bs];
  return b0 >= 0 && b0 + int(j % pc.map_bs) <= pos[pc.pos_off + t];
}

// Values 4i .. 4i + 3 of a 16-byte load (i < NPU / 4).
vec4 part4(uvec4 w, uint i) {
#ifdef KV_Q8
  const int x = int(w[i]);
  return vec4(ivec4(x << 24, x << 16, x << 8, x) >> 24);
#else
  return vec4(unpackHalf2x16(w[2 * i]), unpackHalf2x16(w[2 * i + 1]));
#endif
}

void main() {
  const uint s = gl_WorkGroupID.x, t = gl_WorkGroupID.z;
  const uint group = pc.n_heads / pc.n_kv_heads;
  const uint n_gchunks = (group + GM - 1) / GM;
  const uint kvh = gl_WorkGroupID.y / n_gchunks;
  const uint h0 = kvh * group + (gl_WorkGroupID.y % n_gchunks) * GM;
  const uint gn = min(GM, kvh * group + group - h0);
  const uint hd = pc.head_dim, rw = hd / NPU;  // uvec4s a row

  const uint n_keys = pc.map_bs > 0 ? pc.map_keys : uint(pos[pc.pos_off + t]) + 1;
  const uint k0 = s * pc.chunk;
  const uint n = k0 < n_keys ? min(pc.chunk, n_keys - k0) : 0;

  const uint P = pc.lanes, SG = gl_SubgroupSize, lane = gl_SubgroupInvocationID;
  const uint c = lane % P, slot = lane / P, per_sg = SG / P;
  const bool seg = c * NV < hd;  // this lane holds NV values of a row
  const uint cs = seg ? c : 0;    // where it reads (a lane past the row reads its first values)

  float qv[GM][NV], o[GM][NV], m[GM], l[GM];
  [[unroll]] for (uint g = 0; g < GM; ++g) {
    m[g] = NEG_BIG;
    l[g] = 0.0;
    const uint qb = pc.q_off + t * pc.q_ld + (h0 + min(g, gn - 1)) * hd + cs * NV;
    [[unroll]] for (uint e = 0; e < NV; ++e) {
      qv[g][e] = seg && g < gn ? q[qb + e] * (pc.scale * LOG2E) : 0.0;
      o[g][e] = 0.0;
    }
  }

  const uint step = gl_NumSubgroups * per_sg;
  const uint rb = kvh * pc.n_ctx + k0;  // the split's first row
  // The loop bound is the subgroup's, not the lane group's: the shuffles need
  // every lane.
  for (uint jb = gl_SubgroupID * per_sg; jb < n; jb += KU * step) {
    uvec4 kw[KU][VS], vw[KU][VS];
    float ks[KU], vsc[KU];  // the rows' scales (1 for F16 rows)
    bool cnt[KU];
    [[unroll]] for (uint u = 0; u < KU; ++u) {
      const uint j = jb + u * step + slot;
      cnt[u] = j < n && key_ok(k0 + j, t);
      const bool ld = cnt[u] && seg;
      const uint row = rb + min(j, n - 1);  // in bounds, loaded or not
      const uint rbase = row * rw + cs * VS;
      [[unroll]] for (uint v = 0; v < VS; ++v) {
        kw[u][v] = ld ? k4[pc.k_off + rbase + v] : uvec4(0);
        vw[u][v] = ld ? v4[pc.v_off + rbase + v] : uvec4(0);
      }
#ifdef KV_Q8
      const uint di = row * (hd / 32) + cs * NV / 32;  // VS = 1: one block a lane
      ks[u] = ld ? kd[pc.kd_off + di] : 0.0;  // (a row that does not count may hold anything)
      vsc[u] = ld ? vd[pc.vd_off + di] : 0.0;
#else
      ks[u] = 1.0;
      vsc[u] = 1.0;
#endif
    }
    float sc[KU][GM];
    [[unroll]] for (uint u = 0; u < KU; ++u) {
      float acc[GM];
      [[unroll]] for (uint g = 0; g < GM; ++g) acc[g] = 0.0;
      [[unroll]] for (uint v = 0; v < VS; ++v) {
        [[unroll]] for (uint i = 0; i < NPU / 4; ++i) {
          const vec4 a = part4(kw[u][v], i);
          const uint e = NPU * v + 4 * i;
          [[unroll]] for (uint g = 0; g < GM; ++g)
            acc[g] += dot(vec4(qv[g][e], qv[g][e + 1], qv[g][e + 2], qv[g][e + 3]), a);
        }
      }
      [[unroll]] for (uint g = 0; g < GM; ++g) acc[g] *= ks[u];
      for (uint off = P / 2; off > 0; off >>= 1) {
        [[unroll]] for (uint g = 0; g < GM; ++g) acc[g] += subgroupShuffleXor(acc[g], off);
      }
      [[unroll]] for (uint g = 0; g < GM; ++g) sc[u][g] = cnt[u] ? acc[g] : NEG_BIG;
    }
    [[unroll]] for (uint g = 0; g < GM; ++g) {
      float mn = m[g];
      [[unroll]] for (uint u = 0; u < KU; ++u) mn = max(mn, sc[u][g]);
      if (mn == NEG_BIG) continue;  // no key of this lane group counted yet
      const float corr = exp2(m[g] - mn);
      m[g] = mn;
      l[g] *= corr;
      [[unroll]] for (uint e = 0; e < NV; ++e) o[g][e] *= corr;
      [[unroll]] for (uint u = 0; u < KU; ++u) {
        const float p = cnt[u] ? exp2(sc[u][g] - mn) : 0.0;
        l[g] += p;
        const float pv = p * vsc[u];
        [[unroll]] for (uint v = 0; v < VS; ++v) {
          [[unroll]] for (uint i = 0; i < NPU / 4; ++i) {
            const vec4 a = part4(vw[u][v], i);
            [[unroll]] for (uint e = 0; e < 4; ++e) o[g][NPU * v + 4 * i + e] += pv * a[e];
          }
        }
      }
    }
  }

  // The subgroup's lane groups merged: every lane ends with the subgroup's
  // sums for its segment.
  for (uint off = P; off < SG; off <<= 1) {
    [[unroll]] for (uint g = 0; g < GM; ++g) {
      const float mo = subgroupShuffleXor(m[g], off), lo = subgroupShuffleXor(l[g], off);
      const float mn = max(m[g], mo);
      const float a = exp2(m[g] - mn), b = exp2(mo - mn);  // 0 for a side that counted nothing
      l[g] = l[g] * a + lo * b;
      [[unroll]] for (uint e = 0; e < NV; ++e) o[g][e] = o[g][e] * a + subgroupShuffleXor(o[g][e], off) * b;
      m[g] = mn;
    }
  }
  // Then the subgroups: their (m, l), the common max, and o added in turn.
  const uint sgi = gl_SubgroupID;
  if (lane == 0) {
    [[unroll]] for (uint g = 0; g < GM; ++g) ml_sh[sgi][g] = vec2(m[g], l[g]);
  }
  barrier();
  float M[GM], L[GM];
  [[unroll]] for (uint g = 0; g < GM; ++g) {
    M[g] = NEG_BIG;
    for (uint w = 0; w < gl_NumSubgroups; ++w) M[g] = max(M[g], ml_sh[w][g].x);
    L[g] = 0.0;
    for (uint w = 0; w < gl_NumSubgroups; ++w) L[g] += ml_sh[w][g].y * exp2(ml_sh[w][g].x - M[g]);
  }
  for (uint w = 0; w < gl_NumSubgroups; ++w) {  // uniform
    if (sgi == w && slot == 0 && seg) {
      [[unroll]] for (uint g = 0; g < GM; ++g) {
        const float a = exp2(m[g] - M[g]);
        [[unroll]] for (uint e = 0; e < NV; ++e) o_sh[g][c * NV + e] = (w == 0 ? 0.0 : o_sh[g][c * NV + e]) + o[g][e] * a;
      }
    }
    barrier();
  }
  // The partial, in base e for the merge.
  const uint tid = gl_LocalInvocationID.x, stride = hd + 2;
  for (uint i = tid; i < gn * hd; i += WG) {
    const uint g = i / hd, d = i % hd;
    float Mg = M[0], Lg = L[0];
    [[unroll]] for (uint gg = 1; gg < GM; ++gg) {
      Mg = gg == g ? M[gg] : Mg;
      Lg = gg == g ? L[gg] : Lg;
    }
    const uint pb = pc.part_off + ((t * pc.n_heads + h0 + g) * pc.n_splits + s) * stride;
    if (d == 0) {
      part[pb] = Mg == NEG_BIG ? NEG_BIG : Mg / LOG2E;
      part[pb + 1] = Lg;
    }
    part[pb + 2 + d] = o_sh[g][d];
  }
}
