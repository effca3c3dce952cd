// Causal GQA attention over a layer's device K/V (cuda_attention.h), with
// the semantics of cpu::attention: query t sees positions 0 .. pos[t].
//
// Two kernels, both with an online softmax (running max m, sum l, and the
// weighted sum o of V, rescaled as the max grows), all in float:
//  - decode (T <= kMaxSplitTokens): split-K flash decoding, a block per
//    group of query heads sharing a KV head and per split of the keys
//    (decode_attention.cu), and a merge of the splits.
//  - tile (prefill): grid (head, 16-query tile). The block's 16 queries
//    share each tile of 16 keys and values, dequantized once into shared
//    memory; each warp runs 4 of the queries over the tile. Prompts take
//    flash_prefill.cu (tensor cores) instead for head_dim 64/80/96/128/256.
// head_dim up to 256 (8 values per lane); K/V rows F16 or Q8_0.
#include <cuda_fp16.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/backends/cuda/attention/decode_attention.h"
#include "engine/backends/cuda/attention/flash_prefill.h"
#include "engine/backends/cuda/cuda_util.h"

namespace loom::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kTileQ = 16;  // queries per tile block (kWarps x kQPerWarp)
constexpr int kQPerWarp = kTileQ / kWarps;
constexpr int kTileK = 16;  // keys per shared-memory tile
constexpr int64_t kMaxSplitTokens = 8;

struct KvFmt {
  int64_t capacity;
  uint64_t row_bytes;
  int head_dim;
  bool q8;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Value d of a K or V row.
__device__ __forceinline__ float kv_at(const uint8_t* row, int d, bool q8) {
  if (!q8) return __half2float(reinterpret_cast<const __half*>(row)[d]);
  const uint8_t* blk = row + (d / 32) * 34;
  const float scale = __half2float(*reinterpret_cast<const __half*>(blk));
  return scale * static_cast<float>(static_cast<int8_t>(blk[2 + d % 32]));
}

__device__ __forceinline__ const uint8_t* kv_row(const uint8_t* base, const KvFmt& f, int kvh,
                                                 int64_t j) {
  return base + (static_cast<int64_t>(kvh) * f.capacity + j) * f.row_bytes;
}

template <int kD>
__global__ void __launch_bounds__(kWarps * 32)
    attn_tile_kernel(const uint8_t* kc, const uint8_t* vc, KvFmt f, const float* q,
                     const int32_t* pos, int T, int n_heads, int group, float scale, float* out) {
  __shared__ float ks[kTileK][kD * 32];
  __shared__ float vs[kTileK][kD * 32];
  __shared__ int max_pos_s;
  const int h = blockIdx.x, q0 = blockIdx.y * kTileQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int kvh = h / group;
  const int hd = f.head_dim;
  if (threadIdx.x == 0) {
    int mp = -1;
    for (int i = 0; i < kTileQ && q0 + i < T; ++i) mp = max(mp, pos[q0 + i]);
    max_pos_s = mp;
  }
  float qr[kQPerWarp][kD], o[kQPerWarp][kD], m[kQPerWarp], l[kQPerWarp];
  int qpos[kQPerWarp];
#pragma unroll
  for (int a = 0; a < kQPerWarp; ++a) {
    const int tq = q0 + warp * kQPerWarp + a;
    qpos[a] = tq < T ? pos[tq] : -1;  // -1: no query (sees no key)
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int i = 0; i < kD; ++i) {
      const int d = lane + 32 * i;
      qr[a][i] =
          tq < T && d < hd ? q[(static_cast<int64_t>(tq) * n_heads + h) * hd + d] * scale : 0.0f;
      o[a][i] = 0.0f;
    }
  }
  __syncthreads();
  const int max_pos = max_pos_s;
  for (int j0 = 0; j0 <= max_pos; j0 += kTileK) {
    for (int idx = threadIdx.x; idx < kTileK * kD * 32; idx += kWarps * 32) {
      const int key = idx / (kD * 32), d = idx % (kD * 32);
      const int j = j0 + key;
      const bool in = j <= max_pos && d < hd;
      ks[key][d] = in ? kv_at(kv_row(kc, f, kvh, j), d, f.q8) : 0.0f;
      vs[key][d] = in ? kv_at(kv_row(vc, f, kvh, j), d, f.q8) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kQPerWarp; ++a) {
      // Uniform across the warp: the query and its position are the warp's.
      const int n = qpos[a] - j0 + 1 < kTileK ? qpos[a] - j0 + 1 : kTileK;
      for (int key = 0; key < n; ++key) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kD; ++i) dot += qr[a][i] * ks[key][lane + 32 * i];
        dot = warp_sum(dot);
        const float m_new = fmaxf(m[a], dot);
        const float corr = expf(m[a] - m_new);
        const float p = expf(dot - m_new);
        l[a] = l[a] * corr + p;
#pragma unroll
        for (int i = 0; i < kD; ++i) o[a][i] = o[a][i] * corr + p * vs[key][lane + 32 * i];
        m[a] = m_new;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int a = 0; a < kQPerWarp; ++a) {
    const int tq = q0 + warp * kQPerWarp + a;
    if (tq >= T) continue;
#pragma unroll
    for (int i = 0; i < kD; ++i) {
      const int d = lane + 32 * i;
      if (d < hd)
        out[(static_cast<int64_t>(tq) * n_heads + h) * hd + d] =
            l[a] > 0.0f ? o[a][i] / l[a] : 0.0f;
    }
  }
}

template <typename F>
bool with_kd(int64_t head_dim, F&& f) {
  if (head_dim <= 32) return f.template operator()<1>(), true;
  if (head_dim <= 64) return f.template operator()<2>(), true;
  if (head_dim <= 128) return f.template operator()<4>(), true;
  if (head_dim <= 256) return f.template operator()<8>(), true;
  return false;
}

}  // namespace

// ---- scratch --------------------------------------------------------------------

AttentionScratch::~AttentionScratch() {
  if (data_) (void)cudaFree(data_);
}

std::unique_ptr<AttentionScratch> AttentionScratch::create() {
  return std::make_unique<AttentionScratch>();
}

Status AttentionScratch::ensure(uint64_t bytes, cudaStream_t s) {
  if (bytes <= bytes_) return {};
  LOOM_CUDA_TRY(cudaStreamSynchronize(s), "synchronize before growing attention scratch");
  if (data_) (void)cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
  const uint64_t grown = bytes + bytes / 2;
  LOOM_TRY(device_alloc(&data_, grown, "attention partial results (scratch)"));
  bytes_ = grown;
  return {};
}

int AttentionScratch::sm_count() {
  if (sm_count_ == 0) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0)
      sm_count_ = n;
    else
      sm_count_ = 132;
  }
  return sm_count_;
}

// ---- attention ------------------------------------------------------------------

bool attention_writes_q8(const DevKvLayer& layer, int64_t T, const AttentionScratch& scratch) {
  return T >= 1 && T <= kMaxSplitTokens && (scratch.kernel() == 0 || scratch.kernel() == 2) &&
         layer.head_dim % 32 == 0;
}

Status attention(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                 int64_t max_pos, int64_t n_heads, float scale, float* out,
                 AttentionScratch& scratch, cudaStream_t s, int64_t plan_keys, const Q8Out* q8) {
  if (T <= 0) return {};
  if (!layer.k || !layer.v)
    return make_error(ErrorCode::kInternal, "CUDA attention: the layer is not on the device");
  if (layer.n_kv_heads <= 0 || n_heads % layer.n_kv_heads != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "CUDA attention: %" PRId64 " query heads over %" PRId64 " KV heads", n_heads,
                      layer.n_kv_heads);
  if (max_pos < 0 || max_pos >= layer.capacity)
    return make_error(ErrorCode::kOutOfRange,
                      "CUDA attention: position %" PRId64 " outside the cache (%" PRId64
                      " tokens reserved)",
                      max_pos, layer.capacity);
  if (T > 65535 || n_heads > 65535)
    return make_error(ErrorCode::kUnsupported,
                      "CUDA attention: %" PRId64 " tokens x %" PRId64 " heads in one call", T,
                      n_heads);
  if (layer.dtype != DType::kF16 && !(layer.dtype == DType::kQ8_0 && layer.head_dim % 32 == 0))
    return make_error(ErrorCode::kUnsupported, "CUDA attention: a %s cache of head_dim %" PRId64,
                      std::string(dtype_name(layer.dtype)).c_str(), layer.head_dim);
  const KvFmt f{layer.capacity, layer.row_bytes, static_cast<int>(layer.head_dim),
                layer.dtype == DType::kQ8_0};
  const auto* kc = static_cast<const uint8_t*>(layer.k);
  const auto* vc = static_cast<const uint8_t*>(layer.v);
  const int group = static_cast<int>(n_heads / layer.n_kv_heads);
  const int nh = static_cast<int>(n_heads);

  const bool split = scratch.kernel() == 2 || (scratch.kernel() == 0 && T <= kMaxSplitTokens);
  if (!split) {
    // Tensor cores (flash_prefill.cu) for the head_dims they have kernels for,
    // unless tiles are forced (kernel 1) or LOOM_CUDA_ATTN=tile switches them off.
    const bool one_stage = scratch.kernel() == kAttnKernelFlashOneStage;
    if (scratch.kernel() == kAttnKernelFlash || one_stage ||
        (scratch.kernel() == 0 && flash_prefill_enabled() &&
         flash_prefill_supports(layer.head_dim)))
      return flash_prefill(layer, q, T, pos, n_heads, scale, out, s, one_stage);
    const dim3 grid(static_cast<unsigned>(n_heads),
                    static_cast<unsigned>((T + kTileQ - 1) / kTileQ));
    const bool ok = with_kd(layer.head_dim, [&]<int kD>() {
      attn_tile_kernel<kD><<<grid, kWarps * 32, 0, s>>>(kc, vc, f, q, pos, static_cast<int>(T), nh,
                                                        group, scale, out);
    });
    if (!ok)
      return make_error(ErrorCode::kUnsupported,
                        "CUDA attention: head_dim %" PRId64 " (at most 256)", layer.head_dim);
    return launch_status("attention (tile)");
  }

  // Decode: split-K over the planned keys (decode_attention.cu).
  const int64_t n_ctx = std::min(std::max(max_pos + 1, plan_keys), layer.capacity);
  return detail::decode_attention(layer, q, T, pos, n_ctx, nh, scale, scratch.split_keys(), scratch,
                                  out, s,
                                  q8 && attention_writes_q8(layer, T, scratch) ? q8 : nullptr);
}

Status attention_rows(const DevKvLayer& layer, const RowKv* rows, const float* q, int64_t T,
                      const int32_t* pos, int64_t plan_keys, int64_t n_heads, float scale,
                      float* out, AttentionScratch& scratch, cudaStream_t s) {
  if (T <= 0) return {};
  if (!rows || layer.n_kv_heads <= 0 || n_heads % layer.n_kv_heads != 0 || n_heads > INT32_MAX)
    return make_error(ErrorCode::kInvalidArgument,
                      "CUDA attention_rows: %" PRId64 " heads over %" PRId64 " KV heads", n_heads,
                      layer.n_kv_heads);
  return detail::decode_attention(layer, q, T, pos, plan_keys, static_cast<int>(n_heads), scale,
                                  scratch.split_keys(), scratch, out, s, nullptr, nullptr, nullptr,
                                  rows);
}

}  // namespace loom::cuda
