// gemma2: the embedding scaled by sqrt(n_embd); RMS norms before and after
// attention and the FFN (attn_norm, post_attention_norm, ffn_norm,
// post_ffw_norm; GGUF keeps gemma's (1 + w) as the stored weight, and the
// Hugging Face loader adds the 1); GeGLU (GELU with the tanh approximation)
// FFN; attention scores scaled by query_pre_attn_scalar^-1/2 and soft-capped
// (cap * tanh(s / cap)); every even layer (0, 2, ...) attends over a sliding
// window; final logits soft-capped; NeoX RoPE; tied embeddings.
#include <cmath>

#include "engine/model/arch/arch.h"
#include "engine/model/arch/bind_attn_ffn.h"

namespace loom {
namespace {

Status bind_gemma2(const GgufFile& f, Model* m) {
  HParams& hp = m->hp;
  hp.rope_neox = true;
  hp.ffn_gelu = true;
  hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
  const std::string a = "gemma2.";
  auto opt_float = [&](const std::string& key, float* out) -> Status {
    LOOM_ASSIGN_OR_RETURN(std::optional<double> v, f.get_float(a + key));
    if (v) *out = static_cast<float>(*v);
    return {};
  };
  hp.attn_softcap = 50.0f;
  hp.final_softcap = 30.0f;
  LOOM_TRY(opt_float("attn_logit_softcapping", &hp.attn_softcap));
  LOOM_TRY(opt_float("final_logit_softcapping", &hp.final_softcap));
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> window, f.get_int(a + "attention.sliding_window"));
  hp.sliding_window = window.value_or(4096);
  hp.swa_every = 2;
  // query_pre_attn_scalar: Hugging Face's config (kept under this key by the
  // folder loader and `loom convert`); llama.cpp's GGUFs do not carry it:
  // the head size then, but n_embd / n_head for the 46-layer (27B) model.
  float qpas = static_cast<float>(hp.head_dim);
  if (hp.n_layer == 46) qpas = static_cast<float>(hp.n_embd / hp.n_head);
  LOOM_TRY(opt_float("attention.query_pre_attn_scalar", &qpas));
  if (!(qpas > 0)) {
    return make_error(ErrorCode::kFormat, "%s: query_pre_attn_scalar %g must be positive",
                      f.path().c_str(), static_cast<double>(qpas));
  }
  hp.attn_scale = 1.0f / std::sqrt(qpas);

  LOOM_TRY(detail::bind_decoder_common(f, m));
  // The post-attention and post-FFN norms, between the attention and the FFN
  // weights.
  return detail::bind_attn_ffn(f, m, [&](const std::string& p, LayerWeights& L) -> Status {
    LOOM_ASSIGN_OR_RETURN(L.post_attn_norm,
                          detail::bind_weight(f, p + "post_attention_norm.weight", {hp.n_embd}));
    LOOM_ASSIGN_OR_RETURN(L.post_ffn_norm,
                          detail::bind_weight(f, p + "post_ffw_norm.weight", {hp.n_embd}));
    return {};
  });
}

}  // namespace

const Architecture kArchGemma2 = {"gemma2", &bind_gemma2};

}  // namespace loom
