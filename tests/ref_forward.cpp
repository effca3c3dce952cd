#include "tests/ref_forward.h"

#include <gtest/gtest.h>

#include <cmath>

#include "cpu/ref/quants.h"

namespace loom::test {
namespace {

using Vec = std::vector<double>;

Vec dequant_row(const Weight& w, int64_t r) {
  std::vector<float> f(static_cast<size_t>(w.n_in));
  const auto* p = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes;
  Status s = ref::dequantize_row(w.dtype, p, f.data(), w.n_in);
  EXPECT_TRUE(s.ok()) << s.message();
  return Vec(f.begin(), f.end());
}

// y = W x (+ b)
Vec matvec(const Weight& w, const Vec& x, const Weight* b = nullptr) {
  Vec y(static_cast<size_t>(w.n_out));
  for (int64_t r = 0; r < w.n_out; ++r) {
    Vec row = dequant_row(w, r);
    double s = 0;
    for (int64_t i = 0; i < w.n_in; ++i)
      s += row[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
    y[static_cast<size_t>(r)] = s;
  }
  if (b && b->present()) {
    Vec bb = dequant_row(*b, 0);
    for (size_t i = 0; i < y.size(); ++i) y[i] += bb[i];
  }
  return y;
}

Vec rmsnorm(const Vec& x, const Weight& w, double eps) {
  Vec g = dequant_row(w, 0);
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g[i];
  return y;
}

// RoPE without scaling (the synthetic and fixture models have none).
void rope(Vec& x, int64_t n_heads, int64_t hd, int64_t n_rot, bool neox, double base, int64_t pos) {
  for (int64_t h = 0; h < n_heads; ++h) {
    double* v = x.data() + h * hd;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const double theta =
          static_cast<double>(pos) *
          std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
      const double c = std::cos(theta), s = std::sin(theta);
      const int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

std::vector<std::vector<double>> reference_logits(const Model& m,
                                                  const std::vector<int32_t>& tokens) {
  const HParams& hp = m.hp;
  const auto T = static_cast<int64_t>(tokens.size());
  const int64_t hd = hp.head_dim, kv_dim = hp.n_head_kv * hd, group = hp.n_head / hp.n_head_kv;
  std::vector<Vec> x(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    x[static_cast<size_t>(t)] = dequant_row(m.tok_embd, tokens[static_cast<size_t>(t)]);
  if (hp.embd_scale > 0) {  // gemma2
    for (Vec& r : x) {
      for (double& e : r) e *= static_cast<double>(hp.embd_scale);
    }
  }
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const LayerWeights& L = m.layers[li];
    // gemma2: every hp.swa_every-th layer attends over a window; scores soft-capped.
    const bool swa =
        hp.sliding_window > 0 && hp.swa_every > 0 && static_cast<int64_t>(li) % hp.swa_every == 0;
    std::vector<Vec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)),
        v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const auto ti = static_cast<size_t>(t);
      Vec xb = rmsnorm(x[ti], L.attn_norm, hp.rms_eps);
      q[ti] = matvec(L.wq, xb, &L.bq);
      k[ti] = matvec(L.wk, xb, &L.bk);
      v[ti] = matvec(L.wv, xb, &L.bv);
      if (L.q_norm.present()) {  // qwen3: an RMS norm per head
        for (int64_t h = 0; h < hp.n_head; ++h) {
          Vec part(q[ti].begin() + h * hd, q[ti].begin() + (h + 1) * hd);
          part = rmsnorm(part, L.q_norm, hp.rms_eps);
          std::copy(part.begin(), part.end(), q[ti].begin() + h * hd);
        }
        for (int64_t h = 0; h < hp.n_head_kv; ++h) {
          Vec part(k[ti].begin() + h * hd, k[ti].begin() + (h + 1) * hd);
          part = rmsnorm(part, L.k_norm, hp.rms_eps);
          std::copy(part.begin(), part.end(), k[ti].begin() + h * hd);
        }
      }
      rope(q[ti], hp.n_head, hd, hp.n_rot, hp.rope_neox, hp.rope_freq_base, t);
      rope(k[ti], hp.n_head_kv, hd, hp.n_rot, hp.rope_neox, hp.rope_freq_base, t);
    }
    for (int64_t t = 0; t < T; ++t) {
      const auto ti = static_cast<size_t>(t);
      Vec att(static_cast<size_t>(hp.n_head * hd), 0.0);
      for (int64_t h = 0; h < hp.n_head; ++h) {
        const int64_t kh = h / group;
        Vec sc(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t i = 0; i < hd; ++i)
            s += q[ti][static_cast<size_t>(h * hd + i)] *
                 k[static_cast<size_t>(j)][static_cast<size_t>(kh * hd + i)];
          s *= hp.attn_scale > 0 ? static_cast<double>(hp.attn_scale)
                                 : 1.0 / std::sqrt(static_cast<double>(hd));
          if (hp.attn_softcap > 0) s = hp.attn_softcap * std::tanh(s / hp.attn_softcap);
          if (swa && t - j >= hp.sliding_window) s = -1e300;
          sc[static_cast<size_t>(j)] = s;
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (double& s : sc) sum += s = std::exp(s - mx);
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t i = 0; i < hd; ++i) {
            att[static_cast<size_t>(h * hd + i)] +=
                sc[static_cast<size_t>(j)] / sum *
                v[static_cast<size_t>(j)][static_cast<size_t>(kh * hd + i)];
          }
        }
      }
      (void)kv_dim;
      Vec o = matvec(L.wo, att);
      if (L.post_attn_norm.present()) o = rmsnorm(o, L.post_attn_norm, hp.rms_eps);
      for (size_t i = 0; i < o.size(); ++i) x[ti][i] += o[i];
      Vec xb = rmsnorm(x[ti], L.ffn_norm, hp.rms_eps);
      Vec g = matvec(L.w_gate, xb), u = matvec(L.w_up, xb);
      for (size_t i = 0; i < g.size(); ++i) {
        const double a = g[i];
        g[i] =
            (hp.ffn_gelu
                 ? 0.5 * a * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)))
                 : a / (1.0 + std::exp(-a))) *
            u[i];
      }
      Vec d = matvec(L.w_down, g);
      if (L.post_ffn_norm.present()) d = rmsnorm(d, L.post_ffn_norm, hp.rms_eps);
      for (size_t i = 0; i < d.size(); ++i) x[ti][i] += d[i];
    }
  }
  std::vector<Vec> out;
  for (int64_t t = 0; t < T; ++t) {
    out.push_back(matvec(m.output, rmsnorm(x[static_cast<size_t>(t)], m.output_norm, hp.rms_eps)));
    if (hp.final_softcap > 0) {
      for (double& e : out.back()) e = hp.final_softcap * std::tanh(e / hp.final_softcap);
    }
  }
  return out;
}

double normalized_error(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

}  // namespace loom::test
