// Dequantization kernels: dequantize_rows (embedding lookup, tests) and the
// F16 weight tiles of the prefill GEMM. One thread per output element
// (grid-stride), each decoding its element on its own as cpu/ref does:
// simple and exact; memory-bound like the copy it is.
#include <cuda_fp16.h>

#include <cinttypes>

#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/cuda_matmul.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"
#include "engine/backends/cuda/quant_device.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

// Blocks for n elements, grid-stride beyond a cap.
unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

template <DType D>
__global__ void dequant_rows_kernel(const uint8_t* w, uint64_t row_bytes, int64_t n_out,
                                    int64_t n_in, const int32_t* ids, int64_t T, float* out) {
  const int64_t total = T * n_in;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = k / n_in, i = k % n_in;
    const int64_t r = ids[t];
    // An id outside the matrix gives zeros (the host checks ids before).
    out[k] = r >= 0 && r < n_out ? dequant_one<D>(w + r * row_bytes, i) : 0.0f;
  }
}

template <DType D>
__global__ void dequant_f16_kernel(const uint8_t* w, uint64_t row_bytes, int64_t r0, int64_t n,
                                   int64_t n_in, __half* out) {
  const int64_t total = n * n_in;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / n_in, i = k % n_in;
    out[k] = __float2half_rn(dequant_one<D>(w + (r0 + r) * row_bytes, i));
  }
}

__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[k] = __float2half_rn(fminf(fmaxf(x[k], -65504.0f), 65504.0f));  // saturate, never inf
}

Status check_matrix(const DevMatrix& w, const char* op) {
  if (!matmul_supported(w.dtype))
    return make_error(ErrorCode::kUnsupported, "CUDA %s: no kernel for %s weights", op,
                      std::string(dtype_name(w.dtype)).c_str());
  const auto rb = dtype_row_bytes(w.dtype, static_cast<uint64_t>(w.n_in));
  if (!rb || *rb != w.row_bytes || w.n_out <= 0 || !w.data)
    return make_error(ErrorCode::kInvalidArgument,
                      "CUDA %s: a %s matrix of %" PRId64 " x %" PRId64
                      " with rows %llu bytes apart is malformed",
                      op, std::string(dtype_name(w.dtype)).c_str(), w.n_out, w.n_in,
                      static_cast<unsigned long long>(w.row_bytes));
  return {};
}

}  // namespace

bool matmul_supported(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return true;
    default: return false;
  }
}

Status dequantize_rows(const DevMatrix& w, const int32_t* ids, int64_t T, float* out,
                       cudaStream_t s) {
  LOOM_TRY(check_matrix(w, "dequantize_rows"));
  if (T <= 0) return {};
  const auto* p = static_cast<const uint8_t*>(w.data);
  dispatch_dtype(w.dtype, [&]<DType D>() {
    dequant_rows_kernel<D>
        <<<grid_for(T * w.n_in), kThreads, 0, s>>>(p, w.row_bytes, w.n_out, w.n_in, ids, T, out);
  });
  return launch_status("dequantize_rows");
}

Status dequant_f16(const DevMatrix& w, int64_t r0, int64_t n, uint16_t* out, cudaStream_t s) {
  LOOM_TRY(check_matrix(w, "dequant_f16"));
  if (r0 < 0 || n <= 0 || r0 + n > w.n_out)
    return make_error(ErrorCode::kInternal,
                      "CUDA dequant_f16: rows %" PRId64 "+%" PRId64 " of %" PRId64, r0, n, w.n_out);
  const auto* p = static_cast<const uint8_t*>(w.data);
  auto* o = reinterpret_cast<__half*>(out);
  dispatch_dtype(w.dtype, [&]<DType D>() {
    dequant_f16_kernel<D>
        <<<grid_for(n * w.n_in), kThreads, 0, s>>>(p, w.row_bytes, r0, n, w.n_in, o);
  });
  return launch_status("dequant_f16");
}

Status to_f16(const float* x, int64_t n, uint16_t* out, cudaStream_t s) {
  if (n <= 0) return {};
  to_f16_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, reinterpret_cast<__half*>(out));
  return launch_status("to_f16");
}

}  // namespace loom::cuda
