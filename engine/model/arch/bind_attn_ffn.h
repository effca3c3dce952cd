// Internal to engine/model/arch/: the per-layer binding that llama-style
// decoders with separate projections share (q/k/v, then gate/up), with a hook
// for what an architecture binds between the two. Not part of the public
// engine headers.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"
#include "engine/model/gguf.h"
#include "engine/model/model.h"

namespace loom::detail {

/// For every layer `l` (prefix `p` = "blk.<l>."), in this order: attn_q
/// [n_embd, n_head * head_dim], attn_k and attn_v [n_embd, n_head_kv *
/// head_dim], then `extra(p, L)` for the architecture's own tensors, then
/// ffn_gate and ffn_up [n_embd, n_ff]. The first error (a layer's, in that
/// order) is returned. Expects m->layers already sized (bind_decoder_common).
template <typename Extra>
Status bind_attn_ffn(const GgufFile& f, Model* m, Extra&& extra) {
  const HParams& hp = m->hp;
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = m->layers[static_cast<size_t>(l)];
    LOOM_ASSIGN_OR_RETURN(L.wq, bind_weight(f, p + "attn_q.weight", {hp.n_embd, q_dim}));
    LOOM_ASSIGN_OR_RETURN(L.wk, bind_weight(f, p + "attn_k.weight", {hp.n_embd, kv_dim}));
    LOOM_ASSIGN_OR_RETURN(L.wv, bind_weight(f, p + "attn_v.weight", {hp.n_embd, kv_dim}));
    LOOM_TRY(extra(p, L));
    LOOM_ASSIGN_OR_RETURN(L.w_gate, bind_weight(f, p + "ffn_gate.weight", {hp.n_embd, hp.n_ff}));
    LOOM_ASSIGN_OR_RETURN(L.w_up, bind_weight(f, p + "ffn_up.weight", {hp.n_embd, hp.n_ff}));
  }
  return {};
}

/// The same with nothing between the attention and the FFN weights.
inline Status bind_attn_ffn(const GgufFile& f, Model* m) {
  return bind_attn_ffn(f, m, [](const std::string&, LayerWeights&) -> Status { return {}; });
}

}  // namespace loom::detail
