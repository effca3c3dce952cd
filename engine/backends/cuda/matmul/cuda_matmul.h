// The CUDA backend's matrix products (loom_cuda_matmul): weights in device
// memory as their GGUF rows, decode matvecs on Q8 activations with int8 dot
// products, and prefill GEMMs on the tensor cores through cuBLAS (opened at
// run time, cublas_loader.h). Host-callable; no CUDA syntax here, so the
// backend's .cpp files include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace loom::cuda {

/// A weight matrix in device memory: n_out rows of n_in values, each row
/// `row_bytes` of GGUF blocks exactly as in the file (no repacking, so any
/// kernel that knows the GGUF block formats can read it).
struct DevMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t n_out = 0;
  int64_t n_in = 0;
  uint64_t row_bytes = 0;
};

/// Whether weights of `dtype` can be multiplied (and dequantized) on CUDA.
bool matmul_supported(DType dtype);

/// out[t] = dequantized row ids[t] of `w` (ids: device int32[T]); out [T, n_in].
Status dequantize_rows(const DevMatrix& w, const int32_t* ids, int64_t T, float* out,
                       cudaStream_t s);

/// Most tokens the matvec kernels take; beyond, the GEMM path.
inline constexpr int64_t kMaxMatvecTokens = 8;

/// Most tokens the quantized weights' tensor-core kernel (gemm_q) takes
/// past the matvecs; beyond, cuBLAS on F16 copies of the weights. gemm_q
/// reads and decodes the weights once per 64 tokens, cuBLAS's path makes an
/// F16 copy of them once per call: a serve step of 64 decoding sequences and
/// a few prompt rows is past 64 tokens, and two gemm_q tiles cost less than
/// the copy. LOOM_CUDA_GEMMQ_TOKENS overrides it (0: cuBLAS from 9 tokens on).
inline constexpr int64_t kMaxGemmQTokens = 128;
int64_t gemm_q_max_tokens();

/// Q8 activations of a product's x [T, n] (layout: q8_act.cuh), made by
/// rms_norm_q8 together with x: q [T, q8_token_bytes(n)], d [T, n / 32]
/// (scale pairs: q8_act.cuh).
struct Q8Act {
  const int8_t* q = nullptr;
  const float2* d = nullptr;
};

/// Bytes of one token's Q8 quants of n values (whole chunks of 32 groups).
uint64_t q8_token_bytes(int64_t n);

/// out[t] = rms_norm(x[t]) * w as the backend's rms_norm (cuda_ops.h) gives
/// it, bit for bit, and in the same launch its Q8 activations into xq
/// [T, q8_token_bytes(n)] and xd [T, n / 32]. T <= kMaxMatvecTokens (8),
/// n a multiple of 32.
Status rms_norm_q8(const float* x, const float* w, float eps, float* out, int64_t T, int64_t n,
                   int8_t* xq, float2* xd, cudaStream_t s);

/// The decode matvecs' way of reading quantized rows (matvec.cu), picked at
/// start by LOOM_CUDA_MATVEC: direct loads per lane (`direct`), chunks
/// staged through shared memory (`staged`), or staged with Q4_0, Q8_0 and Q6_K
/// groups read from shared memory as aligned 32-bit words (the default; the
/// other types as `staged`). One warp a row in all: two or four warps a row
/// (the K dimension split between them, their sums added in shared memory)
/// measured 13% slower on the H200.
inline constexpr int kMatvecDirect = 0;
inline constexpr int kMatvecStaged = 1;
inline constexpr int kMatvecStagedWords = 2;
int matvec_kernel();
/// Test and benchmark hook: the kernel of later launches (not thread-safe).
void set_matvec_kernel(int k);

/// Runs the products of one backend on one stream. Owns the cuBLAS handle and
/// the scratch (Q8 activations, dequantized F16 weight tiles), grown as needed.
/// Errors (kernel launch, cuBLAS, out of memory) come back as a Status.
class Matmul {
 public:
  /// Opens cuBLAS (kUnsupported, naming the library, when it cannot be opened).
  static Result<std::unique_ptr<Matmul>> create(int device);
  virtual ~Matmul() = default;

  /// y [T, w.n_out] = x [T, w.n_in] W^T (+ bias [n_out] when not null); with
  /// `accumulate`, y += instead. Small T (decode): matvec kernels; up to
  /// gemm_q_max_tokens() and quantized weights: gemm_q; else a cuBLAS GEMM
  /// on the tensor cores. All pointers are device memory. With `xq8`
  /// (T <= 8): x's Q8 activations are already made (rms_norm_q8), so the
  /// matvec of a quantized weight reads them instead of quantizing x.
  virtual Status run(const DevMatrix& w, const float* x, int64_t T, float* y, const float* bias,
                     bool accumulate, cudaStream_t s, const Q8Act* xq8 = nullptr) = 0;
  /// y [T, n_out] = silu(x gate^T) * (x up^T) (the FFN's first half);
  /// gate and up have the same shape and dtype.
  virtual Status run_glu(const DevMatrix& gate, const DevMatrix& up, const float* x, int64_t T,
                         float* y, cudaStream_t s, const Q8Act* xq8 = nullptr) = 0;
  /// ys[i] [T, ws[i].n_out] = x ws[i]^T (+ biases[i] when not null), for n
  /// matrices of the same n_in (q, k, v of one input): x is quantized (or
  /// converted to F16) once for all of them. Types may differ.
  virtual Status run_multi(const DevMatrix* ws, const float* const* biases, float* const* ys, int n,
                           const float* x, int64_t T, cudaStream_t s,
                           const Q8Act* xq8 = nullptr) = 0;
  /// Device bytes of scratch held.
  virtual uint64_t scratch_bytes() const = 0;
};

}  // namespace loom::cuda
