// Quantized and dense matrix products on the CPU, with run-time ISA dispatch.
//
// Weights stay in their GGUF block format (memory-mapped, never copied or
// repacked). Activations are converted once per matmul into the format the
// weight's dot product wants (Q8_0 for the 32-element formats, Q8_K for the
// K-quants, F32/F16/BF16 for dense weights), then every weight row is dotted
// with every activation row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/core/dtype.h"

namespace loom::cpu {

/// Instruction-set levels, lowest first.
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* isa_name(Isa isa);

/// Best level this CPU supports (cpuid), capped by $LOOM_CPU=scalar|avx2|avx512.
Isa detected_isa();
/// Level in use (detected_isa() unless set_isa() lowered it).
Isa active_isa();
/// Forces a level; returns false (and changes nothing) when the CPU lacks it.
bool set_isa(Isa isa);

/// True when matmul_rows handles weights of this dtype.
bool matmul_supported(DType w);
/// The activation format used with weights of type `w`.
DType activation_type(DType w);
/// Bytes of one converted activation row of n elements.
size_t activation_row_bytes(DType w, int64_t n);
/// Converts one activation row (n floats) for weights of type `w`.
void convert_activation(DType w, const float* x, void* out, int64_t n);

/// Y[t, r] = dot(W row r, X row t) for t in [0, T), r in [r0, r1).
///   W: weight rows of n elements in dtype `w`, `w_row_bytes` apart
///   X: T activation rows converted by convert_activation, `x_row_bytes` apart
///   Y: f32, row t at Y + t * ldy (column r at index r)
/// Pure function of its arguments: callers split [0, rows) across threads.
void matmul_rows(DType w, const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes,
                 int64_t T, float* Y, int64_t ldy, int64_t n, int64_t r0, int64_t r1);

}  // namespace loom::cpu
