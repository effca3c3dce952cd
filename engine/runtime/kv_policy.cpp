#include "engine/runtime/kv_policy.h"

namespace loom {

namespace {

class LruPolicy final : public KvTierPolicy {
 public:
  const char* name() const override { return "lru"; }
  double score(const KvBlockStats& b) const override { return static_cast<double>(b.block); }
  double promote_margin() const override { return 0; }  // never promotes: order never changes
};

class ImportancePolicy final : public KvTierPolicy {
 public:
  const char* name() const override { return "importance"; }
  // Mass first; among blocks of equal mass, the newer one.
  double score(const KvBlockStats& b) const override {
    return static_cast<double>(b.mass) + 1e-9 * static_cast<double>(b.block);
  }
  bool wants_mass() const override { return true; }
};

}  // namespace

std::unique_ptr<KvTierPolicy> make_lru_policy() {
  return std::make_unique<LruPolicy>();
}
std::unique_ptr<KvTierPolicy> make_importance_policy() {
  return std::make_unique<ImportancePolicy>();
}

Result<std::unique_ptr<KvTierPolicy>> make_kv_policy(std::string_view name) {
  if (name == "lru") return make_lru_policy();
  if (name == "importance") return make_importance_policy();
  return make_error(ErrorCode::kInvalidArgument, "unknown KV tier policy '%.*s' (lru, importance)",
                    static_cast<int>(name.size()), name.data());
}

}  // namespace loom
