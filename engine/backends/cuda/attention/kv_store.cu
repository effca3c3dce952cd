// kv_store: one token's K and V rows written into a layer's device cache,
// converted to its dtype exactly as the host cache stores them (F16 rounded
// to nearest even; Q8_0 as ref::quantize_row_q8_0: d = amax / 127 stored as
// F16, quants round(x / d) with halves away from zero).
#include <cuda_fp16.h>

#include <cinttypes>

#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/backends/cuda/cuda_util.h"

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

}  // namespace

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
