#include "tools/serve/metrics.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>

namespace loom::serve {

namespace {
void append_f(std::string* out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void append_f(std::string* out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) out->append(buf, static_cast<size_t>(std::min<int>(n, sizeof buf - 1)));
}
}  // namespace

void Histogram::record(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max(0.0, seconds) * 1e9), std::memory_order_relaxed);
}

void Histogram::render(const std::string& name, std::string* out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    if (i < kBounds.size())
      append_f(out, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name.c_str(), kBounds[i], cum);
    else
      append_f(out, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name.c_str(), cum);
  }
  append_f(out, "%s_sum %.9f\n", name.c_str(),
           static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9);
  append_f(out, "%s_count %" PRIu64 "\n", name.c_str(), cum);
}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::set_kv(const KvTierStats& s) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_ = s;
}

std::string Metrics::render() const {
  std::string out;
  out += "# HELP loom_requests_total HTTP requests by route and status code.\n";
  out += "# TYPE loom_requests_total counter\n";
  KvTierStats kv;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, n] : requests_)
      append_f(&out, "loom_requests_total{route=\"%s\",code=\"%d\"} %" PRIu64 "\n", k.first.c_str(),
               k.second, n);
    kv = kv_;
  }
  out += "# HELP loom_requests_cancelled_total Generations stopped because the client left.\n";
  out += "# TYPE loom_requests_cancelled_total counter\n";
  append_f(&out, "loom_requests_cancelled_total %" PRIu64 "\n", cancelled_.load());
  out += "# HELP loom_prompt_tokens_total Prompt tokens of admitted requests.\n";
  out += "# TYPE loom_prompt_tokens_total counter\n";
  append_f(&out, "loom_prompt_tokens_total %" PRIu64 "\n", prompt_tokens_.load());
  out += "# HELP loom_generated_tokens_total Tokens generated.\n";
  out += "# TYPE loom_generated_tokens_total counter\n";
  append_f(&out, "loom_generated_tokens_total %" PRIu64 "\n", generated_tokens_.load());
  out +=
      "# HELP loom_shared_prefix_tokens_total Prompt tokens whose KV was copied from another "
      "slot instead of evaluated.\n";
  out += "# TYPE loom_shared_prefix_tokens_total counter\n";
  append_f(&out, "loom_shared_prefix_tokens_total %" PRIu64 "\n", shared_prefix_.load());
  out += "# HELP loom_batch_steps_total Forward steps run (each batches every running sequence).\n";
  out += "# TYPE loom_batch_steps_total counter\n";
  append_f(&out, "loom_batch_steps_total %" PRIu64 "\n", steps_.load());
  out +=
      "# HELP loom_batch_sequences_total Sequences summed over the steps (divided by the steps: "
      "the mean batch).\n";
  out += "# TYPE loom_batch_sequences_total counter\n";
  append_f(&out, "loom_batch_sequences_total %" PRIu64 "\n", step_seqs_.load());
  out +=
      "# HELP loom_batch_rows_total Token rows summed over the steps (prompt chunks and decode "
      "tokens).\n";
  out += "# TYPE loom_batch_rows_total counter\n";
  append_f(&out, "loom_batch_rows_total %" PRIu64 "\n", step_rows_.load());
  out += "# HELP loom_queue_depth Requests waiting for a slot.\n";
  out += "# TYPE loom_queue_depth gauge\n";
  append_f(&out, "loom_queue_depth %" PRId64 "\n", queue_depth_.load());
  out += "# HELP loom_active_requests Requests holding a slot.\n";
  out += "# TYPE loom_active_requests gauge\n";
  append_f(&out, "loom_active_requests %" PRId64 "\n", active_.load());
  out += "# HELP loom_slots Sequences the scheduler runs at once (--parallel).\n";
  out += "# TYPE loom_slots gauge\n";
  append_f(&out, "loom_slots %" PRId64 "\n", slots_.load());
  out +=
      "# HELP loom_ttft_seconds Time from a request's arrival to its first token (queue wait "
      "included).\n";
  out += "# TYPE loom_ttft_seconds histogram\n";
  ttft_.render("loom_ttft_seconds", &out);
  out += "# HELP loom_itl_seconds Time between two tokens of one request.\n";
  out += "# TYPE loom_itl_seconds histogram\n";
  itl_.render("loom_itl_seconds", &out);
  out += "# HELP loom_kv_bytes KV cache bytes per tier, all slots.\n";
  out += "# TYPE loom_kv_bytes gauge\n";
  append_f(&out, "loom_kv_bytes{tier=\"device\"} %" PRIu64 "\n", kv.device_bytes);
  append_f(&out, "loom_kv_bytes{tier=\"ram\"} %" PRIu64 "\n", kv.ram_bytes);
  append_f(&out, "loom_kv_bytes{tier=\"ssd\"} %" PRIu64 "\n", kv.ssd_bytes);
  append_f(&out, "loom_kv_bytes{tier=\"staging\"} %" PRIu64 "\n", kv.staging_bytes);
  return out;
}

}  // namespace loom::serve
