// VulkanBackend's other ops: get_rows, rms_norm (with the Q8 copy of one
// token's row), quant_q8, RoPE (alone, q and k together, or storing k and v
// into the KV cache too), and the element-wise ops.
#include <algorithm>
#include <cmath>

#include "cpu/ref/ops_ref.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

constexpr uint32_t kWgElt = 256;
constexpr uint32_t kNormVec4PerThread = 4;   // VPT in rms_norm.comp
constexpr uint32_t kQuantVec4PerThread = 8;  // VPT of quant_q8 (shaders/variants.txt)

}  // namespace

// ---- ops ----------------------------------------------------------------------

bool VulkanBackend::positions_in_range(const int32_t* pos, int64_t n, int64_t n_ctx,
                                       const char* op) {
  // A position past the cache would make the shader write outside its layer.
  for (int64_t t = 0; t < n; ++t) {
    if (pos[t] < 0 || pos[t] >= n_ctx) {
      fail(make_error(ErrorCode::kOutOfRange,
                      "Vulkan %s: position %d is outside the KV cache (0..%lld)", op, pos[t],
                      static_cast<long long>(n_ctx - 1)));
      return false;
    }
  }
  return true;
}

void VulkanBackend::get_rows(const Weight& w, const int32_t* ids, Act out) {
  if (!status_.ok() || !check_act(out, "get_rows")) return;
  const Resident* r = find_weight(w.data);
  if (!r)
    return fail(make_error(ErrorCode::kInternal, "Vulkan get_rows: tensor '%s' is not on the GPU",
                           w.name().c_str()));
  auto io = put_ints(ids, out.rows);
  if (!io.ok()) return fail(io.status());
  // Embeddings are whole tensors: ids index the tensor's rows.
  struct {
    uint32_t w_off, w_off2, row_units, K, n_rows, ids_off, o_off, o_ld;
  } pc{u32(r->alloc.offset / 4),
       u32((r->alloc.offset + r->off2) / 4),
       r->row_units,
       u32(w.n_in),
       u32(r->n_rows),
       *io,
       u32(out.offset / 4),
       u32(out.cols)};
  const Bind wb{r->alloc.block, r->alloc.offset, r->alloc.size, false};
  const Bind ib{ring_.block, 0, 0, false};
  dispatch(typed("get_rows", r->dtype, false, true), Spec{kWgSmall}, {wb, ib, act_bind(out, true)},
           &pc, sizeof(pc), (r->row_units + kWgSmall - 1) / kWgSmall, u32(out.rows), 1);
}

namespace {
// Push constants of rms_norm.comp (rms_norm, rms_norm_q8, quant_q8).
struct NormPush {
  uint32_t x_off, x_ld, w_off, o_off, o_ld, n, rows;
  float eps;
  uint32_t vec4_ok, xq_off, xd_off;
};
}  // namespace

void VulkanBackend::quantize_q8(Act x) {
  // One row, 16-byte aligned, all of it in registers (VPT of quant_q8).
  const uint32_t wg = norm_wg_;
  if (!status_.ok() || x.rows != 1 || x.cols % 32 || x.offset % 16 ||
      static_cast<uint64_t>(x.cols) > uint64_t{4} * kQuantVec4PerThread * wg || wg % 8 ||
      !check_act(x, "quantize_q8"))
    return;
  const uint32_t n = u32(x.cols);
  Xq8 copy;
  auto qb = xq8_out(x, &copy);
  if (!qb.ok()) return fail(qb.status());
  NormPush pc{u32(x.offset / 4), n, 0, 0, n, n, 1, 0.0f, 1, copy.xq_off, copy.xd_off};
  const Bind none{static_cast<Block*>(x.buffer), 0, 0, false};
  dispatch(plain("quant_q8", true), Spec{wg}, {act_bind(x, false), none, none, *qb}, &pc,
           sizeof(pc), 1, 1, 1);
  if (status_.ok()) xq8_ = copy;
}

void VulkanBackend::rms_norm(Act x, const Weight& w, float eps, Act out) {
  if (!status_.ok() || !check_act(x, "rms_norm") || !check_act(out, "rms_norm")) return;
  const Resident* r = find_weight(w.data);
  if (!r)
    return fail(make_error(ErrorCode::kInternal, "Vulkan rms_norm: tensor '%s' is not on the GPU",
                           w.name().c_str()));
  const uint64_t w_off = r->device_offset(w.data);
  NormPush pc{u32(x.offset / 4),
              u32(x.cols),
              u32(w_off / 4),
              u32(out.offset / 4),
              u32(out.cols),
              u32(x.cols),
              u32(x.rows),
              eps,
              0,
              0,
              0};
  pc.vec4_ok = (pc.x_off | pc.x_ld | pc.w_off | pc.o_off | pc.o_ld | pc.n) % 4 == 0 ? 1 : 0;
  uint32_t gx, gz;
  grid_1d(static_cast<uint64_t>(x.rows), &gx, &gz);
  const Bind wb{r->alloc.block, r->alloc.offset, r->alloc.size, false};
  // Narrower workgroups for short rows: at least a vec4 per thread.
  uint32_t wg = norm_wg_;
  while (wg > reduce_wg_ && wg / 2 * 4 >= pc.n) wg /= 2;
  // One token's row, all in registers: also its Q8 copy for the integer-dot
  // matvecs that read it next (rms_norm_q8; see xq8_).
  const vk::DeviceCaps& c = dev_->caps();
  if (c.int_dot && int_dot_ && x.rows == 1 && pc.vec4_ok && pc.n % 32 == 0 &&
      pc.n <= 4 * kNormVec4PerThread * wg && wg % 8 == 0) {
    Xq8 copy;
    auto qb = xq8_out(out, &copy);
    if (!qb.ok()) return fail(qb.status());
    pc.xq_off = copy.xq_off;
    pc.xd_off = copy.xd_off;
    dispatch(plain("rms_norm_q8", true), Spec{wg},
             {act_bind(x, false), wb, act_bind(out, true), *qb}, &pc, sizeof(pc), gx, 1, gz);
    if (status_.ok()) xq8_ = copy;
    return;
  }
  dispatch(plain("rms_norm", true), Spec{wg}, {act_bind(x, false), wb, act_bind(out, true)}, &pc,
           sizeof(pc), gx, 1, gz);
}

void VulkanBackend::rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                         const cpu::RopeParams& p) {
  rope_impl(x, n_heads, x, 0, head_dim, pos, p);
}

void VulkanBackend::rope_qk(Act q, Act k, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                            const int32_t* pos, const cpu::RopeParams& p) {
  rope_impl(q, n_heads, k, n_kv_heads, head_dim, pos, p);
}

void VulkanBackend::rope_qk_kv(Act q, Act k, Act v, KvCache& kv, int64_t layer, int64_t n_heads,
                               int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                               const cpu::RopeParams& p) {
  // One dispatch (rope_kv) for an F16 cache with K and V in one block, normal
  // ordering over the whole head; rope_qk then kv_store otherwise.
  auto* s = dynamic_cast<VkKvStorage*>(kv.storage());
  const bool fused =
      status_.ok() && s && s->owner_ == this && s->layer_resident(layer) &&
      s->layer_slots(layer) == 0 && s->cfg_.dtype == DType::kF16 && !p.neox &&
      p.n_rot == head_dim && s->cfg_.head_dim == head_dim && s->cfg_.n_kv_heads == n_kv_heads &&
      k.rows == q.rows && v.rows == q.rows &&
      s->k_[static_cast<size_t>(layer)].block == s->v_[static_cast<size_t>(layer)].block &&
      check_act(v, "rope_qk_kv");
  if (!fused) return Backend::rope_qk_kv(q, k, v, kv, layer, n_heads, n_kv_heads, head_dim, pos, p);
  if (!positions_in_range(pos, k.rows, s->cfg_.n_ctx, "kv_store")) return;
  const RopeKv rk{v, &s->k_[static_cast<size_t>(layer)], &s->v_[static_cast<size_t>(layer)],
                  u32(s->cfg_.n_ctx)};
  rope_impl(q, n_heads, k, n_kv_heads, head_dim, pos, p, &rk);
}

Status VulkanBackend::put_rope_inputs(const int32_t* pos, int64_t n, const cpu::RopeParams& p,
                                      uint32_t* pos_off, uint32_t* ff_off) {
  auto po = put_ints(pos, n);
  LOOM_TRY(po.status());
  *ff_off = 0xFFFFFFFFu;
  if (p.freq_factors) {
    const uint64_t bytes = static_cast<uint64_t>(p.n_rot / 2) * 4;
    LOOM_TRY(ring_reserve(bytes));
    if (!ints_memo_valid_) {  // the flush dropped the positions: put them again
      po = put_ints(pos, n);
      LOOM_TRY(po.status());
      LOOM_TRY(ring_reserve(bytes));
    }
    *ff_off = u32(ring_put(p.freq_factors, bytes) / 4);
  }
  *pos_off = *po;
  return {};
}

void VulkanBackend::rope_impl(Act x, int64_t n_heads, Act x2, int64_t n_heads2, int64_t head_dim,
                              const int32_t* pos, const cpu::RopeParams& p, const RopeKv* kv) {
  if (!status_.ok() || !check_act(x, "rope") || (n_heads2 && !check_act(x2, "rope"))) return;
  if (n_heads2 && x2.rows != x.rows)
    return fail(make_error(ErrorCode::kInternal, "Vulkan rope: q and k differ in rows"));
  uint32_t pos_off = 0, ff_off = 0;
  Status rs = put_rope_inputs(pos, x.rows, p, &pos_off, &ff_off);
  if (!rs.ok()) return fail(rs);
  float corr[2];
  ref::rope_yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
  struct {
    uint32_t x_off, x_ld, n_heads, head_dim, n_rot, neox, pos_off, ff_off;
    float theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1;
    uint32_t x2_off, x2_ld, n_heads2;
    uint32_t v_off = 0, v_ld = 0, kc_off = 0, vc_off = 0, n_ctx = 0;
  } pc{u32(x.offset / 4), u32(x.cols),  u32(n_heads),
       u32(head_dim),     u32(p.n_rot), p.neox ? 1u : 0u,
       pos_off,           ff_off,       std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot)),
       p.freq_scale,      p.ext_factor, p.attn_factor,
       corr[0],           corr[1],      u32(x2.offset / 4),
       u32(x2.cols),      u32(n_heads2)};
  const Bind rb{ring_.block, 0, 0, false};
  const uint64_t pairs = static_cast<uint64_t>((n_heads + n_heads2) * (p.n_rot / 2));
  // Without a second tensor, binding 3 repeats x's buffer with no range (no hazard).
  const Bind b2 = n_heads2 ? act_bind(x2, true) : Bind{static_cast<Block*>(x.buffer), 0, 0, false};
  if (kv) {
    pc.v_off = u32(kv->v.offset / 4);
    pc.v_ld = u32(kv->v.cols);
    pc.kc_off = u32(kv->k_cache->offset / 4);
    pc.vc_off = u32(kv->v_cache->offset / 4);
    pc.n_ctx = kv->n_ctx;
    const vk::Alloc &ka = *kv->k_cache, &va = *kv->v_cache;
    const uint64_t lo = std::min(ka.offset, va.offset),
                   hi = std::max(ka.offset + ka.size, va.offset + va.size);
    const uint64_t all = pairs + static_cast<uint64_t>(n_heads2 * (p.n_rot / 2));  // + v's pairs
    dispatch(
        plain("rope_kv"), Spec{kWgSmall},
        {act_bind(x, true), rb, rb, b2, act_bind(kv->v, false), Bind{ka.block, lo, hi - lo, true}},
        &pc, sizeof(pc), u32((all + kWgSmall - 1) / kWgSmall), u32(x.rows), 1);
    return;
  }
  dispatch(plain("rope"), Spec{kWgSmall}, {act_bind(x, true), rb, rb, b2}, &pc, sizeof(pc),
           u32((pairs + kWgSmall - 1) / kWgSmall), u32(x.rows), 1);
}

namespace {
struct EltPush {
  uint32_t a_off, a_ld, b_off, b_ld, o_off, o_ld, n, v4;
};
}  // namespace

// Element-wise ops: one vec4 per thread where alignment allows.
void VulkanBackend::eltwise(const char* op, Act a, Act b, Act out) {
  EltPush pc{u32(a.offset / 4),   u32(a.cols),   u32(b.offset / 4), u32(b.cols),
             u32(out.offset / 4), u32(out.cols), u32(a.cols),       0};
  pc.v4 = (pc.a_off | pc.a_ld | pc.b_off | pc.b_ld | pc.o_off | pc.o_ld | pc.n) % 4 == 0 ? 1 : 0;
  const uint64_t items = pc.v4 ? pc.n / 4 : pc.n;
  uint32_t gx, gz;
  grid_1d((items + kWgElt - 1) / kWgElt, &gx, &gz);
  dispatch(plain(op), Spec{kWgElt}, {act_bind(a, false), act_bind(b, false), act_bind(out, true)},
           &pc, sizeof(pc), gx, u32(a.rows), gz);
}

void VulkanBackend::silu_mul(Act gate, Act up, Act out) {
  if (!status_.ok() || !check_act(gate, "silu_mul") || !check_act(up, "silu_mul") ||
      !check_act(out, "silu_mul"))
    return;
  eltwise("silu_mul", gate, up, out);
}

void VulkanBackend::gelu_mul(Act gate, Act up, Act out) {
  if (!status_.ok() || !check_act(gate, "gelu_mul") || !check_act(up, "gelu_mul") ||
      !check_act(out, "gelu_mul"))
    return;
  eltwise("gelu_mul", gate, up, out);
}

void VulkanBackend::add(Act a, Act b, Act out) {
  if (!status_.ok() || !check_act(a, "add") || !check_act(b, "add") || !check_act(out, "add"))
    return;
  eltwise("add", a, b, out);
}

void VulkanBackend::copy(Act src, Act dst) {
  if (!status_.ok() || !check_act(src, "copy") || !check_act(dst, "copy")) return;
  eltwise("copy", src, src, dst);
}

}  // namespace loom
