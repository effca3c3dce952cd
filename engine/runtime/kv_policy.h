// Which KV blocks stay in host RAM and which go down to the SSD spill file
// when RAM runs out (KvCache::rebalance). A policy only ranks blocks; the
// cache keeps the attention sinks and the newest window in RAM whatever the
// policy says, and moves the lowest-ranked of the rest first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/core/status.h"

namespace loom {

/// What the cache knows of one (layer, block).
struct KvBlockStats {
  int64_t layer = 0;
  int64_t block = 0;
  float mass = 0;             ///< attention mass received, a decaying running sum
  int64_t last_hot_step = 0;  ///< decode step at which its mass last rose above its average
};

class KvTierPolicy {
 public:
  virtual ~KvTierPolicy() = default;
  virtual const char* name() const = 0;
  /// Higher scores stay in the faster tier.
  virtual double score(const KvBlockStats& b) const = 0;
  /// How much better a block on the SSD must score than the worst one in RAM
  /// before the two swap (hysteresis, so that blocks do not bounce).
  virtual double promote_margin() const { return 1.5; }
  /// Whether the cache should measure attention mass for this policy.
  virtual bool wants_mass() const { return false; }
};

/// Oldest first: every block is read at every step, so "least recently used"
/// comes down to the order the blocks were written in.
std::unique_ptr<KvTierPolicy> make_lru_policy();
/// Importance-weighted: blocks that received little attention go down first;
/// one that grows hot again comes back up.
std::unique_ptr<KvTierPolicy> make_importance_policy();
/// "lru" or "importance" (errors name the choices).
Result<std::unique_ptr<KvTierPolicy>> make_kv_policy(std::string_view name);

}  // namespace loom
