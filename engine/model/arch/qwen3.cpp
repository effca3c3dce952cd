// qwen3: a qwen2-style decoder without q/k/v biases whose q and k get an RMS
// norm per head (attn_q_norm / attn_k_norm, [head_dim]) after the projection
// and before RoPE; NeoX RoPE ordering; the head size may differ from
// n_embd / n_head (attention.key_length).
#include "engine/model/arch/arch.h"

namespace loom {
namespace {

Status bind_qwen3(const GgufFile& f, Model* m) {
  HParams& hp = m->hp;
  hp.rope_neox = true;
  LOOM_TRY(detail::bind_decoder_common(f, m));
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = m->layers[static_cast<size_t>(l)];
    LOOM_ASSIGN_OR_RETURN(L.wq, detail::bind_weight(f, p + "attn_q.weight", {hp.n_embd, q_dim}));
    LOOM_ASSIGN_OR_RETURN(L.wk, detail::bind_weight(f, p + "attn_k.weight", {hp.n_embd, kv_dim}));
    LOOM_ASSIGN_OR_RETURN(L.wv, detail::bind_weight(f, p + "attn_v.weight", {hp.n_embd, kv_dim}));
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
    LOOM_ASSIGN_OR_RETURN(L.w_gate,
                          detail::bind_weight(f, p + "ffn_gate.weight", {hp.n_embd, hp.n_ff}));
    LOOM_ASSIGN_OR_RETURN(L.w_up,
                          detail::bind_weight(f, p + "ffn_up.weight", {hp.n_embd, hp.n_ff}));
  }
  return {};
}

}  // namespace

const Architecture kArchQwen3 = {"qwen3", &bind_qwen3};

}  // namespace loom
