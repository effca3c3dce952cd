// Dense (F32, F16, BF16) weights: the portable scalar path and the dispatch
// to cpu/avx2/dense_avx2.cpp and cpu/avx512/dense_avx512.cpp.
//
// Contract (cpu/matmul_internal.h): Y[t * ldy + r] = dot(W row r, X row t) for
// t < T, r0 <= r < r1, n elements per row; X rows are F32 for F32 weights, F16
// for F16 and BF16 for BF16. Inputs are widened exactly and every product is
// accumulated in fp32.
#include <cstddef>
#include <cstdint>

#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"
#include "cpu/ref/fp16.h"
#include "engine/core/dtype.h"

// The ISA kernels. They take plain pointers (no DType, no std types) so the
// ISA-flagged files need no header of ours; a mismatch with the definitions
// there is a link error (the parameter types are part of the mangled name).
#define LOOM_DENSE_KERNEL_ARGS                                                               \
  const void *W, size_t w_row_bytes, const void *X, size_t x_row_bytes, int64_t T, float *Y, \
      int64_t ldy, int64_t n, int64_t r0, int64_t r1
namespace loom::cpu::avx2 {
void dense_f32(LOOM_DENSE_KERNEL_ARGS);
void dense_f16(LOOM_DENSE_KERNEL_ARGS);
void dense_bf16(LOOM_DENSE_KERNEL_ARGS);
}  // namespace loom::cpu::avx2
namespace loom::cpu::avx512 {
void dense_f32(LOOM_DENSE_KERNEL_ARGS);
void dense_f16(LOOM_DENSE_KERNEL_ARGS);
void dense_bf16(LOOM_DENSE_KERNEL_ARGS);        // vdpbf16ps: needs avx512_bf16
void dense_bf16_widen(LOOM_DENSE_KERNEL_ARGS);  // AVX-512F only
}  // namespace loom::cpu::avx512

namespace loom::cpu {
namespace {

// Scalar path: widen, multiply, add in fp32. Four tokens at a time share each
// widened weight element (the widening is the slow part for F16).
template <typename Elem, float (*Widen)(Elem)>
void dense_scalar(LOOM_DENSE_KERNEL_ARGS) {
  const auto* w = static_cast<const uint8_t*>(W);
  const auto* x = static_cast<const uint8_t*>(X);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* wr = reinterpret_cast<const Elem*>(w + static_cast<size_t>(r) * w_row_bytes);
    int64_t t = 0;
    for (; t + 4 <= T; t += 4) {
      const Elem* xr[4];
      for (int j = 0; j < 4; ++j)
        xr[j] = reinterpret_cast<const Elem*>(x + static_cast<size_t>(t + j) * x_row_bytes);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t i = 0; i < n; ++i) {
        const float wi = Widen(wr[i]);
        for (int j = 0; j < 4; ++j) acc[j] += wi * Widen(xr[j][i]);
      }
      for (int j = 0; j < 4; ++j) Y[(t + j) * ldy + r] = acc[j];
    }
    for (; t < T; ++t) {
      const auto* xr = reinterpret_cast<const Elem*>(x + static_cast<size_t>(t) * x_row_bytes);
      float acc = 0.0f;
      for (int64_t i = 0; i < n; ++i) acc += Widen(wr[i]) * Widen(xr[i]);
      Y[t * ldy + r] = acc;
    }
  }
}

// Isa::kAvx512 (cpu/matmul.cpp) requires F/BW/VL/DQ/VNNI but not BF16:
// Ice Lake and Cascade Lake have the rest without it.
bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
#else
  return false;
#endif
}

// vdpbf16ps or widening for BF16 on AVX-512. Measured on one Emerald Rapids
// core (tools/bench/dense_bench, T = 128): the packed GEMM reached 72-78
// GFLOP/s with vdpbf16ps and 75-102 widening to fp32 FMA, since Intel issues
// vdpbf16ps at half the rate of vfmadd. AMD (Zen 4/5) issues it at the FMA
// rate, which doubles the products per cycle, so it keeps vdpbf16ps
// (unmeasured here). GEMV (T <= 6, the avx512 file's kTileTokensMax) is bound
// by memory either way and keeps vdpbf16ps everywhere.
bool use_dpbf16(int64_t T) {
  if (!cpu_has_avx512_bf16()) return false;
  if (T <= 6) return true;
#if defined(__x86_64__) || defined(__i386__)
  static const bool intel = __builtin_cpu_is("intel") != 0;
  return !intel;
#else
  return true;
#endif
}

float widen_f32(float v) {
  return v;
}
float widen_f16(uint16_t v) {
  return ref::fp16_to_fp32(v);
}
float widen_bf16(uint16_t v) {
  return ref::bf16_to_fp32(v);
}

}  // namespace

namespace detail {

void matmul_rows_dense(Isa isa, DType w, const void* W, size_t w_row_bytes, const void* X,
                       size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0,
                       int64_t r1) {
  if (T <= 0 || r0 >= r1) return;
  switch (w) {
    case DType::kF32:
      if (isa == Isa::kAvx512)
        return avx512::dense_f32(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
      if (isa == Isa::kAvx2)
        return avx2::dense_f32(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
      return dense_scalar<float, widen_f32>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
    case DType::kF16:
      if (isa == Isa::kAvx512)
        return avx512::dense_f16(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
      if (isa == Isa::kAvx2)
        return avx2::dense_f16(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
      return dense_scalar<uint16_t, widen_f16>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0,
                                               r1);
    case DType::kBF16:
      if (isa == Isa::kAvx512) {
        if (use_dpbf16(T))
          return avx512::dense_bf16(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
        return avx512::dense_bf16_widen(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
      }
      if (isa == Isa::kAvx2)
        return avx2::dense_bf16(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
      return dense_scalar<uint16_t, widen_bf16>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0,
                                                r1);
    default:
      // The dispatcher only sends dense dtypes here (matmul_supported).
      return;
  }
}

}  // namespace detail
}  // namespace loom::cpu
