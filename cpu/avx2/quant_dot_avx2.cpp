// placeholder
#include "cpu/matmul_internal.h"

namespace loom::cpu::avx2 {
void matmul_q4_0(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q4_0(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q4_1(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q4_1(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q5_0(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q5_0(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q5_1(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q5_1(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q8_0(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q8_0(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q2_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q2_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q3_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q3_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q4_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q4_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q5_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q5_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void matmul_q6_k(LOOM_QUANT_KERNEL_ARGS) { scalar::matmul_q6_k(W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1); }
void quantize_act_q8_0(const float* x, void* out, int64_t n) { scalar::quantize_act_q8_0(x, out, n); }
void quantize_act_q8_k(const float* x, void* out, int64_t n) { scalar::quantize_act_q8_k(x, out, n); }
}  // namespace loom::cpu::avx2
