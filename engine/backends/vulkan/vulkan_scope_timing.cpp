// VulkanBackend's scope timing for the forward pass's profiler
// (set_scope_timing, begin_scope, take_scope_times): one timestamp per scope
// boundary, resolved after each submission's fence.
#include <algorithm>

#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

namespace {

// Scope timestamps per submission: the pool starts with this many and doubles
// (up to the most) whenever a submission fills it, which then flushes early.
constexpr uint32_t kScopeQueries = 1024;
constexpr uint32_t kMaxScopeQueries = 65536;

}  // namespace

// ---- scope timing -----------------------------------------------------------------

Status VulkanBackend::make_scope_pool(uint32_t n) {
  const vk::Fns& fn = dev_->fn();
  VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = n;
  VkQueryPool pool = VK_NULL_HANDLE;
  const VkResult r = fn.vkCreateQueryPool(dev_->device(), &qi, nullptr, &pool);
  if (r != VK_SUCCESS) return vk::vk_error(r, "vkCreateQueryPool");
  if (scope_pool_) fn.vkDestroyQueryPool(dev_->device(), scope_pool_, nullptr);
  scope_pool_ = pool;
  scope_cap_ = n;
  return {};
}

void VulkanBackend::set_scope_timing(bool on) {
  if (on == scope_on_) return;
  if (!on) {
    mark_scope(-1);  // the open scope ends here
    scope_on_ = false;
    return;
  }
  // No timestamps on this queue: stays off (the caller sees device_timing() false).
  if (!device_timing()) return;
  if (!scope_pool_) {
    scope_want_ = kScopeQueries;
    if (!make_scope_pool(scope_want_).ok()) return;
  }
  scope_on_ = true;
}

void VulkanBackend::write_scope_mark(int32_t starts, bool ends) {
  const vk::Fns& fn = dev_->fn();
  if (!scope_reset_) {
    fn.vkCmdResetQueryPool(cmd_, scope_pool_, 0, scope_cap_);
    scope_reset_ = true;
  }
  // Bottom of pipe: the time when every command recorded before has finished,
  // so consecutive marks split the submission's time with no gap or overlap.
  fn.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, scope_pool_,
                         u32(scope_marks_.size()));
  scope_marks_.push_back(ScopeMark{starts, ends});
}

void VulkanBackend::mark_scope(int32_t id) {
  if (id < 0) id = -1;
  // Keep one query for the pause mark of flush(); a full pool flushes early
  // and the next submission gets a bigger one.
  if (recording_ && scope_marks_.size() + 2 > scope_cap_) {
    (void)flush();  // an error stays in status_ for the next synchronize()
    scope_want_ = std::min(scope_cap_ * 2, kMaxScopeQueries);
  }
  if (!recording_) {
    // Nothing queued since the last flush: the open scope's time is all in the carry.
    if (scope_open_ >= 0) scope_done_.push_back(ScopeTime{scope_open_, ticks_to_ns(scope_carry_)});
    scope_carry_ = 0;
    scope_open_ = id;
    return;
  }
  write_scope_mark(id, true);
  scope_open_ = id;
}

void VulkanBackend::resolve_scopes() {
  if (scope_marks_.empty()) return;
  const size_t n = scope_marks_.size();
  std::vector<uint64_t> ts(n);
  const VkResult r = dev_->fn().vkGetQueryPoolResults(
      dev_->device(), scope_pool_, 0, u32(n), n * sizeof(uint64_t), ts.data(), sizeof(uint64_t),
      VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  const uint32_t bits = dev_->caps().timestamp_bits;
  // The counter wraps at its valid bits.
  const uint64_t mask = bits >= 64 ? ~0ull : (1ull << bits) - 1;
  uint64_t acc = scope_carry_;  // ticks of the scope of the current interval
  for (size_t i = 0; i + 1 < n; ++i) {
    const int32_t id = scope_marks_[i].starts;
    if (id < 0) {
      acc = 0;
      continue;
    }
    if (r == VK_SUCCESS) acc += (ts[i + 1] - ts[i]) & mask;
    if (scope_marks_[i + 1].ends) {
      scope_done_.push_back(ScopeTime{id, ticks_to_ns(acc)});
      acc = 0;
    }
  }
  // The pause mark closes the submission with the scope still open: carry its time.
  scope_carry_ = scope_open_ >= 0 ? acc : 0;
  scope_marks_.clear();
}

void VulkanBackend::take_scope_times(std::vector<ScopeTime>* out) {
  out->insert(out->end(), scope_done_.begin(), scope_done_.end());
  scope_done_.clear();
}

}  // namespace loom
