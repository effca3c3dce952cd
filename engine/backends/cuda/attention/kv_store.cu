// kv_store: one token's K and V rows written into a layer's device cache,
// converted to its dtype exactly as the host cache stores them (F16 rounded
// to nearest even; Q8_0 as ref::quantize_row_q8_0: d = amax / 127 stored as
// F16, quants round(x / d) with halves away from zero).
#include <cuda_fp16.h>

#include <cinttypes>

#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/backends/cuda/cuda_util.h"
#include "engine/backends/cuda/pdl.cuh"

namespace loom::cuda {

namespace {

// F16: one thread per value. Grid: x over values of a row, y = token, z = 0 (K) or 1 (V).
__global__ void kv_store_f16_kernel(uint8_t* kc, uint8_t* vc, const float* k, const float* v,
                                    const int32_t* pos, int64_t n_kv_heads, int64_t head_dim,
                                    int64_t capacity) {
  const int64_t t = blockIdx.y;
  const int64_t width = n_kv_heads * head_dim;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= width) return;
  const int64_t p = pos[t];
  if (p < 0 || p >= capacity) return;  // the host checks positions first
  const int64_t h = i / head_dim, d = i % head_dim;
  const float* src = blockIdx.z == 0 ? k : v;
  auto* dst = reinterpret_cast<__half*>(blockIdx.z == 0 ? kc : vc);
  dst[(h * capacity + p) * head_dim + d] = __float2half_rn(src[t * width + i]);
}

// Q8_0: one warp per 32-value block, lane j quantizes value j.
__global__ void kv_store_q8_kernel(uint8_t* kc, uint8_t* vc, const float* k, const float* v,
                                   const int32_t* pos, int64_t n_kv_heads, int64_t head_dim,
                                   int64_t capacity, uint64_t row_bytes) {
  const int64_t t = blockIdx.y;
  const int64_t width = n_kv_heads * head_dim;
  const int64_t blocks_per_token = width / 32;
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (b >= blocks_per_token) return;
  const int lane = threadIdx.x & 31;
  const int64_t p = pos[t];
  if (p < 0 || p >= capacity) return;
  const float* src = blockIdx.z == 0 ? k : v;
  uint8_t* cache = blockIdx.z == 0 ? kc : vc;
  const float x = src[t * width + b * 32 + lane];
  float amax = fabsf(x);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const int64_t h = (b * 32) / head_dim, blk = ((b * 32) % head_dim) / 32;
  uint8_t* dst = cache + (h * capacity + p) * row_bytes + blk * 34;
  // roundf rounds halves away from zero, as the reference quantizer does.
  const float q = fminf(fmaxf(roundf(x * id), -128.0f), 127.0f);
  dst[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(q));
  // One 16-bit store (blocks start at even offsets: rows of 34-byte blocks in
  // a cudaMalloc'd buffer). Two byte stores of the half's bits came back with
  // the low byte 0 on the H200 (sm_90, CUDA 13.0).
  if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
}

// RoPE of q and k and the store of the rotated k and of v, in one launch.
// Grid: x over head slots (n_heads q heads, then n_kv_heads k heads, then
// n_kv_heads v heads), y = token; a block of head_dim threads (a multiple of
// 32), thread d owning element d of its head. Every thread reads its pair
// before any writes (block barrier), rotates with cpu::rope's expressions
// (as rope_kernel of cuda_ops.cu), writes q and k back, and the k and v
// slots store the row into the cache as kv_store_f16/q8_kernel do.
template <bool kQ8>
__global__ void rope_kv_store_kernel(float* q, float* k, const float* v, uint8_t* kc, uint8_t* vc,
                                     const int32_t* pos, int64_t n_heads, int64_t n_kv_heads,
                                     int64_t head_dim, int64_t n_pairs, int neox, const float* cs,
                                     int64_t capacity, uint64_t row_bytes, const RowKv* rows) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.y;
  if (rows) {  // this row's sequence's cache
    kc = static_cast<uint8_t*>(const_cast<void*>(rows[t].k));
    vc = static_cast<uint8_t*>(const_cast<void*>(rows[t].v));
    capacity = rows[t].capacity;
  }
  const int64_t slot = blockIdx.x;
  const int d = threadIdx.x;
  const int kind = slot < n_heads ? 0 : (slot < n_heads + n_kv_heads ? 1 : 2);  // q, k, v
  const int64_t h = kind == 0 ? slot : (kind == 1 ? slot - n_heads : slot - n_heads - n_kv_heads);
  float* row = kind == 0 ? q + (t * n_heads + h) * head_dim
                         : (kind == 1 ? k + (t * n_kv_heads + h) * head_dim : nullptr);
  float val;
  if (kind == 2) {
    val = v[(t * n_kv_heads + h) * head_dim + d];
  } else {
    val = row[d];
    if (d < 2 * n_pairs) {
      const int64_t i = neox ? d % n_pairs : d / 2;
      const bool second = neox ? d >= n_pairs : (d & 1) != 0;
      const int64_t i0 = neox ? i : 2 * i;
      const int64_t i1 = neox ? i + n_pairs : 2 * i + 1;
      const float c = cs[(t * n_pairs + i) * 2], sn = cs[(t * n_pairs + i) * 2 + 1];
      const float x0 = row[i0], x1 = row[i1];
      val = second ? x0 * sn + x1 * c : x0 * c - x1 * sn;
    }
    __syncthreads();  // the pair read by every thread before any writes (uniform: kind is per
                      // block)
    row[d] = val;
  }
  if (kind == 0) return;
  const int64_t p = pos[t];
  if (p < 0 || p >= capacity) return;  // the host checks positions first
  uint8_t* cache = kind == 1 ? kc : vc;
  if constexpr (!kQ8) {
    reinterpret_cast<__half*>(cache)[(h * capacity + p) * head_dim + d] = __float2half_rn(val);
  } else {
    const int lane = d & 31;
    float amax = fabsf(val);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const float dq = amax / 127.0f;
    const float id = dq != 0.0f ? 1.0f / dq : 0.0f;
    uint8_t* dst = cache + (h * capacity + p) * row_bytes + (d / 32) * 34;
    const float qv = fminf(fmaxf(roundf(val * id), -128.0f), 127.0f);
    dst[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(qv));
    if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(dq);
  }
}

}  // namespace

bool rope_kv_store_fits(const DevKvLayer& layer, int64_t head_dim) {
  return layer.head_dim == head_dim && head_dim % 32 == 0 && head_dim <= 1024 &&
         (layer.dtype == DType::kF16 || layer.dtype == DType::kQ8_0);
}

Status rope_kv_store(const DevKvLayer& layer, float* q, int64_t n_heads, float* k, const float* v,
                     int64_t T, int64_t n_pairs, bool neox, const float* cs, const int32_t* pos,
                     cudaStream_t s, const RowKv* rows) {
  if (T <= 0) return {};
  if (!rows && (!layer.k || !layer.v))
    return make_error(ErrorCode::kInternal, "CUDA rope_kv_store: the layer is not on the device");
  if (!rope_kv_store_fits(layer, layer.head_dim) || T > 65535)
    return make_error(ErrorCode::kUnsupported,
                      "CUDA rope_kv_store: a %s cache of head_dim %" PRId64 ", %" PRId64 " tokens",
                      std::string(dtype_name(layer.dtype)).c_str(), layer.head_dim, T);
  const dim3 grid(static_cast<unsigned>(n_heads + 2 * layer.n_kv_heads), static_cast<unsigned>(T));
  const unsigned threads = static_cast<unsigned>(layer.head_dim);
  auto* kc = static_cast<uint8_t*>(layer.k);
  auto* vc = static_cast<uint8_t*>(layer.v);
  if (layer.dtype == DType::kQ8_0)
    (void)launch_chained(rope_kv_store_kernel<true>, grid, threads, 0, s, q, k, v, kc, vc, pos,
                         n_heads, layer.n_kv_heads, layer.head_dim, n_pairs, neox ? 1 : 0, cs,
                         layer.capacity, layer.row_bytes, rows);
  else
    (void)launch_chained(rope_kv_store_kernel<false>, grid, threads, 0, s, q, k, v, kc, vc, pos,
                         n_heads, layer.n_kv_heads, layer.head_dim, n_pairs, neox ? 1 : 0, cs,
                         layer.capacity, layer.row_bytes, rows);
  return launch_status("rope_kv_store");
}

Status kv_store(const DevKvLayer& layer, const float* k, const float* v, int64_t T,
                const int32_t* pos, cudaStream_t s) {
  if (T <= 0) return {};
  if (!layer.k || !layer.v)
    return make_error(ErrorCode::kInternal, "CUDA kv_store: the layer is not on the device");
  if (T > 65535)
    return make_error(ErrorCode::kUnsupported, "CUDA kv_store: %" PRId64 " tokens at once", T);
  auto* kc = static_cast<uint8_t*>(layer.k);
  auto* vc = static_cast<uint8_t*>(layer.v);
  const int64_t width = layer.n_kv_heads * layer.head_dim;
  if (layer.dtype == DType::kF16) {
    const dim3 grid(static_cast<unsigned>((width + 255) / 256), static_cast<unsigned>(T), 2);
    kv_store_f16_kernel<<<grid, 256, 0, s>>>(kc, vc, k, v, pos, layer.n_kv_heads, layer.head_dim,
                                             layer.capacity);
    return launch_status("kv_store_f16");
  }
  if (layer.dtype == DType::kQ8_0 && layer.head_dim % 32 == 0) {
    const int64_t blocks = width / 32;
    const dim3 grid(static_cast<unsigned>((blocks + 7) / 8), static_cast<unsigned>(T), 2);
    kv_store_q8_kernel<<<grid, 256, 0, s>>>(kc, vc, k, v, pos, layer.n_kv_heads, layer.head_dim,
                                            layer.capacity, layer.row_bytes);
    return launch_status("kv_store_q8_0");
  }
  return make_error(ErrorCode::kUnsupported, "CUDA kv_store: a %s cache of head_dim %" PRId64,
                    std::string(dtype_name(layer.dtype)).c_str(), layer.head_dim);
}

}  // namespace loom::cuda
