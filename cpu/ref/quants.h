// Scalar reference (de)quantization of every dtype Loom reads or writes.
//
// These loops are the ground truth: each SIMD and GPU kernel is tested
// against them. They reproduce the GGUF/ggml definitions bit for bit:
// dequantization computes the same fp32 products in the same order, and
// quantization writes the same bytes as ggml's reference (non-imatrix)
// quantizers, including the iterative scale searches of the K-quants. Keep
// them plain and in that order; "simplifying" an expression changes rounding.
//
// Row functions take n elements (a multiple of the block size; checked only
// by assert) and n / block_size blocks. Pointers must be aligned for their
// types; the generic dequantize_row/quantize_row accept any alignment and
// check their arguments, returning errors instead.
#pragma once

#include <cstdint>

#include "cpu/ref/blocks.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace loom::ref {

/// @name Plain float formats. x / y: n values (fp16/bf16 as bit patterns).
/// @{
void dequantize_row_f32(const float* x, float* y, int64_t n);
void quantize_row_f32(const float* x, float* y, int64_t n);
void dequantize_row_f16(const uint16_t* x, float* y, int64_t n);
void quantize_row_f16(const float* x, uint16_t* y, int64_t n);
void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n);
void quantize_row_bf16(const float* x, uint16_t* y, int64_t n);
/// @}

/// @name Legacy block formats: n a multiple of 32, n / 32 blocks.
/// @{
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n);
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void dequantize_row_q4_1(const BlockQ4_1* x, float* y, int64_t n);
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n);
void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n);
void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
/// @}

/// @name K-quants: n a multiple of 256, n / 256 super-blocks.
/// @{
void dequantize_row_q2_k(const BlockQ2_K* x, float* y, int64_t n);
void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n);
void dequantize_row_q3_k(const BlockQ3_K* x, float* y, int64_t n);
void quantize_row_q3_k(const float* x, BlockQ3_K* y, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n);
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n);
/// Q8_K quantization also fills bsums.
void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n);
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n);
/// @}

/// Decodes sub-block j (0..7) of the packed 6-bit scales/mins of Q4_K/Q5_K.
/// @param scales  the block's 12 scale bytes
/// @param sc, mn  out: 6-bit scale and min
void scale_min_k4(int j, const uint8_t* scales, uint8_t* sc, uint8_t* mn);

/// True when this file has both dequantize and quantize for `t`
/// (agrees with traits(t).has_reference).
bool has_reference(DType t);

/// Dequantizes n elements of type `t` at `src` (any alignment) into `dst`.
/// @return kUnsupported for a dtype without a reference, kInvalidArgument
///         for n < 0, n not a multiple of the block size, or null pointers.
Status dequantize_row(DType t, const void* src, float* dst, int64_t n);

/// Quantizes n floats into `dst` (any alignment; dtype_row_bytes(t, n)
/// bytes), as ggml's reference quantizer does. Errors as dequantize_row.
Status quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace loom::ref
