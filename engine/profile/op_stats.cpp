#include "engine/profile/op_stats.h"

namespace loom {

const char* op_label_name(OpLabel l) {
  switch (l) {
    case OpLabel::kEmbed: return "embed";
    case OpLabel::kNorm: return "rms_norm";
    case OpLabel::kQkv: return "matmul qkv";
    case OpLabel::kRope: return "rope";
    case OpLabel::kKvStore: return "kv_store";
    case OpLabel::kAttention: return "attention";
    case OpLabel::kAttnOut: return "matmul attn_out";
    case OpLabel::kFfnUpGate: return "matmul ffn gate+up";
    case OpLabel::kSiluMul: return "silu_mul";
    case OpLabel::kFfnDown: return "matmul ffn_down";
    case OpLabel::kAdd: return "add";
    case OpLabel::kOutput: return "output (norm+lm_head)";
    case OpLabel::kCount: break;
  }
  return "?";
}

uint64_t OpStats::total_ns() const {
  uint64_t t = 0;
  for (uint64_t v : ns) t += v;
  return t;
}

}  // namespace loom
