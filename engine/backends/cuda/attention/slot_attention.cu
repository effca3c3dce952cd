// Attention over a layer of the device KV tier (cuda_attention.h, "The
// device KV tier"): the layer's rows are slots of whole blocks, which the
// KvCache fills and empties as its policy moves blocks between the GPU and
// the host.
//  - attention_slots: the split-K decode kernel (decode_attention.cu) under
//    the slot map, its splits merged, or kept for the host's partial;
//  - gather_blocks: the blocks up to a prefill chunk's last position copied
//    by position into one K/V pair (slots from the layer, host blocks from a
//    staging copy), over which the flash prefill runs as over a whole layer.
#include <cinttypes>

#include "engine/backends/cuda/attention/cuda_attention.h"
#include "engine/backends/cuda/attention/decode_attention.h"
#include "engine/backends/cuda/cuda_util.h"

namespace loom::cuda {

namespace {

constexpr int kGatherThreads = 256;

// Grid (block, KV head, K or V): one head's rows of one block, 16 bytes a thread.
__global__ void gather_kernel(const uint8_t* lk, const uint8_t* lv, int64_t capacity,
                              uint64_t block_bytes, int64_t bs, const int32_t* src,
                              const uint8_t* staged, int n_kv_heads, int64_t g_rows, uint8_t* gk,
                              uint8_t* gv) {
  const int64_t b = blockIdx.x;
  const int h = blockIdx.y;
  const bool is_v = blockIdx.z == 1;
  const int32_t from = src[b];
  const uint64_t row_bytes = block_bytes / static_cast<uint64_t>(bs);
  const uint8_t* in;
  if (from >= 0) {
    in = (is_v ? lv : lk) + (static_cast<uint64_t>(h) * static_cast<uint64_t>(capacity) +
                             static_cast<uint64_t>(from) * static_cast<uint64_t>(bs)) *
                                row_bytes;
  } else {
    const auto i = static_cast<uint64_t>(-from - 1);
    in = staged +
         ((i * 2 + (is_v ? 1 : 0)) * static_cast<uint64_t>(n_kv_heads) + static_cast<uint64_t>(h)) *
             block_bytes;
  }
  uint8_t* out = (is_v ? gv : gk) + (static_cast<uint64_t>(h) * static_cast<uint64_t>(g_rows) +
                                     static_cast<uint64_t>(b) * static_cast<uint64_t>(bs)) *
                                        row_bytes;
  const uint64_t n16 = block_bytes / 16;
  for (uint64_t i = threadIdx.x; i < n16; i += kGatherThreads)
    reinterpret_cast<uint4*>(out)[i] = reinterpret_cast<const uint4*>(in)[i];
}

}  // namespace

Status attention_slots(const DevKvLayer& layer, const float* q, int64_t T, const int32_t* pos,
                       int64_t n_heads, float scale, const SlotMap& slots, int64_t split_rows,
                       float* out, AttentionScratch& scratch, cudaStream_t s, SplitPartials* keep,
                       const Q8Out* q8) {
  if (T <= 0) return {};
  if (!layer.k || !layer.v || !slots.first_pos)
    return make_error(ErrorCode::kInternal,
                      "CUDA attention: the slotted layer is not on the device");
  if (layer.n_kv_heads <= 0 || n_heads % layer.n_kv_heads != 0 || T > 65535 || n_heads > 65535)
    return make_error(ErrorCode::kInvalidArgument,
                      "CUDA attention: %" PRId64 " tokens, %" PRId64 " query heads over %" PRId64
                      " KV heads",
                      T, n_heads, layer.n_kv_heads);
  if (slots.n_slots <= 0 || slots.n_slots * slots.block_size > layer.capacity)
    return make_error(ErrorCode::kOutOfRange,
                      "CUDA attention: %" PRId64 " slots of %" PRId64
                      " rows in a layer of %" PRId64,
                      slots.n_slots, slots.block_size, layer.capacity);
  if (slots.host && (slots.n_host <= 0 || slots.host_head_bytes == 0 || slots.host_v_offset == 0))
    return make_error(ErrorCode::kInvalidArgument,
                      "CUDA attention: %" PRId64 " host blocks of %" PRIu64 " bytes a head",
                      slots.n_host, slots.host_head_bytes);
  return detail::decode_attention(
      layer, q, T, pos, 0, static_cast<int>(n_heads), scale, split_rows, scratch, out, s,
      q8 && attention_writes_q8(layer, T, scratch) ? q8 : nullptr, &slots, keep);
}

Status gather_blocks(const DevKvLayer& layer, int64_t block_size, const int32_t* src,
                     int64_t n_blocks, const uint8_t* staged, void* gk, void* gv, cudaStream_t s) {
  if (n_blocks <= 0) return {};
  const uint64_t block_bytes = static_cast<uint64_t>(block_size) * layer.row_bytes;
  if (block_bytes % 16 != 0 || n_blocks > 0x7FFFFFFF || layer.n_kv_heads > 65535)
    return make_error(ErrorCode::kUnsupported,
                      "CUDA KV gather: blocks of %" PRIu64 " bytes per head, %" PRId64 " blocks",
                      block_bytes, n_blocks);
  const dim3 grid(static_cast<unsigned>(n_blocks), static_cast<unsigned>(layer.n_kv_heads), 2);
  gather_kernel<<<grid, kGatherThreads, 0, s>>>(
      static_cast<const uint8_t*>(layer.k), static_cast<const uint8_t*>(layer.v), layer.capacity,
      block_bytes, block_size, src, staged, static_cast<int>(layer.n_kv_heads),
      n_blocks * block_size, static_cast<uint8_t*>(gk), static_cast<uint8_t*>(gv));
  return launch_status("KV gather");
}

}  // namespace loom::cuda
