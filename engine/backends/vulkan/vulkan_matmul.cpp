// VulkanBackend's matrix products: single-token matvecs (launch shape from
// the matrix, integer dots on a Q8 copy of the input where there is one),
// few-token matvecs, and prefill matmuls on cooperative matrices or the
// tiled kernel; and the Q8 copies of activations the integer-dot matvecs read.
#include <algorithm>
#include <string_view>

#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

// Workgroup sizes (specialization constant 0) and rows per matvec workgroup.
constexpr uint32_t kWgMatvec = 64;
constexpr uint32_t kMatvecRows = 2;
constexpr uint32_t kMatvecCols = 8;  // NC of the "matvec" variants; up to this many tokens use them
// Single-token matvecs (matvec1_*_sg): rows per row group up to NR_MAX, unit
// parts per thread and step for 4 parts per unit (UNROLL in mul_mat_vec.comp;
// a part is a quarter of a 32-element unit, half for K-quants), and the
// workgroup count that fills a large GPU (H200: 132 SMs, 16 workgroups each).
constexpr uint32_t kMatvecUnroll = 4;
constexpr uint32_t kMatvecUnrollMax = 8;  // UNROLL_MAX in mul_mat_vec.comp
// Parts per 32-element unit (PPU in dequant.glsl): K-quants 2, the rest 4.
constexpr uint32_t kMatvecPartsMax = 4;
uint32_t matvec_parts(DType t) {
  return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ? 2 : kMatvecPartsMax;
}
constexpr uint32_t kManyGroups = 2048;
constexpr uint32_t kWgCast = 256;    // to_f16.comp
constexpr uint32_t kWgMatmul = 256;  // mul_mat.comp's tile needs exactly 256
// BM and BN of mul_mat.comp's "matmul" ("matmul_n64": half the BN).
constexpr uint32_t kMatmulTileM = 128;
constexpr uint32_t kMatmulTileN = 128;
constexpr uint32_t kMatmulWideShared = 32768;  // the 128-column tiles' shared memory
// mul_mat_cm.comp (cooperative matrices): BM rows x BN tokens per workgroup
// of SGM x SGN subgroups, in double-buffered F16 tiles (2 (BM + BN) 40
// halves), reading x from its F16 copy (to_f16.comp). The variants of
// shaders/variants.txt; set_matmul_coopmat / set_matmul_cm_tile pick one.
// H200, loom_vulkan_gemm_bench on 8B shapes at 512 and 2048 tokens
// (docs/PERFORMANCE.md): 128 x 128 in eight subgroups was the fastest of 128
// x 128 in four or sixteen, 128 x 64, 64 x 128 and 64 x 64 (also with 64-wide
// k steps), by 0-40%. Loading two steps ahead (PREFETCH2) bought 7-15% for
// 128 x 64 and nothing for 128 x 128, so only matmul_cm_n64 does. On an
// H100 the 128 x 128 tile held 181 registers a thread (one workgroup an SM);
// issuing a step's loads after its products instead of before
// (matmul_cm_np, NO_PREFETCH: 160-170) made it 2-15% faster in the gemm
// bench and the whole prefill 3-4%, so the default takes it.
// A "pre" tile runs its shader's F16 variant on an F16 copy of a quantized
// matrix (dequant_f16.comp, made before the matmul).
struct CmTile {
  const char* name;
  uint32_t bm, bn, sgm, sgn;
  const char* shader = nullptr;  ///< pre tiles: the variant they run
  uint32_t threads() const { return 32 * sgm * sgn; }
  uint32_t shared_bytes() const { return 2 * (bm + bn) * 40 * 2; }
};
constexpr CmTile kCmTiles[] = {
    {"matmul_cm", 128, 128, 2, 4},
    {"matmul_cm_n64", 128, 64, 2, 4},
    {"matmul_cm_pre", 128, 128, 2, 4, "matmul_cm"},
    {"matmul_cm_n64_pre", 128, 64, 2, 4, "matmul_cm_n64"},
    {"matmul_cm_np", 128, 128, 2, 4},  // loads after the products (NO_PREFETCH)
};
constexpr const CmTile& kCmWide = kCmTiles[0];
constexpr const CmTile& kCmNarrow = kCmTiles[1];  // also where shared memory is short
constexpr const CmTile& kCmWideNp = kCmTiles[4];  // variant 3's wide tile
// Benchmarks only (wrong results; Q4_K and F16): matmul_cm without its
// loads, or without its products (PROBE_* in mul_mat_cm.comp).
constexpr CmTile kCmProbes[] = {
    {"matmul_cm_probe_noload", 128, 128, 2, 4},
    {"matmul_cm_probe_nomma", 128, 128, 2, 4},
};
const CmTile* cm_tile(std::string_view name) {
  for (const CmTile& t : kCmTiles) {
    if (name == t.name) return &t;
  }
  for (const CmTile& t : kCmProbes) {
    if (name == t.name) return &t;
  }
  return nullptr;
}
// Variant 2 (eight subgroups by the shape): matrices whose 128 x 128 grid
// has fewer workgroups than this take 128 x 64 tiles (k and v at 512 tokens:
// 32 workgroups for the H200's 132 SMs).
constexpr uint32_t kMatmulCmNarrowBelow = 66;
// The default variant (set_matmul_coopmat): 3. H200, pp512 in one run
// (Q4_0 / Q4_K_M t/s): four subgroups 3545.6 / 3462.8, eight with 128
// tokens always 4484.9 / 4108.4, eight by the shape 4509.0 / 4146.2. H100
// (KHR cooperative matrices, 2026-12-07), two interleaved passes: 2 5907.7 /
// 6084.3 and 6506.2 / 6091.7, 3 (matmul_cm_np for 128 x 128: 170 registers
// a thread against 181) 6756.0 / 6292.6 and 6766.5 / 6259.5.
constexpr uint32_t kMatmulCmDefault = 3;

}  // namespace

std::vector<std::string> VulkanBackend::matmul_cm_tiles() {
  std::vector<std::string> names;
  for (const CmTile& t : kCmTiles) names.emplace_back(t.name);
  return names;
}

Status VulkanBackend::grow_scratch(Alloc* buf, uint64_t bytes, const char* what) {
  LOOM_TRY(flush());  // the old contents may be in use by recorded work
  device_pool_->free(*buf);
  *buf = Alloc{};
  LOOM_ASSIGN_OR_RETURN(*buf, device_pool_->alloc(bytes, what));
  return {};
}

Result<VulkanBackend::Bind> VulkanBackend::xf16_for(const Act& x, uint32_t units) {
  const uint64_t bytes = static_cast<uint64_t>(x.rows) * units * 64;
  if (xf16_.buffer == x.buffer && xf16_.offset == x.offset && xf16_.rows == x.rows &&
      xf16_.cols == x.cols && xf16_.units == units)
    return Bind{xf16_buf_.block, xf16_buf_.offset, bytes, false};
  if (xf16_buf_.size < bytes) {
    xf16_ = Xf16{};
    LOOM_TRY(grow_scratch(&xf16_buf_, std::max<uint64_t>(bytes, 1 << 20), "F16 activations"));
  }
  struct {
    uint32_t a_off, a_ld, n, o_off, o_ld, v4;
  } pc{u32(x.offset / 4), u32(x.cols), u32(x.cols), u32(xf16_buf_.offset / 16), units * 4, 0};
  pc.v4 = (pc.a_off | pc.a_ld) % 4 == 0 ? 1 : 0;
  uint32_t gx, gz;
  grid_1d((pc.o_ld + kWgCast - 1) / kWgCast, &gx, &gz);
  dispatch(plain("to_f16"), Spec{kWgCast},
           {act_bind(x, false), Bind{xf16_buf_.block, xf16_buf_.offset, bytes, true}}, &pc,
           sizeof(pc), gx, u32(x.rows), gz);
  xf16_ = Xf16{x.buffer, x.offset, x.rows, x.cols, units};
  return Bind{xf16_buf_.block, xf16_buf_.offset, bytes, false};
}

Result<VulkanBackend::Bind> VulkanBackend::wf16_for(const Resident& r, uint64_t row0,
                                                    uint32_t rows) {
  const uint64_t bytes = uint64_t{rows} * r.row_units * 64;
  if (wf16_.block == r.alloc.block && wf16_.offset == r.alloc.offset &&
      wf16_.fingerprint == r.fingerprint && wf16_.row0 == row0 && wf16_.rows == rows)
    return Bind{wf16_buf_.block, wf16_buf_.offset, bytes, false};
  if (wf16_buf_.size < bytes) {
    wf16_ = Wf16{};
    LOOM_TRY(grow_scratch(&wf16_buf_, bytes, "F16 weights"));
  }
  struct {
    uint32_t w_off, w_off2, row0, row_units, rows, o_off;
  } pc{u32(r.alloc.offset / 4),   u32((r.alloc.offset + r.off2) / 4), u32(row0), r.row_units, rows,
       u32(wf16_buf_.offset / 16)};
  uint32_t gx, gz;
  grid_1d((uint64_t{rows} * r.row_units + kWgCast - 1) / kWgCast, &gx, &gz);
  dispatch(typed("dequant_f16", r.dtype, false, false), Spec{kWgCast},
           {Bind{r.alloc.block, r.alloc.offset, r.alloc.size, false},
            Bind{wf16_buf_.block, wf16_buf_.offset, bytes, true}},
           &pc, sizeof(pc), gx, 1, gz);
  wf16_ = Wf16{r.alloc.block, r.alloc.offset, r.fingerprint, row0, rows};
  return Bind{wf16_buf_.block, wf16_buf_.offset, bytes, false};
}

Result<std::vector<uint16_t>> VulkanBackend::download_halves(const Bind& b) {
  std::vector<uint16_t> h(b.size / 2);
  Act view;
  view.buffer = b.block;
  view.offset = b.offset;
  view.rows = 1;
  view.cols = static_cast<int64_t>(b.size / 4);
  LOOM_TRY(download(view, reinterpret_cast<float*>(h.data())));
  return h;
}

Result<std::vector<uint16_t>> VulkanBackend::f16_copy(Act x, uint32_t units) {
  if (!check_act(x, "f16_copy")) return status_;
  LOOM_ASSIGN_OR_RETURN(const Bind b, xf16_for(x, units));
  LOOM_TRY(status_);
  return download_halves(b);
}

Result<std::vector<uint16_t>> VulkanBackend::f16_weight_copy(const Weight& w, uint64_t row0,
                                                             uint32_t rows) {
  LOOM_TRY(status_);
  const Resident* r = find_weight(w.data);
  if (!r || r->dtype == DType::kF32 || r->dtype == DType::kF16 ||
      row0 + rows > static_cast<uint64_t>(r->n_rows))
    return make_error(ErrorCode::kInvalidArgument,
                      "f16_weight_copy: '%s' is not a resident quantized weight with those rows",
                      w.name().c_str());
  LOOM_ASSIGN_OR_RETURN(const Bind b, wf16_for(*r, row0, rows));
  LOOM_TRY(status_);
  return download_halves(b);
}

uint64_t VulkanBackend::q8_bytes(uint64_t n) {
  return n + n / 32 * 8;
}

Status VulkanBackend::ensure_xq8(uint64_t n) {
  const uint64_t bytes = (q8_bytes(n) + 255) & ~uint64_t{255};  // slots 256-byte aligned
  if (xq8_slot_ >= bytes) return {};
  LOOM_TRY(flush());  // the old copies may be in use by recorded work
  device_pool_->free(xq8_buf_);
  xq8_buf_ = Alloc{};
  xq8_ = Xq8{};
  xq8_slot_ = 0;
  const uint64_t slot = std::max<uint64_t>(bytes, 32 << 10);
  LOOM_ASSIGN_OR_RETURN(xq8_buf_, device_pool_->alloc(2 * slot, "Q8 activations"));
  xq8_slot_ = slot;
  return {};
}

Result<VulkanBackend::Bind> VulkanBackend::xq8_out(const Act& row, Xq8* copy) {
  const auto n = static_cast<uint64_t>(row.cols);
  LOOM_TRY(ensure_xq8(n));
  // The slot the current copy is not in (a dispatch may read that one).
  const uint64_t base =
      xq8_buf_.offset + (xq8_.buffer && xq8_.base == xq8_buf_.offset ? xq8_slot_ : 0);
  *copy = Xq8{row.buffer, row.offset, row.cols, u32(base / 4), u32((base + n) / 8), base};
  return Bind{xq8_buf_.block, base, q8_bytes(n), true};
}

bool VulkanBackend::int_dot_type(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ6_K;
}

const VulkanBackend::Xq8* VulkanBackend::xq8_for(const Act& x, int64_t K, DType t) const {
  return xq8_.buffer && int_dot_type(t) && x.rows == 1 && x.buffer == xq8_.buffer &&
                 x.offset == xq8_.offset && K == xq8_.n
             ? &xq8_
             : nullptr;
}

VulkanBackend::Bind VulkanBackend::xq8_bind() {
  ++int_dot_dispatches_;
  return Bind{xq8_buf_.block, xq8_.base, q8_bytes(static_cast<uint64_t>(xq8_.n)), false};
}

VulkanBackend::MatvecShape VulkanBackend::matvec1_shape(uint32_t M, uint32_t row_units, DType dtype,
                                                        bool int_dot) const {
  // Two rows per row group (each x load serves both; measured on the H200,
  // this beats one row with twice the workgroups, and four rows run out of
  // registers), UNROLL parts of 32 elements in all per thread and step (K-quant
  // parts are twice as long as the others), then the row split over more
  // threads while the grid is short of kManyGroups workgroups and each thread
  // still gets one whole step. The K-quants' integer-dot variants take one part
  // per step (on the H200 their matvecs took 10-15% less time than with two).
  // set_matvec_tuning() fixes any of these instead.
  const uint32_t S = std::max<uint32_t>(1, dev_->caps().subgroup_size);
  const uint32_t parts = matvec_parts(dtype);
  MatvecShape s;
  s.wg = mv_tune_.wg ? std::max(mv_tune_.wg, S) : matvec_wg_;
  s.unroll = mv_tune_.unroll         ? std::min(mv_tune_.unroll, kMatvecUnrollMax)
             : int_dot && parts == 2 ? 1
                                     : kMatvecUnroll * parts / kMatvecPartsMax;
  s.nr = matvec_rows_ ? matvec_rows_ : kMatvecRowsMax / 2;
  s.tpr = matvec_tpr_ ? matvec_tpr_ : std::min(S, s.wg);
  const uint32_t many = mv_tune_.groups ? mv_tune_.groups : kManyGroups;
  auto groups = [&] { return (M + s.wg / s.tpr * s.nr - 1) / (s.wg / s.tpr * s.nr); };
  if (!matvec_tpr_) {
    while (groups() < many && s.tpr * 2 <= s.wg && parts * row_units >= 2 * s.tpr * s.unroll)
      s.tpr *= 2;
  }
  return s;
}

void VulkanBackend::matvec1_grid(const MatvecShape& s, uint32_t M, uint32_t* gx,
                                 uint32_t* gz) const {
  const uint32_t rows_per_group = s.wg / s.tpr * s.nr;
  grid_1d((M + rows_per_group - 1) / rows_per_group, gx, gz);
}

void VulkanBackend::matmul(const Weight& w, Act x, Act out, const Weight* bias) {
  matmul_impl(w, x, out, bias, false);
}

void VulkanBackend::matmul_add(const Weight& w, Act x, Act y, Act tmp) {
  if (x.rows == 1 && dev_->caps().subgroup_arithmetic) {
    // Optionally (int_dot_inputs_) a Q8 copy of x first, for the integer-dot matvec.
    if (int_dot_inputs_ && int_dot_ && dev_->caps().int_dot) {
      const Resident* r = find_weight(w.data);
      if (r && int_dot_type(r->dtype) && !xq8_for(x, w.n_in, r->dtype)) quantize_q8(x);
    }
    return matmul_impl(w, x, y, nullptr, true);
  }
  Backend::matmul_add(w, x, y, tmp);
}

void VulkanBackend::matmul_impl(const Weight& w, Act x, Act out, const Weight* bias,
                                bool accumulate) {
  if (!status_.ok() || !check_act(x, "matmul") || !check_act(out, "matmul")) return;
  const Resident* r = find_weight(w.data);
  if (!r)
    return fail(make_error(ErrorCode::kInternal, "Vulkan matmul: tensor '%s' is not on the GPU",
                           w.name().c_str()));
  const auto row0 = static_cast<uint64_t>((static_cast<const uint8_t*>(w.data) - r->begin()) /
                                          static_cast<ptrdiff_t>(r->src_row_bytes));
  const Resident* rb = nullptr;
  uint64_t b_off = 0;
  if (bias && bias->present()) {
    rb = find_weight(bias->data);
    if (!rb)
      return fail(make_error(ErrorCode::kInternal, "Vulkan matmul: bias '%s' is not on the GPU",
                             bias->name().c_str()));
    b_off = rb->device_offset(bias->data) / 4;
  }
  const uint32_t T = u32(x.rows), M = u32(w.n_out);
  const uint32_t x_off = u32(x.offset / 4), x_ld = u32(x.cols);
  MatvecPush pc{u32(r->alloc.offset / 4),
                u32((r->alloc.offset + r->off2) / 4),
                u32(row0),
                r->row_units,
                u32(w.n_in),
                M,
                T,
                x_off,
                x_ld,
                u32(out.offset / 4),
                u32(out.cols),
                u32(b_off),
                0};
  if (rb) pc.flags |= 1;
  if (x_off % 4 == 0 && x_ld % 4 == 0) pc.flags |= 2;
  if (accumulate) pc.flags |= 4;
  const Bind wb{r->alloc.block, r->alloc.offset, r->alloc.size, false};
  const Bind bb = rb ? Bind{rb->alloc.block, rb->alloc.offset, rb->alloc.size, false}
                     : Bind{r->alloc.block, 0, 0, false};
  if (T == 1 && dev_->caps().subgroup_arithmetic) {
    // Decode: row groups of TPR threads own NR rows each (mul_mat_vec.comp).
    const Xq8* xq = probe_loads_ ? nullptr : xq8_for(x, w.n_in, r->dtype);
    const MatvecShape s = matvec1_shape(M, r->row_units, r->dtype, xq != nullptr);
    uint32_t gx, gz;
    matvec1_grid(s, M, &gx, &gz);
    if (profile_) prof_shape_ = shape_tag(M, w.n_in);
    if (xq) {  // integer dots on x's Q8 copy
      pc.xq_off = xq->xq_off;
      pc.xd_off = xq->xd_off;
      const Bind none{r->alloc.block, 0, 0, false};
      dispatch(typed("matvec1x", r->dtype, true, false), Spec{s.wg, s.nr, s.tpr, s.unroll},
               {wb, act_bind(x, false), act_bind(out, true), bb, none, none, xq8_bind()}, &pc,
               sizeof(pc), gx, 1, gz);
      return;
    }
    dispatch(typed(probe_loads_ && r->dtype == DType::kQ4_0 ? "matvec1_probe" : "matvec1", r->dtype,
                   true, true),
             Spec{s.wg, s.nr, s.tpr, s.unroll}, {wb, act_bind(x, false), act_bind(out, true), bb},
             &pc, sizeof(pc), gx, 1, gz);
  } else if (T <= kMatvecCols) {
    // With subgroups a workgroup covers (subgroups per workgroup) x kMatvecRows rows.
    const vk::DeviceCaps& c = dev_->caps();
    const uint32_t nsg =
        c.subgroup_arithmetic ? std::max<uint32_t>(1, kWgMatvec / c.subgroup_size) : 1;
    const uint32_t rows_per_group = nsg * kMatvecRows;
    uint32_t gx, gz;
    grid_1d((M + rows_per_group - 1) / rows_per_group, &gx, &gz);
    dispatch(typed(T == 1 ? "matvec1" : "matvec", r->dtype, true, true),
             Spec{kWgMatvec, kMatvecRows, nsg}, {wb, act_bind(x, false), act_bind(out, true), bb},
             &pc, sizeof(pc), gx, (T + kMatvecCols - 1) / kMatvecCols, gz);
  } else if (coopmat_ && dev_->caps().coopmat && r->dtype != DType::kF32 &&
             dev_->caps().max_shared_bytes >= kCmNarrow.shared_bytes()) {
    // Tensor cores: F16 tiles, F32 sums (F32 weights stay on the exact kernel).
    // 128 x 128 tiles where the shared memory has room, else 128 x 64.
    const CmTile* tile = cm_tile_name_.empty() ? nullptr : cm_tile(cm_tile_name_);
    if (!tile) {
      uint32_t v = coopmat_variant_ ? coopmat_variant_ : kMatmulCmDefault;
      const CmTile* wide = v == 3 ? &kCmWideNp : &kCmWide;
      if (v == 2 || v == 3)
        v = ((M + 127) / 128) * ((T + 127) / 128) < kMatmulCmNarrowBelow ? 64 : 128;
      tile = v == 64 ? &kCmNarrow : wide;
    }
    if (dev_->caps().max_shared_bytes < tile->shared_bytes() ||
        dev_->caps().max_wg_threads < tile->threads()) {
      tile = &kCmNarrow;
    }
    // x's F16 copy: rows of row_units 32-wide units, zeros past n_in.
    const Result<Bind> xh = xf16_for(x, r->row_units);
    if (!xh.ok()) return fail(xh.status());
    pc.x_off = u32(xh->offset / 16);
    pc.x_ld = r->row_units * 4;
    Bind wbind = wb;
    DType wt = r->dtype;
    if (tile->shader && wt != DType::kF16) {
      const Result<Bind> wh = wf16_for(*r, row0, M);
      if (!wh.ok()) return fail(wh.status());
      wbind = *wh;
      wt = DType::kF16;
      pc.w_off = u32(wh->offset / 4);
      pc.row0 = 0;
    }
    dispatch(typed(tile->shader ? tile->shader : tile->name, wt, false, true),
             Spec{tile->threads()}, {wbind, *xh, act_bind(out, true), bb}, &pc, sizeof(pc),
             (M + tile->bm - 1) / tile->bm, (T + tile->bn - 1) / tile->bn, 1);
  } else {
    // 128 x 128 tiles (32 KiB of shared memory) where the device has room,
    // else 128 x 64 (24 KiB).
    const bool wide = dev_->caps().max_shared_bytes >= kMatmulWideShared && !matmul_n64_;
    const uint32_t bn = wide ? kMatmulTileN : kMatmulTileN / 2;
    dispatch(typed(wide ? "matmul" : "matmul_n64", r->dtype, false, true), Spec{kWgMatmul},
             {wb, act_bind(x, false), act_bind(out, true), bb}, &pc, sizeof(pc),
             (M + kMatmulTileM - 1) / kMatmulTileM, (T + bn - 1) / bn, 1);
  }
}

}  // namespace loom
