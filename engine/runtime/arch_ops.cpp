#include "engine/runtime/arch_ops.h"

#include "cpu/ops.h"

namespace loom {

void host_scale(Act x, float s) {
  const int64_t n = x.rows * x.cols;
  for (int64_t i = 0; i < n; ++i) x.data[i] *= s;
}

void host_softcap(Act x, float cap) {
  if (cap > 0) cpu::softcap(x.data, x.rows * x.cols, cap);
}

}  // namespace loom
