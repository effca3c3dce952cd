// llama: Llama 2/3, Mistral, TinyLlama, stories. Separate q/k/v and gate/up
// projections, normal (GPT-J style, adjacent pairs) RoPE ordering, optional
// llama3 per-frequency RoPE divisors in `rope_freqs.weight`.
#include "engine/model/arch/arch.h"

namespace loom {
namespace {

Status bind_llama(const GgufFile& f, Model* m) {
  HParams& hp = m->hp;
  hp.rope_neox = false;
  LOOM_TRY(detail::bind_decoder_common(f, m));
  LOOM_ASSIGN_OR_RETURN(m->rope_freqs,
                        detail::bind_weight(f, "rope_freqs.weight", {hp.n_rot / 2}, false));
  if (m->rope_freqs.present()) {
    if (m->rope_freqs.dtype != DType::kF32) {
      return make_error(ErrorCode::kUnsupported, "%s: rope_freqs.weight must be F32",
                        f.path().c_str());
    }
    hp.rope_scaling = RopeScaling::kLlama3;
  }
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = m->layers[static_cast<size_t>(l)];
    LOOM_ASSIGN_OR_RETURN(L.wq, detail::bind_weight(f, p + "attn_q.weight", {hp.n_embd, q_dim}));
    LOOM_ASSIGN_OR_RETURN(L.wk, detail::bind_weight(f, p + "attn_k.weight", {hp.n_embd, kv_dim}));
    LOOM_ASSIGN_OR_RETURN(L.wv, detail::bind_weight(f, p + "attn_v.weight", {hp.n_embd, kv_dim}));
    LOOM_ASSIGN_OR_RETURN(L.w_gate,
                          detail::bind_weight(f, p + "ffn_gate.weight", {hp.n_embd, hp.n_ff}));
    LOOM_ASSIGN_OR_RETURN(L.w_up,
                          detail::bind_weight(f, p + "ffn_up.weight", {hp.n_embd, hp.n_ff}));
  }
  return {};
}

}  // namespace

const Architecture kArchLlama = {"llama", &bind_llama};

}  // namespace loom
