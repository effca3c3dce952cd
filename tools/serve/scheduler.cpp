#include "tools/serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace loom::serve {

namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// log-softmax of the chosen token and the `top` most likely ones, from raw logits [n].
TokenLogprob logprobs_of(const Tokenizer& tok, const float* logits, int64_t n, int32_t id,
                         int top) {
  float mx = logits[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  TokenLogprob lp;
  lp.token = tok.token_to_piece(id);
  lp.logprob = logits[id] - lse;
  if (top > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min<size_t>(static_cast<size_t>(top), idx.size());
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (size_t i = 0; i < k; ++i)
      lp.top.emplace_back(tok.token_to_piece(idx[i]), logits[idx[i]] - lse);
  }
  return lp;
}
}  // namespace

const char* finish_reason_text(Finish f) {
  switch (f) {
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kCancelled: return "cancelled";
    case Finish::kError: return "error";
    case Finish::kNone: break;
  }
  return "";
}

bool Request::wait_events(std::vector<Event>* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, timeout, [&] { return !events.empty() || finish != Finish::kNone; });
  for (auto& e : events) out->push_back(std::move(e));
  events.clear();
  return !(finish != Finish::kNone && out->empty());
}

Scheduler::Scheduler(std::vector<std::unique_ptr<Session>> slots, const SchedulerOptions& o,
                     Metrics* metrics)
    : opt_(o), metrics_(metrics) {
  for (auto& s : slots) {
    auto slot = std::make_unique<Slot>();
    slot->session = std::move(s);
    slots_.push_back(std::move(slot));
  }
  n_ctx_ = slots_.front()->session->n_ctx();
  budget_ = slots_.front()->session->forward().max_chunk();
  chunk_ = std::min(o.prefill_chunk > 0 ? o.prefill_chunk : budget_, budget_);
  for (auto& s : slots_) s->logits.resize(static_cast<size_t>(model().hp.n_vocab));
  const int sample_threads = std::min(o.sample_threads, n_slots());
  if (sample_threads > 1) {
    sample_pool_ = std::make_unique<cpu::ThreadPool>(sample_threads);
    // Draws come once a step: workers that spun on would take the cores from
    // a hybrid placement's CPU threads while the step runs.
    sample_pool_->set_spin_us(0);
  }
  if (metrics_) metrics_->set_slots(n_slots());
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Scheduler::submit(std::shared_ptr<Request> r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return make_error(ErrorCode::kCancelled, "the server is shutting down");
    // Free slots take requests at the next round: only the excess waits.
    const int64_t free_slots = n_slots() - n_active_;
    if (static_cast<int64_t>(queue_.size()) - free_slots >= opt_.queue_max) {
      return make_error(ErrorCode::kOutOfRange,
                        "the server is busy: %zu requests are waiting (at most %lld)",
                        queue_.size(), static_cast<long long>(opt_.queue_max));
    }
    queue_.push_back(std::move(r));
    if (metrics_) metrics_->set_queue_depth(static_cast<int64_t>(queue_.size()));
  }
  cv_.notify_all();
  return {};
}

int64_t Scheduler::queue_depth() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t Scheduler::active() {
  std::lock_guard<std::mutex> lock(mu_);
  return n_active_;
}

void Scheduler::set_paused(bool paused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = paused;
  }
  cv_.notify_all();
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (!paused_ && (!queue_.empty() || n_active_ > 0)); });
      if (stop_) break;
    }
    const auto t0 = Clock::now();
    admit();
    const double forward_ms = step_all();
    publish_kv();
    if (metrics_ && forward_ms > 0) {
      metrics_->step_forward().record(forward_ms * 1e-3);
      metrics_->step_host().record((ms_between(t0, Clock::now()) - forward_ms) * 1e-3);
    }
  }
  // Shutting down: whoever waits hears that it ended.
  for (auto& s : slots_)
    if (s->req) finish(*s, Finish::kCancelled);
  std::deque<std::shared_ptr<Request>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(queue_);
  }
  for (auto& r : left) {
    std::lock_guard<std::mutex> lock(r->mu);
    r->finish = Finish::kCancelled;
    r->cv.notify_all();
  }
}

void Scheduler::admit() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!queue_.empty()) {
    std::shared_ptr<Request> r = queue_.front();
    // The free slot whose cache shares the longest prefix with the prompt.
    Slot* best = nullptr;
    size_t best_common = 0;
    for (auto& s : slots_) {
      if (s->req) continue;
      const auto& toks = s->session->tokens();
      size_t c = 0;
      while (c < toks.size() && c < r->prompt.size() && toks[c] == r->prompt[c]) ++c;
      if (!best || c > best_common) {
        best = s.get();
        best_common = c;
      }
    }
    if (!best) break;
    queue_.pop_front();
    ++n_active_;
    lock.unlock();

    Slot& s = *best;
    s.req = std::move(r);
    Request& q = *s.req;
    s.sampler = std::make_unique<Sampler>(q.sampling, model().hp.n_vocab);
    s.detok = std::make_unique<StreamingDetokenizer>(*model().tokenizer);
    s.held.clear();
    s.held_lp.clear();
    s.next = -1;
    int64_t kept = q.prompt.empty() ? 0 : s.session->keep_prefix(q.prompt);
    kept = take_shared_prefix(s, kept);
    s.prefill_pos = kept;
    {
      std::lock_guard<std::mutex> ql(q.mu);
      q.n_prompt = static_cast<int64_t>(q.prompt.size());
      q.n_reused = kept;
      q.queue_ms = ms_between(q.t_arrival, Clock::now());
    }
    if (metrics_) metrics_->add_prompt_tokens(static_cast<int64_t>(q.prompt.size()));
    if (q.prompt.empty() || static_cast<int64_t>(q.prompt.size()) >= n_ctx_) {
      finish(s, Finish::kError, "the prompt is empty or does not fit the context");
    }
    lock.lock();
  }
  if (metrics_) {
    metrics_->set_queue_depth(static_cast<int64_t>(queue_.size()));
    metrics_->set_active(n_active_);
  }
}

int64_t Scheduler::take_shared_prefix(Slot& s, int64_t kept) {
  // Another slot (running or not) that holds a longer start of the prompt
  // lends its KV: the shared system prompt is evaluated once.
  const std::vector<int32_t>& prompt = s.req->prompt;
  Slot* donor = nullptr;
  int64_t best = kept;
  for (auto& o : slots_) {
    if (o.get() == &s) continue;
    const std::vector<int32_t>& toks = o->session->tokens();
    const int64_t limit =
        std::min<int64_t>({static_cast<int64_t>(toks.size()), o->session->kv().n_tokens(),
                           static_cast<int64_t>(prompt.size()) - 1});
    int64_t c = 0;
    while (c < limit && toks[static_cast<size_t>(c)] == prompt[static_cast<size_t>(c)]) ++c;
    if (c > best) {
      best = c;
      donor = o.get();
    }
  }
  if (!donor || best - kept < kMinSharedPrefix) return kept;
  if (!s.session->take_prefix(*donor->session, best).ok()) return 0;  // evaluated as usual
  if (metrics_) metrics_->add_shared_prefix_tokens(best - kept);
  return best;
}

double Scheduler::step_all() {
  // Who runs in this step, and with which tokens: prompt chunks (chunked
  // prefill) and one token of every decoding sequence, at most budget_ rows.
  std::vector<Slot*> prefill, decode;
  const size_t n = slots_.size();
  for (size_t i = 0; i < n; ++i) {
    Slot& s = *slots_[(i + rr_) % n];  // a rotating start: fair when the budget is short
    if (!s.req) continue;
    if (s.req->cancel.load(std::memory_order_relaxed)) {
      finish(s, Finish::kCancelled);
      continue;
    }
    (s.prefill_pos < static_cast<int64_t>(s.req->prompt.size()) ? prefill : decode).push_back(&s);
  }
  rr_ = (rr_ + 1) % n;
  if (prefill.empty() && decode.empty()) return 0;
  // Decode steps first in the budget, but prompts get at least half of it.
  const int64_t max_decode = prefill.empty() ? budget_ : std::max<int64_t>(1, budget_ / 2);
  if (static_cast<int64_t>(decode.size()) > max_decode)
    decode.resize(static_cast<size_t>(max_decode));
  int64_t left = budget_ - static_cast<int64_t>(decode.size());
  // Beside decoding sequences, prompts take what keeps the step near a
  // decode-only one: their inter-token latency stays even.
  if (!decode.empty() && !prefill.empty() && opt_.itl_factor > 1 && left > 0)
    left = cost_.prompt_budget(static_cast<int64_t>(decode.size()), opt_.itl_factor, kMinPromptRows,
                               left);

  struct Planned {
    Slot* slot;
    int64_t n;    ///< prompt tokens (0: a decode step)
    bool logits;  ///< the step ends the prompt, or decodes
  };
  std::vector<Planned> plan;
  for (Slot* s : prefill) {
    if (left <= 0) break;
    const int64_t rest = static_cast<int64_t>(s->req->prompt.size()) - s->prefill_pos;
    const int64_t take = std::min({chunk_, left, rest});
    plan.push_back({s, take, take == rest});
    left -= take;
  }
  // Sequences that want logits last: the output matmul runs from the first such row on.
  std::stable_partition(plan.begin(), plan.end(), [](const Planned& p) { return !p.logits; });
  for (Slot* s : decode) plan.push_back({s, 0, true});

  // Sessions sharing a forward pass go in one batched step; others alone.
  std::vector<size_t> group;
  std::vector<Session::BatchItem> items;
  double forward_ms = 0;
  for (size_t first = 0; first < plan.size(); ++first) {
    if (!plan[first].slot) continue;
    const ForwardPass* fwd = &plan[first].slot->session->forward();
    group.clear();
    items.clear();
    for (size_t j = first; j < plan.size(); ++j) {
      Slot* s = plan[j].slot;
      if (!s || &s->session->forward() != fwd) continue;
      group.push_back(j);
      Session::BatchItem it;
      it.session = s->session.get();
      it.tokens = plan[j].n > 0 ? std::span<const int32_t>(s->req->prompt.data() + s->prefill_pos,
                                                           static_cast<size_t>(plan[j].n))
                                : std::span<const int32_t>(&s->next, 1);
      it.logits = plan[j].logits ? s->logits.data() : nullptr;
      items.push_back(it);
    }
    const auto t0 = Clock::now();
    Session::append_batch(items);
    int64_t rows = 0;
    for (const auto& it : items) rows += static_cast<int64_t>(it.tokens.size());
    const double ms = ms_between(t0, Clock::now());
    forward_ms += ms;
    cost_.add(rows, ms);
    if (metrics_) metrics_->count_step(static_cast<int64_t>(items.size()), rows);
    std::vector<Slot*> drawing;
    for (size_t k = 0; k < group.size(); ++k)
      if (items[k].status.ok() && plan[group[k]].logits) drawing.push_back(plan[group[k]].slot);
    sample_all(drawing);
    for (size_t k = 0; k < group.size(); ++k) {
      Planned& p = plan[group[k]];
      Slot& s = *std::exchange(p.slot, nullptr);
      if (!items[k].status.ok()) {
        finish(s, Finish::kError, items[k].status.message());
        continue;
      }
      if (p.n > 0) s.prefill_pos += p.n;
      if (p.logits) on_logits(s);
    }
  }
  return forward_ms;
}

void Scheduler::sample_all(std::span<Slot* const> slots) {
  const int64_t n_vocab = model().hp.n_vocab;
  auto draw = [&](int64_t begin, int64_t end, int /*ith*/) {
    for (int64_t i = begin; i < end; ++i) {
      Slot& s = *slots[static_cast<size_t>(i)];
      s.drawn = s.sampler->sample(s.logits.data(), s.session->tokens());
      s.drawn_lp.reset();
      if (s.req->top_logprobs >= 0)
        s.drawn_lp =
            logprobs_of(*model().tokenizer, s.logits.data(), n_vocab, s.drawn, s.req->top_logprobs);
    }
  };
  const auto n = static_cast<int64_t>(slots.size());
  if (sample_pool_ && n > 1)
    sample_pool_->parallel_for(n, 1, draw);
  else
    draw(0, n, 0);
}

void Scheduler::on_logits(Slot& s) {
  Request& q = *s.req;
  Session& ses = *s.session;
  const int32_t id = s.drawn;
  const auto now = Clock::now();
  if (q.n_generated == 0 && s.next < 0) {
    const double ttft = ms_between(q.t_arrival, now);
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.ttft_ms = ttft;
    }
    if (metrics_) metrics_->ttft().record(ttft * 1e-3);
  } else {
    const double itl = ms_between(s.t_last, now);
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.itl_ms.push_back(itl);
    }
    if (metrics_) metrics_->itl().record(itl * 1e-3);
  }
  s.t_last = now;
  s.next = id;
  const Tokenizer& tok = *model().tokenizer;
  if (!q.ignore_eos && tok.vocab().is_end_of_generation(id)) {
    finish(s, Finish::kStop);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(q.mu);
    ++q.n_generated;
  }
  if (metrics_) metrics_->add_generated_tokens(1);
  if (emit_text(s, s.detok->push(id), std::exchange(s.drawn_lp, std::nullopt))) {
    finish(s, Finish::kStop, {}, /*flush=*/false);
    return;
  }
  if (q.max_tokens >= 0 && q.n_generated >= q.max_tokens) {
    finish(s, Finish::kLength);
    return;
  }
  if (static_cast<int64_t>(ses.tokens().size()) >= n_ctx_) finish(s, Finish::kLength);
}

bool Scheduler::emit_text(Slot& s, const std::string& piece, std::optional<TokenLogprob> lp) {
  Request& q = *s.req;
  s.held += piece;
  if (lp) s.held_lp.push_back(std::move(*lp));
  size_t release = s.held.size();
  bool stopped = false;
  size_t stop_at = std::string::npos;
  for (const auto& stop : q.stop) {
    if (stop.empty()) continue;
    const size_t p = s.held.find(stop);
    if (p != std::string::npos) stop_at = std::min(stop_at, p);
  }
  if (stop_at != std::string::npos) {
    release = stop_at;
    stopped = true;
  } else {
    // Hold back the longest tail that is the start of a stop string.
    size_t keep = 0;
    for (const auto& stop : q.stop) {
      const size_t m = std::min(stop.size() - (stop.empty() ? 0 : 1), s.held.size());
      for (size_t k = m; k > keep; --k) {
        if (s.held.compare(s.held.size() - k, k, stop, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
    release = s.held.size() - keep;
  }
  if (release > 0 || stopped || (!s.held_lp.empty() && release == s.held.size())) {
    Event e;
    e.text = s.held.substr(0, release);
    e.logprobs = std::move(s.held_lp);
    s.held_lp.clear();
    s.held.erase(0, stopped ? s.held.size() : release);
    std::lock_guard<std::mutex> lock(q.mu);
    q.events.push_back(std::move(e));
    q.cv.notify_all();
  }
  return stopped;
}

void Scheduler::finish(Slot& s, Finish f, const std::string& error, bool flush) {
  Request& q = *s.req;
  if (flush && (f == Finish::kStop || f == Finish::kLength)) {
    // The detokenizer's and the stop check's held-back text is part of the answer.
    std::string rest = s.detok->flush();
    if (!rest.empty()) (void)emit_text(s, rest, std::nullopt);
    if (!s.held.empty() || !s.held_lp.empty()) {
      Event e;
      e.text = std::move(s.held);
      e.logprobs = std::move(s.held_lp);
      std::lock_guard<std::mutex> lock(q.mu);
      q.events.push_back(std::move(e));
    }
  }
  s.held.clear();
  s.held_lp.clear();
  if (f == Finish::kCancelled && metrics_) metrics_->count_cancelled();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.finish = f;
    q.error = error;
    q.cv.notify_all();
  }
  s.req.reset();
  std::lock_guard<std::mutex> lock(mu_);
  --n_active_;
  if (metrics_) metrics_->set_active(n_active_);
}

void Scheduler::publish_kv() {
  if (!metrics_) return;
  // The sums walk every slot's cache: at most ten times a second while
  // requests run, and once more when none does (the final figures).
  const bool busy = std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->req; });
  const auto now = std::chrono::steady_clock::now();
  if (busy && now - kv_published_ < std::chrono::milliseconds(100)) return;
  kv_published_ = now;
  KvTierStats sum;
  for (const auto& s : slots_) {
    const KvTierStats t = s->session->kv().tier_stats();
    sum.device_bytes += t.device_bytes;
    sum.ram_bytes += t.ram_bytes;
    sum.ssd_bytes += t.ssd_bytes;
    sum.staging_bytes += t.staging_bytes;
  }
  metrics_->set_kv(sum);
}

}  // namespace loom::serve
