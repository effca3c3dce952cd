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

namespace {

// "# HELP name help" and "# TYPE name type" lines.
void header(std::string* out, const char* name, const char* type, const char* help) {
  append_f(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

// A metric of one unlabelled value, with its header.
void single(std::string* out, const char* name, const char* type, const char* help, uint64_t v) {
  header(out, name, type, help);
  append_f(out, "%s %" PRIu64 "\n", name, v);
}

}  // namespace

std::string Metrics::render() const {
  std::string out;
  header(&out, "loom_requests_total", "counter", "HTTP requests by route and status code.");
  KvTierStats kv;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, n] : requests_)
      append_f(&out, "loom_requests_total{route=\"%s\",code=\"%d\"} %" PRIu64 "\n", k.first.c_str(),
               k.second, n);
    kv = kv_;
  }
  single(&out, "loom_requests_cancelled_total", "counter",
         "Generations stopped because the client left.", cancelled_.load());
  single(&out, "loom_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         prompt_tokens_.load());
  single(&out, "loom_generated_tokens_total", "counter", "Tokens generated.",
         generated_tokens_.load());
  single(&out, "loom_shared_prefix_tokens_total", "counter",
         "Prompt tokens whose KV was copied from another slot instead of evaluated.",
         shared_prefix_.load());
  single(&out, "loom_batch_steps_total", "counter",
         "Forward steps run (each batches every running sequence).", steps_.load());
  single(&out, "loom_batch_sequences_total", "counter",
         "Sequences summed over the steps (divided by the steps: the mean batch).",
         step_seqs_.load());
  single(&out, "loom_batch_rows_total", "counter",
         "Token rows summed over the steps (prompt chunks and decode tokens).", step_rows_.load());
  single(&out, "loom_queue_depth", "gauge", "Requests waiting for a slot.",
         static_cast<uint64_t>(std::max<int64_t>(0, queue_depth_.load())));
  single(&out, "loom_active_requests", "gauge", "Requests holding a slot.",
         static_cast<uint64_t>(std::max<int64_t>(0, active_.load())));
  single(&out, "loom_slots", "gauge", "Sequences the scheduler runs at once (--parallel).",
         static_cast<uint64_t>(std::max<int64_t>(0, slots_.load())));
  header(&out, "loom_ttft_seconds", "histogram",
         "Time from a request's arrival to its first token (queue wait included).");
  ttft_.render("loom_ttft_seconds", &out);
  header(&out, "loom_itl_seconds", "histogram", "Time between two tokens of one request.");
  itl_.render("loom_itl_seconds", &out);
  header(&out, "loom_step_forward_seconds", "histogram",
         "A batched step's forward pass (every matmul over all its rows).");
  step_forward_.render("loom_step_forward_seconds", &out);
  header(&out, "loom_step_host_seconds", "histogram",
         "The scheduler's time around a step's forward pass: admission, sampling, text.");
  step_host_.render("loom_step_host_seconds", &out);
  header(&out, "loom_kv_bytes", "gauge", "KV cache bytes per tier, all slots.");
  append_f(&out, "loom_kv_bytes{tier=\"device\"} %" PRIu64 "\n", kv.device_bytes);
  append_f(&out, "loom_kv_bytes{tier=\"ram\"} %" PRIu64 "\n", kv.ram_bytes);
  append_f(&out, "loom_kv_bytes{tier=\"ssd\"} %" PRIu64 "\n", kv.ssd_bytes);
  append_f(&out, "loom_kv_bytes{tier=\"staging\"} %" PRIu64 "\n", kv.staging_bytes);
  return out;
}

}  // namespace loom::serve
