// phi3: fused projections — attn_qkv holds q, k and v rows one after the
// other, ffn_up holds the gate rows then the up rows — and NeoX RoPE ordering.
// The fused tensors are split here into row ranges, so the forward pass sees
// the same separate weights as llama (no copy: the rows are contiguous).
#include "engine/model/arch/arch.h"

namespace loom {
namespace {

Status bind_phi3(const GgufFile& f, Model* m) {
  HParams& hp = m->hp;
  hp.rope_neox = true;
  LOOM_TRY(detail::bind_decoder_common(f, m));
  if (f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight")) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: Phi-3 LongRoPE (rope_factors_long/short) is not supported yet",
                      f.path().c_str());
  }
  const int64_t q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = m->layers[static_cast<size_t>(l)];
    Weight qkv;
    LOOM_ASSIGN_OR_RETURN(
        qkv, detail::bind_weight(f, p + "attn_qkv.weight", {hp.n_embd, q_dim + 2 * kv_dim}));
    L.wq = qkv.rows(0, q_dim);
    L.wk = qkv.rows(q_dim, kv_dim);
    L.wv = qkv.rows(q_dim + kv_dim, kv_dim);
    Weight gate_up;
    LOOM_ASSIGN_OR_RETURN(gate_up,
                          detail::bind_weight(f, p + "ffn_up.weight", {hp.n_embd, 2 * hp.n_ff}));
    L.w_gate = gate_up.rows(0, hp.n_ff);
    L.w_up = gate_up.rows(hp.n_ff, hp.n_ff);
  }
  return {};
}

}  // namespace

const Architecture kArchPhi3 = {"phi3", &bind_phi3};

}  // namespace loom
