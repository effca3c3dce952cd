// qwen3: a qwen2-style decoder without q/k/v biases whose q and k get an RMS
// norm per head (attn_q_norm / attn_k_norm, [head_dim]) after the projection
// and before RoPE; NeoX RoPE ordering; the head size may differ from
// n_embd / n_head (attention.key_length).
#include "engine/model/arch/arch.h"
#include "engine/model/arch/bind_attn_ffn.h"

namespace loom {
namespace {

Status bind_qwen3(const GgufFile& f, Model* m) {
  HParams& hp = m->hp;
  hp.rope_neox = true;
  LOOM_TRY(detail::bind_decoder_common(f, m));
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  // The per-head q/k norms and optional biases, between the attention and
  // the FFN weights.
  return detail::bind_attn_ffn(f, m, [&](const std::string& p, LayerWeights& L) -> Status {
    LOOM_ASSIGN_OR_RETURN(L.q_norm,
                          detail::bind_weight(f, p + "attn_q_norm.weight", {hp.head_dim}));
    LOOM_ASSIGN_OR_RETURN(L.k_norm,
                          detail::bind_weight(f, p + "attn_k_norm.weight", {hp.head_dim}));
    // attention_bias (false in the released models): used when present.
    LOOM_ASSIGN_OR_RETURN(L.bq, detail::bind_weight(f, p + "attn_q.bias", {q_dim}, false));
    LOOM_ASSIGN_OR_RETURN(L.bk, detail::bind_weight(f, p + "attn_k.bias", {kv_dim}, false));
    LOOM_ASSIGN_OR_RETURN(L.bv, detail::bind_weight(f, p + "attn_v.bias", {kv_dim}, false));
    for (const Weight* n : {&L.q_norm, &L.k_norm, &L.bq, &L.bk, &L.bv}) {
      if (!n->present()) continue;
      if (n->dtype != DType::kF32) {
        return make_error(ErrorCode::kUnsupported, "%s: '%s' must be F32", f.path().c_str(),
                          n->name().c_str());
      }
    }
    return {};
  });
}

}  // namespace

const Architecture kArchQwen3 = {"qwen3", &bind_qwen3};

}  // namespace loom
