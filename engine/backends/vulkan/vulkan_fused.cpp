// VulkanBackend's decode fusions of matvecs: gate and up in one matvec that
// writes silu(g)*u (and its Q8 copy), q, k and v in one matvec, and that
// matvec rotating q and k and storing k and v into the F16 KV cache.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "cpu/ref/ops_ref.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

// matvec1_qkv_rope: MatvecPush up to y_off_c (N, y_ld, b_off and row0_b
// holding head_dim, n_ctx and the K and V caches' word offsets), then these.
struct MatvecRopePush {
  uint32_t w_off, w_off2, row0, row_units, K, M, head_dim, x_off, x_ld, y_off, n_ctx, kc_off, flags;
  uint32_t w_off_b, w_off2_b, vc_off;
  uint32_t w_off_c, w_off2_c, m_a, m_b, y_off_b, y_off_c;
  int32_t pos;
  uint32_t ff_off;
  float theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1;
  uint32_t xq_off = 0, xd_off = 0;
};
static_assert(sizeof(MatvecRopePush) <= kPushBytes);
static_assert(offsetof(MatvecRopePush, xq_off) == offsetof(MatvecPush, xq_off));
static_assert(offsetof(MatvecRopePush, y_off_c) == offsetof(MatvecPush, y_off_c));

}  // namespace

void VulkanBackend::matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) {
  const Resident* rg = whole_tensor(gate);
  const Resident* ru = whole_tensor(up);
  // One dispatch when both are whole tensors of one type in one memory block.
  const bool fused = status_.ok() && x.rows == 1 && dev_->caps().subgroup_arithmetic && rg && ru &&
                     rg->alloc.block == ru->alloc.block && rg->dtype == ru->dtype &&
                     rg->row_units == ru->row_units && gate.n_out == up.n_out &&
                     gate.n_in == up.n_in && check_act(x, "matmul_glu") &&
                     check_act(out, "matmul_glu");
  if (!fused) return Backend::matmul_glu(gate, up, x, out, tmp);
  const uint32_t M = 2 * u32(gate.n_out);  // interleaved gate and up rows
  const uint32_t x_off = u32(x.offset / 4), x_ld = u32(x.cols);
  MatvecPush pc{u32(rg->alloc.offset / 4),
                u32((rg->alloc.offset + rg->off2) / 4),
                0,
                rg->row_units,
                u32(gate.n_in),
                M,
                1,
                x_off,
                x_ld,
                u32(out.offset / 4),
                u32(out.cols),
                0,
                (x_off % 4 == 0 && x_ld % 4 == 0) ? 2u : 0u,
                u32(ru->alloc.offset / 4),
                u32((ru->alloc.offset + ru->off2) / 4),
                0};
  // Room for out's Q8 copy first: making room drops the copies there are.
  if (int_dot_outputs_ && xq8_.buffer) {
    Status st = ensure_xq8(static_cast<uint64_t>(std::max(gate.n_in, gate.n_out)));
    if (!st.ok()) return fail(st);
  }
  const Xq8* xq = xq8_for(x, gate.n_in, rg->dtype);  // integer dots on x's Q8 copy
  MatvecShape s = matvec1_shape(M, rg->row_units, rg->dtype, xq != nullptr);
  s.nr = std::max<uint32_t>(2, s.nr & ~1u);  // whole (gate, up) pairs per row group
  uint32_t gx, gz;
  matvec1_grid(s, M, &gx, &gz);
  const Bind wg{rg->alloc.block, rg->alloc.offset, rg->alloc.size, false};
  // Binding 4 (not read by the shader) puts the up tensor's range in the hazard tracking.
  const Bind wu{ru->alloc.block, ru->alloc.offset, ru->alloc.size, false};
  if (profile_) prof_shape_ = shape_tag(M, gate.n_in);
  // With integer dots on x's Q8 copy, and where each workgroup's outputs lie
  // in one 32-element block, also out's Q8 copy (matvec1x_glu_q8) for down.
  const uint32_t per_group = s.wg / s.tpr * s.nr / 2;
  const uint32_t n_blocks = u32(gate.n_out / 32);
  if (xq) {
    pc.xq_off = xq->xq_off;
    pc.xd_off = xq->xd_off;
    if (int_dot_outputs_ && gate.n_out % 32 == 0 && out.offset % 16 == 0 && 32 % per_group == 0 &&
        s.wg % 8 == 0 && n_blocks <= kCounters) {
      Xq8 copy;
      auto qo = xq8_out(out, &copy);
      if (!qo.ok()) return fail(qo.status());
      auto cnt = counters(n_blocks);
      if (!cnt.ok()) return fail(cnt.status());
      pc.cnt_off = u32(cnt->offset / 4);
      pc.qo_off = copy.xq_off;
      pc.qdo_off = copy.xd_off;
      dispatch(typed("matvec1x_glu_q8", rg->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
               {wg, act_bind(x, false), act_bind(out, true), wg, wu, *qo, xq8_bind(), *cnt}, &pc,
               sizeof(pc), gx, 1, gz);
      if (status_.ok()) xq8_ = copy;
      return;
    }
    dispatch(typed("matvec1x_glu", rg->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wg, act_bind(x, false), act_bind(out, true), wg, wu,
              Bind{rg->alloc.block, 0, 0, false}, xq8_bind()},
             &pc, sizeof(pc), gx, 1, gz);
    return;
  }
  dispatch(typed("matvec1_glu", rg->dtype, true, true), Spec{s.wg, s.nr, s.tpr, s.unroll},
           {wg, act_bind(x, false), act_bind(out, true), wg, wu}, &pc, sizeof(pc), gx, 1, gz);
}

void VulkanBackend::matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv,
                               const Weight& bq, const Weight& bk, const Weight& bv, Act x, Act q,
                               Act k, Act v) {
  (void)qkv_impl(wq, wk, wv, bq, bk, bv, x, q, k, v, nullptr);
}

void VulkanBackend::matmul_qkv_rope_kv(const Weight& wq, const Weight& wk, const Weight& wv,
                                       const Weight& bq, const Weight& bk, const Weight& bv, Act x,
                                       Act q, Act k, Act v, KvCache& kv, int64_t layer,
                                       int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                       const int32_t* pos, const cpu::RopeParams& p) {
  // One dispatch (matvec1_qkv_rope) where rope_kv's conditions hold (an F16
  // cache with K and V in one block, normal ordering over whole heads) and q,
  // k and v fuse into one matvec; otherwise matmul_qkv, then rope_qk_kv.
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  const bool ok =
      status_.ok() && x.rows == 1 && qkv_rope_ && s && s->owner_ == this &&
      s->layer_resident(layer) && s->layer_slots(layer) == 0 && s->cfg_.dtype == DType::kF16 &&
      !p.neox && p.n_rot == head_dim && head_dim % 2 == 0 && s->cfg_.head_dim == head_dim &&
      s->cfg_.n_kv_heads == n_kv_heads && wq.n_out == n_heads * head_dim &&
      wk.n_out == n_kv_heads * head_dim && wv.n_out == n_kv_heads * head_dim &&
      s->k_[static_cast<size_t>(layer)].block == s->v_[static_cast<size_t>(layer)].block;
  if (ok) {
    if (!positions_in_range(pos, 1, s->cfg_.n_ctx, "kv_store")) return;
    const RopeKv rk{v, &s->k_[static_cast<size_t>(layer)], &s->v_[static_cast<size_t>(layer)],
                    u32(s->cfg_.n_ctx)};
    const QkvRope r{&rk, pos, &p, u32(head_dim)};
    if (qkv_impl(wq, wk, wv, bq, bk, bv, x, q, k, v, &r)) return;
  }
  Backend::matmul_qkv_rope_kv(wq, wk, wv, bq, bk, bv, x, q, k, v, kv, layer, n_heads, n_kv_heads,
                              head_dim, pos, p);
}

bool VulkanBackend::qkv_impl(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                             const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v,
                             const QkvRope* rope) {
  // One dispatch for q and k, and v with them, when they are whole tensors of
  // one type in one memory block without a bias, writing into one block.
  const Resident* rq = whole_tensor(wq);
  auto joins = [&](const Weight& w, const Weight& b, const Act& out) -> const Resident* {
    const Resident* r = whole_tensor(w);
    return r && rq && !b.present() && r->alloc.block == rq->alloc.block && r->dtype == rq->dtype &&
                   r->row_units == rq->row_units && out.buffer == q.buffer && out.rows == 1 &&
                   out.offset % 4 == 0
               ? r
               : nullptr;
  };
  const Resident* rk = joins(wk, bk, k);
  const Resident* rv = joins(wv, bv, v);
  const bool fused = status_.ok() && x.rows == 1 && dev_->caps().subgroup_arithmetic && rq && rk &&
                     !bq.present() && (rv || !rope) && check_act(x, "matmul_qkv") &&
                     check_act(q, "matmul_qkv");
  if (!fused) {
    if (rope) return false;  // the caller runs the ops apart
    Backend::matmul_qkv(wq, wk, wv, bq, bk, bv, x, q, k, v);
    return true;
  }
  const uint32_t mq = u32(wq.n_out), mk = u32(wk.n_out), M = mq + mk + (rv ? u32(wv.n_out) : 0);
  const uint32_t x_off = u32(x.offset / 4), x_ld = u32(x.cols);
  auto w_off = [](const Resident* r) { return u32(r->alloc.offset / 4); };
  auto w_off2 = [](const Resident* r) { return u32((r->alloc.offset + r->off2) / 4); };
  MatvecPush pc{w_off(rq),
                w_off2(rq),
                0,
                rq->row_units,
                u32(wq.n_in),
                M,
                1,
                x_off,
                x_ld,
                u32(q.offset / 4),
                u32(q.cols),
                0,
                (x_off % 4 == 0 && x_ld % 4 == 0) ? 2u : 0u};
  pc.w_off_b = w_off(rk);
  pc.w_off2_b = w_off2(rk);
  pc.w_off_c = rv ? w_off(rv) : 0;
  pc.w_off2_c = rv ? w_off2(rv) : 0;
  pc.m_a = mq;
  pc.m_b = mk;
  pc.y_off_b = u32(k.offset / 4);
  pc.y_off_c = u32(v.offset / 4);
  const Xq8* xq = xq8_for(x, wq.n_in, rq->dtype);  // integer dots on x's Q8 copy
  MatvecShape s = matvec1_shape(M, rq->row_units, rq->dtype, xq != nullptr);
  if (rope) s.nr = std::max<uint32_t>(2, s.nr & ~1u);  // whole rotated pairs per row group
  uint32_t gx, gz;
  matvec1_grid(s, M, &gx, &gz);
  // The hazard ranges span the fused matrices and outputs (each in one block).
  uint64_t wlo = UINT64_MAX, whi = 0, ylo = UINT64_MAX, yhi = 0;
  for (const Resident* r : {rq, rk, rv}) {
    if (r)
      wlo = std::min(wlo, r->alloc.offset), whi = std::max(whi, r->alloc.offset + r->alloc.size);
  }
  for (const Act* a : {&q, &k, rv ? &v : &q}) {
    ylo = std::min(ylo, a->offset);
    yhi = std::max(yhi, a->offset + static_cast<uint64_t>(a->rows * a->cols) * 4);
  }
  const Bind wb{rq->alloc.block, wlo, whi - wlo, false};
  const Bind ob{static_cast<Block*>(q.buffer), ylo, yhi - ylo, true};
  if (profile_) prof_shape_ = shape_tag(M, wq.n_in);
  if (rope) {
    const cpu::RopeParams& p = *rope->p;
    const vk::Alloc &ka = *rope->kv->k_cache, &va = *rope->kv->v_cache;
    MatvecRopePush rp{pc.w_off,
                      pc.w_off2,
                      0,
                      pc.row_units,
                      pc.K,
                      pc.M,
                      rope->head_dim,
                      pc.x_off,
                      pc.x_ld,
                      pc.y_off,
                      rope->kv->n_ctx,
                      u32(ka.offset / 4),
                      pc.flags,
                      pc.w_off_b,
                      pc.w_off2_b,
                      u32(va.offset / 4),
                      pc.w_off_c,
                      pc.w_off2_c,
                      pc.m_a,
                      pc.m_b,
                      pc.y_off_b,
                      pc.y_off_c,
                      rope->pos[0],
                      0xFFFFFFFFu,
                      std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot)),
                      p.freq_scale,
                      p.ext_factor,
                      p.attn_factor,
                      0,
                      0};
    float corr[2];
    ref::rope_yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
    rp.corr0 = corr[0];
    rp.corr1 = corr[1];
    // Frequency factors: the resident tensor (rope_freqs), or a copy in the ring.
    Bind fb{ring_.block, 0, 0, false};
    if (p.freq_factors) {
      if (const Resident* rf = find_weight(p.freq_factors); rf && rf->dtype == DType::kF32) {
        fb = Bind{rf->alloc.block, rf->alloc.offset, rf->alloc.size, false};
        rp.ff_off = u32(rf->device_offset(p.freq_factors) / 4);
      } else {
        const uint64_t bytes = static_cast<uint64_t>(p.n_rot / 2) * 4;
        Status st = ring_reserve(bytes);
        if (!st.ok()) {
          fail(st);
          return true;
        }
        rp.ff_off = u32(ring_put(p.freq_factors, bytes) / 4);
      }
    }
    const uint64_t lo = std::min(ka.offset, va.offset),
                   hi = std::max(ka.offset + ka.size, va.offset + va.size);
    const Bind cb{ka.block, lo, hi - lo, true};
    if (xq) {
      rp.xq_off = xq->xq_off;
      rp.xd_off = xq->xd_off;
      dispatch(typed("matvec1x_qkv_rope", rq->dtype, true, false),
               Spec{s.wg, s.nr, s.tpr, s.unroll},
               {wb, act_bind(x, false), ob, wb, fb, cb, xq8_bind()}, &rp, sizeof(rp), gx, 1, gz);
      return true;
    }
    dispatch(typed("matvec1_qkv_rope", rq->dtype, true, true), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wb, act_bind(x, false), ob, wb, fb, cb}, &rp, sizeof(rp), gx, 1, gz);
    return true;
  }
  if (xq) {
    pc.xq_off = xq->xq_off;
    pc.xd_off = xq->xd_off;
    const Bind none{rq->alloc.block, 0, 0, false};
    dispatch(typed("matvec1x_qkv", rq->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wb, act_bind(x, false), ob, wb, none, none, xq8_bind()}, &pc, sizeof(pc), gx, 1, gz);
  } else {
    dispatch(typed("matvec1_qkv", rq->dtype, true, true), Spec{s.wg, s.nr, s.tpr, s.unroll},
             {wb, act_bind(x, false), ob, wb}, &pc, sizeof(pc), gx, 1, gz);
  }
  if (!rv) matmul(wv, x, v, bv.present() ? &bv : nullptr);
  return true;
}

}  // namespace loom
