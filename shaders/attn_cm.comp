#version 450
// Causal GQA attention for prefill on the tensor cores (flash attention over
// GL_NV_cooperative_matrix): the same inputs, outputs and push constants as
// attn_tile.comp, which stays the kernel for devices without cooperative
// matrices; the host picks (engine/backends/vulkan/vulkan_attention.cpp).
//
// A workgroup of NSG = 4 subgroups of 32 threads takes BR = 64 query rows of
// one head (subgroup s: rows 16 s .. + 15) and walks the keys 0 .. (largest
// position among them) in tiles of BC = 32. Per tile:
//   - K and V rows go to shared memory as F16 (Q8_0 dequantized on the way);
//     the next tile's loads are issued before this tile's products and
//     stored after them, so the products hide their latency;
//   - S = Q K^T: Q (times the scale, F16) sits in 16 x 16 matrices in
//     registers for the whole walk, K is read column-major as B; F32 sums;
//   - the online softmax in plain code: S through shared memory, two lanes
//     per query row, P = exp(S - m) as F16 into shared memory;
//   - O += P V on the tensor cores, O in F32 accumulators.
// O's rows would need scaling whenever a row's running max m grows. They are
// scaled only when some row's max grows by more than RESCALE (nats) past the
// max P was taken against (then through shared memory, 16 x 16 at a time);
// otherwise P is taken against the older max, so P <= e^RESCALE (F16 holds
// it) and the sums l carry the same reference. The result is the same softmax.
// Workgroups run in reverse row order: the rows with the most keys start first.
// Needs: subgroups of 32, head_dim a multiple of 16 up to 128, K/V offsets
// 16-byte aligned (checked by the host). Grid: x = ceil(T / BR), y = n_heads.

#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_KHR_memory_scope_semantics : require

#include "common.glsl"

#define NSG 4
#define NT (32 * NSG)        // threads; WG must be this (set by the host)
#define BR (16 * NSG)        // query rows per workgroup
#define BC 32                // keys per tile
#define HD_MAX 128
#define ND_MAX (HD_MAX / 16) // 16-wide blocks of a head
#define SR 17                // shared K/V/Q row stride in uvec4s: 136 halves (HD_MAX + 8)
#define SP 5                 // shared P row stride in uvec4s: 40 halves (BC + 8)
#define PPT (BC * HD_MAX / 8 / NT)  // pieces of 8 elements per thread, K and V each
#define RESCALE 8.0

layout(binding = 0) readonly buffer Q { float q[]; };
#ifdef KV_F16
layout(binding = 1) readonly buffer KC4 { uvec4 kc4[]; };
layout(binding = 2) readonly buffer VC4 { uvec4 vc4[]; };
#else
layout(binding = 1) readonly buffer KC2 { uvec2 kc2[]; };
layout(binding = 1) readonly buffer KCF { float kcf[]; };
layout(binding = 2) readonly buffer VC2 { uvec2 vc2[]; };
layout(binding = 2) readonly buffer VCF { float vcf[]; };
#endif
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) readonly buffer P { int pos[]; };

layout(push_constant) uniform PC {
  uint q_off, q_ld, o_off, o_ld;
  uint kc_off, kc_d_off, vc_off, vc_d_off;
  uint n_ctx, n_heads, n_kv_heads, head_dim;
  uint pos_off, T;
  float scale;
} pc;

// K tile rows 0 .. BC-1, V tile rows BC .. 2 BC-1 (before the walk: Q's BR rows).
shared uvec4 kvs[2 * BC * SR];
shared float ssf[NSG][16 * BC];  // a subgroup's S tile, or one 16 x 16 block of O
shared uvec4 ps[NSG][16 * SP];   // a subgroup's P tile, F16

uvec4 pack8(vec4 a, vec4 b) {
  return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

// A tile's K and V pieces as loaded; converted to F16 in store_kv.
struct KvRegs {
#ifdef KV_F16
  uvec4 k[PPT], v[PPT];
#else
  uvec2 k[PPT], v[PPT];
  float kd[PPT], vd[PPT];
#endif
};

// Piece e = tid + NT i of the tile at key kb: key kb + e / (hd / 8), elements 8 (e % (hd / 8)) .. + 7.
KvRegs load_kv(int kb, int kmax, uint kvh) {
  const uint tid = gl_LocalInvocationID.x, hv8 = pc.head_dim / 8;
  KvRegs t;
  [[unroll]] for (uint i = 0; i < PPT; ++i) {
    const uint e = tid + NT * i, j = e / hv8, c = e % hv8;
    const int key = kb + int(j);
#ifdef KV_F16
    t.k[i] = uvec4(0);
    t.v[i] = uvec4(0);
    if (j < BC && key <= kmax) {
      const uint row = kvh * pc.n_ctx + uint(key);
      t.k[i] = kc4[(pc.kc_off + row * (pc.head_dim / 2)) / 4 + c];
      t.v[i] = vc4[(pc.vc_off + row * (pc.head_dim / 2)) / 4 + c];
    }
#else
    t.k[i] = uvec2(0);
    t.v[i] = uvec2(0);
    t.kd[i] = 0.0;
    t.vd[i] = 0.0;
    if (j < BC && key <= kmax) {
      const uint row = kvh * pc.n_ctx + uint(key);
      t.k[i] = kc2[(pc.kc_off + row * (pc.head_dim / 4)) / 2 + c];
      t.v[i] = vc2[(pc.vc_off + row * (pc.head_dim / 4)) / 2 + c];
      t.kd[i] = kcf[pc.kc_d_off + row * (pc.head_dim / 32) + c / 4];
      t.vd[i] = vcf[pc.vc_d_off + row * (pc.head_dim / 32) + c / 4];
    }
#endif
  }
  return t;
}

#ifndef KV_F16
vec4 i8x4(uint w) {
  return vec4(int(w << 24) >> 24, int(w << 16) >> 24, int(w << 8) >> 24, int(w) >> 24);
}
#endif

void store_kv(const KvRegs t) {
  const uint tid = gl_LocalInvocationID.x, hv8 = pc.head_dim / 8;
  [[unroll]] for (uint i = 0; i < PPT; ++i) {
    const uint e = tid + NT * i, j = e / hv8, c = e % hv8;
    if (j < BC) {
#ifdef KV_F16
      kvs[j * SR + c] = t.k[i];
      kvs[(BC + j) * SR + c] = t.v[i];
#else
      kvs[j * SR + c] = pack8(i8x4(t.k[i].x) * t.kd[i], i8x4(t.k[i].y) * t.kd[i]);
      kvs[(BC + j) * SR + c] = pack8(i8x4(t.v[i].x) * t.vd[i], i8x4(t.v[i].y) * t.vd[i]);
#endif
    }
  }
}

void sg_sync() {
  subgroupMemoryBarrierShared();
  subgroupBarrier();
}

void main() {
  const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint t0 = (gl_NumWorkGroups.x - 1 - gl_WorkGroupID.x) * BR, h = gl_WorkGroupID.y;
  const uint kvh = h / (pc.n_heads / pc.n_kv_heads);
  const uint hd = pc.head_dim, nd = hd / 16, hv8 = hd / 8;
  // The workgroup's and this subgroup's last key (uniform in each).
  int kmax = 0, sg_kmax = -1;
  for (uint r = 0; r < BR && t0 + r < pc.T; ++r) {
    const int p = pos[pc.pos_off + t0 + r];
    kmax = max(kmax, p);
    if (r / 16 == sg) sg_kmax = max(sg_kmax, p);
  }
  // This lane's query row in the softmax (r) and its half of the tile's keys.
  const uint r = lane / 2, half_ = lane % 2, row = t0 + 16 * sg + r;
  const int my_pos = row < pc.T ? pos[pc.pos_off + row] : -1;

  // Q (times the scale) as F16 through shared memory into registers.
  for (uint e = tid; e < BR * hv8; e += NT) {
    const uint rr = e / hv8, c = e % hv8;
    vec4 a = vec4(0.0), b = vec4(0.0);
    if (t0 + rr < pc.T) {
      const uint base = pc.q_off + (t0 + rr) * pc.q_ld + h * hd + 8 * c;
      a = vec4(q[base], q[base + 1], q[base + 2], q[base + 3]) * pc.scale;
      b = vec4(q[base + 4], q[base + 5], q[base + 6], q[base + 7]) * pc.scale;
    }
    kvs[rr * SR + c] = pack8(a, b);
  }
  KvRegs t = load_kv(0, kmax, kvh);
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> qa[ND_MAX];
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> oacc[ND_MAX];
  [[unroll]] for (uint i = 0; i < ND_MAX; ++i) {
    oacc[i] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    if (i < nd) coopMatLoadNV(qa[i], kvs, 16 * sg * SR + 2 * i, SR, false);
  }
  barrier();  // Q is in registers: the K/V tile may overwrite it
  store_kv(t);
  barrier();

  float m_ref = NEG_BIG, l = 0.0;
  for (int kb = 0; kb <= kmax; kb += BC) {
    const bool next = kb + BC <= kmax;
    if (next) t = load_kv(kb + BC, kmax, kvh);
    if (kb <= sg_kmax) {
      // S = Q K^T for this subgroup's 16 rows and the tile's 32 keys.
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> sacc[2];
      sacc[0] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
      sacc[1] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
      [[unroll]] for (uint i = 0; i < ND_MAX; ++i) {
        if (i < nd) {
          [[unroll]] for (uint jb = 0; jb < 2; ++jb) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> kbm;
            coopMatLoadNV(kbm, kvs, 16 * jb * SR + 2 * i, SR, true);
            sacc[jb] = coopMatMulAddNV(qa[i], kbm, sacc[jb]);
          }
        }
      }
      coopMatStoreNV(sacc[0], ssf[sg], 0, BC, false);
      coopMatStoreNV(sacc[1], ssf[sg], 16, BC, false);
      sg_sync();
      float s[16];
      float mx = NEG_BIG;
      [[unroll]] for (uint c = 0; c < 16; ++c) {
        const int key = kb + int(16 * half_ + c);
        s[c] = key <= my_pos ? ssf[sg][r * BC + 16 * half_ + c] : NEG_BIG;
        mx = max(mx, s[c]);
      }
      mx = max(mx, subgroupShuffleXor(mx, 1));
      const float m_new = max(m_ref, mx);
      if (subgroupAny(m_new > m_ref + RESCALE)) {
        // Every row to its new max: O's rows and l scaled by exp(m_ref - m_new).
        const float alpha = exp(m_ref - m_new);
        l *= alpha;
        m_ref = m_new;
        sg_sync();  // every lane has read its S values
        [[unroll]] for (uint i = 0; i < ND_MAX; ++i) {
          if (i < nd) {
            coopMatStoreNV(oacc[i], ssf[sg], 0, 16, false);
            sg_sync();
            [[unroll]] for (uint c = 0; c < 8; ++c) ssf[sg][r * 16 + 8 * half_ + c] *= alpha;
            sg_sync();
            coopMatLoadNV(oacc[i], ssf[sg], 0, 16, false);
            sg_sync();
          }
        }
      }
      float p[16];
      float psum = 0.0;
      [[unroll]] for (uint c = 0; c < 16; ++c) {
        p[c] = s[c] > 0.5 * NEG_BIG ? exp(s[c] - m_ref) : 0.0;
        psum += p[c];
      }
      l += psum + subgroupShuffleXor(psum, 1);
      ps[sg][r * SP + 2 * half_] = pack8(vec4(p[0], p[1], p[2], p[3]), vec4(p[4], p[5], p[6], p[7]));
      ps[sg][r * SP + 2 * half_ + 1] =
          pack8(vec4(p[8], p[9], p[10], p[11]), vec4(p[12], p[13], p[14], p[15]));
      sg_sync();
      // O += P V: A = P (16 rows x 16 keys), B = V (16 keys x 16 dims), row-major.
      [[unroll]] for (uint kk = 0; kk < 2; ++kk) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> pa;
        coopMatLoadNV(pa, ps[sg], 2 * kk, SP, false);
        [[unroll]] for (uint i = 0; i < ND_MAX; ++i) {
          if (i < nd) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> vb;
            coopMatLoadNV(vb, kvs, (BC + 16 * kk) * SR + 2 * i, SR, false);
            oacc[i] = coopMatMulAddNV(pa, vb, oacc[i]);
          }
        }
      }
    }
    barrier();  // the tile is consumed
    if (next) store_kv(t);
    barrier();
  }

  // O / l, one 16 x 16 block at a time through shared memory.
  const float inv = l > 0.0 ? 1.0 / l : 0.0;
  [[unroll]] for (uint i = 0; i < ND_MAX; ++i) {
    if (i < nd) {
      coopMatStoreNV(oacc[i], ssf[sg], 0, 16, false);
      sg_sync();
      if (row < pc.T) {
        const uint base = pc.o_off + row * pc.o_ld + h * hd + 16 * i + 8 * half_;
        [[unroll]] for (uint c = 0; c < 8; ++c) o[base + c] = ssf[sg][r * 16 + 8 * half_ + c] * inv;
      }
      sg_sync();
    }
  }
}
