// llama: Llama 2/3, Mistral, TinyLlama, stories. Separate q/k/v and gate/up
// projections, normal (GPT-J style, adjacent pairs) RoPE ordering, optional
// llama3 per-frequency RoPE divisors in `rope_freqs.weight`.
#include "engine/model/arch/arch.h"
#include "engine/model/arch/bind_attn_ffn.h"

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
  return detail::bind_attn_ffn(f, m);
}

}  // namespace

const Architecture kArchLlama = {"llama", &bind_llama};

}  // namespace loom
