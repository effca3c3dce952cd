// qwen2: a llama-style decoder with biases on the q/k/v projections, NeoX
// RoPE ordering (rotating pairs (i, i + n_rot/2)), and usually tied embeddings.
#include "engine/model/arch/arch.h"
#include "engine/model/arch/bind_attn_ffn.h"

namespace loom {
namespace {

Status bind_qwen2(const GgufFile& f, Model* m) {
  HParams& hp = m->hp;
  hp.rope_neox = true;
  LOOM_TRY(detail::bind_decoder_common(f, m));
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  // The q/k/v biases, between the attention and the FFN weights.
  return detail::bind_attn_ffn(f, m, [&](const std::string& p, LayerWeights& L) -> Status {
    LOOM_ASSIGN_OR_RETURN(L.bq, detail::bind_weight(f, p + "attn_q.bias", {q_dim}));
    LOOM_ASSIGN_OR_RETURN(L.bk, detail::bind_weight(f, p + "attn_k.bias", {kv_dim}));
    LOOM_ASSIGN_OR_RETURN(L.bv, detail::bind_weight(f, p + "attn_v.bias", {kv_dim}));
    for (const Weight* b : {&L.bq, &L.bk, &L.bv}) {
      if (b->dtype != DType::kF32) {
        return make_error(ErrorCode::kUnsupported, "%s: bias '%s' must be F32", f.path().c_str(),
                          b->name().c_str());
      }
    }
    return {};
  });
}

}  // namespace

const Architecture kArchQwen2 = {"qwen2", &bind_qwen2};

}  // namespace loom
