#version 450
// y[c][r] = sum_k W[r][k] * x[c][k] (+ bias[r]) for a few columns c (decode):
// matrix-vector products, memory bound on the weights.
//
// NC: columns per workgroup, a variant define (1 for single-token decode, 8
// for small batches).
#ifndef NC
#define NC 8
#endif

#if NC == 1 && defined(USE_SUBGROUP)
// ---- single token, subgroups (matvec1_*_sg): the decode hot path ----------
// The workgroup (WG threads) is split into row groups of TPR threads (a
// multiple of the subgroup size, chosen on the host from M so that the grid
// fills the GPU); a row group owns NR consecutive rows. Each 32-element unit
// is split over PPU threads (dequant.glsl's parts), and the row group's
// threads stride over the rows' parts, UNROLL parts at a time: all weight
// loads of UNROLL parts x NR rows are issued before any of them is used
// (load_part / dot_part), so each thread keeps several loads in flight, and
// each x part (XV vec4) is loaded once for the NR rows. Several threads per
// unit make a subgroup's x loads cover a few whole cache lines rather than
// one line per thread. Sums: subgroupAdd, then (TPR larger than a subgroup)
// one shared-memory step.
// Grid: x (spilling into z) = ceil(M / NR / (WG / TPR)) workgroups.
//
// ROPE_KV (matvec1_qkv_rope_*, with QKV): then RoPE of q and k and the F16
// KV store of k and v (rope.comp's rope_kv), row pairs (2i, 2i + 1) being
// rotated pairs: NR is even, and each row group's thread for a pair writes it.
//
// XQ8 (matvec1x*: Q4_0, Q8_0, Q4_K, Q6_K): x comes as rms_norm_q8 wrote it (32-element
// blocks of int8 with (d, d * sum q)), and each part's dot is two 4x8-bit
// integer dot products (OpSDot / OpSUDot, VK_KHR_shader_integer_dot_product)
// scaled once: Q4_0's -8 offset is -8 d_w (d_x sum q) per block (Q4_K's
// minimum likewise), which the block's part 0 adds. A fraction of the float
// path's arithmetic, and a quarter of its x bytes.
//
// GLU (matvec1_glu_*): y = silu(gate x) * (up x) in one dispatch. The M rows
// are 2 n_ff virtual rows, gate and up rows interleaved (even: gate row i/2
// at w_off, odd: up row i/2 at w_off_b, in the same buffer), NR even, so each
// row group holds whole pairs and writes silu(g) * u itself.
//
// Q8_TAIL (matvec1x_glu_q8_*, with GLU): also y's Q8 copy (q8.glsl) for the
// integer-dot down matrix. A workgroup's outputs lie in one 32-element block
// (the host keeps to it); they are counted into the block's counter
// cnt[cnt_off + block] once written, and whoever completes the count
// quantizes the block: no quant_q8 dispatch. With one subgroup per row group
// each writing thread counts its own output, and the subgroup whose thread
// completes the count quantizes (no workgroup barrier); otherwise the
// workgroup counts its outputs after a barrier and quantizes as a whole.
#define NR_MAX 4
#define UNROLL_MAX 8
layout(constant_id = 1) const uint NR = 2;    // rows per row group, 1..NR_MAX
layout(constant_id = 2) const uint TPR = 32;  // threads per row group, a power of two dividing WG
layout(constant_id = 3) const uint UNROLL = 4;  // parts per thread and step, 1..UNROLL_MAX
#include "common.glsl"
#define WANT_DOT_PART
#include "dequant.glsl"
#ifdef XQ8
#extension GL_EXT_spirv_intrinsics : require
// OpSDotKHR / OpSUDotKHR on 4x8-bit packed words (format 0): sum of the four
// byte products; SUDot's first operand signed, its second unsigned.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal int fmt);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4(uint a, uint b, spirv_literal int fmt);
#endif
#else
// ---- several columns, or no subgroups --------------------------------------
// A workgroup owns NR consecutive rows; all its threads stride over the
// 32-element units of those rows, so each x unit is loaded once per NR rows
// and a warp reads consecutive units (coalesced). Partial sums are reduced
// across the workgroup (subgroupAdd, then shared memory) at the end.
// Grid: x (spilling into z) = row groups (NR rows, or NSG * NR with subgroups),
// y = ceil(N / NC) column blocks.
#define NR_MAX 2
layout(constant_id = 1) const uint NR = 2;  // rows together, 1..NR_MAX (the host keeps to it)
#define ACC_N (NR_MAX * NC)  // accumulators per thread
#ifndef USE_SUBGROUP
#define RED_N ACC_N  // common.glsl's shared-memory reductions
#endif
#include "common.glsl"
#include "dequant.glsl"
#endif

layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };
#if defined(Q8_TAIL)
// coherent: a block's last workgroup reads outputs the others wrote.
layout(binding = 2) coherent buffer Y { float y[]; };
layout(binding = 2) coherent buffer Y4 { vec4 y4[]; };
layout(binding = 5) writeonly buffer QO { uint qo[]; };
layout(binding = 5) writeonly buffer QD { vec2 qdo[]; };
layout(binding = 7) coherent buffer CNT { uint cnt[]; };
#else
layout(binding = 2) buffer Y { float y[]; };  // read too with flags & 4
#endif
layout(binding = 3) readonly buffer B { float bias[]; };
#if defined(XQ8) && NC == 1 && defined(USE_SUBGROUP)
layout(binding = 6) readonly buffer XQ { uint xq[]; };
layout(binding = 6) readonly buffer XD { vec2 xd[]; };
#endif
#ifdef ROPE_KV
layout(binding = 4) readonly buffer RF { float ff[]; };  // RoPE frequency factors
layout(binding = 5) buffer KVC { uint cache[]; };       // K and V caches, F16 pairs
#endif

layout(push_constant) uniform PC {
  uint w_off, w_off2;   // weight arrays (uint words)
  uint row0;            // first row of the view inside the tensor
  uint row_units;       // 32-element units per row of the tensor
  uint K, M, N;         // elements per row, rows, columns
  uint x_off, x_ld;     // floats
  uint y_off, y_ld;     // floats
  uint b_off;           // floats
  uint flags;           // 1: add bias; 2: x rows 16-byte aligned (vec4 loads);
                        // 4: y += W x (single-token subgroup variant only)
  uint w_off_b, w_off2_b, row0_b;  // GLU: the up matrix (w_off..row0: gate)
  // QKV: rows [0, m_a) of the first matrix (w_off, y_off), [m_a, m_a + m_b)
  // of the second (w_off_b, y_off_b), the rest of the third (w_off_c, y_off_c).
  uint w_off_c, w_off2_c, m_a, m_b, y_off_b, y_off_c;
#ifdef ROPE_KV
  // rope.comp's parameters and this token's position. (128 bytes is all some
  // devices take, so the head size, the cache length and the caches' offsets
  // (words) take the places of N, y_ld, b_off and row0_b, unused here.)
  int rope_pos;
  uint ff_off;
  float theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1;
#define RP_HEAD_DIM pc.N
#define RP_N_CTX pc.y_ld
#define RP_KC_OFF pc.b_off
#define RP_VC_OFF pc.row0_b
#else
  uint cnt_off;          // Q8_TAIL: the blocks' arrival counters
  uint qo_off, qdo_off;  // Q8_TAIL: y's Q8 copy (words, vec2s)
  uint pad0, pad1, pad2, pad3, pad4;
#endif
  uint xq_off, xd_off;  // XQ8: x's Q8 copy (words, vec2s)
} pc;

#ifdef ROPE_KV
#include "rope.glsl"

// Rows g (even) and g + 1 of the stacked q, k, v: q and k rotated (as
// rope.comp: x0 c - x1 s, x0 s + x1 c), k and v also into this position's
// cache rows (kv_store.comp's F16 layout).
void store_pair(uint g, float a, float b) {
  const uint hd = RP_HEAD_DIM, half_hd = hd / 2, n_ctx = RP_N_CTX;
  const int p = pc.rope_pos;
  if (g < pc.m_a + pc.m_b) {
    const bool is_k = g >= pc.m_a;
    const uint gg = is_k ? g - pc.m_a : g, i = (gg % hd) / 2;
    const vec2 cs = rope_cs(i, p);
    const float y0 = a * cs.x - b * cs.y, y1 = a * cs.y + b * cs.x;
    const uint base = is_k ? pc.y_off_b : pc.y_off;
    y[base + gg] = y0;
    y[base + gg + 1] = y1;
    if (is_k) cache[RP_KC_OFF + ((gg / hd) * n_ctx + uint(p)) * half_hd + i] = packHalf2x16(vec2(y0, y1));
  } else {
    const uint gv = g - pc.m_a - pc.m_b;
    y[pc.y_off_c + gv] = a;
    y[pc.y_off_c + gv + 1] = b;
    cache[RP_VC_OFF + ((gv / hd) * n_ctx + uint(p)) * half_hd + (gv % hd) / 2] = packHalf2x16(vec2(a, b));
  }
}
#endif

void load_x(uint c, uint u, out vec4 xv[8]) {
  const uint base = pc.x_off + c * pc.x_ld + 32 * u;
  if ((pc.flags & 2u) != 0 && 32 * u + 32 <= pc.K) {
    [[unroll]] for (uint i = 0; i < 8; ++i) xv[i] = x4[base / 4 + i];
  } else {
    // Tail of an F32/F16 row, or unaligned rows: weights past K are zero
    // padding, but x past K belongs to the next row (maybe Inf), so mask it.
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      vec4 v;
      [[unroll]] for (uint e = 0; e < 4; ++e) {
        const uint k = 32 * u + 4 * i + e;
        v[e] = k < pc.K ? x[base + 4 * i + e] : 0.0;
      }
      xv[i] = v;
    }
  }
}

#if NC == 1 && defined(USE_SUBGROUP)
// Part s of x unit u: its vec4s XV/2 s .. XV/2 s + XV/2 - 1 and 4 + the same
// (dequant.glsl's parts).
void load_x_part(uint u, uint s, out vec4 xv[XV]) {
  const uint base = pc.x_off + 32 * u;
  if ((pc.flags & 2u) != 0 && 32 * u + 32 <= pc.K) {
    [[unroll]] for (uint i = 0; i < XV / 2; ++i) {
      xv[i] = x4[base / 4 + XV / 2 * s + i];
      xv[XV / 2 + i] = x4[base / 4 + 4 + XV / 2 * s + i];
    }
  } else {
    // As load_x: past K, x belongs to the next row (maybe Inf), so mask it.
    [[unroll]] for (uint i = 0; i < XV; ++i) {
      const uint v = (i < XV / 2 ? 0 : 4 - XV / 2) + XV / 2 * s + i;  // vec4 index in the unit
      [[unroll]] for (uint e = 0; e < 4; ++e) {
        const uint k = 32 * u + 4 * v + e;
        xv[i][e] = k < pc.K ? x[base + 4 * v + e] : 0.0;
      }
    }
  }
}

shared float red1[NR_MAX][WG];

// x for part s of unit u, and its dot with a weight part.
#ifdef XQ8
struct XP {
  uint w[XV];  // the part's Q8 words of the block (dequant.glsl's part_vec)
  vec2 ds;     // d, d * sum q of the block
};
XP load_xp(uint u, uint s) {
  XP x;
  [[unroll]] for (uint i = 0; i < XV; ++i) x.w[i] = xq[pc.xq_off + 8 * u + part_vec(s, i)];
  x.ds = xd[pc.xd_off + u];
  return x;
}
// Offsets that apply to a whole 32-element block (Q4_0's -8, Q4_K's minimum)
// are added once, by the block's part 0.
float dot_xp(const Part p, uint u, uint s, const XP x) {
#if defined(DT_Q4_0)
  const int i = sudot4(x.w[0], p.q & 0x0F0F0F0Fu, 0) + sudot4(x.w[1], (p.q >> 4) & 0x0F0F0F0Fu, 0);
  return p.d * (x.ds.x * float(i) - (s == 0u ? 8.0 * x.ds.y : 0.0));
#elif defined(DT_Q8_0)
  return p.d * (x.ds.x * float(sdot4(x.w[0], p.q[0], 0) + sdot4(x.w[1], p.q[1], 0)));
#elif defined(DT_Q4_K)
  const uint j = u % 8, sh = 4 * (j % 2);
  const vec2 dm = unpackHalf2x16(p.hdr.x);
  float sc, mn;
  k4_scale_min(p.hdr, j, sc, mn);
  int i = 0;
  [[unroll]] for (uint k = 0; k < XV; ++k) i += sudot4(x.w[k], (p.q[k] >> sh) & 0x0F0F0F0Fu, 0);
  return (dm.x * sc) * (x.ds.x * float(i)) - (s == 0u ? (dm.y * mn) * x.ds.y : 0.0);
#elif defined(DT_Q6_K)
  // As dot_part: two 16-element halves with their own int8 scales; the
  // 6-bit quants become signed bytes q - 32 without borrows between bytes.
  const uint j = u % 8, k = j % 4, s0 = 2 * k;
  const uint sb = (p.sc >> (8 * (s0 % 4))) ^ 0x8080u;
  const float d0 = p.d * (uintBitsToFloat((sb & 0xFFu) | MAGIC) - 8388736.0);
  const float d1 = p.d * (uintBitsToFloat(((sb >> 8) & 0xFFu) | MAGIC) - 8388736.0);
  const uint lsh = 4 * (k / 2), hsh = 2 * k;
  int a = 0, b = 0;
  [[unroll]] for (uint i = 0; i < XV; ++i) {
    const uint c = ((p.l[i] >> lsh) & 0x0F0F0F0Fu) | (((p.h[i] >> hsh) & 0x03030303u) << 4);
    const int t = sdot4(x.w[i], ((c | 0x80808080u) - 0x20202020u) ^ 0x80808080u, 0);
    if (i < XV / 2) a += t;
    else b += t;
  }
  return x.ds.x * (d0 * float(a) + d1 * float(b));
#else
#error "XQ8: Q4_0, Q8_0, Q4_K and Q6_K only"
#endif
}
#else
struct XP {
  vec4 v[XV];
};
XP load_xp(uint u, uint s) {
  XP x;
  load_x_part(u, s, x.v);
  return x;
}
float dot_xp(const Part p, uint u, uint s, const XP x) { return dot_part(p, u, x.v); }
#endif

// Row g of the output: y[y_off + g], or (QKV) the row of its own matrix's output.
void store_y(uint g, float v) {
#ifdef QKV
  if (g < pc.m_a) {
    y[pc.y_off + g] = v;
  } else if (g < pc.m_a + pc.m_b) {
    y[pc.y_off_b + g - pc.m_a] = v;
  } else {
    y[pc.y_off_c + g - pc.m_a - pc.m_b] = v;
  }
#else
  y[pc.y_off + g] = v;
#endif
}


#ifdef Q8_TAIL
#include "q8.glsl"
shared bool last_q8_sh;

// The Q8 copy of block blk of y by one subgroup of at least 8 threads: the
// first eight hold a vec4 each, the others zeros, so whole-subgroup
// reductions give the block's max and sum.
void q8_block_sg(uint blk) {
  memoryBarrierBuffer();
  const uint l = gl_SubgroupInvocationID;
  const vec4 v = l < 8 ? y4[pc.y_off / 4 + 8 * blk + l] : vec4(0.0);
  const float amax = subgroupMax(max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w))));
  const ivec4 qi = q8_round(v, amax);
  const int qsum = subgroupAdd(qi.x + qi.y + qi.z + qi.w);
  if (l < 8) qo[pc.qo_off + 8 * blk + l] = q8_pack(qi);
  if (l == 0) {
    const float d = amax / 127.0;
    qdo[pc.qdo_off + blk] = vec2(d, d * float(qsum));
    cnt[pc.cnt_off + blk] = 0;  // ready for the next dispatch
  }
}

// One subgroup per row group: a thread that wrote output i counts it in (last:
// it completed the count), and the subgroup quantizes the block if any did.
bool q8_count(uint i) {
  memoryBarrierBuffer();
  return atomicAdd(cnt[pc.cnt_off + i / 32], 1u) == 31u;
}

// Otherwise every workgroup calls this after writing its outputs (GLU: a pair
// of rows each); the last of its block's workgroups writes the block's copy.
void q8_tail() {
  const uint tid = gl_LocalInvocationID.x, per = WG / TPR * NR / 2;
  const uint first = linear_group() * per, blk = first / 32;
  memoryBarrierBuffer();
  barrier();
  if (tid == 0) last_q8_sh = first < pc.M / 2 && atomicAdd(cnt[pc.cnt_off + blk], per) == 32 - per;
  barrier();
  if (!last_q8_sh) return;  // uniform
  memoryBarrierBuffer();
  if (tid == 0) cnt[pc.cnt_off + blk] = 0;  // ready for the next dispatch
  const vec4 v = tid < 8 ? y4[pc.y_off / 4 + 8 * blk + tid] : vec4(0.0);
  vec2 ds;
  const uint w = q8_quant(v, ds);
  if (tid < 8) qo[pc.qo_off + 8 * blk + tid] = w;
  if (tid == 0) qdo[pc.qdo_off + blk] = ds;
}
#endif

void main() {
  const uint tid = gl_LocalInvocationID.x;
  // Row group and index inside it. Whole subgroups make a row group (so
  // subgroupAdd sums one row group) whenever the subgroup is no wider than
  // TPR; otherwise (a device whose subgroups are wider than the host
  // thought) threads are grouped by index and summed in shared memory only.
  const uint S = gl_SubgroupSize;
  const bool by_sg = S <= TPR;  // uniform
  uint rg, t;
  if (by_sg) {
    const uint per = TPR / S;
    rg = gl_SubgroupID / per;
    t = (gl_SubgroupID % per) * S + gl_SubgroupInvocationID;
  } else {
    rg = tid / TPR;
    t = tid % TPR;
  }
  const uint r0 = (linear_group() * (WG / TPR) + rg) * NR;
  uint rows[NR_MAX];
  // Rows past M repeat the last row (their sums are dropped) so loads stay in bounds.
#ifdef GLU
  [[unroll]] for (uint r = 0; r < NR_MAX; ++r) rows[r] = (r % 2 == 0 ? pc.row0 : pc.row0_b) + min((r0 + r) / 2, pc.M / 2 - 1);
#define W_OFF(r) ((r) % 2 == 0 ? pc.w_off : pc.w_off_b)
#define W_OFF2(r) ((r) % 2 == 0 ? pc.w_off2 : pc.w_off2_b)
#elif defined(QKV)
  // Whole tensors stacked (row0 = 0): each row finds its matrix.
  uint woff[NR_MAX], woff2[NR_MAX];
  [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
    const uint g = min(r0 + r, pc.M - 1);
    if (g < pc.m_a) {
      rows[r] = g, woff[r] = pc.w_off, woff2[r] = pc.w_off2;
    } else if (g < pc.m_a + pc.m_b) {
      rows[r] = g - pc.m_a, woff[r] = pc.w_off_b, woff2[r] = pc.w_off2_b;
    } else {
      rows[r] = g - pc.m_a - pc.m_b, woff[r] = pc.w_off_c, woff2[r] = pc.w_off2_c;
    }
  }
#define W_OFF(r) woff[r]
#define W_OFF2(r) woff2[r]
#else
  [[unroll]] for (uint r = 0; r < NR_MAX; ++r) rows[r] = pc.row0 + min(r0 + r, pc.M - 1);
#define W_OFF(r) pc.w_off
#define W_OFF2(r) pc.w_off2
#endif
  float acc[NR_MAX];
  [[unroll]] for (uint r = 0; r < NR_MAX; ++r) acc[r] = 0.0;

  if (r0 < pc.M) {  // a row group wholly past M only joins the reduction
    const uint parts = PPU * pc.row_units;
    uint q = t;
    for (; q + (UNROLL - 1) * TPR < parts; q += UNROLL * TPR) {
      Part w[UNROLL_MAX][NR_MAX];
      [[unroll]] for (uint k = 0; k < UNROLL_MAX; ++k) {
        const uint qk = q + k * TPR;
        [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
          if (k < UNROLL && r < NR) w[k][r] = load_part(W_OFF(r), W_OFF2(r), pc.row_units, rows[r], qk / PPU, qk % PPU);
        }
      }
      [[unroll]] for (uint k = 0; k < UNROLL_MAX; ++k) {
        if (k >= UNROLL) break;
        const uint qk = q + k * TPR;
        const XP xv = load_xp(qk / PPU, qk % PPU);
        [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
          if (r < NR) acc[r] += dot_xp(w[k][r], qk / PPU, qk % PPU, xv);
        }
      }
    }
    for (; q < parts; q += TPR) {  // the last parts, fewer than UNROLL per thread
      Part w[NR_MAX];
      [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
        if (r < NR) w[r] = load_part(W_OFF(r), W_OFF2(r), pc.row_units, rows[r], q / PPU, q % PPU);
      }
      const XP xv = load_xp(q / PPU, q % PPU);
      [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
        if (r < NR) acc[r] += dot_xp(w[r], q / PPU, q % PPU, xv);
      }
    }
  }

  if (by_sg && TPR == S) {
    // One subgroup per row group: no shared memory, no barrier.
    [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
      if (r < NR) acc[r] = subgroupAdd(acc[r]);
    }
#ifdef GLU
    bool last = false;
    [[unroll]] for (uint j = 0; j < NR_MAX / 2; ++j) {
      if (2 * j < NR && j % TPR == t && r0 + 2 * j < pc.M) {
        const float g = acc[2 * j];
        y[pc.y_off + r0 / 2 + j] = g / (1.0 + exp(-g)) * acc[2 * j + 1];  // as eltwise.comp's silu_mul
#ifdef Q8_TAIL
        if (S >= 8) last = q8_count(r0 / 2 + j) || last;
#endif
      }
    }
#ifdef Q8_TAIL
    if (S >= 8) {  // uniform
      if (subgroupMax(last ? 1u : 0u) != 0u) q8_block_sg(r0 / 64);  // any
    } else {
      q8_tail();
    }
#endif
#elif defined(ROPE_KV)
    [[unroll]] for (uint j = 0; j < NR_MAX / 2; ++j) {
      if (2 * j < NR && j % TPR == t && r0 + 2 * j < pc.M) store_pair(r0 + 2 * j, acc[2 * j], acc[2 * j + 1]);
    }
#else
    [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
      if (r < NR && r % TPR == t && r0 + r < pc.M) {
        float v = acc[r];
        if ((pc.flags & 1u) != 0) v += bias[pc.b_off + r0 + r];
        if ((pc.flags & 4u) != 0) v = y[pc.y_off + r0 + r] + v;  // as add(y, W x): y first
        store_y(r0 + r, v);
      }
    }
#endif
  } else {
  uint parts, first;  // the row group's partial sums in red1[r][first .. first + parts)
  if (by_sg) {
    [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
      if (r < NR) acc[r] = subgroupAdd(acc[r]);
    }
    if (subgroupElect()) {
      [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
        if (r < NR) red1[r][gl_SubgroupID] = acc[r];
      }
    }
    parts = TPR / S;
    first = rg * parts;
  } else {
    [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
      if (r < NR) red1[r][tid] = acc[r];
    }
    parts = TPR;
    first = rg * TPR;
  }
  barrier();
#ifdef GLU
  [[unroll]] for (uint j = 0; j < NR_MAX / 2; ++j) {
    if (2 * j < NR && j % TPR == t && r0 + 2 * j < pc.M) {
      float g = 0.0, u = 0.0;
      for (uint i = 0; i < parts; ++i) g += red1[2 * j][first + i];
      for (uint i = 0; i < parts; ++i) u += red1[2 * j + 1][first + i];
      y[pc.y_off + r0 / 2 + j] = g / (1.0 + exp(-g)) * u;
    }
  }
#elif defined(ROPE_KV)
  [[unroll]] for (uint j = 0; j < NR_MAX / 2; ++j) {
    if (2 * j < NR && j % TPR == t && r0 + 2 * j < pc.M) {
      float a = 0.0, b = 0.0;
      for (uint i = 0; i < parts; ++i) a += red1[2 * j][first + i];
      for (uint i = 0; i < parts; ++i) b += red1[2 * j + 1][first + i];
      store_pair(r0 + 2 * j, a, b);
    }
  }
#else
  [[unroll]] for (uint r = 0; r < NR_MAX; ++r) {
    if (r < NR && r % TPR == t && r0 + r < pc.M) {
      float v = 0.0;
      for (uint i = 0; i < parts; ++i) v += red1[r][first + i];
      if ((pc.flags & 1u) != 0) v += bias[pc.b_off + r0 + r];
      if ((pc.flags & 4u) != 0) v = y[pc.y_off + r0 + r] + v;
      store_y(r0 + r, v);
    }
  }
#endif
#ifdef Q8_TAIL
  q8_tail();  // uniform: the shared-memory branch
#endif
  }
}
#elif defined(USE_SUBGROUP)
// Several columns with subgroups: each subgroup owns NR consecutive rows at a
// time, its lanes stride over the row's units, and subgroupAdd finishes the
// sums: no shared memory and no barrier. A workgroup covers NSG * NR rows;
// NSG is the host's guess of subgroups per workgroup (WG / subgroupSize), but
// the loop below is correct for any actual subgroup count.
layout(constant_id = 2) const uint NSG = 4;

void main() {
  const uint c0 = gl_WorkGroupID.y * NC;
  const uint nc = min(NC, pc.N - c0);
  const uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
  for (uint chunk = gl_SubgroupID; chunk < NSG; chunk += gl_NumSubgroups) {
    const uint r0 = (linear_group() * NSG + chunk) * NR;
    if (r0 >= pc.M) break;  // uniform in the subgroup
    float acc[ACC_N];
    [[unroll]] for (uint i = 0; i < ACC_N; ++i) acc[i] = 0.0;
    for (uint u = lane; u < pc.row_units; u += width) {
      // Dequantize each unit once, dot it with every column.
      vec4 w[NR_MAX][8];
      [[unroll]] for (uint r = 0; r < NR; ++r) {
        dq_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(r0 + r, pc.M - 1), u, w[r]);
      }
      [[unroll]] for (uint c = 0; c < NC; ++c) {
        if (c < nc) {
          vec4 xv[8];
          load_x(c0 + c, u, xv);
          [[unroll]] for (uint r = 0; r < NR; ++r) {
            float s = 0.0;
            [[unroll]] for (uint i = 0; i < 8; ++i) s += dot(w[r][i], xv[i]);
            acc[r * NC + c] += s;
          }
        }
      }
    }
    [[unroll]] for (uint i = 0; i < ACC_N; ++i) acc[i] = subgroupAdd(acc[i]);
    [[unroll]] for (uint i = 0; i < ACC_N; ++i) {
      const uint r = i / NC, c = i % NC;
      if (lane == i % width && r < NR && c < nc && r0 + r < pc.M) {
        float v = acc[i];
        if ((pc.flags & 1u) != 0) v += bias[pc.b_off + r0 + r];
        y[pc.y_off + (c0 + c) * pc.y_ld + r0 + r] = v;
      }
    }
  }
}
#else
// Without subgroups: the whole workgroup shares NR rows; partial sums meet in
// a shared-memory tree (common.glsl).
void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r0 = linear_group() * NR;
  const uint c0 = gl_WorkGroupID.y * NC;
  const uint nc = min(NC, pc.N - c0);

  float acc[RED_N];
  [[unroll]] for (uint i = 0; i < RED_N; ++i) acc[i] = 0.0;

  for (uint u = tid; u < pc.row_units; u += WG) {
    vec4 w[NR_MAX][8];
    [[unroll]] for (uint r = 0; r < NR; ++r) {
      // Rows past M repeat the last row (their sums are dropped) so loads stay in bounds.
      dq_unit(pc.w_off, pc.w_off2, pc.row_units, pc.row0 + min(r0 + r, pc.M - 1), u, w[r]);
    }
    [[unroll]] for (uint c = 0; c < NC; ++c) {
      if (c < nc) {
        vec4 xv[8];
        load_x(c0 + c, u, xv);
        [[unroll]] for (uint r = 0; r < NR; ++r) {
          float s = 0.0;
          [[unroll]] for (uint i = 0; i < 8; ++i) s += dot(w[r][i], xv[i]);
          acc[r * NC + c] += s;
        }
      }
    }
  }

  wg_sum_n(acc);
  if (tid < NR * NC) {
    const uint r = tid / NC, c = tid % NC;
    if (c < nc && r0 + r < pc.M) {
      float v = acc[tid];
      if ((pc.flags & 1u) != 0) v += bias[pc.b_off + r0 + r];
      y[pc.y_off + (c0 + c) * pc.y_ld + r0 + r] = v;
    }
  }
}
#endif
