// The CUDA backend's side of the device KV tier (KvTierConfig::device_budget,
// kv_cache_device.cpp): layers whose K/V live partly in device slots and
// partly in host blocks.
//  - kv_store (store_rows): a token goes to the slot row the cache names;
//    a token whose block is a host block (a recompute of a block lost on
//    the SSD) is stored by the cache, and while recomputing the slots stay
//    as they are.
//  - decode (attention_split), host blocks in mapped pinned memory (the
//    storage gives the tiered layers' host blocks from it), no attention
//    mass wanted and at most tier_gpu_read_ bytes of them: one launch of
//    the one-pass kernel over the slots and then the host blocks, which it
//    reads from a device copy the copy engine made on a second stream while
//    the layer before ran, or else over PCIe where they lie
//    (attention_mapped); nothing waits for the host. Stores, attention and
//    copies are launches (CudaBackend::launch), so that a decode step over
//    tiered layers is a CUDA graph too: its copies a branch on the second
//    stream, joined by events inside the capture.
//  - decode otherwise (more host bytes, Q8_0 rows, the mass, a spilled
//    block's staging copy, LOOM_CUDA_KV_HOST=cpu): the split-K kernel over
//    the slots under the slot map, splits kept; the CPU attends over the
//    host blocks where they lie (no host block is copied up to be read
//    once) into the one split left free, and the merge kernel combines them
//    exactly. Without the attention mass, q comes down first and the CPU
//    works while the GPU does, and where the host blocks are all pinned the
//    GPU reads the newest tier_gpu_share_ percent of them over PCIe in the
//    same launch (PCIe and the CPU's memory bus both busy); with the mass,
//    the splits' (max, sum) come down too (one split per slot).
//  - prompts (16 query rows or more): the layer's blocks are gathered by
//    position into one K/V pair (host blocks over PCIe once per chunk) and
//    the flash prefill runs over it; without device memory for that, the
//    query rows go through the split path in groups.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/ops.h"
#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/launch_key.h"

namespace loom {

using namespace launch_key;  // NOLINT(google-build-using-namespace)

namespace {

constexpr int64_t kGatherMinRows = 16;           // query rows from which a prompt gathers
constexpr uint64_t kSplitGroupBytes = 64 << 20;  // partials of one group of query rows

}  // namespace

Status CudaBackend::tier_host(uint64_t bytes) {
  // Earlier copies from or into the buffer must be done before it is rewritten.
  LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "a queued kernel");
  if (bytes <= tier_host_bytes_) return {};
  if (tier_host_) (void)cudaFreeHost(tier_host_);
  tier_host_ = nullptr;
  tier_host_bytes_ = 0;
  const uint64_t want = bytes + bytes / 4;
  LOOM_CUDA_TRY(cudaMallocHost(&tier_host_, want), "allocate pinned memory for the KV tier");
  tier_host_bytes_ = want;
  return {};
}

const int32_t* CudaBackend::put_slot_map(KvCache& kv, int64_t layer, int64_t n_slots,
                                         const std::vector<int32_t>& host_blocks) {
  std::vector<int32_t> map = kv.slot_positions(layer);
  map.resize(static_cast<size_t>(n_slots), -1);  // free slots past the last one in use
  for (const int32_t b : host_blocks)
    map.push_back(b * static_cast<int32_t>(kv.config().block_size));
  return static_cast<const int32_t*>(put(map.data(), map.size() * sizeof(int32_t)));
}

const int32_t* CudaBackend::store_rows(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l,
                                       const int32_t* pos, int64_t T, std::vector<int32_t>* rows,
                                       bool* to_host) {
  *to_host = false;
  if (!kv.device_tiered(layer)) {  // the positions
    for (int64_t t = 0; t < T; ++t) {
      if (pos[t] < 0 || pos[t] >= l.capacity) {
        fail(make_error(ErrorCode::kOutOfRange,
                        "CUDA kv_store: position %d outside the %" PRId64 " tokens reserved",
                        pos[t], l.capacity));
        return nullptr;
      }
    }
    return static_cast<const int32_t*>(put(pos, static_cast<uint64_t>(T) * sizeof(int32_t)));
  }
  rows->resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = kv.device_row(layer, pos[t]);
    if (r >= l.capacity) {
      fail(make_error(ErrorCode::kOutOfRange,
                      "CUDA kv_store: slot row %" PRId64 " outside the layer's %" PRId64, r,
                      l.capacity));
      return nullptr;
    }
    (*rows)[static_cast<size_t>(t)] = r < 0 ? -1 : kv.recomputing() ? -2 : static_cast<int32_t>(r);
    *to_host |= r < 0;
  }
  return static_cast<const int32_t*>(put(rows->data(), static_cast<uint64_t>(T) * sizeof(int32_t)));
}

void CudaBackend::store_host_rows(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos,
                                  const std::vector<int32_t>& rows) {
  if (!status_.ok()) return;
  const int64_t T = k.rows;
  std::vector<float> kh(static_cast<size_t>(T * k.cols)), vh(kh.size());
  Status st = download(k, kh.data());
  if (st.ok()) st = download(v, vh.data());
  if (!st.ok()) return fail(st);
  for (int64_t t = 0; t < T; ++t) {
    if (rows[static_cast<size_t>(t)] == -1)
      kv.store(layer, pos[t], kh.data() + t * k.cols, vh.data() + t * k.cols);
  }
}

void CudaBackend::attention_slotted(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l, Act q,
                                    const int32_t* pos, int64_t n_heads, float scale, Act out) {
  const int64_t T = q.rows;
  if (T >= kGatherMinRows) {
    const Status g = attention_gathered(kv, layer, l, q, pos, n_heads, scale, out);
    if (g.ok() || !status_.ok()) return;
    if (g.error().code() != ErrorCode::kOutOfMemory) return fail(g);
    // No device memory to gather into: the slots' splits, below.
  }
  auto* st = dynamic_cast<cuda::CudaKvStorage*>(kv.storage());
  const int64_t n_slots = st->layer_slots(layer);
  // The query rows in groups whose partials fit kSplitGroupBytes.
  const uint64_t per_row =
      static_cast<uint64_t>(n_heads * (n_slots + 1) * l.head_dim) * sizeof(float);
  const int64_t tn = static_cast<int64_t>(std::max<uint64_t>(1, kSplitGroupBytes / per_row));
  for (int64_t t0 = 0; t0 < T && status_.ok(); t0 += tn) {
    const int64_t n = std::min(tn, T - t0);
    const cuda::SlotMap map{put_slot_map(kv, layer, n_slots), kv.config().block_size, n_slots};
    const auto* d_pos = static_cast<const int32_t*>(put(pos + t0, n * sizeof(int32_t)));
    if (!map.first_pos || !d_pos) return;
    launch_slots(l, q.rows_view(t0, n), d_pos, n_heads, scale, map, out.rows_view(t0, n), -1);
  }
}

Status CudaBackend::attention_gathered(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l, Act q,
                                       const int32_t* pos, int64_t n_heads, float scale, Act out) {
  const int64_t T = q.rows, bs = kv.config().block_size, H = l.n_kv_heads;
  int32_t max_pos = 0;
  for (int64_t t = 0; t < T; ++t) max_pos = std::max(max_pos, pos[t]);
  const int64_t n_blocks = max_pos / bs + 1;
  const uint64_t block_bytes = static_cast<uint64_t>(bs) * l.row_bytes;  // one head's rows
  // Where each block is: its slot, or -(i + 1) for host block i.
  std::vector<int32_t> src(static_cast<size_t>(n_blocks), INT32_MIN);
  const std::vector<int32_t> map = kv.slot_positions(layer);
  for (size_t sp = 0; sp < map.size(); ++sp) {
    if (map[sp] >= 0 && map[sp] / bs < n_blocks)
      src[static_cast<size_t>(map[sp] / bs)] = static_cast<int32_t>(sp);
  }
  std::vector<int32_t> blocks;
  const cpu::KvView hv = kv.host_view(layer, n_blocks, &blocks);
  for (size_t i = 0; i < blocks.size(); ++i)
    src[static_cast<size_t>(blocks[i])] = -static_cast<int32_t>(i) - 1;
  for (int64_t b = 0; b < n_blocks; ++b) {
    if (src[static_cast<size_t>(b)] == INT32_MIN)
      return make_error(ErrorCode::kInternal,
                        "CUDA attention: block %" PRId64 " of layer %" PRId64
                        " is neither in a slot nor a host block",
                        b, layer);
  }
  // Device memory: the staged host blocks, then the gathered K and V.
  const uint64_t staged = blocks.size() * 2 * static_cast<uint64_t>(H) * block_bytes;
  const uint64_t half = static_cast<uint64_t>(H * n_blocks) * block_bytes;
  const uint64_t need = (staged + 255) / 256 * 256 + 2 * half;
  if (need > gather_bytes_) {
    LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "a queued kernel");  // may read the old one
    if (gather_) {
      (void)cudaFree(gather_);
      budget_.give(gather_bytes_);
    }
    gather_ = nullptr;
    gather_bytes_ = 0;
    const uint64_t want = need + need / 4;
    LOOM_TRY(budget_.take(want, "the KV gather buffer"));
    Status a = cuda::device_alloc(&gather_, want, "the KV gather buffer");
    if (!a.ok()) {
      budget_.give(want);
      return a;
    }
    gather_bytes_ = want;
  }
  auto* stage_dev = static_cast<uint8_t*>(gather_);
  uint8_t* gk = stage_dev + (staged + 255) / 256 * 256;
  uint8_t* gv = gk + half;
  if (staged > 0) {
    LOOM_TRY(tier_host(staged));
    auto* h = static_cast<uint8_t*>(tier_host_);
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (int which = 0; which < 2; ++which) {
        const auto* blk = static_cast<const uint8_t*>(which == 0 ? hv.k_blocks[i] : hv.v_blocks[i]);
        for (int64_t kvh = 0; kvh < H; ++kvh, h += block_bytes)
          std::memcpy(h, blk + static_cast<uint64_t>(kvh) * hv.head_stride_bytes, block_bytes);
      }
    }
    LOOM_CUDA_TRY(cudaMemcpyAsync(stage_dev, tier_host_, staged, cudaMemcpyHostToDevice, stream_),
                  "copy host KV blocks to the GPU");
  }
  const auto* d_src = static_cast<const int32_t*>(put(src.data(), src.size() * sizeof(int32_t)));
  const auto* d_pos = static_cast<const int32_t*>(put(pos, T * sizeof(int32_t)));
  if (!d_src || !d_pos) return status_;
  LOOM_TRY(cuda::gather_blocks(l, bs, d_src, n_blocks, stage_dev, gk, gv, stream_));
  cuda::DevKvLayer g = l;
  g.k = gk;
  g.v = gv;
  g.capacity = n_blocks * bs;
  return cuda::attention(g, dev(q), T, d_pos, max_pos, n_heads, scale, dev(out), *attn_scratch_,
                         stream_);
}

bool CudaBackend::mapped_blocks(KvCache& kv, int64_t layer, int64_t n_blocks, MappedBlocks* mb) {
  auto* st = dynamic_cast<cuda::CudaKvStorage*>(kv.storage());
  const cpu::KvView hv = kv.host_view(layer, n_blocks, &mb->blocks);
  if (!st || mb->blocks.empty()) return false;
  mb->head_bytes = hv.head_stride_bytes;
  mb->v_off = hv.head_stride_bytes * static_cast<uint64_t>(hv.n_kv_heads);  // K, then V
  mb->host.resize(mb->blocks.size());
  mb->dev.resize(mb->blocks.size());
  for (size_t i = 0; i < mb->blocks.size(); ++i) {
    const auto* k = static_cast<const uint8_t*>(hv.k_blocks[i]);
    mb->host[i] = k;
    mb->dev[i] = k ? st->mapped(k) : nullptr;  // null: spilled, not fetched
    if (!mb->dev[i] || static_cast<const uint8_t*>(hv.v_blocks[i]) != k + mb->v_off) return false;
  }
  return true;
}

int CudaBackend::staged(const KvCache& kv, int64_t layer,
                        const std::vector<const uint8_t*>& blocks) const {
  for (int b = 0; b < 2; ++b) {
    const TierStage& st = stage_[b];
    if (st.kv == &kv && st.layer == layer && st.epoch == kv.host_epoch() && st.blocks == blocks)
      return b;
  }
  return -1;
}

int CudaBackend::stage_copy(const KvCache& kv, int64_t layer,
                            const std::vector<const uint8_t*>& blocks, uint64_t pair, int avoid) {
  if (!tier_stage_ || blocks.empty()) return -1;
  if (!copy_stream_) {
    if (cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking) != cudaSuccess) {
      copy_stream_ = nullptr;
      return -1;
    }
    for (TierStage& st : stage_) {
      if (cudaEventCreateWithFlags(&st.ready, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming) != cudaSuccess)
        return -1;
    }
  }
  int b = next_stage_;
  if (b == avoid) b ^= 1;
  next_stage_ = b ^ 1;
  TierStage& st = stage_[b];
  st.layer = -1;  // until the copy is queued
  const uint64_t need = blocks.size() * pair;
  if (need > st.bytes) {
    // The old buffer may still be read or written by queued work (a step's
    // kept launches first).
    finish_step();
    if (cudaStreamSynchronize(copy_stream_) != cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess)
      return -1;
    if (st.dev) {
      (void)cudaFree(st.dev);
      budget_.give(st.bytes);
    }
    st.dev = nullptr;
    st.bytes = 0;
    const uint64_t want = need + need / 4;
    if (!budget_.take(want, "the KV tier's staging").ok()) return -1;
    if (!cuda::device_alloc(&st.dev, want, "the KV tier's staging").ok()) {
      budget_.give(want);
      st.dev = nullptr;
      return -1;
    }
    st.bytes = want;
  }
  // Runs of blocks that lie back to back in the pinned slabs go as one copy.
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<size_t> len;
  uint64_t h = 0xcbf29ce484222325ull;  // the sources, into the step's hash
  for (size_t i = 0; i < blocks.size(); ++i) {
    h = (h ^ u(blocks[i])) * 0x100000001b3ull;
    if (!src.empty() && static_cast<const uint8_t*>(src.back()) + len.back() == blocks[i]) {
      len.back() += pair;
      continue;
    }
    dst.push_back(static_cast<uint8_t*>(st.dev) + i * pair);
    src.push_back(blocks[i]);
    len.push_back(pair);
  }
  // Not before the kernels that read the stage's last copy are done: their
  // event where it was recorded in this run of launches, else this point of
  // the stream (after everything queued so far).
  const bool fork = st.done_serial != step_serial_;
  cudaStream_t cs = copy_stream_, ms = stream_;
  cudaEvent_t done = st.done, ready = st.ready;
  const int device = device_;
  launch({kOpStageCopy, u(st.dev), static_cast<uint64_t>(b), h, pair,
          static_cast<uint64_t>(blocks.size()), fork},
         [=]() mutable -> Status {
           cudaError_t e = fork ? cudaEventRecord(done, ms) : cudaSuccess;
           if (e == cudaSuccess) e = cudaStreamWaitEvent(cs, done, 0);
           cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
           if (e == cudaSuccess) e = cudaStreamIsCapturing(cs, &capturing);
           if (e == cudaSuccess && capturing == cudaStreamCaptureStatusActive) {
             // A graph has no node for a batch of copies: one node each.
             for (size_t i = 0; i < dst.size() && e == cudaSuccess; ++i)
               e = cudaMemcpyAsync(dst[i], src[i], len[i], cudaMemcpyHostToDevice, cs);
           } else if (e == cudaSuccess) {
             cudaMemcpyAttributes attr{};
             attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
             attr.srcLocHint.type = cudaMemLocationTypeHost;
             attr.dstLocHint.type = cudaMemLocationTypeDevice;
             attr.dstLocHint.id = device;
             attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
             size_t attr_at = 0;
             e = cudaMemcpyBatchAsync(dst.data(), src.data(), len.data(), dst.size(), &attr,
                                      &attr_at, 1, cs);
           }
           if (e == cudaSuccess) e = cudaEventRecord(ready, cs);
           return cuda::cuda_status(e, "copy a tiered layer's host KV blocks to the GPU");
         });
  if (!status_.ok()) return -1;
  st.kv = &kv;
  st.layer = layer;
  st.epoch = kv.host_epoch();
  st.blocks = blocks;
  return b;
}

void CudaBackend::launch_slots(const cuda::DevKvLayer& l, Act q, const int32_t* d_pos,
                               int64_t n_heads, float scale, const cuda::SlotMap& map, Act out,
                               int si) {
  const float* qp = dev(q);
  float* o = dev(out);
  const int64_t T = q.rows, split = attn_scratch_->split_keys();
  cudaEvent_t ready = si >= 0 ? stage_[si].ready : nullptr;
  cudaEvent_t done = si >= 0 ? stage_[si].done : nullptr;
  if (si >= 0) stage_[si].done_serial = step_serial_;
  // The o product's Q8 activations too, as attention() writes them.
  const int64_t width = n_heads * l.head_dim;
  const cuda::Q8Out q8o = attention_q8(l, n_heads, out);
  const bool q8 = q8o.q != nullptr;
  cuda::AttentionScratch* scratch = attn_scratch_.get();
  launch({kOpAttentionSlots,
          u(l.k),
          u(l.v),
          u(l.capacity),
          l.row_bytes,
          u(l.head_dim),
          u(l.n_kv_heads),
          static_cast<uint64_t>(l.dtype),
          u(qp),
          u(T),
          u(d_pos),
          u(n_heads),
          u(scale),
          u(o),
          u(split),
          u(map.first_pos),
          u(map.block_size),
          u(map.n_slots),
          u(map.host),
          u(map.n_host),
          map.host_head_bytes,
          map.host_v_offset,
          u(ready),
          u(q8o.q)},
         [=, this]() -> Status {
           if (ready) {
             LOOM_CUDA_TRY(cudaStreamWaitEvent(stream_, ready, 0),
                           "wait for the KV tier's staging");
           }
           LOOM_TRY(cuda::attention_slots(l, qp, T, d_pos, n_heads, scale, map, split, o, *scratch,
                                          stream_, nullptr, q8 ? &q8o : nullptr));
           if (done) LOOM_CUDA_TRY(cudaEventRecord(done, stream_), "record an event");
           return {};
         });
  if (q8) norm_q8_ = NormQ8{o, T, width, op_seq_};
}

void CudaBackend::attention_mapped(KvCache& kv, int64_t layer, const cuda::DevKvLayer& l, Act q,
                                   const int32_t* pos, int64_t n_blocks, int64_t n_heads,
                                   float scale, Act out, MappedBlocks& mb) {
  auto* st = dynamic_cast<cuda::CudaKvStorage*>(kv.storage());
  const int64_t bs = kv.config().block_size, n_slots = st->layer_slots(layer);
  const uint64_t pair = 2 * mb.v_off;
  // A device copy (prefetched while the layer before ran, else queued now),
  // or else the pinned blocks themselves, read over PCIe.
  int si = staged(kv, layer, mb.host);
  if (si < 0) si = stage_copy(kv, layer, mb.host, pair, -1);
  if (!status_.ok()) return;
  if (si >= 0) {
    for (size_t i = 0; i < mb.dev.size(); ++i)
      mb.dev[i] = static_cast<const uint8_t*>(stage_[si].dev) + i * pair;
  }
  const int32_t* d_map = put_slot_map(kv, layer, n_slots, mb.blocks);
  const auto* d_at =
      static_cast<const uint8_t* const*>(put(mb.dev.data(), mb.dev.size() * sizeof(mb.dev[0])));
  const auto* d_pos = static_cast<const int32_t*>(put(pos, q.rows * sizeof(int32_t)));
  if (!d_map || !d_at || !d_pos) return;  // failed (status_)
  cuda::SlotMap sm{d_map, bs, n_slots};
  sm.host = d_at;
  sm.n_host = static_cast<int64_t>(mb.blocks.size());
  sm.host_head_bytes = mb.head_bytes;
  sm.host_v_offset = mb.v_off;
  launch_slots(l, q, d_pos, n_heads, scale, sm, out, si);
  // The next tiered layer's host blocks start up while this layer goes on.
  for (int64_t l2 = layer + 1; l2 < kv.config().n_layer && status_.ok(); ++l2) {
    if (!kv.device_tiered(l2) || !kv.has_host_blocks(l2, n_blocks)) continue;
    MappedBlocks next;
    if (mapped_blocks(kv, l2, n_blocks, &next) && gpu_reads_all(next) &&
        staged(kv, l2, next.host) < 0)
      (void)stage_copy(kv, l2, next.host, 2 * next.v_off, si);
    break;
  }
}

Status CudaBackend::attention_split(KvCache& kv, int64_t layer, Act q, const int32_t* pos,
                                    int64_t n_heads, float scale, Act out,
                                    const HostAttentionFn& host) {
  if (!ready()) return status_;
  auto* st = dynamic_cast<cuda::CudaKvStorage*>(kv.storage());
  if (!st || st->layer_slots(layer) == 0)
    return make_error(ErrorCode::kInternal,
                      "CUDA attention_split: layer %" PRId64 " is not in device slots here", layer);
  if (!check_act(q, "attention") || !check_act(out, "attention")) return status_;
  cuda::DevKvLayer l;
  if (!kv_layer(kv, layer, "attention", &l)) return status_;
  const int64_t T = q.rows, hd = l.head_dim, bs = kv.config().block_size;
  const int64_t n_slots = st->layer_slots(layer);
  int32_t max_pos = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (pos[t] < 0 || pos[t] >= kv.capacity())
      return make_error(ErrorCode::kOutOfRange,
                        "CUDA attention: position %d outside the context (%" PRId64 ")", pos[t],
                        kv.capacity());
    max_pos = std::max(max_pos, pos[t]);
  }
  const int64_t n_blocks = max_pos / bs + 1;
  if (!kv.has_host_blocks(layer, n_blocks)) {  // all on the device: the slot map alone
    attention_slotted(kv, layer, l, q, pos, n_heads, scale, out);
    return status_;
  }
  if (T >= kGatherMinRows) {  // a prompt: host blocks go up once for all the rows
    const Status g = attention_gathered(kv, layer, l, q, pos, n_heads, scale, out);
    if (g.ok() || !status_.ok() || g.error().code() != ErrorCode::kOutOfMemory) return g;
    // No device memory to gather into: the split path below.
  }
  const bool mass = kv.wants_mass(layer);
  // Host blocks all in mapped pinned memory (listed once for both uses below).
  MappedBlocks mb;
  const bool mapped = !mass && cuda::host_slots_fit(l) && mapped_blocks(kv, layer, n_blocks, &mb);
  if (mapped && T < kGatherMinRows && gpu_reads_all(mb)) {
    attention_mapped(kv, layer, l, q, pos, n_blocks, n_heads, scale, out, mb);
    return status_;
  }
  finish_step();  // the CPU's part waits for q: a step's kept launches go first
  std::vector<float> block_mass(mass ? static_cast<size_t>(n_blocks) : 0, 0.0f);
  const int64_t stride = hd + 2;  // the host's partial per row: m, l, o
  const uint64_t per_row = static_cast<uint64_t>(n_heads * (n_slots + 1) * hd) * sizeof(float);
  const int64_t tn = static_cast<int64_t>(std::max<uint64_t>(1, kSplitGroupBytes / per_row));
  if (!tier_event_)
    LOOM_CUDA_TRY(cudaEventCreateWithFlags(&tier_event_, cudaEventDisableTiming),
                  "create an event");
  std::vector<float> dev_ml;
  // Where the host blocks are all pinned and no mass is wanted, the GPU
  // reads the newest share of them (tier_gpu_share_, in the slots' launch,
  // over PCIe) while the CPU attends over the others: both buses at once.
  std::vector<int32_t> gpu_blocks;
  std::vector<const uint8_t*> gpu_at;
  uint64_t g_v_off = 0, g_head = 0;
  int64_t n_cpu = -1;  // the CPU's host blocks (-1: all)
  if (mapped && tier_gpu_share_ > 0) {
    const auto nb = static_cast<int64_t>(mb.blocks.size());
    const int64_t ng = nb * tier_gpu_share_ / 100;
    if (ng > 0) {
      n_cpu = nb - ng;
      gpu_blocks.assign(mb.blocks.begin() + n_cpu, mb.blocks.end());
      gpu_at.assign(mb.dev.begin() + n_cpu, mb.dev.end());
      g_v_off = mb.v_off;
      g_head = mb.head_bytes;
    }
  }
  for (int64_t t0 = 0; t0 < T && status_.ok(); t0 += tn) {
    const int64_t n = std::min(tn, T - t0), rows = n * n_heads;
    const Act qc = q.rows_view(t0, n), oc = out.rows_view(t0, n);
    cuda::SlotMap map{put_slot_map(kv, layer, n_slots, gpu_blocks), bs, n_slots};
    if (!gpu_blocks.empty()) {
      map.host =
          static_cast<const uint8_t* const*>(put(gpu_at.data(), gpu_at.size() * sizeof(gpu_at[0])));
      map.n_host = static_cast<int64_t>(gpu_blocks.size());
      map.host_head_bytes = g_head;
      map.host_v_offset = g_v_off;
      if (!map.host) return status_;
    }
    const auto* d_pos = static_cast<const int32_t*>(put(pos + t0, n * sizeof(int32_t)));
    if (!map.first_pos || !d_pos) return status_;
    // Pinned: q, the host's partial, the device splits' (max, sum).
    const uint64_t q_floats = static_cast<uint64_t>(n * q.cols);
    const uint64_t h_floats = static_cast<uint64_t>(rows * stride);
    const uint64_t ml_floats = mass ? static_cast<uint64_t>(rows * (n_slots + 1)) * 2 : 0;
    LOOM_TRY(tier_host((q_floats + h_floats + ml_floats) * sizeof(float)));
    float* qh = static_cast<float*>(tier_host_);
    float* hpart = qh + q_floats;
    float* split_ml = hpart + h_floats;
    cuda::SplitPartials sp;
    if (!mass) {
      // q comes down first; the device part runs while the CPU attends.
      LOOM_CUDA_TRY(
          cudaMemcpyAsync(qh, dev(qc), q_floats * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "attention: q to the host");
      LOOM_CUDA_TRY(cudaEventRecord(tier_event_, stream_), "record an event");
      LOOM_TRY(cuda::attention_slots(l, dev(qc), n, d_pos, n_heads, scale, map,
                                     attn_scratch_->split_keys(), dev(oc), *attn_scratch_, stream_,
                                     &sp));
      LOOM_CUDA_TRY(cudaEventSynchronize(tier_event_), "attention: q to the host");
    } else {
      // One split per slot: its (max, sum) is its block's share of the mass.
      LOOM_TRY(cuda::attention_slots(l, dev(qc), n, d_pos, n_heads, scale, map, bs, dev(oc),
                                     *attn_scratch_, stream_, &sp));
      LOOM_CUDA_TRY(
          cudaMemcpyAsync(qh, dev(qc), q_floats * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "attention: q to the host");
      LOOM_CUDA_TRY(cudaMemcpyAsync(split_ml, sp.ml, ml_floats * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_),
                    "attention: the splits' (max, sum) to the host");
      LOOM_CUDA_TRY(cudaStreamSynchronize(stream_), "attention (the device's part)");
    }
    const int64_t S = sp.n_splits - 1;  // the device's splits; split S is the host's
    // The device part's totals per row (for the attention mass only).
    dev_ml.assign(mass ? static_cast<size_t>(rows) * 2 : 0, 0.0f);
    for (int64_t r = 0; mass && r < rows; ++r) {
      const float* sm = split_ml + r * sp.n_splits * 2;
      float M = cpu::kAttnEmptyMax, L = 0.0f;
      for (int64_t s = 0; s < S; ++s) M = std::max(M, sm[2 * s]);
      for (int64_t s = 0; s < S; ++s)
        if (sm[2 * s + 1] > 0.0f) L += sm[2 * s + 1] * std::exp(sm[2 * s] - M);
      dev_ml[static_cast<size_t>(2 * r)] = M;
      dev_ml[static_cast<size_t>(2 * r + 1)] = L;
    }
    host(qh, n, pos + t0, mass ? dev_ml.data() : nullptr, hpart, mass ? block_mass.data() : nullptr,
         n_cpu);
    if (mass) {  // each slot's share of the row's total, at its block
      const std::vector<int32_t> slots = kv.slot_positions(layer);
      for (int64_t r = 0; r < rows; ++r) {
        const float* h = hpart + r * stride;
        const float Md = dev_ml[static_cast<size_t>(2 * r)],
                    Ld = dev_ml[static_cast<size_t>(2 * r + 1)];
        const float M = std::max(Md, h[0]);
        const float L = Ld * std::exp(Md - M) + h[1] * std::exp(h[0] - M);
        if (!(L > 0.0f)) continue;
        const float* sm = split_ml + r * sp.n_splits * 2;
        for (int64_t s = 0; s < S && s < static_cast<int64_t>(slots.size()); ++s) {
          if (slots[static_cast<size_t>(s)] < 0 || !(sm[2 * s + 1] > 0.0f)) continue;
          const auto b = static_cast<size_t>(slots[static_cast<size_t>(s)] / bs);
          if (b < block_mass.size()) block_mass[b] += sm[2 * s + 1] * std::exp(sm[2 * s] - M) / L;
        }
      }
    }
    // The host's partial as split S: o, and (max, sum).
    const uint64_t hpitch = static_cast<uint64_t>(stride) * sizeof(float);
    LOOM_CUDA_TRY(cudaMemcpy2DAsync(sp.o + S * hd, static_cast<size_t>(sp.n_splits * hd) * 4,
                                    hpart + 2, hpitch, static_cast<size_t>(hd) * 4,
                                    static_cast<size_t>(rows), cudaMemcpyHostToDevice, stream_),
                  "attention: the host's partial to the GPU");
    LOOM_CUDA_TRY(cudaMemcpy2DAsync(sp.ml + S, static_cast<size_t>(sp.n_splits) * sizeof(float2),
                                    hpart, hpitch, sizeof(float2), static_cast<size_t>(rows),
                                    cudaMemcpyHostToDevice, stream_),
                  "attention: the host's partial to the GPU");
    LOOM_TRY(cuda::merge_splits(sp, n, n_heads, hd, dev(oc), stream_));
  }
  if (mass) kv.add_mass(layer, block_mass.data(), n_blocks);
  return status_;
}

}  // namespace loom
