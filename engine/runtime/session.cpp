#include "engine/runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <utility>

#include "engine/placement/adaptive.h"

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

const char* stop_reason_text(StopReason r) {
  switch (r) {
    case StopReason::kEndOfGeneration: return "end of generation token";
    case StopReason::kMaxTokens: return "token limit reached";
    case StopReason::kContextFull: return "context full";
    case StopReason::kCancelled: return "cancelled";
  }
  return "?";
}

Result<std::unique_ptr<Session>> Session::create(const Model& model, Backend& backend,
                                                 const SessionConfig& cfg) {
  std::unique_ptr<Session> s(new Session(model));
  KvCacheConfig kc;
  kc.n_layer = model.hp.n_layer;
  kc.n_kv_heads = model.hp.n_head_kv;
  kc.head_dim = model.hp.head_dim;
  kc.n_ctx = cfg.n_ctx > 0 ? cfg.n_ctx : std::min<int64_t>(model.hp.n_ctx_train, 4096);
  kc.dtype = cfg.kv_dtype;
  if (!backend.supports(OpKind::kAttention, kc.dtype)) {
    return make_error(ErrorCode::kUnsupported, "backend %s cannot run attention with a %s KV cache",
                      backend.name().c_str(), std::string(dtype_name(kc.dtype)).c_str());
  }
  auto kv = KvCache::create(kc);
  if (!kv.ok()) return kv.error();
  s->kv_ = std::move(kv).value();
  LOOM_TRY(s->kv_->configure_tiers(cfg.kv_tiers));
  s->fwd_ = std::make_shared<ForwardPass>(model, backend, *s->kv_, cfg.max_chunk);
  s->logits_.resize(static_cast<size_t>(model.hp.n_vocab));
  return s;
}

Result<std::unique_ptr<Session>> Session::create_sharing(Session& base, const SessionConfig& cfg) {
  std::unique_ptr<Session> s(new Session(base.m_));
  KvCacheConfig kc = base.kv_->config();
  if (cfg.n_ctx > 0) kc.n_ctx = cfg.n_ctx;
  auto kv = KvCache::create(kc);
  if (!kv.ok()) return kv.error();
  s->kv_ = std::move(kv).value();
  LOOM_TRY(s->kv_->configure_tiers(cfg.kv_tiers));
  LOOM_TRY(base.fwd_->attach_kv(*s->kv_));
  s->fwd_ = base.fwd_;
  s->logits_.resize(base.logits_.size());
  return s;
}

Session::~Session() {
  if (fwd_ && kv_) fwd_->detach_kv(*kv_);
}

std::vector<int32_t> Session::tokenize_raw(std::string_view text) const {
  return m_.tokenizer->encode(text, /*add_special=*/true, /*parse_special=*/false);
}

Result<std::vector<int32_t>> Session::tokenize_chat(
    const std::vector<ChatMessage>& messages) const {
  auto text = m_.chat_template.apply(messages, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.error();
  // The template may write the BOS text itself; then the tokenizer must not add another.
  const bool add_special = !m_.chat_template.adds_bos_text();
  return m_.tokenizer->encode(*text, add_special, /*parse_special=*/true);
}

void Session::reset() {
  tokens_.clear();
  kv_->clear();
}

Status Session::shift_context() {
  // Keep the first token (BOS / system start) and the newer half; recompute
  // their KV (positions change, so cached keys cannot be reused).
  const int64_t n = static_cast<int64_t>(tokens_.size());
  const int64_t keep_head = 1;
  const int64_t drop = (n - keep_head) / 2;
  std::vector<int32_t> kept(tokens_.begin(), tokens_.begin() + keep_head);
  kept.insert(kept.end(), tokens_.begin() + keep_head + drop, tokens_.end());
  kv_->clear();
  tokens_.clear();
  // The last token is fed by the decode loop; evaluate all but it.
  std::span<const int32_t> pre(kept.data(), kept.size() - 1);
  LOOM_TRY(eval(pre, 0, logits_.data(), nullptr));
  tokens_.assign(pre.begin(), pre.end());
  return {};
}

Status Session::recompute_lost(std::span<const int32_t> pending, int64_t pos0, GenerateStats* st) {
  // The cache holds tokens [0, done): tokens_ then the first part of `pending`.
  const int64_t done = kv_->n_tokens();
  auto token_at = [&](int64_t i) {
    return i < pos0 ? tokens_[static_cast<size_t>(i)] : pending[static_cast<size_t>(i - pos0)];
  };
  std::vector<float> scratch(logits_.size());
  std::vector<std::pair<int64_t, int64_t>> queue = kv_->take_lost();
  Status result;
  for (int steps = 0; !queue.empty(); ++steps) {
    if (steps >= 64) {
      result = make_error(ErrorCode::kIo,
                          "KV cache: blocks keep failing to come back from the spill file; "
                          "giving up after 64 recomputations");
      break;
    }
    const auto [a, b] = queue.front();
    std::vector<int32_t> toks;
    for (int64_t i = a; i < b; ++i) toks.push_back(token_at(i));
    kv_->set_n_tokens(a);
    kv_->set_recomputing(true);
    Status s = fwd_->eval(*kv_, toks, a, scratch.data());
    kv_->set_recomputing(false);
    kv_->set_n_tokens(done);
    if (!s.ok()) {
      if (!kv_->has_lost()) {
        result = s;
        break;
      }
      for (auto r : kv_->take_lost()) queue.push_back(r);  // and this range again
      continue;
    }
    if (st)
      st->n_kv_recomputed += (b - a + kv_->config().block_size - 1) / kv_->config().block_size;
    queue.erase(queue.begin());
  }
  kv_->finish_recompute();
  return result;
}

Status Session::eval(std::span<const int32_t> tokens, int64_t pos0, float* logits,
                     GenerateStats* st) {
  // Blocks lost outside a step (moving a layer's KV, say) hold zeros: recompute them first.
  if (kv_->has_lost()) LOOM_TRY(recompute_lost(tokens.first(0), pos0, st));
  for (int attempt = 0;; ++attempt) {
    Status s = fwd_->eval(*kv_, tokens, pos0, logits);
    if (s.ok() || attempt >= 8 || !kv_->has_lost()) return s;
    LOOM_TRY(recompute_lost(tokens, pos0, st));
    // Go on from where the failed evaluation stopped.
    const int64_t done = kv_->n_tokens();
    tokens = tokens.subspan(static_cast<size_t>(done - pos0));
    pos0 = done;
    if (tokens.empty()) return {};
  }
}

int64_t Session::keep_prefix(std::span<const int32_t> prompt) {
  size_t common = 0;
  while (common < tokens_.size() && common + 1 < prompt.size() && tokens_[common] == prompt[common])
    ++common;
  tokens_.resize(common);
  kv_->set_n_tokens(static_cast<int64_t>(common));
  return static_cast<int64_t>(common);
}

Status Session::take_prefix(Session& src, int64_t n) {
  if (n < 0 || n > src.kv_->n_tokens() || n > static_cast<int64_t>(src.tokens_.size()))
    return make_error(ErrorCode::kInvalidArgument,
                      "take_prefix: %" PRId64 " tokens, the other session holds %" PRId64, n,
                      src.kv_->n_tokens());
  Status s = kv_->copy_prefix(*src.kv_, n);
  if (!s.ok()) {
    reset();
    return s;
  }
  tokens_.assign(src.tokens_.begin(), src.tokens_.begin() + n);
  return {};
}

Status Session::append(std::span<const int32_t> tokens, float* logits, GenerateStats* st) {
  if (tokens.empty()) return make_error(ErrorCode::kInvalidArgument, "nothing to evaluate");
  const int64_t pos0 = static_cast<int64_t>(tokens_.size());
  if (pos0 + static_cast<int64_t>(tokens.size()) > kv_->capacity()) {
    return make_error(ErrorCode::kOutOfRange,
                      "%zu more tokens do not fit: the context holds %" PRId64 " and has %" PRId64,
                      tokens.size(), kv_->capacity(), pos0);
  }
  (void)apply_pending_placement();  // errors went to the requester; the old placement stays
  LOOM_TRY(eval(tokens, pos0, logits, st));
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return {};
}

void Session::append_batch(std::span<BatchItem> items) {
  if (items.empty()) return;
  std::vector<ForwardPass::SeqStep> steps;
  bool batched = items.size() > 1;
  for (BatchItem& it : items) {
    Session& s = *it.session;
    it.status = Status();
    batched &= s.fwd_ == items[0].session->fwd_ && !s.kv_->has_lost() && !s.has_pending_.load();
    if (s.tokens_.size() + it.tokens.size() > static_cast<size_t>(s.kv_->capacity()) ||
        it.tokens.empty())
      batched = false;  // append() gives the error
    steps.push_back({s.kv_.get(), it.tokens, it.logits});
  }
  if (batched) {
    Status st = items[0].session->fwd_->eval_batch(steps);
    if (st.ok()) {
      for (BatchItem& it : items) {
        auto& t = it.session->tokens_;
        t.insert(t.end(), it.tokens.begin(), it.tokens.end());
      }
      return;
    }
    // Back to what each session holds; then one at a time.
    for (BatchItem& it : items)
      it.session->kv_->set_n_tokens(static_cast<int64_t>(it.session->tokens_.size()));
  }
  for (BatchItem& it : items) it.status = it.session->append(it.tokens, it.logits);
}

void Session::request_placement(const Placement& p, std::function<void(const Status&)> done) {
  std::function<void(const Status&)> replaced;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    replaced = std::exchange(pending_done_, std::move(done));
    pending_ = p;
    has_pending_.store(true, std::memory_order_release);
  }
  // An earlier request not applied yet is dropped: its requester hears so (on this thread).
  if (replaced)
    replaced(make_error(ErrorCode::kCancelled, "replaced by a newer placement request"));
}

Status Session::apply_pending_placement() {
  if (!has_pending_.load(std::memory_order_acquire)) return {};
  std::optional<Placement> p;
  std::function<void(const Status&)> done;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    p.swap(pending_);
    done.swap(pending_done_);
    has_pending_.store(false, std::memory_order_release);
  }
  if (!p) return {};
  Status s = fwd_->set_placement(*p);
  if (s.ok()) adapt_ = nullptr;  // the requester's choice wins over the controller's
  if (done) done(s);
  return s;
}

void Session::adapt_step(double step_ms) {
  if (!adapt_ || has_pending_.load(std::memory_order_acquire)) return;
  adapt_->step(step_ms, static_cast<int64_t>(tokens_.size()), prof_,
               [this](const Placement& p) { return fwd_->set_placement(p); });
}

Result<GenerateStats> Session::generate(std::span<const int32_t> prompt,
                                        const GenerateParams& params, const PieceCallback& on_piece,
                                        const std::atomic<bool>* cancel) {
  GenerateStats st;
  if (prompt.empty()) return make_error(ErrorCode::kInvalidArgument, "the prompt is empty");
  const int64_t n_ctx = kv_->capacity();
  if (static_cast<int64_t>(prompt.size()) >= n_ctx) {
    return make_error(ErrorCode::kOutOfRange,
                      "the prompt is %zu tokens but the context holds %" PRId64
                      " (one more is needed to answer): shorten it or raise the context size",
                      prompt.size(), n_ctx);
  }
  const auto t0 = Clock::now();
  (void)apply_pending_placement();  // errors went to the requester; the old placement stays

  // Reuse the cached prefix; at least the last prompt token is evaluated so
  // there are logits to sample from.
  size_t common = 0;
  while (common < tokens_.size() && common < prompt.size() - 1 && tokens_[common] == prompt[common])
    ++common;
  tokens_.resize(common);
  kv_->set_n_tokens(static_cast<int64_t>(common));
  st.n_reused = static_cast<int64_t>(common);
  std::span<const int32_t> todo = prompt.subspan(common);
  st.n_prompt = static_cast<int64_t>(todo.size());
  LOOM_TRY(eval(todo, static_cast<int64_t>(common), logits_.data(), &st));
  tokens_.insert(tokens_.end(), todo.begin(), todo.end());
  st.prefill_ms = ms_since(t0);

  Sampler sampler(params.sampling, m_.hp.n_vocab);
  StreamingDetokenizer detok(*m_.tokenizer, /*render_special=*/false, params.escape_invalid_utf8);
  const Vocab& vocab = m_.tokenizer->vocab();
  auto last = Clock::now();
  const auto decode_t0 = Clock::now();
  for (;;) {
    if (cancel && cancel->load(std::memory_order_relaxed)) {
      st.reason = StopReason::kCancelled;
      break;
    }
    const int32_t id = sampler.sample(logits_.data(), tokens_);
    const auto now = Clock::now();
    if (st.n_generated == 0) {
      st.ttft_ms = ms_since(t0);
      if (prof_) prof_->record_ttft(static_cast<uint64_t>(st.ttft_ms * 1e6));
    } else {
      st.itl_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
      if (prof_) prof_->record_itl(static_cast<uint64_t>(st.itl_ms.back() * 1e6));
    }
    last = now;
    if (params.stop_at_eog && vocab.is_end_of_generation(id)) {
      st.reason = StopReason::kEndOfGeneration;
      break;
    }
    ++st.n_generated;
    if (params.on_token) params.on_token(id);
    std::string piece = detok.push(id);
    if (!piece.empty() && on_piece && !on_piece(piece)) {
      st.reason = StopReason::kCancelled;
      tokens_.push_back(id);  // its text was delivered; its KV is not computed
      break;
    }
    if (params.max_tokens >= 0 && st.n_generated >= params.max_tokens) {
      st.reason = StopReason::kMaxTokens;
      tokens_.push_back(id);
      break;
    }
    if (static_cast<int64_t>(tokens_.size()) >= n_ctx) {
      if (!params.context_shift) {
        st.reason = StopReason::kContextFull;
        tokens_.push_back(id);
        break;
      }
      tokens_.push_back(id);
      LOOM_TRY(shift_context());
      ++st.n_shifts;
      const int32_t last_tok = id;
      LOOM_TRY(eval(std::span<const int32_t>(&last_tok, 1), static_cast<int64_t>(tokens_.size()),
                    logits_.data(), &st));
      tokens_.push_back(last_tok);
      continue;
    }
    (void)apply_pending_placement();  // between two tokens: moves weights and KV, then goes on
    const auto step_t0 = Clock::now();
    Status s = eval(std::span<const int32_t>(&id, 1), static_cast<int64_t>(tokens_.size()),
                    logits_.data(), &st);
    if (!s.ok()) {
      if (s.error().code() != ErrorCode::kNoSpace) return s.error();
      // The spill disk is full and RAM is at its budget: the context ends here.
      st.reason = StopReason::kContextFull;
      st.note = s.message();
      tokens_.push_back(id);
      break;
    }
    tokens_.push_back(id);
    adapt_step(ms_since(step_t0));
  }
  std::string rest = detok.flush();
  if (!rest.empty() && on_piece) on_piece(rest);
  st.decode_ms = ms_since(decode_t0);
  // The KV cache covers the tokens whose forward ran; a sampled token that was
  // never evaluated stays in tokens_ only until the next prompt recomputes it.
  if (static_cast<int64_t>(tokens_.size()) > kv_->n_tokens())
    tokens_.resize(static_cast<size_t>(kv_->n_tokens()));
  return st;
}

}  // namespace loom
