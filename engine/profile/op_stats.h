// Per-op time accumulators for one forward pass: where a decode step's time
// goes. Cheap (one steady_clock read per op boundary); off unless attached.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace loom {

enum class OpLabel : int {
  kEmbed,
  kNorm,
  kQkv,
  kRope,
  kKvStore,
  kAttention,
  kAttnOut,
  kFfnUpGate,
  kSiluMul,
  kFfnDown,
  kAdd,
  kOutput,
  kCount
};
const char* op_label_name(OpLabel l);

struct OpStats {
  std::array<uint64_t, static_cast<size_t>(OpLabel::kCount)> ns{};
  std::array<uint64_t, static_cast<size_t>(OpLabel::kCount)> calls{};
  void reset() { *this = OpStats(); }
  uint64_t total_ns() const;
};

/// Adds the time from construction to destruction to `stats` (when non-null).
class OpTimer {
 public:
  OpTimer(OpStats* stats, OpLabel label) : stats_(stats), label_(label) {
    if (stats_) t0_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    if (!stats_) return;
    const auto d = std::chrono::steady_clock::now() - t0_;
    stats_->ns[static_cast<size_t>(label_)] +=
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
    stats_->calls[static_cast<size_t>(label_)] += 1;
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  OpStats* stats_;
  OpLabel label_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace loom
