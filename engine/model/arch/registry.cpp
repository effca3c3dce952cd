#include <string>

#include "engine/model/arch/arch.h"

namespace loom {

namespace {
const Architecture* const kAll[] = {&kArchLlama, &kArchQwen2, &kArchPhi3, &kArchQwen3,
                                    &kArchGemma2};
}

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture* a : kAll) {
    if (name == a->name) return a;
  }
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const Architecture* a : kAll) s += (s.empty() ? "" : ", ") + std::string(a->name);
  return s;
}

namespace detail {

Status bind_decoder_common(const GgufFile& f, Model* m) {
  const HParams& hp = m->hp;
  LOOM_ASSIGN_OR_RETURN(m->tok_embd, bind_weight(f, "token_embd.weight", {hp.n_embd, hp.n_vocab}));
  LOOM_ASSIGN_OR_RETURN(m->output_norm, bind_weight(f, "output_norm.weight", {hp.n_embd}));
  LOOM_ASSIGN_OR_RETURN(m->output, bind_weight(f, "output.weight", {hp.n_embd, hp.n_vocab}, false));
  if (!m->output.present()) m->output = m->tok_embd;  // tied embeddings
  m->layers.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = m->layers[static_cast<size_t>(l)];
    LOOM_ASSIGN_OR_RETURN(L.attn_norm, bind_weight(f, p + "attn_norm.weight", {hp.n_embd}));
    LOOM_ASSIGN_OR_RETURN(L.ffn_norm, bind_weight(f, p + "ffn_norm.weight", {hp.n_embd}));
    LOOM_ASSIGN_OR_RETURN(
        L.wo, bind_weight(f, p + "attn_output.weight", {hp.n_head * hp.head_dim, hp.n_embd}));
    LOOM_ASSIGN_OR_RETURN(L.w_down, bind_weight(f, p + "ffn_down.weight", {hp.n_ff, hp.n_embd}));
  }
  return {};
}

}  // namespace detail
}  // namespace loom
