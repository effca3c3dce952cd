// The CPU backend's fused decode ops: q/k/v, gate/up (with SiLU * up) and a
// matmul with its residual add, each as one activation conversion and one
// parallel section over all the rows, where the unfused ops take three to
// six sections and convert the same input once per matrix. Only for a few
// tokens (decode); longer inputs take the separate matmuls (GEMM paths,
// oneDNN for dense weights).
#include <algorithm>

#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "engine/backends/cpu/cpu_backend.h"

namespace loom {

namespace {
// Up to this many tokens the fused ops run (the dense prefill takes oneDNN
// above six, cpu_backend.cpp).
constexpr int64_t kFusedMaxTokens = 6;
int64_t align_up(int64_t v) {
  return (v + CpuBackend::kRowAlign - 1) / CpuBackend::kRowAlign * CpuBackend::kRowAlign;
}
}  // namespace

bool CpuBackend::fusable(const Weight& a, const Weight& b, int64_t T) const {
  return fuse_ && T <= kFusedMaxTokens && a.n_in == b.n_in && cpu::matmul_supported(a.dtype) &&
         cpu::matmul_supported(b.dtype) &&
         cpu::activation_type(a.dtype) == cpu::activation_type(b.dtype);
}

void CpuBackend::matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                            const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v) {
  if (!fusable(wq, wk, x.rows) || !fusable(wq, wv, x.rows))
    return Backend::matmul_qkv(wq, wk, wv, bq, bk, bv, x, q, k, v);
  const int64_t T = x.rows, n = wq.n_in;
  const size_t xrb = cpu::activation_row_bytes(wq.dtype, n);
  const uint8_t* xq = convert_input(wq.dtype, x);
  struct Part {
    const Weight* w;
    const Weight* b;
    Act out;
    int64_t base;  // the part's first row in the section's index space
  };
  const int64_t base_k = align_up(wq.n_out), base_v = base_k + align_up(wk.n_out);
  const Part parts[3] = {{&wq, bq.present() ? &bq : nullptr, q, 0},
                         {&wk, bk.present() ? &bk : nullptr, k, base_k},
                         {&wv, bv.present() ? &bv : nullptr, v, base_v}};
  pool_.parallel_for(base_v + wv.n_out, kRowAlign, [&](int64_t r0, int64_t r1, int) {
    for (const Part& p : parts) {
      const int64_t a = std::max(r0, p.base) - p.base;
      const int64_t e = std::min(r1, p.base + p.w->n_out) - p.base;
      if (a >= e) continue;
      cpu::matmul_rows(p.w->dtype, p.w->data, p.w->row_bytes, xq, xrb, T, p.out.data, p.out.cols, n,
                       a, e);
      if (p.b) add_bias(p.out, *p.b, a, e);
    }
  });
}

void CpuBackend::matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) {
  if (!fusable(gate, up, x.rows) || gate.n_out != up.n_out)
    return Backend::matmul_glu(gate, up, x, out, tmp);
  const int64_t T = x.rows, n = gate.n_in;
  const size_t xrb = cpu::activation_row_bytes(gate.dtype, n);
  const uint8_t* xq = convert_input(gate.dtype, x);
  pool_.parallel_for(gate.n_out, kRowAlign, [&](int64_t r0, int64_t r1, int) {
    cpu::matmul_rows(gate.dtype, gate.data, gate.row_bytes, xq, xrb, T, out.data, out.cols, n, r0,
                     r1);
    cpu::matmul_rows(up.dtype, up.data, up.row_bytes, xq, xrb, T, tmp.data, tmp.cols, n, r0, r1);
    for (int64_t t = 0; t < T; ++t)
      cpu::silu_mul(out.row(t) + r0, tmp.row(t) + r0, out.row(t) + r0, r1 - r0);
  });
}

void CpuBackend::matmul_add(const Weight& w, Act x, Act y, Act tmp) {
  if (!fusable(w, w, x.rows)) return Backend::matmul_add(w, x, y, tmp);
  const int64_t T = x.rows, n = w.n_in;
  const size_t xrb = cpu::activation_row_bytes(w.dtype, n);
  const uint8_t* xq = convert_input(w.dtype, x);
  pool_.parallel_for(w.n_out, kRowAlign, [&](int64_t r0, int64_t r1, int) {
    cpu::matmul_rows(w.dtype, w.data, w.row_bytes, xq, xrb, T, tmp.data, tmp.cols, n, r0, r1);
    for (int64_t t = 0; t < T; ++t)
      cpu::add(y.row(t) + r0, tmp.row(t) + r0, y.row(t) + r0, r1 - r0);
  });
}

}  // namespace loom
