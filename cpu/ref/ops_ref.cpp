// Scalar reference ops: see ops_ref.h. Plain loops in the order a reader
// would write them; sums in double unless matching ggml's float expression
// is the point (rms_norm's scale, RoPE's angles).
#include "cpu/ref/ops_ref.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numbers>
#include <vector>

#include "cpu/ref/fp16.h"
#include "cpu/ref/quants.h"

// RoPE must round every a * b + c twice, as ggml's (non-FMA) rope does.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace loom::ref {

void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double silu = g / (1.0 + std::exp(-g));
    out[i] = static_cast<float>(silu * static_cast<double>(up[i]));
  }
}

void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    // 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3): the
    // second form keeps the tiny values of negative g that 1 + tanh(u) cancels to 0.
    const double gelu = g / (1.0 + std::exp(-1.5957691216057308 * (g + 0.044715 * g * g * g)));
    out[i] = static_cast<float>(gelu * static_cast<double>(up[i]));
  }
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  std::vector<double> e(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    e[i] = std::exp(static_cast<double>(x[i]) - static_cast<double>(max));
    sum += e[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(e[i] / sum);
}

void get_row(DType t, const void* w, size_t row_bytes, int64_t row, float* out, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(w) + static_cast<size_t>(row) * row_bytes;
  const Status s = dequantize_row(t, src, out, n);
  assert(s.ok());
  (void)s;
}

// ---- RoPE -------------------------------------------------------------------

namespace {

// Pair index at which rotation `beta` (full turns over n_ctx_orig tokens)
// happens, as a float: n_rot * ln(n_ctx_orig / (2 pi beta)) / (2 ln base).
float yarn_corr_dim(int64_t n_rot, int64_t n_ctx_orig, float beta, float freq_base) {
  const float two_pi = 2 * std::numbers::pi_v<float>;
  return static_cast<float>(n_rot) * std::log(static_cast<float>(n_ctx_orig) / (beta * two_pi)) /
         (2 * std::log(freq_base));
}

// 1 below `low`, 0 above `high`, linear in between (pair index i).
float yarn_ramp(float low, float high, int64_t i) {
  const float denom = 0.001f > high - low ? 0.001f : high - low;
  const float y = (static_cast<float>(i) - low) / denom;
  const float clamped = y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y);
  return 1.0f - clamped;
}

}  // namespace

void rope_yarn_corr_dims(int64_t n_rot, int64_t n_ctx_orig, float freq_base, float beta_fast,
                         float beta_slow, float dims[2]) {
  const float start = std::floor(yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base));
  const float end = std::ceil(yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base));
  const float last = static_cast<float>(n_rot - 1);
  dims[0] = 0.0f > start ? 0.0f : start;
  dims[1] = last < end ? last : end;
}

void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int32_t* pos,
          const cpu::RopeParams& p) {
  const int64_t n_rot = p.n_rot;
  assert(n_rot % 2 == 0 && n_rot <= head_dim);
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_rot));
  float corr[2];
  rope_yarn_corr_dims(n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);

  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      // theta_i = pos * theta_scale^i, built up one factor at a time.
      float theta = static_cast<float>(pos[t]);
      for (int64_t i = 0; i < n_rot / 2; ++i) {
        const float ff = p.freq_factors ? p.freq_factors[i] : 1.0f;
        const float theta_extrap = theta / ff;
        const float theta_interp = p.freq_scale * theta_extrap;
        float angle = theta_interp;
        float mscale = p.attn_factor;
        if (p.ext_factor != 0.0f) {
          const float mix = yarn_ramp(corr[0], corr[1], i) * p.ext_factor;
          angle = theta_interp * (1 - mix) + theta_extrap * mix;
          mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
        }
        const float c = std::cos(angle) * mscale;
        const float s = std::sin(angle) * mscale;
        theta *= theta_scale;

        // Normal ordering rotates (2i, 2i+1); NeoX rotates (i, i + n_rot/2).
        const int64_t i0 = p.neox ? i : 2 * i;
        const int64_t i1 = p.neox ? i + n_rot / 2 : 2 * i + 1;
        const float x0 = v[i0];
        const float x1 = v[i1];
        v[i0] = x0 * c - x1 * s;
        v[i1] = x0 * s + x1 * c;
      }
    }
  }
}

// ---- KV cache and attention -------------------------------------------------

namespace {

size_t kv_row_bytes(DType dtype, int64_t head_dim) {
  const auto bytes = dtype_row_bytes(dtype, static_cast<uint64_t>(head_dim));
  assert(bytes.has_value());
  return static_cast<size_t>(*bytes);
}

// Dequantizes cached token j of KV head g into out[head_dim].
void load_kv_row(const void* const* blocks, const cpu::KvView& kv, int64_t g, int64_t j,
                 float* out) {
  const auto* block = static_cast<const uint8_t*>(blocks[j / kv.block_size]);
  const uint8_t* row = block + static_cast<size_t>(g) * kv.head_stride_bytes +
                       static_cast<size_t>(j % kv.block_size) * kv_row_bytes(kv.dtype, kv.head_dim);
  const Status s = dequantize_row(kv.dtype, row, out, kv.head_dim);
  assert(s.ok());
  (void)s;
}

}  // namespace

void kv_store(DType dtype, void* block, size_t head_stride_bytes, int64_t n_kv_heads,
              int64_t head_dim, int64_t row, const float* src) {
  const size_t row_bytes = kv_row_bytes(dtype, head_dim);
  for (int64_t h = 0; h < n_kv_heads; ++h) {
    auto* dst = static_cast<uint8_t*>(block) + static_cast<size_t>(h) * head_stride_bytes +
                static_cast<size_t>(row) * row_bytes;
    const Status s = quantize_row(dtype, src + h * head_dim, dst, head_dim);
    assert(s.ok());
    (void)s;
  }
}

void attention(const float* q, int64_t T, const int32_t* q_pos, int64_t n_heads,
               const cpu::KvView& kv, float scale, float* out, int64_t h0, int64_t h1) {
  const int64_t hd = kv.head_dim;
  const int64_t n_rep = n_heads / kv.n_kv_heads;  // query heads per KV head
  int64_t n_ctx_max = 0;
  for (int64_t t = 0; t < T; ++t)
    n_ctx_max = std::max<int64_t>(n_ctx_max, static_cast<int64_t>(q_pos[t]) + 1);

  for (int64_t g = h0 / n_rep; h0 < h1 && g <= (h1 - 1) / n_rep; ++g) {
    // The cached K and V of KV head g as floats: [n_ctx_max, hd] each.
    std::vector<float> k(static_cast<size_t>(n_ctx_max * hd));
    std::vector<float> v(static_cast<size_t>(n_ctx_max * hd));
    for (int64_t j = 0; j < n_ctx_max; ++j) {
      load_kv_row(kv.k_blocks, kv, g, j, k.data() + j * hd);
      load_kv_row(kv.v_blocks, kv, g, j, v.data() + j * hd);
    }
    for (int64_t h = std::max(h0, g * n_rep); h < std::min(h1, (g + 1) * n_rep); ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n_ctx = static_cast<int64_t>(q_pos[t]) + 1;  // positions 0..q_pos[t]
        const float* qh = q + (t * n_heads + h) * hd;

        // score[j] = q . k_j * scale
        std::vector<double> score(static_cast<size_t>(n_ctx));
        double max = -INFINITY;
        for (int64_t j = 0; j < n_ctx; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d)
            dot += static_cast<double>(qh[d]) * static_cast<double>(k[j * hd + d]);
          score[j] = dot * static_cast<double>(scale);
          max = score[j] > max ? score[j] : max;
        }

        // softmax(score) . V
        double sum = 0.0;
        std::vector<double> acc(static_cast<size_t>(hd), 0.0);
        for (int64_t j = 0; j < n_ctx; ++j) {
          const double p = std::exp(score[j] - max);
          sum += p;
          for (int64_t d = 0; d < hd; ++d) acc[d] += p * static_cast<double>(v[j * hd + d]);
        }
        float* oh = out + (t * n_heads + h) * hd;
        for (int64_t d = 0; d < hd; ++d) oh[d] = static_cast<float>(acc[d] / sum);
      }
    }
  }
}

}  // namespace loom::ref
