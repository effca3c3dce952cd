// The Matmul class: picks the matvec kernels (decode), the quantized
// tensor-core GEMM (gemm_q.cu: a few dozen tokens) or cuBLAS GEMMs on F16
// tensor cores (prefill), and owns their scratch.
//
// Prefill: y [T, n_out] = x [T, n_in] W^T. In cuBLAS's column-major terms,
// W's rows (row-major [n_out, n_in]) are an n_in x n_out matrix, so
//   y^T (n_out x T, ld n_out) = (W buffer)^T (n_out x n_in) * x buffer (n_in x T),
// i.e. GemmEx(OP_T, OP_N, m = n_out, n = T, k = n_in, A = W f16 (lda n_in),
// B = x f16 (ldb n_in), C = y f32 (ldc n_out)), computed in F32. The weight
// is dequantized to F16 a slice of rows at a time (at most kF16SliceBytes),
// each slice's GEMM writing its columns of y.
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/cublas_loader.h"
#include "engine/backends/cuda/matmul/cuda_matmul.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"

namespace loom::cuda {

namespace {

// Dequantized weight rows per GEMM: an 8B's largest matrix (117 MiB) in one.
// H100, llama3-8b Q4_K_M, pp512 (docs/PERFORMANCE.md): 16 MiB slices
// 6,849 tokens/s, 64 MiB 9,995, 128 MiB 11,862, 256 MiB 11,833.
constexpr uint64_t kF16SliceBytes = 256ull << 20;

// LOOM_CUDA_GEMM_SLICE_MIB overrides kF16SliceBytes (for A/B runs).
uint64_t f16_slice_bytes() {
  static const uint64_t bytes = [] {
    const char* e = std::getenv("LOOM_CUDA_GEMM_SLICE_MIB");
    const long mib = e ? std::strtol(e, nullptr, 10) : 0;
    return mib > 0 ? static_cast<uint64_t>(mib) << 20 : kF16SliceBytes;
  }();
  return bytes;
}

// Whether gemm_q takes w by T tokens (past the matvecs).
bool takes_gemm_q(const DevMatrix& w, int64_t T) {
  return T <= gemm_q_max_tokens() && matvec_uses_q8(w.dtype) && w.n_in % 32 == 0;
}

// A device buffer that only grows (old contents are not kept).
struct Scratch {
  void* p = nullptr;
  uint64_t bytes = 0;
  ~Scratch() {
    if (p) (void)cudaFree(p);
  }
  Status ensure(uint64_t need, cudaStream_t s, const char* what) {
    if (need <= bytes) return {};
    // Work queued on the stream may still read the old buffer.
    LOOM_CUDA_TRY(cudaStreamSynchronize(s), "synchronize before growing scratch");
    if (p) (void)cudaFree(p);
    p = nullptr;
    bytes = 0;
    const uint64_t grown = need + need / 4;
    LOOM_TRY(device_alloc(&p, grown, what));
    bytes = grown;
    return {};
  }
};

class MatmulImpl final : public Matmul {
 public:
  MatmulImpl(const CublasApi* api, cublasHandle_t h, int sms) : api_(api), handle_(h), sms_(sms) {}
  ~MatmulImpl() override {
    if (handle_) api_->destroy(handle_);
  }

  Status run(const DevMatrix& w, const float* x, int64_t T, float* y, const float* bias,
             bool accumulate, cudaStream_t s, const Q8Act* xq8) override {
    LOOM_TRY(check(w, T));
    if (T <= kMaxMatvecTokens) {
      const int8_t* xq = nullptr;
      const float2* xd = nullptr;
      LOOM_TRY(prepare_q8(w, x, T, s, xq8, &xq, &xd));
      return matvec(w, nullptr, x, xq, xd, T, y, bias, accumulate, s);
    }
    LOOM_TRY(prepare_f16(w.n_in, x, T, s));
    if (takes_gemm_q(w, T)) return run_gemm_q(w, T, y, bias, accumulate, s);
    LOOM_TRY(gemm_f16(w, T, y, accumulate, s));
    if (bias) LOOM_TRY(add_bias(y, bias, T, w.n_out, s));
    return {};
  }

  Status run_glu(const DevMatrix& gate, const DevMatrix& up, const float* x, int64_t T, float* y,
                 cudaStream_t s, const Q8Act* xq8) override {
    LOOM_TRY(check(gate, T));
    LOOM_TRY(check(up, T));
    if (gate.dtype != up.dtype || gate.n_in != up.n_in || gate.n_out != up.n_out)
      return make_error(ErrorCode::kInvalidArgument,
                        "CUDA matmul_glu: gate (%s, %" PRId64 " x %" PRId64 ") and up (%s, %" PRId64
                        " x %" PRId64 ") differ",
                        std::string(dtype_name(gate.dtype)).c_str(), gate.n_out, gate.n_in,
                        std::string(dtype_name(up.dtype)).c_str(), up.n_out, up.n_in);
    if (T <= kMaxMatvecTokens) {
      const int8_t* xq = nullptr;
      const float2* xd = nullptr;
      LOOM_TRY(prepare_q8(gate, x, T, s, xq8, &xq, &xd));
      return matvec(gate, &up, x, xq, xd, T, y, nullptr, false, s);
    }
    const uint64_t n = static_cast<uint64_t>(T * up.n_out);
    LOOM_TRY(up_.ensure(n * sizeof(float), s, "the FFN up product (scratch)"));
    auto* u = static_cast<float*>(up_.p);
    LOOM_TRY(prepare_f16(gate.n_in, x, T, s));
    if (takes_gemm_q(gate, T)) {
      LOOM_TRY(run_gemm_q(gate, T, y, nullptr, false, s));
      LOOM_TRY(run_gemm_q(up, T, u, nullptr, false, s));
    } else {
      LOOM_TRY(gemm_f16(gate, T, y, false, s));
      LOOM_TRY(gemm_f16(up, T, u, false, s));
    }
    return silu_mul_f32(y, u, y, static_cast<int64_t>(n), s);
  }

  Status run_multi(const DevMatrix* ws, const float* const* biases, float* const* ys, int n,
                   const float* x, int64_t T, cudaStream_t s, const Q8Act* xq8) override {
    if (n <= 0) return {};
    for (int i = 0; i < n; ++i) {
      LOOM_TRY(check(ws[i], T));
      if (ws[i].n_in != ws[0].n_in)
        return make_error(ErrorCode::kInvalidArgument,
                          "CUDA matmul: matrices of one input differ in width (%" PRId64
                          " and %" PRId64 ")",
                          ws[0].n_in, ws[i].n_in);
    }
    if (T <= kMaxMatvecTokens) {
      // One Q8 copy of x serves every quantized matrix (the same 32-value groups).
      const int8_t* xq = nullptr;
      const float2* xd = nullptr;
      for (int i = 0; i < n && !xq; ++i) LOOM_TRY(prepare_q8(ws[i], x, T, s, xq8, &xq, &xd));
      if (matvec_multi_fits(ws, n)) return matvec_multi(ws, n, xq, xd, T, ys, biases, s);
      for (int i = 0; i < n; ++i)
        LOOM_TRY(matvec(ws[i], nullptr, x, xq, xd, T, ys[i], biases[i], false, s));
      return {};
    }
    LOOM_TRY(prepare_f16(ws[0].n_in, x, T, s));
    for (int i = 0; i < n; ++i) {
      if (takes_gemm_q(ws[i], T)) {
        LOOM_TRY(run_gemm_q(ws[i], T, ys[i], biases[i], false, s));
        continue;
      }
      LOOM_TRY(gemm_f16(ws[i], T, ys[i], false, s));
      if (biases[i]) LOOM_TRY(add_bias(ys[i], biases[i], T, ws[i].n_out, s));
    }
    return {};
  }

  uint64_t scratch_bytes() const override {
    return xq_.bytes + xd_.bytes + wf16_.bytes + xf16_.bytes + up_.bytes + part_.bytes;
  }

 private:
  static Status check(const DevMatrix& w, int64_t T) {
    if (!matmul_supported(w.dtype))
      return make_error(ErrorCode::kUnsupported, "CUDA matmul: no kernel for %s weights",
                        std::string(dtype_name(w.dtype)).c_str());
    if (T < 0 || w.n_in <= 0 || w.n_out <= 0 || !w.data)
      return make_error(ErrorCode::kInvalidArgument,
                        "CUDA matmul: %" PRId64 " tokens by a %" PRId64 " x %" PRId64 " matrix", T,
                        w.n_out, w.n_in);
    if (w.n_in > INT32_MAX || w.n_out > INT32_MAX || T > INT32_MAX)
      return make_error(ErrorCode::kUnsupported,
                        "CUDA matmul: a %" PRId64 " x %" PRId64 " matrix is too large", w.n_out,
                        w.n_in);
    return {};
  }

  // Q8 copy of x for quantized weights (xq8's where given); nothing for float ones.
  Status prepare_q8(const DevMatrix& w, const float* x, int64_t T, cudaStream_t s, const Q8Act* xq8,
                    const int8_t** xq, const float2** xd) {
    if (!matvec_uses_q8(w.dtype)) return {};
    if (xq8 && xq8->q) {
      *xq = xq8->q;
      *xd = xq8->d;
      return {};
    }
    const uint64_t n = static_cast<uint64_t>(T * w.n_in);
    LOOM_TRY(xq_.ensure(static_cast<uint64_t>(T) * q8_token_bytes(w.n_in), s, "Q8 activations"));
    LOOM_TRY(xd_.ensure(n / 32 * sizeof(float2), s, "Q8 activation scales"));
    LOOM_TRY(
        quantize_q8(x, T, w.n_in, static_cast<int8_t*>(xq_.p), static_cast<float2*>(xd_.p), s));
    *xq = static_cast<const int8_t*>(xq_.p);
    *xd = static_cast<const float2*>(xd_.p);
    return {};
  }

  // y = xf16_ (prepare_f16 of T tokens) W^T (+ bias) (+ y) through gemm_q.
  Status run_gemm_q(const DevMatrix& w, int64_t T, float* y, const float* bias, bool accumulate,
                    cudaStream_t s) {
    const int splits = gemm_q_splits(w, T, sms_);
    if (splits > 1)
      LOOM_TRY(part_.ensure(static_cast<uint64_t>(splits * T * w.n_out) * sizeof(float), s,
                            "the quantized GEMM's partial sums"));
    return gemm_q(w, static_cast<const uint16_t*>(xf16_.p), T, y, bias, accumulate, splits,
                  static_cast<float*>(part_.p), s);
  }

  // xf16_ = F16 of x [T, n_in].
  Status prepare_f16(int64_t n_in, const float* x, int64_t T, cudaStream_t s) {
    const uint64_t row_f16 = static_cast<uint64_t>(n_in) * 2;
    LOOM_TRY(xf16_.ensure(static_cast<uint64_t>(T) * row_f16, s, "F16 activations"));
    return to_f16(x, T * n_in, static_cast<uint16_t*>(xf16_.p), s);
  }

  // y = xf16_ (prepare_f16 of T tokens) W^T, a slice of W's rows at a time.
  Status gemm_f16(const DevMatrix& w, int64_t T, float* y, bool accumulate, cudaStream_t s) {
    const uint64_t row_f16 = static_cast<uint64_t>(w.n_in) * 2;
    int64_t slice = static_cast<int64_t>(f16_slice_bytes() / row_f16);
    if (slice < 1) slice = 1;
    if (slice > w.n_out) slice = w.n_out;
    LOOM_TRY(wf16_.ensure(static_cast<uint64_t>(slice) * row_f16, s, "F16 weight rows"));
    const auto* xh = static_cast<const uint16_t*>(xf16_.p);
    auto* wh = static_cast<uint16_t*>(wf16_.p);
    cublasStatus_t st = api_->set_stream(handle_, s);
    if (st != CUBLAS_STATUS_SUCCESS)
      return make_error(ErrorCode::kInternal, "cuBLAS set stream: %s", api_->describe(st).c_str());
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    for (int64_t r0 = 0; r0 < w.n_out; r0 += slice) {
      const int64_t n = w.n_out - r0 < slice ? w.n_out - r0 : slice;
      LOOM_TRY(dequant_f16(w, r0, n, wh, s));
      st =
          api_->gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(T),
                        static_cast<int>(w.n_in), &alpha, wh, CUDA_R_16F, static_cast<int>(w.n_in),
                        xh, CUDA_R_16F, static_cast<int>(w.n_in), &beta, y + r0, CUDA_R_32F,
                        static_cast<int>(w.n_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) {
        const ErrorCode code =
            st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal;
        return make_error(code,
                          "cuBLAS GemmEx (%" PRId64 " x %" PRId64 " by %" PRId64 " tokens): %s", n,
                          w.n_in, T, api_->describe(st).c_str());
      }
    }
    return {};
  }

  const CublasApi* api_;
  cublasHandle_t handle_;
  int sms_;  // the device's multiprocessors
  Scratch xq_, xd_, wf16_, xf16_, up_, part_;
};

}  // namespace

int64_t gemm_q_max_tokens() {
  static const int64_t t = [] {
    const char* e = std::getenv("LOOM_CUDA_GEMMQ_TOKENS");
    return e ? static_cast<int64_t>(std::strtol(e, nullptr, 10)) : kMaxGemmQTokens;
  }();
  return t;
}

Result<std::unique_ptr<Matmul>> Matmul::create(int device) {
  LOOM_ASSIGN_OR_RETURN(const CublasApi* api, load_cublas());
  LOOM_CUDA_TRY(cudaSetDevice(device), "select the device for cuBLAS");
  cublasHandle_t h = nullptr;
  const cublasStatus_t st = api->create(&h);
  if (st != CUBLAS_STATUS_SUCCESS)
    return make_error(
        st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kUnsupported,
        "cuBLAS (%s) could not start: %s", api->path.c_str(), api->describe(st).c_str());
  // Tensor cores for the F16 inputs (the default math mode allows them).
  (void)api->set_math_mode(h, CUBLAS_DEFAULT_MATH);
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms < 1)
    sms = 1;
  return std::unique_ptr<Matmul>(std::make_unique<MatmulImpl>(api, h, sms));
}

}  // namespace loom::cuda
