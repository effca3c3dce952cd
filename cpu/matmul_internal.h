// Internal interface between the matmul dispatcher (cpu/matmul.cpp) and the
// kernels behind it. Not for use outside cpu/.
//
// Who implements what:
//   - cpu/matmul.cpp: ISA detection, activation formats, dispatch.
//   - detail::matmul_rows_dense (F32/F16/BF16 weights): cpu/matmul_dense*.cpp.
//   - quantized weights: scalar::, avx2::, avx512:: kernels below, in
//     cpu/quant_dot_scalar.cpp, cpu/avx2/quant_dot_avx2.cpp and
//     cpu/avx512/quant_dot_avx512.cpp.
//
// This header only includes <cstddef>/<cstdint> and forward-declares the two
// enums, so the ISA-flagged sources in cpu/avx2 and cpu/avx512 may include
// it without instantiating any std template or inline function.
//
// Activation formats of the quantized weights (what convert_activation writes,
// one row of n elements; every kernel below reads exactly this):
//
//   32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): "Q8_0, split". The
//   values are those of ref::quantize_row_q8_0 bit for bit, laid out as
//   arrays so that SIMD loads get whole blocks of quants without gathers and
//   the scales as ready fp32, with the block sums Q8_1 would carry:
//     byte 0                 qs[n]   int8   quants, block b at qs + 32 b
//     byte n                 d[nb]   float  fp16_to_fp32 of the block's fp16 scale
//     byte n + 4 nb          s[nb]   float  d[b] * (sum of block b's 32 quants)
//     (nb = n / 32; the row is padded to a multiple of 64 bytes)
//   s serves Q4_1/Q5_1 (offset m times the activation sum) and lets kernels
//   fold Q4_0/Q5_0's "-8"/"-16" into one term per block. Keeping d and s as
//   fp32 costs 8 bytes per 32 activations but saves the fp16 conversions in
//   the inner loops and keeps s exact (Q8_1 rounds it to fp16).
//
//   K-quants (Q2_K .. Q6_K): standard Q8_K blocks (ref::BlockQ8_K, 292 bytes:
//   fp32 d, 256 quants, 16 int16 sums of 16), as ref::quantize_row_q8_k
//   writes them; the row is padded to a multiple of 64 bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {
enum class DType : uint32_t;  // engine/core/dtype.h
namespace cpu {
enum class Isa;  // cpu/matmul.h
}  // namespace cpu
}  // namespace loom

namespace loom::cpu::detail {

/// Dense weights (F32, F16, BF16). Activations are F32 rows for F32 weights,
/// F16 rows for F16 and BF16 rows for BF16 (bit patterns). Same contract as
/// matmul_rows: Y[t * ldy + r] = dot(W row r, X row t), t < T, r0 <= r < r1.
void matmul_rows_dense(Isa isa, DType w, const void* W, size_t w_row_bytes, const void* X,
                       size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0,
                       int64_t r1);

/// True when the CPU has AVX512_VBMI (on top of the AVX-512 level).
bool cpu_has_avx512_vbmi();

/// True where one-token GEMVs read their weight rows one at a time (one
/// sequential stream) rather than several at once: on AMD cores, where the
/// 16-bit dense weights and Q8_0 measured faster that way (the kernels say
/// by how much). Intel cores keep the multi-row kernels.
bool gemv_one_stream();

/// Scratch memory for the calling thread: at least `bytes`, 64-byte aligned,
/// valid until the thread's next call. For the GEMM kernels (packed
/// activation and weight tiles); grows as needed and is kept for the life of
/// the thread, so steady-state matmuls allocate nothing.
void* thread_scratch(size_t bytes);

}  // namespace loom::cpu::detail

// The quantized kernels: one function per weight dtype and ISA, all with the
// matmul_rows contract (X in the activation format above, n a multiple of the
// weight's block size). Every ISA file defines all of them; one without a
// fast kernel for some dtype forwards to the next lower level.
#define LOOM_QUANT_KERNEL_ARGS                                                               \
  const void *W, size_t w_row_bytes, const void *X, size_t x_row_bytes, int64_t T, float *Y, \
      int64_t ldy, int64_t n, int64_t r0, int64_t r1
#define LOOM_DECLARE_QUANT_KERNELS                              \
  void matmul_q4_0(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q4_1(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q5_0(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q5_1(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q8_0(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q2_k(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q3_k(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q4_k(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q5_k(LOOM_QUANT_KERNEL_ARGS);                     \
  void matmul_q6_k(LOOM_QUANT_KERNEL_ARGS);                     \
  /* x[n] floats -> one activation row (formats above) */       \
  void quantize_act_q8_0(const float* x, void* out, int64_t n); \
  void quantize_act_q8_k(const float* x, void* out, int64_t n);
// Defines the ten matmul_* kernels of an ISA file from its two templates, one
// for 32-element blocks (impl32) and one for K-quant super-blocks (implk),
// each instantiated with P##Q4_0 and so on (ref::Block or the file's Fmt).
#define LOOM_QUANT_KERNEL_DEF_(name, impl, type)                      \
  void name(LOOM_QUANT_KERNEL_ARGS) {                                 \
    impl<type>(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); \
  }
#define LOOM_DEFINE_QUANT_KERNELS(impl32, implk, P)    \
  LOOM_QUANT_KERNEL_DEF_(matmul_q4_0, impl32, P##Q4_0) \
  LOOM_QUANT_KERNEL_DEF_(matmul_q4_1, impl32, P##Q4_1) \
  LOOM_QUANT_KERNEL_DEF_(matmul_q5_0, impl32, P##Q5_0) \
  LOOM_QUANT_KERNEL_DEF_(matmul_q5_1, impl32, P##Q5_1) \
  LOOM_QUANT_KERNEL_DEF_(matmul_q8_0, impl32, P##Q8_0) \
  LOOM_QUANT_KERNEL_DEF_(matmul_q2_k, implk, P##Q2_K)  \
  LOOM_QUANT_KERNEL_DEF_(matmul_q3_k, implk, P##Q3_K)  \
  LOOM_QUANT_KERNEL_DEF_(matmul_q4_k, implk, P##Q4_K)  \
  LOOM_QUANT_KERNEL_DEF_(matmul_q5_k, implk, P##Q5_K)  \
  LOOM_QUANT_KERNEL_DEF_(matmul_q6_k, implk, P##Q6_K)

namespace loom::cpu::scalar {
LOOM_DECLARE_QUANT_KERNELS
}  // namespace loom::cpu::scalar
namespace loom::cpu::avx2 {
LOOM_DECLARE_QUANT_KERNELS
}  // namespace loom::cpu::avx2
namespace loom::cpu::avx512 {
LOOM_DECLARE_QUANT_KERNELS
/// The AVX-512 kernels use AVX512_VBMI byte permutes where the CPU has them.
/// Test hook: turns that off (or back on; false when the CPU lacks VBMI).
bool set_vbmi(bool enable);
}  // namespace loom::cpu::avx512
