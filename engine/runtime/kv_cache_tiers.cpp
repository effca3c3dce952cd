// KvCache's RAM and SSD tiers (see kv_cache.h): spilling, fetching for
// attention, promotion, and blocks lost on the way.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "cpu/ref/fp8.h"
#include "cpu/ref/quants.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

namespace {
// How much of a block's earlier attention mass carries over to the next step.
constexpr float kMassDecay = 0.9f;
// Device-tiered layers measure their attention mass one step in this many.
constexpr int kDeviceMassEvery = 4;
// Most blocks promoted in one rebalance (bounds the I/O between two tokens).
constexpr size_t kMaxPromotions = 8;
// Records per io_uring submission, and so the most blocks one read-ahead
// covers: a layer's spilled blocks up to 256 (TinyLlama's at 8k tokens with
// half of them spilled: 2-8% faster decode there than 64, in each of three
// passes), with the spill file's staging buffers (depth records each way)
// near 32 MiB.
unsigned spill_queue_depth(uint64_t payload_bytes) {
  const uint64_t by_bytes = (uint64_t{32} << 20) / (2 * (payload_bytes + 4096));
  return static_cast<unsigned>(std::clamp<uint64_t>(by_bytes, 64, 256));
}
// The dtype field of an FP8 spill record's header (no DType has this value).
constexpr uint32_t kSpillFp8Code = 0xF8;
}  // namespace

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoull(line.substr(13)) * 1024ull;
  }
  return 0;
}

std::string default_kv_spill_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg && *xdg ? xdg : std::string(home ? home : "/tmp") + "/.cache";
  return base + "/loom/kv";
}

uint64_t default_kv_ram_budget(uint64_t kv_bytes_full_context) {
  const uint64_t avail = available_memory_bytes();
  return avail > 0 && kv_bytes_full_context > avail / 2 ? avail / 2 : 0;
}

Status KvCache::configure_tiers(const KvTierConfig& t) {
  if (spill_ || n_tokens_ > 0) {
    return make_error(ErrorCode::kInternal, "KV cache: tiers are set before the first token");
  }
  if (t.ram_budget == 0 && t.device_budget == 0) {
    tiers_ = t;
    return {};
  }
  if (t.ram_budget > 0 && t.spill_dir.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: a RAM budget needs a spill folder (--kv-dir)");
  }
  auto policy = make_kv_policy(t.policy);
  if (!policy.ok()) return policy.error();
  DType spill_dtype = cfg_.dtype;
  const bool fp8 = t.spill_type == "fp8" || t.spill_type == "fp8_e4m3";
  if (!t.spill_type.empty() && !fp8) {
    const auto d = dtype_from_name(t.spill_type);
    const bool ok = d && (*d == cfg_.dtype || (cfg_.dtype == DType::kF16 && *d == DType::kQ8_0 &&
                                               cfg_.head_dim % 32 == 0));
    if (!ok && d && *d == DType::kQ8_0 && cfg_.dtype == DType::kF16) {
      return make_error(ErrorCode::kUnsupported,
                        "KV cache: a q8_0 spill needs a head size that is a multiple of 32 (this "
                        "model's is %" PRId64 ")",
                        cfg_.head_dim);
    }
    if (!ok) {
      return make_error(ErrorCode::kUnsupported,
                        "KV cache: spill precision '%s' is not available under a %s cache (the "
                        "cache's own, fp8, or q8_0 under F16)",
                        t.spill_type.c_str(), std::string(dtype_name(cfg_.dtype)).c_str());
    }
    spill_dtype = *d;
  }
  const int64_t bs = cfg_.block_size;
  if (t.ram_budget > 0 &&
      t.ram_budget < pair_bytes() * static_cast<uint64_t>(cfg_.n_layer) *
                         static_cast<uint64_t>((t.window_tokens + bs - 1) / bs + 1)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: a RAM budget of %" PRIu64 " KiB cannot hold the newest %" PRId64
                      " tokens of every layer (%" PRIu64 " KiB): raise --kv-ram",
                      t.ram_budget >> 10, t.window_tokens,
                      (pair_bytes() * static_cast<uint64_t>(cfg_.n_layer) *
                       static_cast<uint64_t>((t.window_tokens + bs - 1) / bs + 1)) >>
                          10);
  }
  tiers_ = t;
  tiers_.window_tokens = std::max(t.window_tokens, bs);
  if (tiers_.session == 0) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    tiers_.session = (static_cast<uint64_t>(::getpid()) << 32) ^ static_cast<uint64_t>(now);
  }
  policy_ = std::move(policy).value();
  spill_dtype_ = spill_dtype;
  spill_fp8_ = fp8;
  // Files of sessions that crashed: their lock is free.
  if (t.ram_budget > 0) storage::remove_stale_spill_files(tiers_.spill_dir);
  return {};
}

Status KvCache::open_spill_file() {
  if (spill_) return {};
  storage::SpillOptions o;
  o.dir = tiers_.spill_dir;
  o.session = tiers_.session;
  o.payload_bytes = spill_pair_bytes();
  o.queue_depth = spill_queue_depth(o.payload_bytes);
  auto f = storage::KvSpillFile::open(o);
  if (!f.ok()) return f.error();
  spill_ = std::move(f).value();
  spill_->set_faults(tiers_.faults);
  spill_note_ = spill_->direct_io() ? "O_DIRECT" : spill_->direct_io_note();
  return {};
}

KvTierStats KvCache::tier_stats() const {
  KvTierStats s;
  s.device_bytes = storage_ ? storage_->allocated_bytes() : 0;
  s.device_used_bytes = s.device_bytes;
  if (dev_slots_ > 0) {  // slotted layers: count the slots that hold a block
    uint64_t free_slots = 0;
    for (const auto& sb : slot_block_)
      free_slots += static_cast<uint64_t>(std::count(sb.begin(), sb.end(), -1));
    s.device_used_bytes -= std::min(s.device_used_bytes, free_slots * pair_bytes());
  }
  s.blocks_to_host = n_to_host_;
  s.blocks_to_device = n_to_device_;
  s.ram_bytes = n_ram_blocks_ * pair_bytes();
  // (A write-behind batch's blocks count in RAM until their writes are done.)
  s.ssd_bytes = spill_ ? (spill_->slots_used() - behind_.size()) * spill_pair_bytes() : 0;
  s.staging_bytes = staging_[0].capacity() + staging_[1].capacity() + spill_staging_[0].capacity() +
                    spill_staging_[1].capacity();
  s.blocks_read_ahead = n_prefetched_;
  s.blocks_spilled = n_spilled_;
  s.blocks_promoted = n_promoted_;
  s.blocks_lost = n_lost_;
  if (spill_) {
    s.ssd_read_bytes = spill_->stats().bytes_read;
    s.ssd_written_bytes = spill_->stats().bytes_written;
    s.ssd_read_requests = spill_->stats().read_requests;
  }
  s.spill_full = spill_full_;
  s.note = spill_note_;
  return s;
}

std::vector<KvLayerTiers> KvCache::layer_tiers() const {
  std::vector<KvLayerTiers> out(static_cast<size_t>(cfg_.n_layer));
  const auto used =
      std::min(block_table_.size(),
               static_cast<size_t>((n_tokens_ + cfg_.block_size - 1) / cfg_.block_size));
  const uint64_t ssd_pair = spill_ ? spill_pair_bytes() : pair_bytes();
  for (size_t l = 0; l < out.size(); ++l) {
    KvLayerTiers& t = out[l];
    const bool tiered_l = device_tiered(static_cast<int64_t>(l));
    if (on_device(static_cast<int64_t>(l)) && !tiered_l) {  // the whole layer in device storage
      t.device = used * pair_bytes();
      continue;
    }
    for (size_t i = 0; i < used; ++i) {
      const auto b = static_cast<size_t>(block_table_[i]);
      if (tiered_l && b < dev_slot_[l].size() && dev_slot_[l][b] >= 0)
        t.device += pair_bytes();
      else if (b < blocks_[l].size() && blocks_[l][b])
        t.ram += pair_bytes();
      else if (b < slot_[l].size() && slot_[l][b] >= 0)
        t.ssd += ssd_pair;
    }
  }
  return out;
}

bool KvCache::pinned(int64_t block) const {
  const int64_t bs = cfg_.block_size;
  const int64_t begin = block * bs;
  return begin < tiers_.sink_tokens || begin + bs > n_tokens_ - tiers_.window_tokens;
}

bool KvCache::wants_mass(int64_t layer) const {
  if (!policy_ || !policy_->wants_mass()) return false;
  if (!on_device(layer)) return true;  // the CPU's attention has it at hand
  // A device-tiered layer's mass costs a download of the device splits' (m, l):
  // measured one step in kDeviceMassEvery, and weighted as that many (add_mass).
  return device_tiered(layer) && n_rebalances_ % kDeviceMassEvery == 0;
}

void KvCache::add_mass(int64_t layer, const float* mass, int64_t n_blocks) {
  auto& m = mass_[static_cast<size_t>(layer)];
  const auto n = std::min(m.size(), static_cast<size_t>(std::max<int64_t>(n_blocks, 0)));
  // One step's mass, or, for a device-tiered layer (measured one step in
  // kDeviceMassEvery), as if each of those steps had had it.
  float decay = kMassDecay, weight = 1.0f;
  if (device_tiered(layer)) {
    for (int i = 1; i < kDeviceMassEvery; ++i) {
      weight += decay;
      decay *= kMassDecay;
    }
  }
  for (size_t b = 0; b < n; ++b) m[b] = m[b] * decay + mass[b] * weight;
}

// Writes the given (layer, block) pairs to the SSD and frees their RAM.
uint64_t KvCache::spill_pair_bytes() const {
  if (spill_fp8_) {
    return 2ull * static_cast<uint64_t>(cfg_.n_kv_heads) *
           (sizeof(float) + static_cast<uint64_t>(cfg_.block_size * cfg_.head_dim));
  }
  return 2ull * cpu::kv_head_bytes(spill_dtype_, cfg_.block_size, cfg_.head_dim) *
         static_cast<uint64_t>(cfg_.n_kv_heads);
}

// Row by row through floats: [K|V][kv_head][row] in each dtype's layout.
// Q8_0 back to F16 (the read path of every decode step) in one SIMD pass:
// both layouts are the pair's values back to back.
void KvCache::convert_pair(const uint8_t* src, DType from, uint8_t* dst, DType to) const {
  if (from == DType::kQ8_0 && to == DType::kF16) {
    cpu::q8_0_to_f16(src, dst, 2 * cfg_.n_kv_heads * cfg_.block_size * cfg_.head_dim);
    return;
  }
  const size_t hb_from = cpu::kv_head_bytes(from, cfg_.block_size, cfg_.head_dim);
  const size_t hb_to = cpu::kv_head_bytes(to, cfg_.block_size, cfg_.head_dim);
  const size_t rb_from = hb_from / static_cast<size_t>(cfg_.block_size);
  const size_t rb_to = hb_to / static_cast<size_t>(cfg_.block_size);
  std::vector<float> row(static_cast<size_t>(cfg_.head_dim));
  const auto heads = static_cast<size_t>(2 * cfg_.n_kv_heads);  // K's heads, then V's
  for (size_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < cfg_.block_size; ++r) {
      const size_t ri = static_cast<size_t>(r);
      (void)ref::dequantize_row(from, src + h * hb_from + ri * rb_from, row.data(), cfg_.head_dim);
      (void)ref::quantize_row(to, row.data(), dst + h * hb_to + ri * rb_to, cfg_.head_dim);
    }
  }
}

// FP8: per head of K and of V, the block's largest magnitude maps to 448.
void KvCache::to_spill(const uint8_t* src, uint8_t* dst) const {
  if (!spill_fp8_) return convert_pair(src, cfg_.dtype, dst, spill_dtype_);
  const size_t hb = cpu::kv_head_bytes(cfg_.dtype, cfg_.block_size, cfg_.head_dim);
  const size_t rb = hb / static_cast<size_t>(cfg_.block_size);
  const auto n = static_cast<size_t>(cfg_.block_size * cfg_.head_dim);
  std::vector<float> vals(n);
  for (size_t h = 0; h < static_cast<size_t>(2 * cfg_.n_kv_heads); ++h) {
    float amax = 0.0f;
    for (int64_t r = 0; r < cfg_.block_size; ++r) {
      float* row = vals.data() + static_cast<size_t>(r * cfg_.head_dim);
      (void)ref::dequantize_row(cfg_.dtype, src + h * hb + static_cast<size_t>(r) * rb, row,
                                cfg_.head_dim);
      for (int64_t i = 0; i < cfg_.head_dim; ++i) amax = std::max(amax, std::fabs(row[i]));
    }
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    uint8_t* out = dst + h * (sizeof(float) + n);
    std::memcpy(out, &scale, sizeof(float));
    for (size_t i = 0; i < n; ++i) out[sizeof(float) + i] = ref::fp32_to_fp8_e4m3(vals[i] / scale);
  }
}

void KvCache::from_spill(const uint8_t* src, uint8_t* dst) const {
  if (!spill_fp8_) return convert_pair(src, spill_dtype_, dst, cfg_.dtype);
  const size_t hb = cpu::kv_head_bytes(cfg_.dtype, cfg_.block_size, cfg_.head_dim);
  const size_t rb = hb / static_cast<size_t>(cfg_.block_size);
  const auto n = static_cast<size_t>(cfg_.block_size * cfg_.head_dim);
  std::vector<float> row(static_cast<size_t>(cfg_.head_dim));
  for (size_t h = 0; h < static_cast<size_t>(2 * cfg_.n_kv_heads); ++h) {
    const uint8_t* in = src + h * (sizeof(float) + n);
    float scale = 1.0f;
    std::memcpy(&scale, in, sizeof(float));
    if (cfg_.dtype == DType::kF16) {  // the head's rows are back to back
      cpu::fp8_e4m3_to_f16(in + sizeof(float), scale, dst + h * hb, static_cast<int64_t>(n));
      continue;
    }
    for (int64_t r = 0; r < cfg_.block_size; ++r) {
      const uint8_t* q = in + sizeof(float) + static_cast<size_t>(r * cfg_.head_dim);
      for (int64_t i = 0; i < cfg_.head_dim; ++i)
        row[static_cast<size_t>(i)] = ref::fp8_e4m3_to_fp32(q[i]) * scale;
      (void)ref::quantize_row(cfg_.dtype, row.data(), dst + h * hb + static_cast<size_t>(r) * rb,
                              cfg_.head_dim);
    }
  }
}

Status KvCache::spill(std::vector<std::pair<size_t, size_t>>& victims) {
  if (victims.empty()) return {};
  drain_prefetch();
  LOOM_TRY(open_spill_file());
  std::vector<storage::SpillWrite> w;
  w.reserve(victims.size());
  if (converts()) spill_buf_.resize(victims.size() * spill_pair_bytes());
  for (size_t i = 0; i < victims.size(); ++i) {
    auto [l, b] = victims[i];
    const uint8_t* payload = blocks_[l][b].get();
    if (converts()) {
      uint8_t* q = spill_buf_.data() + i * spill_pair_bytes();
      to_spill(payload, q);
      payload = q;
    }
    w.push_back({spill_key(l, b), payload});
  }
  std::vector<uint32_t> slots;
  LOOM_TRY(settle_spill());
  if (tiers_.write_behind && victims.size() <= spill_->queue_depth()) {
    // Written while the next step computes: a batch of a layer's blocks at
    // a block boundary took a token's latency up by the disk's time for it.
    LOOM_TRY(spill_->begin_writes(w, &slots));
    behind_ = victims;
    behind_slots_ = std::move(slots);
    return {};
  }
  LOOM_TRY(spill_->write(w, &slots));
  commit_spill(victims, slots);
  return {};
}

void KvCache::commit_spill(const std::vector<std::pair<size_t, size_t>>& victims,
                           const std::vector<uint32_t>& slots) {
  for (size_t i = 0; i < victims.size(); ++i) {
    auto [l, b] = victims[i];
    if (b >= blocks_[l].size() || !blocks_[l][b] || slot_[l][b] >= 0) {
      spill_->release(slots[i]);  // (freed or moved while its write was on the way)
      continue;
    }
    slot_[l][b] = static_cast<int64_t>(slots[i]);
    blocks_[l][b].reset();
    point_at(l, b, nullptr);
    --n_ram_blocks_;
    ++n_spilled_;
  }
}

Status KvCache::settle_spill() {
  if (behind_.empty()) return {};
  const Status s = spill_->finish_writes();
  std::vector<std::pair<size_t, size_t>> victims = std::move(behind_);
  std::vector<uint32_t> slots = std::move(behind_slots_);
  behind_.clear();
  behind_slots_.clear();
  if (s.ok()) {
    commit_spill(victims, slots);
    return {};
  }
  if (s.error().code() != ErrorCode::kNoSpace) return s;  // the blocks are still in RAM
  spill_full_ = true;
  spill_note_ = s.message();
  return {};
}

// Reads (layer, block) pairs back into RAM for good. Unreadable ones come
// back empty and go on the lost list.
Status KvCache::promote(std::vector<std::pair<size_t, size_t>>& todo) {
  if (todo.empty()) return {};
  drain_prefetch();
  std::vector<storage::SpillRead> reads;
  if (converts()) spill_buf_.resize(todo.size() * spill_pair_bytes());
  for (size_t i = 0; i < todo.size(); ++i) {
    auto [l, b] = todo[i];
    HostPair kv = new_pair(l);
    if (!kv) {
      return make_error(ErrorCode::kOutOfMemory,
                        "KV cache: out of memory bringing block %zu of layer %zu back to RAM", b,
                        l);
    }
    uint8_t* to = converts() ? spill_buf_.data() + i * spill_pair_bytes() : kv.get();
    reads.push_back({static_cast<uint32_t>(slot_[l][b]), spill_key(l, b), to});
    blocks_[l][b] = std::move(kv);
  }
  std::vector<Status> res;
  spill_->read(reads, &res);
  for (size_t i = 0; i < todo.size(); ++i) {
    auto [l, b] = todo[i];
    if (converts() && res[i].ok())
      from_spill(static_cast<const uint8_t*>(reads[i].out), blocks_[l][b].get());
    spill_->release(static_cast<uint32_t>(slot_[l][b]));
    slot_[l][b] = -1;
    point_at(l, b, blocks_[l][b].get());
    ++n_ram_blocks_;
    if (!res[i].ok()) {
      lost_.emplace_back(l, b);
      ++n_lost_;
    }
  }
  n_promoted_ += todo.size();
  return {};
}

Status KvCache::unspill_layer(size_t l) {
  std::vector<std::pair<size_t, size_t>> todo;
  for (size_t b = 0; b < slot_[l].size(); ++b)
    if (slot_[l][b] >= 0) todo.emplace_back(l, b);
  LOOM_TRY(promote(todo));
  if (!lost_.empty()) {
    return make_error(ErrorCode::kIo,
                      "KV cache: %zu spilled blocks of layer %zu could not be read "
                      "back; they are recomputed",
                      lost_.size(), l);
  }
  return {};
}

storage::SpillBlockKey KvCache::spill_key(size_t l, size_t b) const {
  return {static_cast<uint32_t>(l), static_cast<uint32_t>(b),
          static_cast<int64_t>(b) * cfg_.block_size, static_cast<uint32_t>(cfg_.block_size),
          spill_fp8_ ? kSpillFp8Code : static_cast<uint32_t>(spill_dtype_)};
}

Status KvCache::fresh_ram(size_t l, size_t b, bool zero) {
  HostPair kv = new_pair(l, zero);
  if (!kv) {
    return make_error(ErrorCode::kOutOfMemory,
                      "KV cache: out of memory allocating block %zu of layer %zu (%" PRIu64
                      " bytes)",
                      b, l, pair_bytes());
  }
  spill_->release(static_cast<uint32_t>(slot_[l][b]));
  slot_[l][b] = -1;
  point_at(l, b, kv.get());
  blocks_[l][b] = std::move(kv);
  mass_[l][b] = 0.0f;
  ++n_ram_blocks_;
  return {};
}

KvCache::~KvCache() {
  drain_prefetch();  // reads must not land in freed staging
  (void)settle_spill();
  blocks_.clear();  // blocks from the storage go back before it dies
}

std::vector<size_t> KvCache::spilled_blocks(size_t l) const {
  const auto n_blocks =
      std::min(slot_[l].size(),
               static_cast<size_t>((n_tokens_ + cfg_.block_size - 1) / cfg_.block_size + 1));
  std::vector<size_t> out;
  for (size_t b = 0; b < n_blocks; ++b)
    if (slot_[l][b] >= 0) out.push_back(b);
  return out;
}

// Waits for a read-ahead in flight and forgets it (its layer's blocks may
// move before they are used).
void KvCache::drain_prefetch() {
  if (prefetch_layer_ < 0 || !spill_) return;
  std::vector<Status> ignored;
  spill_->finish_reads(&ignored);
  prefetch_layer_ = -1;
  prefetch_blocks_.clear();
}

// Room in layer l's staging for n spilled blocks (and their SSD form when
// that is another precision).
void KvCache::size_staging(size_t l, size_t n) {
  auto grow = [](std::vector<uint8_t>& v, size_t bytes) {
    if (v.size() >= bytes) return;
    v.clear();
    v.shrink_to_fit();
    v.resize(bytes);
  };
  grow(staging_[l % 2], n * pair_bytes());
  if (converts()) grow(spill_staging_[l % 2], n * spill_pair_bytes());
}

// Where the i-th spilled block of layer l is read to.
uint8_t* KvCache::read_target(size_t l, size_t i) {
  return converts() ? spill_staging_[l % 2].data() + i * spill_pair_bytes()
                    : staging_[l % 2].data() + i * pair_bytes();
}

// Begins reading the first spilled blocks of `layer` (as many as one batch
// holds) into its staging buffer; fetch_layer(layer) completes them.
void KvCache::start_prefetch(int64_t layer) {
  if (!spill_ || layer >= cfg_.n_layer || (on_device(layer) && !device_tiered(layer))) return;
  const auto l = static_cast<size_t>(layer);
  std::vector<size_t> spilled = spilled_blocks(l);
  if (spilled.empty()) return;
  size_staging(l, spilled.size());
  spilled.resize(std::min<size_t>(spilled.size(), spill_->queue_depth()));  // one batch
  std::vector<storage::SpillRead> reads;
  for (size_t i = 0; i < spilled.size(); ++i) {
    const size_t b = spilled[i];
    reads.push_back({static_cast<uint32_t>(slot_[l][b]), spill_key(l, b), read_target(l, i)});
  }
  if (spill_->begin_reads(reads).ok()) {
    prefetch_layer_ = layer;
    prefetch_blocks_ = std::move(spilled);
  }
}

Status KvCache::fetch_layer(int64_t layer) {
  if (!spill_ || (on_device(layer) && !device_tiered(layer))) return {};
  const auto l = static_cast<size_t>(layer);
  const std::vector<size_t> spilled = spilled_blocks(l);
  // The read-ahead begun during the layer before covers the first blocks.
  std::vector<Status> res;
  size_t ahead = 0;
  if (prefetch_layer_ == layer && prefetch_blocks_.size() <= spilled.size() &&
      std::equal(prefetch_blocks_.begin(), prefetch_blocks_.end(), spilled.begin())) {
    spill_->finish_reads(&res);
    ahead = prefetch_blocks_.size();
    n_prefetched_ += ahead;
    prefetch_layer_ = -1;
    prefetch_blocks_.clear();
  } else {
    drain_prefetch();
  }
  if (spilled.empty()) {
    start_prefetch(layer + 1);
    return {};
  }
  touch_host();                     // the layer's spilled blocks now point at staging
  size_staging(l, spilled.size());  // (a read-ahead sized it already when there was one)
  std::vector<uint8_t>& buf = staging_[l % 2];
  std::vector<storage::SpillRead> reads;
  for (size_t i = 0; i < spilled.size(); ++i) {
    const size_t b = spilled[i];
    point_at(l, b, buf.data() + i * pair_bytes());
    if (i < ahead) continue;
    reads.push_back({static_cast<uint32_t>(slot_[l][b]), spill_key(l, b), read_target(l, i)});
  }
  std::vector<Status> rest;
  spill_->read(reads, &rest);
  for (auto& r : rest) res.push_back(std::move(r));
  if (converts()) {  // back to the cache's precision, where attention reads it
    for (size_t i = 0; i < spilled.size(); ++i) {
      if (res[i].ok()) from_spill(read_target(l, i), buf.data() + i * pair_bytes());
    }
  }
  // This layer's attention runs next: the following layer's blocks are read meanwhile.
  start_prefetch(layer + 1);
  std::string first_error;
  size_t n_bad = 0;
  for (size_t i = 0; i < spilled.size(); ++i) {
    if (res[i].ok()) continue;
    const size_t b = spilled[i];
    if (first_error.empty()) first_error = res[i].message();
    ++n_bad;
    // Never used unverified: the block gets fresh, empty RAM and is recomputed.
    LOOM_TRY(fresh_ram(l, b, true));
    lost_.emplace_back(l, b);
    ++n_lost_;
  }
  if (n_bad > 0) {
    return make_error(ErrorCode::kIo,
                      "KV cache: %zu block(s) of layer %zu could not be read back from the spill "
                      "file (%s); they are recomputed from their tokens",
                      n_bad, l, first_error.c_str());
  }
  return {};
}

std::vector<std::pair<int64_t, int64_t>> KvCache::take_lost() {
  recompute_.insert(recompute_.end(), lost_.begin(), lost_.end());
  std::vector<int64_t> blocks;
  for (auto [l, b] : lost_) blocks.push_back(static_cast<int64_t>(b));
  lost_.clear();
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const int64_t bs = cfg_.block_size;
  for (int64_t b : blocks) {
    const int64_t begin = b * bs, end = std::min((b + 1) * bs, n_tokens_);
    if (begin >= end) continue;
    if (!ranges.empty() && ranges.back().second == begin)
      ranges.back().second = end;
    else
      ranges.emplace_back(begin, end);
  }
  return ranges;
}

Status KvCache::rebalance() {
  touch_host();
  if (!tiered() || !policy_) return {};
  LOOM_TRY(settle_spill());  // the last step's write-behind, done by now
  ++n_rebalances_;
  // (Not while recomputing lost blocks: they are rewritten where they lie.)
  if (dev_slots_ > 0 && !recomputing_) LOOM_TRY(rebalance_device());  // its moves count below
  if (tiers_.ram_budget == 0) return {};
  const uint64_t budget = tiers_.ram_budget;
  // Under the budget with no swaps wanted (lru): nothing to move, so nothing
  // to score or sort (every host block of every layer, each step).
  if (policy_->promote_margin() <= 0 && n_ram_blocks_ * pair_bytes() <= budget) return {};
  const int64_t used_blocks = (n_tokens_ + cfg_.block_size - 1) / cfg_.block_size;
  struct Cand {
    double score;
    size_t l, b;
  };
  std::vector<Cand> in_ram, on_ssd;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (on_device(static_cast<int64_t>(l)) && !device_tiered(static_cast<int64_t>(l))) continue;
    const size_t n = std::min(blocks_[l].size(), static_cast<size_t>(used_blocks));
    for (size_t b = 0; b < n; ++b) {
      if (pinned(static_cast<int64_t>(b)) || dev_slot_[l][b] >= 0) continue;
      const KvBlockStats st{static_cast<int64_t>(l), static_cast<int64_t>(b), mass_[l][b]};
      (slot_[l][b] >= 0 ? on_ssd : in_ram).push_back({policy_->score(st), l, b});
    }
  }
  auto low_first = [](const Cand& a, const Cand& b) { return a.score < b.score; };
  std::sort(in_ram.begin(), in_ram.end(), low_first);
  std::sort(on_ssd.begin(), on_ssd.end(), [](const Cand& a, const Cand& b) {
    return a.score > b.score;  // hottest first
  });

  // Swaps: a block on the SSD that now clearly outranks the coldest in RAM.
  std::vector<std::pair<size_t, size_t>> down, up;
  size_t next_victim = 0;
  const double margin = policy_->promote_margin();
  if (margin > 0 && !spill_full_) {
    for (const Cand& hot : on_ssd) {
      if (up.size() >= kMaxPromotions || next_victim >= in_ram.size()) break;
      const Cand& cold = in_ram[next_victim];
      if (hot.score <= cold.score * margin || hot.score <= 0) break;
      down.emplace_back(cold.l, cold.b);
      up.emplace_back(hot.l, hot.b);
      ++next_victim;
    }
  }
  // Then down to the budget, coldest first.
  uint64_t ram = n_ram_blocks_ * pair_bytes();
  while (ram > budget && next_victim < in_ram.size()) {
    down.emplace_back(in_ram[next_victim].l, in_ram[next_victim].b);
    ++next_victim;
    ram -= pair_bytes();
  }
  if (spill_full_ || down.empty()) return {};
  Status s = spill(down);
  if (!s.ok()) {
    if (s.error().code() != ErrorCode::kNoSpace) return s;
    // The disk is full: keep everything in RAM from now on; the budget then
    // ends the context (reserve() says so).
    spill_full_ = true;
    spill_note_ = s.message();
    return {};
  }
  return promote(up);
}

}  // namespace loom
