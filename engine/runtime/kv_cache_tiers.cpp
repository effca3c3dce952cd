// KvCache's RAM and SSD tiers (see kv_cache.h): spilling, fetching for
// attention, promotion, and blocks lost on the way.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <new>

#include "engine/runtime/kv_cache.h"

namespace loom {

namespace {
// How much of a block's earlier attention mass carries over to the next step.
constexpr float kMassDecay = 0.9f;
// Most blocks promoted in one rebalance (bounds the I/O between two tokens).
constexpr size_t kMaxPromotions = 8;
}  // namespace

Status KvCache::configure_tiers(const KvTierConfig& t) {
  if (spill_ || n_tokens_ > 0) {
    return make_error(ErrorCode::kInternal, "KV cache: tiers are set before the first token");
  }
  if (t.ram_budget == 0) {
    tiers_ = t;
    return {};
  }
  if (t.spill_dir.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "KV cache: a RAM budget needs a spill folder (--kv-dir)");
  }
  auto policy = make_kv_policy(t.policy);
  if (!policy.ok()) return policy.error();
  const int64_t bs = cfg_.block_size;
  if (t.ram_budget < pair_bytes() * static_cast<uint64_t>(cfg_.n_layer) *
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
  // Files of sessions that crashed: their lock is free.
  storage::remove_stale_spill_files(tiers_.spill_dir);
  return {};
}

Status KvCache::open_spill_file() {
  if (spill_) return {};
  storage::SpillOptions o;
  o.dir = tiers_.spill_dir;
  o.session = tiers_.session;
  o.payload_bytes = pair_bytes();
  o.queue_depth = 32;
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
  s.ram_bytes = n_ram_blocks_ * pair_bytes();
  s.ssd_bytes = spill_ ? spill_->slots_used() * pair_bytes() : 0;
  s.staging_bytes = staging_.capacity();
  s.blocks_spilled = n_spilled_;
  s.blocks_promoted = n_promoted_;
  s.blocks_lost = n_lost_;
  if (spill_) {
    s.ssd_read_bytes = spill_->stats().bytes_read;
    s.ssd_written_bytes = spill_->stats().bytes_written;
  }
  s.spill_full = spill_full_;
  s.note = spill_note_;
  return s;
}

bool KvCache::pinned(int64_t block) const {
  const int64_t bs = cfg_.block_size;
  const int64_t begin = block * bs;
  return begin < tiers_.sink_tokens || begin + bs > n_tokens_ - tiers_.window_tokens;
}

bool KvCache::wants_mass(int64_t layer) const {
  return policy_ && policy_->wants_mass() && !on_device(layer);
}

void KvCache::add_mass(int64_t layer, const float* mass, int64_t n_blocks) {
  auto& m = mass_[static_cast<size_t>(layer)];
  const auto n = std::min(m.size(), static_cast<size_t>(std::max<int64_t>(n_blocks, 0)));
  for (size_t b = 0; b < n; ++b) m[b] = m[b] * kMassDecay + mass[b];
}

// Writes the given (layer, block) pairs to the SSD and frees their RAM.
Status KvCache::spill(std::vector<std::pair<size_t, size_t>>& victims) {
  if (victims.empty()) return {};
  LOOM_TRY(open_spill_file());
  std::vector<storage::SpillWrite> w;
  w.reserve(victims.size());
  for (auto [l, b] : victims) {
    storage::SpillBlockKey key{static_cast<uint32_t>(l), static_cast<uint32_t>(b),
                               static_cast<int64_t>(b) * cfg_.block_size,
                               static_cast<uint32_t>(cfg_.block_size),
                               static_cast<uint32_t>(cfg_.dtype)};
    w.push_back({key, blocks_[l][b].get()});
  }
  std::vector<uint32_t> slots;
  LOOM_TRY(spill_->write(w, &slots));
  for (size_t i = 0; i < victims.size(); ++i) {
    auto [l, b] = victims[i];
    slot_[l][b] = slots[i];
    blocks_[l][b].reset();
    point_at(l, b, nullptr);
    --n_ram_blocks_;
  }
  n_spilled_ += victims.size();
  return {};
}

// Reads (layer, block) pairs back into RAM for good. Unreadable ones come
// back empty and go on the lost list.
Status KvCache::promote(std::vector<std::pair<size_t, size_t>>& todo) {
  if (todo.empty()) return {};
  std::vector<storage::SpillRead> reads;
  for (auto [l, b] : todo) {
    std::unique_ptr<uint8_t[]> kv(new (std::nothrow) uint8_t[pair_bytes()]);
    if (!kv) {
      return make_error(ErrorCode::kOutOfMemory,
                        "KV cache: out of memory bringing block %zu of layer %zu back to RAM", b,
                        l);
    }
    storage::SpillBlockKey key{static_cast<uint32_t>(l), static_cast<uint32_t>(b),
                               static_cast<int64_t>(b) * cfg_.block_size,
                               static_cast<uint32_t>(cfg_.block_size),
                               static_cast<uint32_t>(cfg_.dtype)};
    reads.push_back({static_cast<uint32_t>(slot_[l][b]), key, kv.get()});
    blocks_[l][b] = std::move(kv);
  }
  std::vector<Status> res;
  spill_->read(reads, &res);
  for (size_t i = 0; i < todo.size(); ++i) {
    auto [l, b] = todo[i];
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

Status KvCache::fetch_layer(int64_t layer) {
  if (!spill_ || on_device(layer)) return {};
  const auto l = static_cast<size_t>(layer);
  const auto n_blocks =
      std::min(slot_[l].size(),
               static_cast<size_t>((n_tokens_ + cfg_.block_size - 1) / cfg_.block_size + 1));
  std::vector<size_t> spilled;
  for (size_t b = 0; b < n_blocks; ++b)
    if (slot_[l][b] >= 0) spilled.push_back(b);
  if (spilled.empty()) return {};
  const size_t need = spilled.size() * pair_bytes();
  if (staging_.size() < need) {
    staging_.clear();
    staging_.shrink_to_fit();
    staging_.resize(need);
  }
  std::vector<storage::SpillRead> reads;
  for (size_t i = 0; i < spilled.size(); ++i) {
    const size_t b = spilled[i];
    storage::SpillBlockKey key{static_cast<uint32_t>(l), static_cast<uint32_t>(b),
                               static_cast<int64_t>(b) * cfg_.block_size,
                               static_cast<uint32_t>(cfg_.block_size),
                               static_cast<uint32_t>(cfg_.dtype)};
    uint8_t* at = staging_.data() + i * pair_bytes();
    reads.push_back({static_cast<uint32_t>(slot_[l][b]), key, at});
    point_at(l, b, at);
  }
  std::vector<Status> res;
  spill_->read(reads, &res);
  std::string first_error;
  size_t n_bad = 0;
  for (size_t i = 0; i < spilled.size(); ++i) {
    if (res[i].ok()) continue;
    const size_t b = spilled[i];
    if (first_error.empty()) first_error = res[i].message();
    ++n_bad;
    // Never used unverified: the block gets fresh, empty RAM and is recomputed.
    std::unique_ptr<uint8_t[]> kv(new (std::nothrow) uint8_t[pair_bytes()]());
    if (!kv) {
      return make_error(ErrorCode::kOutOfMemory,
                        "KV cache: out of memory replacing lost block %zu of layer %zu", b, l);
    }
    spill_->release(static_cast<uint32_t>(slot_[l][b]));
    slot_[l][b] = -1;
    point_at(l, b, kv.get());
    blocks_[l][b] = std::move(kv);
    ++n_ram_blocks_;
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
  if (!tiered() || !policy_) return {};
  const uint64_t budget = tiers_.ram_budget;
  const int64_t used_blocks = (n_tokens_ + cfg_.block_size - 1) / cfg_.block_size;
  struct Cand {
    double score;
    size_t l, b;
  };
  std::vector<Cand> in_ram, on_ssd;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (on_device(static_cast<int64_t>(l))) continue;
    const size_t n = std::min(blocks_[l].size(), static_cast<size_t>(used_blocks));
    for (size_t b = 0; b < n; ++b) {
      if (pinned(static_cast<int64_t>(b))) continue;
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
