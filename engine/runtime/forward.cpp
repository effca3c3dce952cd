#include "engine/runtime/forward.h"

#include <cinttypes>
#include <cmath>

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

  const auto C = static_cast<size_t>(max_chunk_);
  const auto q_dim = static_cast<size_t>(hp.n_head * hp.head_dim);
  const auto kv_dim = static_cast<size_t>(hp.n_head_kv * hp.head_dim);
  x_.resize(C * static_cast<size_t>(hp.n_embd));
  xb_.resize(C * static_cast<size_t>(hp.n_embd));
  q_.resize(C * q_dim);
  att_.resize(C * q_dim);
  k_.resize(C * kv_dim);
  v_.resize(C * kv_dim);
  hb_.resize(C * static_cast<size_t>(hp.n_ff));
  hb2_.resize(C * static_cast<size_t>(hp.n_ff));
  pos_.resize(C);
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
  LOOM_TRY(kv_.reserve(pos0 + T));
  for (int64_t c = 0; c < T; c += max_chunk_) {
    const int64_t n = std::min(max_chunk_, T - c);
    const bool last = c + n == T;
    float* out = nullptr;
    if (all_logits) out = logits + c * m_.hp.n_vocab;
    else if (last) out = logits;
    eval_chunk(tokens.data() + c, n, pos0 + c, out, all_logits);
    kv_.set_n_tokens(pos0 + c + n);
  }
  return {};
}

void ForwardPass::eval_chunk(const int32_t* tokens, int64_t T, int64_t pos0, float* logits, bool all_logits) {
  const HParams& hp = m_.hp;
  for (int64_t t = 0; t < T; ++t) pos_[static_cast<size_t>(t)] = static_cast<int32_t>(pos0 + t);
  {
    OpTimer timer(stats_, OpLabel::kEmbed);
    be_.get_rows(m_.tok_embd, tokens, act(x_, T, hp.n_embd));
  }
  for (int64_t l = 0; l < hp.n_layer; ++l) layer(l, T);
  if (!logits) return;

  OpTimer timer(stats_, OpLabel::kOutput);
  // Only the rows whose logits are wanted go through the output matrix.
  const int64_t first = all_logits ? 0 : T - 1;
  const int64_t rows = T - first;
  Act x{x_.data() + first * hp.n_embd, rows, hp.n_embd};
  Act xb{xb_.data(), rows, hp.n_embd};
  be_.rms_norm(x, m_.output_norm, hp.rms_eps, xb);
  be_.matmul(m_.output, xb, Act{logits, rows, hp.n_vocab}, nullptr);
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
    be_.matmul(w.wq, xb, q, w.bq.present() ? &w.bq : nullptr);
    be_.matmul(w.wk, xb, k, w.bk.present() ? &w.bk : nullptr);
    be_.matmul(w.wv, xb, v, w.bv.present() ? &w.bv : nullptr);
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
    be_.matmul(w.wo, att, xb, nullptr);
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
    be_.matmul(w.w_gate, xb, hb, nullptr);
    be_.matmul(w.w_up, xb, hb2, nullptr);
  }
  {
    OpTimer timer(stats_, OpLabel::kSiluMul);
    be_.silu_mul(hb, hb2, hb);
  }
  {
    OpTimer timer(stats_, OpLabel::kFfnDown);
    be_.matmul(w.w_down, hb, xb, nullptr);
  }
  OpTimer timer(stats_, OpLabel::kAdd);
  be_.add(x, xb, x);
}

}  // namespace loom
