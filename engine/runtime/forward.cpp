#include "engine/runtime/forward.h"

#include <cinttypes>
#include <cmath>
#include <thread>
#include <utility>

#include "engine/backends/cpu/cpu_backend.h"

namespace loom {

ForwardPass::ForwardPass(const Model& model, Backend& backend, KvCache& kv, int64_t max_chunk)
    : m_(model), be_(backend), kv_(kv), max_chunk_(max_chunk < 1 ? 1 : max_chunk) {
  const HParams& hp = m_.hp;
  rope_.n_rot = hp.n_rot;
  rope_.neox = hp.rope_neox;
  rope_.freq_base = hp.rope_freq_base;
  if (hp.rope_scaling == RopeScaling::kLinear || hp.rope_scaling == RopeScaling::kYarn) {
    rope_.freq_scale = 1.0f / hp.rope_scale_factor;
  }
  if (hp.rope_scaling == RopeScaling::kYarn) {
    rope_.ext_factor = 1.0f;
    rope_.attn_factor = hp.yarn_attn_factor;
    rope_.beta_fast = hp.yarn_beta_fast;
    rope_.beta_slow = hp.yarn_beta_slow;
  }
  rope_.n_ctx_orig = hp.rope_n_ctx_orig;
  if (m_.rope_freqs.present()) rope_.freq_factors = static_cast<const float*>(m_.rope_freqs.data);

  pos_.resize(static_cast<size_t>(max_chunk_));
}

Status ForwardPass::place_weight(const Weight& w, OpKind op) {
  if (!w.present()) return {};
  if (be_.supports(op, w.dtype)) {
    Status st = be_.upload_weight(w);
    if (st.ok()) return {};
    // No room, or a shape the backend's kernels do not take: matrices go to the fallback.
    const ErrorCode code = st.error().code();
    if ((code != ErrorCode::kOutOfMemory && code != ErrorCode::kUnsupported) ||
        (op != OpKind::kMatmul && op != OpKind::kGetRows)) {
      return st;
    }
    notes_.push_back("tensor '" + w.name() + "' runs on the CPU: " + st.message());
  } else if (op == OpKind::kMatmul || op == OpKind::kGetRows) {
    notes_.push_back("tensor '" + w.name() + "' (" + std::string(dtype_name(w.dtype)) + ") runs on the CPU: " +
                     be_.name() + " has no kernel for that type");
  } else {
    return make_error(ErrorCode::kUnsupported, "backend %s cannot use tensor '%s' of type %s", be_.name().c_str(),
                      w.name().c_str(), std::string(dtype_name(w.dtype)).c_str());
  }
  // Matmul or embedding on the fallback (host memory: it reads the mapped file).
  if (!fallback_) {
    own_fallback_ = std::make_unique<CpuBackend>(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    fallback_ = own_fallback_.get();
  }
  if (!fallback_->supports(op, w.dtype)) {
    return make_error(ErrorCode::kUnsupported, "no backend can run tensor '%s' of type %s", w.name().c_str(),
                      std::string(dtype_name(w.dtype)).c_str());
  }
  fallback_weights_.insert(w.data);
  return {};
}

Status ForwardPass::prepare() {
  if (prepared_) return {};
  const HParams& hp = m_.hp;
  // K/V in the backend's own memory (device backends); the CPU uses the cache's blocks.
  if (!kv_.storage()) {
    auto st = be_.create_kv_storage(kv_.config());
    if (!st.ok()) return st.error();
    if (*st) LOOM_TRY(kv_.attach_storage(std::move(st).value()));
  }
  // Activations before weights: weights can fall back to the CPU when device
  // memory runs out, activations cannot.
  const int64_t C = max_chunk_;
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  for (auto [buf, n] : {std::pair{&x_, hp.n_embd}, {&xb_, hp.n_embd}, {&q_, q_dim}, {&att_, q_dim}, {&k_, kv_dim},
                        {&v_, kv_dim}, {&hb_, hp.n_ff}, {&hb2_, hp.n_ff}}) {
    auto b = be_.alloc_act(C * n);
    if (!b.ok()) return b.error();
    *buf = std::move(b).value();
  }
  if (!be_.host_memory()) {  // the last token's logits, before download (grown for all_logits)
    auto b = be_.alloc_act(hp.n_vocab);
    if (!b.ok()) return b.error();
    logits_ = std::move(b).value();
  }
  // Weights, each tensor once (fused tensors such as phi3's qkv are row ranges
  // of one tensor; backends key residency by tensor). The small vectors first:
  // they cannot fall back; matrices that find no room run on the fallback.
  for (const LayerWeights& w : m_.layers) {
    for (const Weight* n : {&w.attn_norm, &w.ffn_norm}) LOOM_TRY(place_weight(*n, OpKind::kRmsNorm));
    for (const Weight* b : {&w.bq, &w.bk, &w.bv}) LOOM_TRY(place_weight(*b, OpKind::kAdd));
  }
  LOOM_TRY(place_weight(m_.output_norm, OpKind::kRmsNorm));
  LOOM_TRY(place_weight(m_.rope_freqs, OpKind::kRope));
  LOOM_TRY(place_weight(m_.tok_embd, OpKind::kGetRows));
  for (const LayerWeights& w : m_.layers) {
    for (const Weight* mw : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      LOOM_TRY(place_weight(*mw, OpKind::kMatmul));
    }
  }
  LOOM_TRY(place_weight(m_.output, OpKind::kMatmul));

  prepared_ = true;
  return {};
}

void ForwardPass::matmul(const Weight& w, Act x, Act out, const Weight* bias) {
  if (!on_fallback(w)) return be_.matmul(w, x, out, bias);
  // Device activations travel to the host and back around the CPU's matmul.
  fb_in_.resize(static_cast<size_t>(x.rows * x.cols));
  fb_out_.resize(static_cast<size_t>(out.rows * out.cols));
  Status st = be_.download(x, fb_in_.data());
  if (st.ok()) {
    fallback_->matmul(w, Act{fb_in_.data(), x.rows, x.cols}, Act{fb_out_.data(), out.rows, out.cols}, bias);
    st = be_.upload(fb_out_.data(), out);
  }
  if (!st.ok() && fb_status_.ok()) fb_status_ = st;
}

void ForwardPass::get_rows(const Weight& w, const int32_t* ids, Act out) {
  if (!on_fallback(w)) return be_.get_rows(w, ids, out);
  fb_out_.resize(static_cast<size_t>(out.rows * out.cols));
  fallback_->get_rows(w, ids, Act{fb_out_.data(), out.rows, out.cols});
  Status st = be_.upload(fb_out_.data(), out);
  if (!st.ok() && fb_status_.ok()) fb_status_ = st;
}

Status ForwardPass::eval(std::span<const int32_t> tokens, int64_t pos0, float* logits, bool all_logits) {
  const auto T = static_cast<int64_t>(tokens.size());
  if (T == 0) return make_error(ErrorCode::kInvalidArgument, "eval: no tokens");
  if (pos0 != kv_.n_tokens()) {
    return make_error(ErrorCode::kInternal, "eval at position %" PRId64 " but the cache holds %" PRId64 " tokens",
                      pos0, kv_.n_tokens());
  }
  const int32_t n_vocab = static_cast<int32_t>(m_.hp.n_vocab);
  for (int32_t id : tokens) {
    if (id < 0 || id >= n_vocab) {
      return make_error(ErrorCode::kInvalidArgument, "token id %d is outside the vocabulary (0..%d)", id, n_vocab - 1);
    }
  }
  LOOM_TRY(prepare());
  LOOM_TRY(kv_.reserve(pos0 + T));
  for (int64_t c = 0; c < T; c += max_chunk_) {
    const int64_t n = std::min(max_chunk_, T - c);
    const bool last = c + n == T;
    float* out = nullptr;
    if (all_logits) out = logits + c * m_.hp.n_vocab;
    else if (last) out = logits;
    LOOM_TRY(eval_chunk(tokens.data() + c, n, pos0 + c, out, all_logits));
    kv_.set_n_tokens(pos0 + c + n);
  }
  // Device backends queue ops: wait for them, and report what went wrong on the way.
  return be_.synchronize();
}

Status ForwardPass::eval_chunk(const int32_t* tokens, int64_t T, int64_t pos0, float* logits, bool all_logits) {
  const HParams& hp = m_.hp;
  for (int64_t t = 0; t < T; ++t) pos_[static_cast<size_t>(t)] = static_cast<int32_t>(pos0 + t);
  {
    OpTimer timer(stats_, OpLabel::kEmbed);
    get_rows(m_.tok_embd, tokens, act(x_, T, hp.n_embd));
  }
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    LayerTimer timer(layer_stats_, l, T);
    layer(l, T);
  }
  if (!fb_status_.ok()) return std::exchange(fb_status_, Status());
  if (!logits) return {};

  OpTimer timer(stats_, OpLabel::kOutput);
  // Only the rows whose logits are wanted go through the output matrix.
  const int64_t first = all_logits ? 0 : T - 1;
  const int64_t rows = T - first;
  Act x = act(x_, T, hp.n_embd).rows_view(first, rows);
  Act xb = act(xb_, rows, hp.n_embd);
  be_.rms_norm(x, m_.output_norm, hp.rms_eps, xb);
  if (be_.host_memory()) {  // the CPU writes straight into the caller's array
    matmul(m_.output, xb, Act{logits, rows, hp.n_vocab}, nullptr);
    return std::exchange(fb_status_, Status());
  }
  if (!logits_ || logits_->capacity() < rows * hp.n_vocab) {
    logits_.reset();
    auto b = be_.alloc_act(rows * hp.n_vocab);
    if (!b.ok()) return b.error();
    logits_ = std::move(b).value();
  }
  Act out = act(logits_, rows, hp.n_vocab);
  matmul(m_.output, xb, out, nullptr);
  LOOM_TRY(std::exchange(fb_status_, Status()));
  return be_.download(out, logits);
}

void ForwardPass::layer(int64_t l, int64_t T) {
  const HParams& hp = m_.hp;
  const LayerWeights& w = m_.layers[static_cast<size_t>(l)];
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  Act x = act(x_, T, hp.n_embd), xb = act(xb_, T, hp.n_embd);
  Act q = act(q_, T, q_dim), k = act(k_, T, kv_dim), v = act(v_, T, kv_dim), att = act(att_, T, q_dim);
  Act hb = act(hb_, T, hp.n_ff), hb2 = act(hb2_, T, hp.n_ff);

  {
    OpTimer timer(stats_, OpLabel::kNorm);
    be_.rms_norm(x, w.attn_norm, hp.rms_eps, xb);
  }
  {
    OpTimer timer(stats_, OpLabel::kQkv);
    matmul(w.wq, xb, q, w.bq.present() ? &w.bq : nullptr);
    matmul(w.wk, xb, k, w.bk.present() ? &w.bk : nullptr);
    matmul(w.wv, xb, v, w.bv.present() ? &w.bv : nullptr);
  }
  {
    OpTimer timer(stats_, OpLabel::kRope);
    be_.rope(q, hp.n_head, hp.head_dim, pos_.data(), rope_);
    be_.rope(k, hp.n_head_kv, hp.head_dim, pos_.data(), rope_);
  }
  {
    OpTimer timer(stats_, OpLabel::kKvStore);
    be_.kv_store(kv_, l, k, v, pos_.data());
  }
  {
    OpTimer timer(stats_, OpLabel::kAttention);
    be_.attention(kv_, l, q, pos_.data(), hp.n_head, 1.0f / std::sqrt(static_cast<float>(hp.head_dim)), att);
  }
  {
    OpTimer timer(stats_, OpLabel::kAttnOut);
    matmul(w.wo, att, xb, nullptr);
  }
  {
    OpTimer timer(stats_, OpLabel::kAdd);
    be_.add(x, xb, x);
  }
  {
    OpTimer timer(stats_, OpLabel::kNorm);
    be_.rms_norm(x, w.ffn_norm, hp.rms_eps, xb);
  }
  {
    OpTimer timer(stats_, OpLabel::kFfnUpGate);
    matmul(w.w_gate, xb, hb, nullptr);
    matmul(w.w_up, xb, hb2, nullptr);
  }
  {
    OpTimer timer(stats_, OpLabel::kSiluMul);
    be_.silu_mul(hb, hb2, hb);
  }
  {
    OpTimer timer(stats_, OpLabel::kFfnDown);
    matmul(w.w_down, hb, xb, nullptr);
  }
  OpTimer timer(stats_, OpLabel::kAdd);
  be_.add(x, xb, x);
}

}  // namespace loom
