#include "engine/backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cpu/matmul.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

namespace {
// Below this many floats of work a parallel section costs more than it saves.
constexpr int64_t kMinParallelWork = 1 << 14;
// Decode attention over blocks in ranges (CpuBackend::attention): at most
// this many query tokens, and at least this many blocks per range.
constexpr int64_t kMaxRangeRows = 4;
constexpr int64_t kMinRangeBlocks = 8;
}  // namespace

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) {
  att_scratch_.resize(static_cast<size_t>(pool_.size()));
  // Tuning knob for measurements: how long idle workers spin before sleeping.
  if (const char* e = std::getenv("LOOM_CPU_SPIN_US")) pool_.set_spin_us(std::atoi(e));
  // A/B knob for measurements: LOOM_CPU_FUSE=0 runs the fused decode ops unfused.
  if (const char* e = std::getenv("LOOM_CPU_FUSE")) fuse_ = std::atoi(e) != 0;
}

std::string CpuBackend::name() const {
  return std::string("cpu (") + cpu::isa_name(cpu::active_isa()) + ", " +
         std::to_string(pool_.size()) + " threads)";
}

bool CpuBackend::supports(OpKind op, DType dtype) const {
  switch (op) {
    case OpKind::kMatmul:
    case OpKind::kGetRows: return cpu::matmul_supported(dtype);
    case OpKind::kKvStore:
    case OpKind::kAttention: return dtype == DType::kF16 || dtype == DType::kQ8_0;
    default: return dtype == DType::kF32;
  }
}

void CpuBackend::get_rows(const Weight& w, const int32_t* ids, Act out) {
  for (int64_t t = 0; t < out.rows; ++t)
    cpu::get_row(w.dtype, w.data, w.row_bytes, ids[t], out.row(t), w.n_in);
}

void CpuBackend::rms_norm(Act x, const Weight& w, float eps, Act out) {
  const auto* wd = static_cast<const float*>(w.data);
  if (x.rows * x.cols < kMinParallelWork) {
    for (int64_t t = 0; t < x.rows; ++t) cpu::rms_norm(x.row(t), wd, eps, out.row(t), x.cols);
    return;
  }
  pool_.parallel_for(x.rows, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) cpu::rms_norm(x.row(t), wd, eps, out.row(t), x.cols);
  });
}

void CpuBackend::add_bias(Act out, const Weight& bias, int64_t r0, int64_t r1) {
  const auto* b = static_cast<const float*>(bias.data);
  for (int64_t t = 0; t < out.rows; ++t) {
    float* y = out.row(t);
    for (int64_t r = r0; r < r1; ++r) y[r] += b[r];
  }
}

void CpuBackend::matmul(const Weight& w, Act x, Act out, const Weight* bias) {
  const int64_t T = x.rows, n = w.n_in;
  const bool dense = w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16;
  // Dense prefill: our tiled kernel or oneDNN, whichever was measured faster
  // for this shape class (cpu/gemm_onednn.h). Decode keeps the GEMV path below.
  if (dense && T > 6 &&
      cpu::dense_prefill_choice(w.dtype, T, n, w.n_out, pool_.size()) == cpu::DenseImpl::kOneDnn) {
    if (!onednn_) onednn_ = std::make_unique<cpu::OneDnnMatmul>();
    const size_t xrb = cpu::activation_row_bytes(w.dtype, n);
    if (act_buf_.size() < xrb * static_cast<size_t>(T))
      act_buf_.resize(xrb * static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t)
      cpu::convert_activation(w.dtype, x.row(t), act_buf_.data() + xrb * static_cast<size_t>(t), n);
    Status s = cpu::dense_matmul_prefill(w.dtype, w.data, w.row_bytes, act_buf_.data(), xrb, T,
                                         out.data, out.cols, n, w.n_out, pool_, onednn_.get());
    if (s.ok()) {
      if (bias) add_bias(out, *bias, 0, w.n_out);
      return;
    }
    // Not expected (the shapes come from a validated model); the path below always works.
  }
  const size_t xrb = cpu::activation_row_bytes(w.dtype, n);
  const uint8_t* xq = convert_input(w.dtype, x);
  pool_.parallel_for(w.n_out, kRowAlign, [&](int64_t r0, int64_t r1, int) {
    cpu::matmul_rows(w.dtype, w.data, w.row_bytes, xq, xrb, T, out.data, out.cols, n, r0, r1);
    if (bias) add_bias(out, *bias, r0, r1);
  });
}

const uint8_t* CpuBackend::convert_input(DType w, Act x) {
  const int64_t T = x.rows, n = x.cols;
  const size_t xrb = cpu::activation_row_bytes(w, n);
  if (act_buf_.size() < xrb * static_cast<size_t>(T)) act_buf_.resize(xrb * static_cast<size_t>(T));
  uint8_t* xq = act_buf_.data();
  if (T * n < kMinParallelWork) {
    for (int64_t t = 0; t < T; ++t)
      cpu::convert_activation(w, x.row(t), xq + xrb * static_cast<size_t>(t), n);
  } else {
    pool_.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t)
        cpu::convert_activation(w, x.row(t), xq + xrb * static_cast<size_t>(t), n);
    });
  }
  return xq;
}

void CpuBackend::rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                      const cpu::RopeParams& p) {
  cpu::rope(x.data, x.rows, n_heads, head_dim, pos, p);
}

void CpuBackend::kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) {
  for (int64_t t = 0; t < k.rows; ++t) kv.store(layer, pos[t], k.row(t), v.row(t));
}

void CpuBackend::attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                           float scale, Act out) {
  attention(kv, layer, q, pos, n_heads, scale, out, cpu::AttnMods{});
}

void CpuBackend::attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                           float scale, Act out, const cpu::AttnMods& mods) {
  const cpu::KvView view = kv.view(layer);
  const size_t scratch = cpu::attention_scratch_floats(view);
  for (auto& s : att_scratch_) {
    if (s.size() < scratch) s.resize(scratch);
  }
  // The attention mass per KV block, for a tiered cache's importance policy:
  // one array per thread, summed afterwards.
  const bool mass = q.rows > 0 && kv.wants_mass(layer);
  const int64_t n_blocks =
      q.rows > 0 ? *std::max_element(pos, pos + q.rows) / view.block_size + 1 : 0;
  // Decode over a long cache: the blocks in ranges, every head in each
  // (split-K, as on the GPUs): all threads busy whatever the KV head count,
  // and each reads a block's heads back to back. The mass is normalized over
  // the whole row, and the mods' window is per row, so those keep the split
  // by heads.
  const bool plain = !mass && mods.softcap <= 0.0f && mods.window <= 0;
  const int64_t ranges = std::min<int64_t>(2 * pool_.size(), n_blocks / kMinRangeBlocks);
  if (plain && q.rows <= kMaxRangeRows && ranges >= 2) {
    const int64_t hd = view.head_dim, stride = hd + 2, rows = q.rows * n_heads;
    range_out_.resize(static_cast<size_t>(rows * stride));
    host_ranges(q.data, q.rows, pos, n_heads, view, n_blocks, scale, range_out_.data(), ranges);
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = range_out_.data() + r * stride;
      const float inv = 1.0f / p[1];
      for (int64_t d = 0; d < hd; ++d) out.data[r * hd + d] = p[2 + d] * inv;
    }
    return;
  }
  // Split by KV-head groups so the query heads sharing a KV head stay together.
  const int64_t group = n_heads / view.n_kv_heads;
  if (mass) {
    att_mass_.resize(att_scratch_.size());
    for (auto& m : att_mass_) m.assign(static_cast<size_t>(n_blocks), 0.0f);
  }
  pool_.parallel_for(n_heads, group, [&](int64_t h0, int64_t h1, int ith) {
    const auto t = static_cast<size_t>(ith);
    cpu::attention(q.data, q.rows, pos, n_heads, view, scale, out.data, h0, h1,
                   att_scratch_[t].data(), mass ? att_mass_[t].data() : nullptr, mods);
  });
  if (mass) {
    for (size_t t = 1; t < att_mass_.size(); ++t) {
      for (int64_t b = 0; b < n_blocks; ++b)
        att_mass_[0][static_cast<size_t>(b)] += att_mass_[t][static_cast<size_t>(b)];
    }
    kv.add_mass(layer, att_mass_[0].data(), n_blocks);
  }
}

void CpuBackend::attention_host_part(KvCache& kv, int64_t layer, const float* q, int64_t T,
                                     const int32_t* pos, int64_t n_heads, float scale,
                                     const float* device_ml, float* part, float* block_mass,
                                     int64_t n_blocks) {
  if (T <= 0) return;
  const int64_t bs = kv.config().block_size, hd = kv.config().head_dim;
  int32_t max_pos = 0;
  for (int64_t t = 0; t < T; ++t) max_pos = std::max(max_pos, pos[t]);
  std::vector<int32_t> blocks;
  const cpu::KvView view = kv.host_view(layer, max_pos / bs + 1, &blocks);
  if (n_blocks >= 0 && n_blocks < static_cast<int64_t>(blocks.size()))
    blocks.resize(static_cast<size_t>(n_blocks));  // (the view's first ones)
  // The view's rows are the host blocks' rows back to back, in position
  // order: token t sees the first hpos[t] + 1 of them (those at positions <= pos[t]).
  std::vector<int32_t> hpos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    int64_t n = 0;
    for (int32_t b : blocks) n += std::clamp<int64_t>(pos[t] - int64_t{b} * bs + 1, 0, bs);
    hpos[static_cast<size_t>(t)] = static_cast<int32_t>(n - 1);
  }
  // Tokens that see no host key (positions increase with t, so a prefix) get empty partials.
  int64_t t0 = 0;
  while (t0 < T && hpos[static_cast<size_t>(t0)] < 0) ++t0;
  for (int64_t r = 0; r < t0 * n_heads; ++r) {
    float* pr = part + r * (hd + 2);
    pr[0] = cpu::kAttnEmptyMax;
    std::fill(pr + 1, pr + hd + 2, 0.0f);
  }
  if (t0 == T || blocks.empty()) return;
  const size_t scratch = cpu::attention_scratch_floats(view);
  for (auto& s : att_scratch_) {
    if (s.size() < scratch) s.resize(scratch);
  }
  const auto nb = static_cast<int64_t>(blocks.size());
  if (block_mass) {
    att_mass_.resize(att_scratch_.size());
    for (auto& m : att_mass_) m.assign(static_cast<size_t>(nb), 0.0f);
  }
  const int64_t group = n_heads / view.n_kv_heads;
  const float* qt = q + t0 * n_heads * hd;
  float* pt = part + t0 * n_heads * (hd + 2);
  const float* ml = device_ml ? device_ml + t0 * n_heads * 2 : nullptr;
  // Without the attention mass, the blocks are split in ranges, so every
  // thread has work (a KV head per task leaves half of 16 threads idle with
  // 8 KV heads), and the ranges' partials merged. The mass is normalized over
  // the whole row inside attention_partial, so it keeps one range.
  const int64_t ranges = block_mass ? 1 : std::clamp<int64_t>(2 * pool_.size(), 1, nb);
  if (ranges > 1) {
    host_ranges(qt, T - t0, hpos.data() + t0, n_heads, view, nb, scale, pt, ranges);
    return;
  }
  pool_.parallel_for(n_heads, group, [&](int64_t h0, int64_t h1, int ith) {
    const auto i = static_cast<size_t>(ith);
    cpu::attention_partial(qt, T - t0, hpos.data() + t0, n_heads, view, scale, pt, h0, h1,
                           att_scratch_[i].data(), block_mass ? att_mass_[i].data() : nullptr, ml);
  });
  if (block_mass) {
    for (const auto& m : att_mass_) {
      for (int64_t i = 0; i < nb; ++i)
        block_mass[blocks[static_cast<size_t>(i)]] += m[static_cast<size_t>(i)];
    }
  }
}

void CpuBackend::host_ranges(const float* q, int64_t T, const int32_t* hpos, int64_t n_heads,
                             const cpu::KvView& view, int64_t nb, float scale, float* part,
                             int64_t ranges) {
  const int64_t bs = view.block_size, hd = view.head_dim, stride = hd + 2;
  const int64_t rows = T * n_heads;
  const int64_t per = (nb + ranges - 1) / ranges;
  ranges = (nb + per - 1) / per;
  range_parts_.resize(static_cast<size_t>(ranges * rows * stride));
  std::vector<int32_t> rpos(static_cast<size_t>(ranges * T));
  for (int64_t r = 0; r < ranges; ++r) {
    const int64_t b0 = r * per, b1 = std::min(nb, b0 + per);
    for (int64_t t = 0; t < T; ++t) {
      rpos[static_cast<size_t>(r * T + t)] =
          static_cast<int32_t>(std::clamp<int64_t>(hpos[t] + 1 - b0 * bs, 0, (b1 - b0) * bs) - 1);
    }
  }
  // A range per task, every head in it: a block's heads are read back to back.
  pool_.parallel_for(ranges, 1, [&](int64_t r0, int64_t r1, int ith) {
    for (int64_t r = r0; r < r1; ++r) {
      cpu::KvView sub = view;
      sub.k_blocks += r * per;
      sub.v_blocks += r * per;
      cpu::attention_partial(q, T, rpos.data() + r * T, n_heads, sub, scale,
                             range_parts_.data() + r * rows * stride, 0, n_heads,
                             att_scratch_[static_cast<size_t>(ith)].data(), nullptr, nullptr);
    }
  });
  // Log-sum-exp over the ranges, into one partial per row (a range this row
  // sees no key of has l == 0 and is skipped).
  for (int64_t row = 0; row < rows; ++row) {
    float* out = part + row * stride;
    std::fill(out, out + stride, 0.0f);
    out[0] = cpu::kAttnEmptyMax;
    for (int64_t r = 0; r < ranges; ++r)
      cpu::attention_fold_partial(out, range_parts_.data() + (r * rows + row) * stride, hd);
  }
}

void CpuBackend::gelu_mul(Act gate, Act up, Act out) {
  // gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
  // the second form stays finite for any x.
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float x = gate.data[i];
      const float u2 = 1.5957691216057308f * (x + 0.044715f * x * x * x);
      out.data[i] = x / (1.0f + std::exp(-u2)) * up.data[i];
    }
  };
  const int64_t n = gate.rows * gate.cols;
  if (n < kMinParallelWork) {
    run(0, n);
    return;
  }
  pool_.parallel_for(n, 64, [&](int64_t b, int64_t e, int) { run(b, e); });
}

void CpuBackend::silu_mul(Act gate, Act up, Act out) {
  const int64_t n = gate.rows * gate.cols;
  if (n < kMinParallelWork) {
    cpu::silu_mul(gate.data, up.data, out.data, n);
    return;
  }
  pool_.parallel_for(n, 64, [&](int64_t b, int64_t e, int) {
    cpu::silu_mul(gate.data + b, up.data + b, out.data + b, e - b);
  });
}

void CpuBackend::add(Act a, Act b, Act out) {
  cpu::add(a.data, b.data, out.data, a.rows * a.cols);
}

}  // namespace loom
