// Decode products (T <= 8 tokens): one warp per output row, reading the row
// once for every token.
//  - Quantized weights: x is first quantized to Q8 (per 32 values a float
//    scale and int8 quants, quantize_q8), then each lane takes whole 32-value
//    groups of the row (lane, lane + 32, ...: a warp reads a contiguous span
//    of blocks), decodes them to int8 (decode_group) and multiplies with dp4a;
//    the Q8 activations are read 128 bits at a time.
//  - F32/F16/BF16: products in float; 128-bit loads of 8 values per lane
//    where the row length is a multiple of 8 and the rows and x are 16-byte
//    aligned, else one value per lane per step.
// Partial sums are reduced across the warp with shuffles; the epilogue adds
// the bias or the old y, or applies silu(gate) * up for the fused FFN input.
#include <cuda_fp16.h>

#include <cinttypes>

#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/matmul/matmul_kernels.h"
#include "engine/backends/cuda/quant_device.cuh"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;  // output rows per block
constexpr int kMaxT = static_cast<int>(kMaxMatvecTokens);

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + expf(-g));
}

// Writes row r's results: lane t writes token t. kT: the tokens the
// accumulators have room for (T <= kT).
template <bool kGlu, int kT = kMaxT>
__device__ __forceinline__ void epilogue(float (&acc)[kT], float (&acc2)[kT], int T, int64_t r,
                                         int64_t n_out, float* y, const float* bias,
                                         int accumulate) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t < T) {
      acc[t] = warp_sum(acc[t]);
      if constexpr (kGlu) acc2[t] = warp_sum(acc2[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (t < T && lane == t) {
      float v = acc[t];
      float* dst = y + t * n_out + r;
      if constexpr (kGlu) {
        v = silu(v) * acc2[t];
      } else {
        if (bias) v += bias[r];
        if (accumulate) v += *dst;
      }
      *dst = v;
    }
  }
}

// Row `row` (and `row2` for the fused gate/up product) against the Q8
// activations: this lane's share of the products, per token. kT: 1 for one
// token (decode: the fewest registers, so the most warps in flight per SM),
// else 8 with T checked at run time.
template <DType D, bool kGlu, bool kVec16, int kT>
__device__ __forceinline__ void row_products(const uint8_t* row, const uint8_t* row2,
                                             int64_t n_groups, const int8_t* xq, const float* xd,
                                             int T, float (&acc)[kT], float (&acc2)[kT]) {
  const int lane = threadIdx.x & 31;
  // Unrolled so that the loads of several groups are in flight at once.
#pragma unroll 4
  for (int64_t g = lane; g < n_groups; g += 32) {
    const QGroup a = decode_group<D, kVec16>(row, g);
    QGroup b{};
    if constexpr (kGlu) b = decode_group<D, kVec16>(row2, g);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (t < T) {
        const int4* x4 = reinterpret_cast<const int4*>(xq + (t * n_groups + g) * 32);
        const int4 p = x4[0], q = x4[1];
        const int xw[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
        const float s = xd[t * n_groups + g];
        acc[t] += group_dot(a, xw, s);
        if constexpr (kGlu) acc2[t] += group_dot(b, xw, s);
      }
    }
  }
}

template <DType D, bool kGlu, bool kVec16, int kT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_q8_kernel(const uint8_t* w, const uint8_t* w2, uint64_t row_bytes, int64_t n_out,
                     int64_t n_groups, const int8_t* xq, const float* xd, int T, float* y,
                     const float* bias, int accumulate) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (r >= n_out) return;  // the whole warp leaves together
  float acc[kT] = {}, acc2[kT] = {};
  row_products<D, kGlu, kVec16, kT>(w + r * row_bytes, kGlu ? w2 + r * row_bytes : nullptr,
                                    n_groups, xq, xd, T, acc, acc2);
  epilogue<kGlu, kT>(acc, acc2, T, r, n_out, y, bias, accumulate);
}

// Up to three matrices of one dtype and row size over the same activations
// (q, k and v) in one launch: the grid runs over their rows end to end.
struct MultiRows {
  const uint8_t* w[3];
  float* y[3];
  const float* bias[3];
  int64_t rows[3];
};

template <DType D, bool kVec16, int kT>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_q8_multi_kernel(MultiRows m, uint64_t row_bytes, int64_t n_groups, const int8_t* xq,
                           const float* xd, int T) {
  int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  int i = 0;
  while (i < 3 && r >= m.rows[i]) r -= m.rows[i++];
  if (i == 3) return;  // the whole warp leaves together
  float acc[kT] = {}, acc2[kT] = {};
  row_products<D, false, kVec16, kT>(m.w[i] + r * row_bytes, nullptr, n_groups, xq, xd, T, acc,
                                     acc2);
  epilogue<false, kT>(acc, acc2, T, r, m.rows[i], m.y[i], m.bias[i], 0);
}

// Eight consecutive values of a row at element i (i a multiple of 8; the row
// 16-byte aligned).
template <DType D>
__device__ __forceinline__ void load8(const uint8_t* row, int64_t i, float (&v)[8]) {
  if constexpr (D == DType::kF32) {
    const float4* p = reinterpret_cast<const float4*>(row) + i / 4;
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 u = *(reinterpret_cast<const uint4*>(row) + i / 8);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const auto lo = static_cast<uint16_t>(words[k] & 0xFFFFu);
      const auto hi = static_cast<uint16_t>(words[k] >> 16);
      if constexpr (D == DType::kF16) {
        v[2 * k] = h2f(lo), v[2 * k + 1] = h2f(hi);
      } else {
        v[2 * k] = bf2f(lo), v[2 * k + 1] = bf2f(hi);
      }
    }
  }
}

template <DType D, bool kVec, bool kGlu>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_float_kernel(const uint8_t* w, const uint8_t* w2, uint64_t row_bytes, int64_t n_out,
                        int64_t n_in, const float* x, int T, float* y, const float* bias,
                        int accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (r >= n_out) return;
  float acc[kMaxT] = {}, acc2[kMaxT] = {};
  const uint8_t* row = w + r * row_bytes;
  const uint8_t* row2 = kGlu ? w2 + r * row_bytes : nullptr;
  if constexpr (kVec) {
    for (int64_t i = 8 * lane; i < n_in; i += 256) {
      float a[8], b[8] = {};
      load8<D>(row, i, a);
      if constexpr (kGlu) load8<D>(row2, i, b);
#pragma unroll
      for (int t = 0; t < kMaxT; ++t) {
        if (t < T) {
          const float4* xp = reinterpret_cast<const float4*>(x + t * n_in + i);
          const float4 p = xp[0], q = xp[1];
          const float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            acc[t] += a[k] * xv[k];
            if constexpr (kGlu) acc2[t] += b[k] * xv[k];
          }
        }
      }
    }
  } else {
    for (int64_t i = lane; i < n_in; i += 32) {
      const float a = dequant_one<D>(row, i);
      const float b = kGlu ? dequant_one<D>(row2, i) : 0.0f;
#pragma unroll
      for (int t = 0; t < kMaxT; ++t) {
        if (t < T) {
          const float xv = x[t * n_in + i];
          acc[t] += a * xv;
          if constexpr (kGlu) acc2[t] += b * xv;
        }
      }
    }
  }
  epilogue<kGlu>(acc, acc2, T, r, n_out, y, bias, accumulate);
}

__global__ void quantize_q8_kernel(const float* x, int64_t n_groups_total, int8_t* xq, float* xd) {
  // One warp per 32-value group; lane j quantizes value j.
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (g >= n_groups_total) return;
  const int lane = threadIdx.x & 31;
  const float v = x[g * 32 + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float q = fminf(fmaxf(roundf(v * id), -127.0f), 127.0f);
  xq[g * 32 + lane] = static_cast<int8_t>(q);
  // The scale rounded to F16, as the CPU's Q8_0 activations keep it: the
  // quants are the CPU's, and so are the products for Q8_0/Q4_0/Q5_x weights.
  if (lane == 0) xd[g] = __half2float(__float2half_rn(d));
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t T, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < T * n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[k] += bias[k % n];
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[k] = silu(g[k]) * u[k];
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Calls f.template operator()<kVec16, kT>() for the Q8 matvec kernels of D:
// 128-bit quant loads only for Q4_K/Q5_K rows that allow them, and one token
// or up to eight.
template <DType D, typename F>
void q8_variant(bool vec16, int T, F&& f) {
  auto by_t = [&]<bool kVec16>() {
    if (T == 1)
      f.template operator()<kVec16, 1>();
    else
      f.template operator()<kVec16, kMaxT>();
  };
  if constexpr (D == DType::kQ4_K || D == DType::kQ5_K) {
    if (vec16) {
      by_t.template operator()<true>();
      return;
    }
  }
  by_t.template operator()<false>();
}

}  // namespace

bool matvec_uses_q8(DType d) {
  return has_group_decode(d);
}

Status quantize_q8(const float* x, int64_t T, int64_t n, int8_t* xq, float* xd, cudaStream_t s) {
  if (n % 32 != 0)
    return make_error(ErrorCode::kInternal, "CUDA quantize_q8: %" PRId64 " is not a multiple of 32",
                      n);
  const int64_t groups = T * n / 32;
  if (groups <= 0) return {};
  constexpr int kThreads = 256;  // 8 groups per block
  const int64_t blocks = (groups + 7) / 8;
  quantize_q8_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, groups, xq, xd);
  return launch_status("quantize_q8");
}

Status matvec(const DevMatrix& w, const DevMatrix* up, const float* x, const int8_t* xq,
              const float* xd, int64_t T, float* y, const float* bias, bool accumulate,
              cudaStream_t s) {
  if (T <= 0) return {};
  if (T > kMaxMatvecTokens)
    return make_error(ErrorCode::kInternal, "CUDA matvec: %" PRId64 " tokens (at most 8)", T);
  if (up && (up->dtype != w.dtype || up->n_in != w.n_in || up->n_out != w.n_out ||
             up->row_bytes != w.row_bytes))
    return make_error(ErrorCode::kInternal, "CUDA matvec: gate and up differ in shape or type");
  const auto* p = static_cast<const uint8_t*>(w.data);
  const auto* p2 = up ? static_cast<const uint8_t*>(up->data) : nullptr;
  const unsigned blocks = static_cast<unsigned>((w.n_out + kWarps - 1) / kWarps);
  const int t = static_cast<int>(T);
  const int acc = accumulate ? 1 : 0;
  if (has_group_decode(w.dtype)) {
    const int64_t n_groups = w.n_in / 32;
    // 128-bit loads of Q4_K/Q5_K quants where every row starts 16-byte aligned.
    const bool vec16 = w.row_bytes % 16 == 0 && aligned16(p) && (!p2 || aligned16(p2));
    dispatch_dtype(w.dtype, [&]<DType D>() {
      if constexpr (has_group_decode(D)) {
        q8_variant<D>(vec16, t, [&]<bool kVec16, int kT>() {
          if (up)
            matvec_q8_kernel<D, true, kVec16, kT><<<blocks, kWarps * 32, 0, s>>>(
                p, p2, w.row_bytes, w.n_out, n_groups, xq, xd, t, y, nullptr, 0);
          else
            matvec_q8_kernel<D, false, kVec16, kT><<<blocks, kWarps * 32, 0, s>>>(
                p, nullptr, w.row_bytes, w.n_out, n_groups, xq, xd, t, y, bias, acc);
        });
      }
    });
    return launch_status("matvec_q8");
  }
  const bool vec = w.n_in % 8 == 0 && w.row_bytes % 16 == 0 && aligned16(p) &&
                   (!p2 || aligned16(p2)) && aligned16(x);
  const bool launched = dispatch_dtype(w.dtype, [&]<DType D>() {
    if constexpr (D == DType::kF32 || D == DType::kF16 || D == DType::kBF16) {
      if (vec) {
        if (up)
          matvec_float_kernel<D, true, true><<<blocks, kWarps * 32, 0, s>>>(
              p, p2, w.row_bytes, w.n_out, w.n_in, x, t, y, nullptr, 0);
        else
          matvec_float_kernel<D, true, false><<<blocks, kWarps * 32, 0, s>>>(
              p, nullptr, w.row_bytes, w.n_out, w.n_in, x, t, y, bias, acc);
      } else {
        if (up)
          matvec_float_kernel<D, false, true><<<blocks, kWarps * 32, 0, s>>>(
              p, p2, w.row_bytes, w.n_out, w.n_in, x, t, y, nullptr, 0);
        else
          matvec_float_kernel<D, false, false><<<blocks, kWarps * 32, 0, s>>>(
              p, nullptr, w.row_bytes, w.n_out, w.n_in, x, t, y, bias, acc);
      }
    }
  });
  if (!launched)
    return make_error(ErrorCode::kUnsupported, "CUDA matvec: no kernel for %s weights",
                      std::string(dtype_name(w.dtype)).c_str());
  return launch_status("matvec_float");
}

bool matvec_multi_fits(const DevMatrix* ws, int n) {
  if (n < 2 || n > 3 || !has_group_decode(ws[0].dtype)) return false;
  for (int i = 1; i < n; ++i)
    if (ws[i].dtype != ws[0].dtype || ws[i].row_bytes != ws[0].row_bytes ||
        ws[i].n_in != ws[0].n_in)
      return false;
  return true;
}

Status matvec_multi(const DevMatrix* ws, int n, const int8_t* xq, const float* xd, int64_t T,
                    float* const* ys, const float* const* biases, cudaStream_t s) {
  if (!matvec_multi_fits(ws, n))
    return make_error(ErrorCode::kInternal, "CUDA matvec_multi: matrices of different kinds");
  if (T <= 0) return {};
  if (T > kMaxMatvecTokens)
    return make_error(ErrorCode::kInternal, "CUDA matvec: %" PRId64 " tokens (at most 8)", T);
  MultiRows m{};
  int64_t total = 0;
  bool vec16 = ws[0].row_bytes % 16 == 0;
  for (int i = 0; i < n; ++i) {
    m.w[i] = static_cast<const uint8_t*>(ws[i].data);
    m.y[i] = ys[i];
    m.bias[i] = biases[i];
    m.rows[i] = ws[i].n_out;
    total += ws[i].n_out;
    vec16 = vec16 && aligned16(m.w[i]);
  }
  const unsigned blocks = static_cast<unsigned>((total + kWarps - 1) / kWarps);
  const int64_t n_groups = ws[0].n_in / 32;
  const int t = static_cast<int>(T);
  dispatch_dtype(ws[0].dtype, [&]<DType D>() {
    if constexpr (has_group_decode(D)) {
      q8_variant<D>(vec16, t, [&]<bool kVec16, int kT>() {
        matvec_q8_multi_kernel<D, kVec16, kT>
            <<<blocks, kWarps * 32, 0, s>>>(m, ws[0].row_bytes, n_groups, xq, xd, t);
      });
    }
  });
  return launch_status("matvec_q8_multi");
}

Status add_bias(float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T * n <= 0) return {};
  add_bias_kernel<<<grid_for(T * n, 256), 256, 0, s>>>(y, bias, T, n);
  return launch_status("add_bias");
}

Status silu_mul_f32(const float* g, const float* u, float* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return {};
  silu_mul_kernel<<<grid_for(n, 256), 256, 0, s>>>(g, u, out, n);
  return launch_status("silu_mul");
}

}  // namespace loom::cuda
