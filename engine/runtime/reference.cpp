#include "engine/runtime/reference.h"

#include <cinttypes>
#include <cmath>

#include "cpu/ref/quants.h"

namespace loom {

namespace {

using Vec = std::vector<double>;

Status row_of(const Weight& w, int64_t r, Vec* out) {
  std::vector<float> f(static_cast<size_t>(w.n_in));
  const auto* p = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes;
  LOOM_TRY(ref::dequantize_row(w.dtype, p, f.data(), w.n_in));
  out->assign(f.begin(), f.end());
  return {};
}

// Y [T, n_out] = X [T, n_in] W^T (+ b): each weight row dequantized once.
Result<Vec> matmul(const Weight& w, const Vec& x, int64_t T, const Weight* b = nullptr) {
  Vec y(static_cast<size_t>(T * w.n_out));
  Vec row, bias;
  if (b && b->present()) LOOM_TRY(row_of(*b, 0, &bias));
  for (int64_t r = 0; r < w.n_out; ++r) {
    LOOM_TRY(row_of(w, r, &row));
    for (int64_t t = 0; t < T; ++t) {
      const double* xt = x.data() + t * w.n_in;
      double s = 0;
      for (int64_t i = 0; i < w.n_in; ++i) s += row[static_cast<size_t>(i)] * xt[i];
      y[static_cast<size_t>(t * w.n_out + r)] =
          s + (bias.empty() ? 0.0 : bias[static_cast<size_t>(r)]);
    }
  }
  return y;
}

// Each row of `n` values (T of them) RMS-normalized and scaled by `w`.
Result<Vec> rms_norm(const Vec& x, int64_t n, const Weight& w, double eps) {
  Vec g;
  LOOM_TRY(row_of(w, 0, &g));
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(n); ++r) {
    const double* v = x.data() + r * static_cast<size_t>(n);
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      y[r * static_cast<size_t>(n) + static_cast<size_t>(i)] =
          v[i] * inv * g[static_cast<size_t>(i)];
  }
  return y;
}

void rope(Vec& x, int64_t T, int64_t n_heads, const HParams& hp, const float* factors) {
  const int64_t hd = hp.head_dim, n_rot = hp.n_rot;
  const double scale =
      (hp.rope_scaling == RopeScaling::kLinear || hp.rope_scaling == RopeScaling::kYarn)
          ? 1.0 / hp.rope_scale_factor
          : 1.0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      double* v = x.data() + (t * n_heads + h) * hd;
      for (int64_t i = 0; i < n_rot / 2; ++i) {
        double theta = scale * static_cast<double>(t) *
                       std::pow(static_cast<double>(hp.rope_freq_base),
                                -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
        if (factors) theta /= factors[i];
        const double c = std::cos(theta), s = std::sin(theta);
        const int64_t a = hp.rope_neox ? i : 2 * i, b = hp.rope_neox ? i + n_rot / 2 : 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

}  // namespace

Result<std::vector<double>> reference_embed(const Model& m, std::span<const int32_t> tokens) {
  const int64_t n = m.hp.n_embd;
  Vec x(tokens.size() * static_cast<size_t>(n)), row;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= m.hp.n_vocab) {
      return make_error(ErrorCode::kInvalidArgument, "token id %d is outside the vocabulary",
                        tokens[t]);
    }
    LOOM_TRY(row_of(m.tok_embd, tokens[t], &row));
    if (m.hp.embd_scale > 0) {
      for (double& v : row) v *= static_cast<double>(m.hp.embd_scale);
    }
    std::copy(row.begin(), row.end(),
              x.begin() + static_cast<std::ptrdiff_t>(t * static_cast<size_t>(n)));
  }
  return x;
}

Result<std::vector<double>> reference_rms_norm(const Model& m, const Weight& w,
                                               const std::vector<double>& x) {
  if (x.size() % static_cast<size_t>(m.hp.n_embd) != 0) {
    return make_error(ErrorCode::kInvalidArgument, "reference_rms_norm: %zu values", x.size());
  }
  return rms_norm(x, m.hp.n_embd, w, m.hp.rms_eps);
}

Result<std::vector<double>> reference_layer(const Model& m, int64_t l, const std::vector<double>& x,
                                            int64_t T, ReferenceTaps* taps) {
  const HParams& hp = m.hp;
  if (l < 0 || l >= hp.n_layer || static_cast<int64_t>(x.size()) != T * hp.n_embd) {
    return make_error(ErrorCode::kInvalidArgument, "reference_layer: layer %" PRId64 ", %zu values",
                      l, x.size());
  }
  const LayerWeights& L = m.layers[static_cast<size_t>(l)];
  const int64_t hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, group = nh / nkv;
  const float* factors =
      m.rope_freqs.present() ? static_cast<const float*>(m.rope_freqs.data) : nullptr;

  LOOM_ASSIGN_OR_RETURN(Vec xb, rms_norm(x, hp.n_embd, L.attn_norm, hp.rms_eps));
  if (taps) taps->attn_in = xb;
  LOOM_ASSIGN_OR_RETURN(Vec q, matmul(L.wq, xb, T, &L.bq));
  LOOM_ASSIGN_OR_RETURN(Vec k, matmul(L.wk, xb, T, &L.bk));
  LOOM_ASSIGN_OR_RETURN(Vec v, matmul(L.wv, xb, T, &L.bv));
  if (L.q_norm.present()) {  // qwen3: per head
    LOOM_ASSIGN_OR_RETURN(q, rms_norm(q, hd, L.q_norm, hp.rms_eps));
    LOOM_ASSIGN_OR_RETURN(k, rms_norm(k, hd, L.k_norm, hp.rms_eps));
  }
  rope(q, T, nh, hp, factors);
  rope(k, T, nkv, hp, factors);
  const bool swa = hp.sliding_window > 0 && hp.swa_every > 0 && l % hp.swa_every == 0;

  Vec att(static_cast<size_t>(T * nh * hd), 0.0);
  const double scale = hp.attn_scale > 0 ? static_cast<double>(hp.attn_scale)
                                         : 1.0 / std::sqrt(static_cast<double>(hd));
  const double cap = hp.attn_softcap;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kh = h / group;
      const double* qh = q.data() + (t * nh + h) * hd;
      Vec sc(static_cast<size_t>(t + 1));
      double mx = -1e300;
      for (int64_t j = 0; j <= t; ++j) {
        const double* kj = k.data() + (j * nkv + kh) * hd;
        double s = 0;
        for (int64_t i = 0; i < hd; ++i) s += qh[i] * kj[i];
        s *= scale;
        if (cap > 0) s = cap * std::tanh(s / cap);
        if (swa && t - j >= hp.sliding_window) s = -1e300;  // outside the window
        sc[static_cast<size_t>(j)] = s;
        mx = std::max(mx, sc[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& s : sc) sum += s = std::exp(s - mx);
      double* out = att.data() + (t * nh + h) * hd;
      for (int64_t j = 0; j <= t; ++j) {
        const double* vj = v.data() + (j * nkv + kh) * hd;
        const double p = sc[static_cast<size_t>(j)] / sum;
        for (int64_t i = 0; i < hd; ++i) out[i] += p * vj[i];
      }
    }
  }
  LOOM_ASSIGN_OR_RETURN(Vec o, matmul(L.wo, att, T));
  if (L.post_attn_norm.present()) {
    LOOM_ASSIGN_OR_RETURN(o, rms_norm(o, hp.n_embd, L.post_attn_norm, hp.rms_eps));
  }
  Vec y = x;
  for (size_t i = 0; i < y.size(); ++i) y[i] += o[i];
  LOOM_ASSIGN_OR_RETURN(xb, rms_norm(y, hp.n_embd, L.ffn_norm, hp.rms_eps));
  if (taps) taps->ffn_in = xb;
  LOOM_ASSIGN_OR_RETURN(Vec g, matmul(L.w_gate, xb, T));
  LOOM_ASSIGN_OR_RETURN(Vec u, matmul(L.w_up, xb, T));
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = g[i];
    g[i] = (hp.ffn_gelu
                ? 0.5 * a * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)))
                : a / (1.0 + std::exp(-a))) *
           u[i];
  }
  LOOM_ASSIGN_OR_RETURN(Vec d, matmul(L.w_down, g, T));
  if (L.post_ffn_norm.present()) {
    LOOM_ASSIGN_OR_RETURN(d, rms_norm(d, hp.n_embd, L.post_ffn_norm, hp.rms_eps));
  }
  for (size_t i = 0; i < y.size(); ++i) y[i] += d[i];
  return y;
}

}  // namespace loom
