// Matmul dispatch: picks the ISA level once (cpuid, capped by $LOOM_CPU),
// converts activations and routes each weight dtype to its kernel.
//
// Quantized weights go to the scalar/avx2/avx512 kernels declared in
// cpu/matmul_internal.h (whose header comment also defines the activation
// formats); dense weights go to detail::matmul_rows_dense.
#include "cpu/matmul.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "cpu/matmul_internal.h"
#include "cpu/ops.h"
#include "cpu/ref/blocks.h"
#include "cpu/ref/quants.h"

namespace loom::cpu {
namespace {

// CPU features from cpuid, and whether the OS saves the wide registers
// (XGETBV): both are needed before any AVX/AVX-512 instruction may run.
struct CpuFeatures {
  bool avx2 = false;    // avx2 + fma + f16c + bmi2, YMM state enabled
  bool avx512 = false;  // avx512 f + bw + vl + dq + vnni, ZMM and opmask state enabled
  bool vbmi = false;    // avx512_vbmi (with avx512)
};

CpuFeatures probe_cpu() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool fma = (c >> 12) & 1;
  const bool f16c = (c >> 29) & 1;
  if (!osxsave) return f;
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm_state = (xcr0_lo & 0xE6) == 0xE6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = (b >> 5) & 1;
  const bool bmi2 = (b >> 8) & 1;
  const bool avx512f = (b >> 16) & 1;
  const bool avx512dq = (b >> 17) & 1;
  const bool avx512bw = (b >> 30) & 1;
  const bool avx512vl = (b >> 31) & 1;
  const bool avx512vbmi = (c >> 1) & 1;
  const bool avx512vnni = (c >> 11) & 1;
  f.avx2 = ymm_state && avx2 && fma && f16c && bmi2;
  f.avx512 = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni;
  f.vbmi = f.avx512 && avx512vbmi;
#endif
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = probe_cpu();
  return f;
}

// The best level the hardware supports.
Isa hardware_isa() {
  const CpuFeatures& f = cpu_features();
  return f.avx512 ? Isa::kAvx512 : f.avx2 ? Isa::kAvx2 : Isa::kScalar;
}

// hardware_isa() lowered to $LOOM_CPU when that names a lower level. An
// unknown value is ignored (the variable is a debugging aid, not a setting).
Isa capped_isa() {
  Isa isa = hardware_isa();
  if (const char* env = std::getenv("LOOM_CPU")) {
    const std::string_view v(env);
    Isa cap = isa;
    if (v == "scalar") cap = Isa::kScalar;
    if (v == "avx2") cap = Isa::kAvx2;
    if (v == "avx512") cap = Isa::kAvx512;
    if (cap < isa) isa = cap;
  }
  return isa;
}

// Levels as ints so that the atomic stays lock-free and trivially usable.
std::atomic<int>& active_level() {
  static std::atomic<int> level{static_cast<int>(capped_isa())};
  return level;
}

bool is_dense(DType w) {
  return w == DType::kF32 || w == DType::kF16 || w == DType::kBF16;
}

bool is_k_quant(DType w) {
  return w == DType::kQ2_K || w == DType::kQ3_K || w == DType::kQ4_K || w == DType::kQ5_K ||
         w == DType::kQ6_K;
}

bool is_legacy_quant(DType w) {
  return w == DType::kQ4_0 || w == DType::kQ4_1 || w == DType::kQ5_0 || w == DType::kQ5_1 ||
         w == DType::kQ8_0;
}

using QuantKernel = void (*)(LOOM_QUANT_KERNEL_ARGS);
using ActConverter = void (*)(const float* x, void* out, int64_t n);

struct IsaKernels {
  QuantKernel q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k;
  ActConverter act_q8_0, act_q8_k;
};

#define LOOM_ISA_KERNELS(ns)                                                                 \
  IsaKernels {                                                                               \
    ns::matmul_q4_0, ns::matmul_q4_1, ns::matmul_q5_0, ns::matmul_q5_1, ns::matmul_q8_0,     \
        ns::matmul_q2_k, ns::matmul_q3_k, ns::matmul_q4_k, ns::matmul_q5_k, ns::matmul_q6_k, \
        ns::quantize_act_q8_0, ns::quantize_act_q8_k                                         \
  }

const IsaKernels& kernels(Isa isa) {
  static const IsaKernels table[3] = {LOOM_ISA_KERNELS(scalar), LOOM_ISA_KERNELS(avx2),
                                      LOOM_ISA_KERNELS(avx512)};
  return table[static_cast<int>(isa)];
}
#undef LOOM_ISA_KERNELS

QuantKernel quant_kernel(Isa isa, DType w) {
  const IsaKernels& k = kernels(isa);
  switch (w) {
    case DType::kQ4_0: return k.q4_0;
    case DType::kQ4_1: return k.q4_1;
    case DType::kQ5_0: return k.q5_0;
    case DType::kQ5_1: return k.q5_1;
    case DType::kQ8_0: return k.q8_0;
    case DType::kQ2_K: return k.q2_k;
    case DType::kQ3_K: return k.q3_k;
    case DType::kQ4_K: return k.q4_k;
    case DType::kQ5_K: return k.q5_k;
    case DType::kQ6_K: return k.q6_k;
    default: return nullptr;
  }
}

constexpr size_t round_up_64(size_t v) {
  return (v + 63) & ~size_t{63};
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa detected_isa() {
  static const Isa isa = capped_isa();
  return isa;
}

Isa active_isa() {
  return static_cast<Isa>(active_level().load(std::memory_order_relaxed));
}

bool set_isa(Isa isa) {
  static const Isa hw = hardware_isa();
  if (isa > hw) return false;
  active_level().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

bool matmul_supported(DType w) {
  return is_dense(w) || is_legacy_quant(w) || is_k_quant(w);
}

DType activation_type(DType w) {
  if (is_legacy_quant(w)) return DType::kQ8_0;
  if (is_k_quant(w)) return DType::kQ8_K;
  assert(is_dense(w) && "activation_type: dtype without a matmul (check matmul_supported)");
  return w;
}

size_t activation_row_bytes(DType w, int64_t n) {
  assert(n >= 0);
  const auto un = static_cast<size_t>(n);
  if (is_legacy_quant(w)) {
    // quants, fp32 scales, fp32 sums (see matmul_internal.h)
    return round_up_64(un + 8 * (un / ref::kQK));
  }
  if (is_k_quant(w)) return round_up_64(un / ref::kQK_K * sizeof(ref::BlockQ8_K));
  assert(is_dense(w));
  return w == DType::kF32 ? un * 4 : un * 2;
}

void convert_activation(DType w, const float* x, void* out, int64_t n) {
  const Isa isa = active_isa();
  if (is_legacy_quant(w)) {
    assert(n % ref::kQK == 0);
    kernels(isa).act_q8_0(x, out, n);
  } else if (is_k_quant(w)) {
    assert(n % ref::kQK_K == 0);
    kernels(isa).act_q8_k(x, out, n);
  } else if (w == DType::kF32) {
    std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
  } else if (w == DType::kF16) {
    f32_to_f16_row(x, out, n);
  } else {
    assert(w == DType::kBF16);
    const Status st = ref::quantize_row(DType::kBF16, x, out, n);
    assert(st.ok());
    (void)st;
  }
}

void matmul_rows(DType w, const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes,
                 int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1) {
  assert(0 <= r0 && r0 <= r1 && T >= 0 && n >= 0);
  if (r0 == r1 || T == 0) return;
  const Isa isa = active_isa();
  if (is_dense(w)) {
    detail::matmul_rows_dense(isa, w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
    return;
  }
  // Q8_K activation blocks hold a float: rows must be 4-byte aligned
  // (activation buffers are allocated by the engine, 64-byte aligned).
  assert(reinterpret_cast<uintptr_t>(X) % 4 == 0 && x_row_bytes % 4 == 0);
  const QuantKernel k = quant_kernel(isa, w);
  assert(k != nullptr && "matmul_rows: dtype without a matmul (check matmul_supported)");
  k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
}

namespace detail {
bool cpu_has_avx512_vbmi() {
  return cpu_features().vbmi;
}

bool gemv_one_stream() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool amd = __builtin_cpu_is("amd") != 0;
  return amd;
#else
  return false;
#endif
}

void* thread_scratch(size_t bytes) {
  struct Scratch {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
  };
  thread_local Scratch scratch;
  if (scratch.size < bytes) {
    scratch.data.reset();  // release first: peak memory is the new size, not the sum
    scratch.size = round_up_64(bytes + bytes / 4);
    scratch.data.reset(
        new uint8_t[scratch.size + 64]);  // not zeroed: the kernels write before reading
  }
  const auto base = reinterpret_cast<uintptr_t>(scratch.data.get());
  return scratch.data.get() + ((64 - base % 64) % 64);
}
}  // namespace detail

}  // namespace loom::cpu
