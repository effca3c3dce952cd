// Dense prefill matmuls: Y[T, rows] = X[T, n] · W[rows, n]^T for F32, F16 and
// BF16 weights, run either by our own tiled kernel (cpu/matmul_dense.cpp) over
// a ThreadPool, or by oneDNN's matmul primitive when Loom was built with it.
//
// Layouts are those of matmul_rows (cpu/matmul.h): W rows of n elements in
// the weight dtype, `w_row_bytes` apart (memory-mapped, never repacked); X
// rows in activation_type(w) (F32 for F32 weights, F16 for F16, BF16 for
// BF16), `x_row_bytes` apart; Y f32, row t at Y + t * ldy.
//
// oneDNN (Debian's libdnnl 2.6) runs f32 x f32 and bf16 x bf16 (AVX-512 BF16,
// or AMX where the CPU has it) but has no f16 matmul on CPU: F16 goes through
// it by widening X and chunks of 128 W rows to f32 first (exact; scratch of
// (T + 128) x n floats per calling thread, kept for the next call). It brings
// its own OpenMP thread pool, separate from ThreadPool; see OneDnnMatmul::run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cpu/thread_pool.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace loom::cpu {

/// True when Loom was built with oneDNN and it can open a CPU engine.
bool onednn_available();

/// oneDNN matmul primitives for dense weights, cached per shape.
///
/// Creating a primitive costs 0.1 to 0.6 ms (it JIT-compiles its kernels), so
/// one is made per (dtype, T, n, rows, strides, threads) and kept, least
/// recently used first out beyond 64 shapes. Thread-safe: the cache is
/// locked, primitives run outside the lock.
class OneDnnMatmul {
 public:
  OneDnnMatmul();
  ~OneDnnMatmul();
  OneDnnMatmul(const OneDnnMatmul&) = delete;
  OneDnnMatmul& operator=(const OneDnnMatmul&) = delete;

  /// False when Loom was built without oneDNN or the engine could not start.
  bool available() const;

  /// Y[T, rows] = X[T, n] · W[rows, n]^T (layouts in the file comment).
  ///
  /// `n_threads` (>= 1) is the OpenMP thread count oneDNN may use, the
  /// calling thread included; it is set for the calling thread only
  /// (omp_set_num_threads) and restored afterwards. oneDNN's OpenMP workers
  /// are not ThreadPool's: do not call this from inside ThreadPool::run (each
  /// calling thread would get its own team). By default libgomp's workers
  /// spin for milliseconds after each call and slow whatever ThreadPool runs
  /// next on the same cores (measured +44% to +187%); OMP_WAIT_POLICY=passive
  /// in the environment of the process removes that (see gemm_onednn.cpp).
  /// Errors: kUnsupported (no oneDNN, or not a dense dtype), kInvalidArgument
  /// (bad sizes or strides), kInternal (oneDNN refused the shape).
  Status run(DType w, const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes,
             int64_t T, float* Y, int64_t ldy, int64_t n, int64_t rows, int n_threads);

  /// Number of primitives in the cache (for tests).
  size_t cached_primitives() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Which code runs a dense prefill matmul.
enum class DenseImpl { kLoom, kOneDnn };
const char* dense_impl_name(DenseImpl impl);

/// The faster implementation for this shape class and thread count, from the
/// measurements of tools/bench/dense_bench.cpp (table in gemm_onednn.cpp):
/// ours for T <= 6 and for F16 (oneDNN only for T >= 256 on one thread);
/// oneDNN for F32 when one thread or when OMP_WAIT_POLICY=passive (or
/// GOMP_SPINCOUNT <= 10000) is set, and for BF16 where oneDNN uses AMX.
/// Says kOneDnn only when oneDNN is available.
DenseImpl dense_prefill_choice(DType w, int64_t T, int64_t n, int64_t rows, int n_threads);

/// Our own kernel, rows split over `pool` (in multiples of 16) at the active ISA.
/// Errors: kUnsupported (not a dense dtype), kInvalidArgument (bad sizes or strides).
Status dense_matmul_loom(DType w, const void* W, size_t w_row_bytes, const void* X,
                         size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n,
                         int64_t rows, ThreadPool& pool);

/// Runs the implementation dense_prefill_choice picks, with pool.size()
/// threads either way. `onednn` may be null (then always our kernel). Falls
/// back to our kernel if oneDNN fails on a shape. Errors as dense_matmul_loom.
Status dense_matmul_prefill(DType w, const void* W, size_t w_row_bytes, const void* X,
                            size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n,
                            int64_t rows, ThreadPool& pool, OneDnnMatmul* onednn);

}  // namespace loom::cpu
