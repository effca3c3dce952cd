#include "engine/placement/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "cpu/ops.h"

namespace loom {

CostModel CostModel::defaults() {
  CostModel c;
  c.unit[static_cast<size_t>(Unit::kCpu)] = {20e9, 5e-6};
  c.unit[static_cast<size_t>(Unit::kGpu)] = {1000e9, 10e-6};
  c.xfer_latency_s = 50e-6;
  c.xfer_bytes_per_s = 10e9;
  return c;
}

std::string CostModel::describe() const {
  char buf[320];
  const UnitCost& c = unit[0];
  const UnitCost& g = unit[1];
  std::snprintf(
      buf, sizeof(buf),
      "%s: CPU %.1f GB/s + %.1f us/op; GPU %.1f GB/s + %.1f us/op; transfers %.1f us + %.2f GB/s; "
      "GPU-to-host switch %.1f us",
      measured ? "measured" : "defaults (not measured)", c.bytes_per_s / 1e9, c.op_s * 1e6,
      g.bytes_per_s / 1e9, g.op_s * 1e6, xfer_latency_s * 1e6, xfer_bytes_per_s / 1e9,
      switch_s * 1e6);
  return buf;
}

namespace {
uint64_t group_bytes(const Model& m, int64_t l, OpGroup g, std::optional<DType> dt) {
  uint64_t b = 0;
  for (const Weight* w : group_weights(m, l, g))
    b += weight_bytes_as(*w, w->n_out > 1 ? dt : std::nullopt);
  return b;
}
}  // namespace

double CostModel::layer_s(const Model& m, int64_t l, const LayerPlace& lp, Unit x_on,
                          int64_t n_past, DType kv_dtype, int64_t* transfers, double* xfer_s,
                          int64_t* switches, std::array<double, kNumUnits>* unit_s) const {
  const HParams& hp = m.hp;
  const Unit uw = lp[OpGroup::kAttnW].unit, ua = lp[OpGroup::kAttn].unit,
             uf = lp[OpGroup::kFfn].unit, un = lp[OpGroup::kNorm].unit;
  auto uc = [this](Unit u) -> const UnitCost& { return unit[static_cast<size_t>(u)]; };
  double t = 0;
  auto compute = [&](Unit u, double sec) {
    t += sec;
    if (unit_s) (*unit_s)[static_cast<size_t>(u)] += sec;
  };
  // Compute: weight bytes streamed plus a fixed cost per op.
  compute(uw, static_cast<double>(group_bytes(m, l, OpGroup::kAttnW, lp[OpGroup::kAttnW].dtype)) /
                      uc(uw).bytes_per_s +
                  4 * uc(uw).op_s);
  compute(uf, static_cast<double>(group_bytes(m, l, OpGroup::kFfn, lp[OpGroup::kFfn].dtype)) /
                      uc(uf).bytes_per_s +
                  4 * uc(uf).op_s);
  compute(un, 6 * uc(un).op_s);
  const auto row = static_cast<double>(
      dtype_row_bytes(kv_dtype, static_cast<uint64_t>(hp.head_dim)).value_or(0));
  compute(ua, 2.0 * row * static_cast<double>(hp.n_head_kv * (n_past + 1)) / uc(ua).bytes_per_s +
                  2 * uc(ua).op_s);
  // Transfers: the executor's data flow (forward.cpp), one token.
  enum { X, XB, Q, K, V, ATT, HB, HB2, N };
  std::array<uint8_t, N> valid{};
  valid[X] = static_cast<uint8_t>(1u << static_cast<unsigned>(x_on));
  const std::array<int64_t, N> cols = {hp.n_embd,
                                       hp.n_embd,
                                       hp.n_head * hp.head_dim,
                                       hp.n_head_kv * hp.head_dim,
                                       hp.n_head_kv * hp.head_dim,
                                       hp.n_head * hp.head_dim,
                                       hp.n_ff,
                                       hp.n_ff};
  int64_t n_xfer = 0;
  auto in = [&](int a, Unit u) {
    const auto b = static_cast<uint8_t>(1u << static_cast<unsigned>(u));
    if (!(valid[static_cast<size_t>(a)] & b)) {
      const double x = xfer_latency_s +
                       4.0 * static_cast<double>(cols[static_cast<size_t>(a)]) / xfer_bytes_per_s +
                       (u == Unit::kCpu ? switch_s : 0.0);
      t += x;
      if (xfer_s) *xfer_s += x;
      if (switches && u == Unit::kCpu) ++*switches;
      ++n_xfer;
      valid[static_cast<size_t>(a)] |= b;
    }
  };
  auto out = [&](int a, Unit u) {
    valid[static_cast<size_t>(a)] = static_cast<uint8_t>(1u << static_cast<unsigned>(u));
  };
  in(X, un), out(XB, un);
  in(XB, uw), out(Q, uw), out(K, uw), out(V, uw);
  in(Q, un), in(K, un), out(Q, un), out(K, un);
  in(K, ua), in(V, ua), in(Q, ua), out(ATT, ua);
  in(ATT, uw), out(XB, uw);
  in(X, un), in(XB, un), out(X, un), out(XB, un);
  in(XB, uf), out(HB, uf), out(HB2, uf), out(XB, uf);
  in(X, un), in(XB, un);
  if (transfers) *transfers += n_xfer;
  return t;
}

CostModel::Prediction CostModel::predict(const Model& m, const Placement& p, int64_t n_past,
                                         DType kv_dtype) const {
  Prediction r;
  const HParams& hp = m.hp;
  const double xfer_embd = xfer_latency_s + 4.0 * static_cast<double>(hp.n_embd) / xfer_bytes_per_s;
  r.embed_ms = unit[static_cast<size_t>(p.embed.unit)].op_s * 1e3;
  Unit x_on = p.embed.unit;
  for (int64_t l = 0; l < hp.n_layer && l < static_cast<int64_t>(p.layers.size()); ++l) {
    const LayerPlace& lp = p.layers[static_cast<size_t>(l)];
    double xs = 0;
    std::array<double, kNumUnits> us{};
    const double s = layer_s(m, l, lp, x_on, n_past, kv_dtype, &r.transfers, &xs, &r.switches, &us);
    r.xfer_ms += xs * 1e3;
    for (size_t u = 0; u < us.size(); ++u) r.unit_ms[u] += us[u] * 1e3;
    r.layer_ms.push_back(s * 1e3);
    x_on = lp[OpGroup::kNorm].unit;
  }
  const UnitCost& uo = unit[static_cast<size_t>(p.output.unit)];
  r.output_ms = (static_cast<double>(weight_bytes_as(m.output, p.output.dtype)) / uo.bytes_per_s +
                 2 * uo.op_s) *
                1e3;
  r.unit_ms[static_cast<size_t>(p.output.unit)] += r.output_ms;
  r.unit_ms[static_cast<size_t>(p.embed.unit)] += r.embed_ms;
  if (x_on != p.output.unit) {
    const double x = (xfer_embd + (p.output.unit == Unit::kCpu ? switch_s : 0.0)) * 1e3;
    r.output_ms += x;
    r.xfer_ms += x;
    ++r.transfers;
    if (p.output.unit == Unit::kCpu) ++r.switches;
  }
  if (p.output.unit != Unit::kCpu) {  // logits come back to the host
    const double x =
        (xfer_latency_s + 4.0 * static_cast<double>(hp.n_vocab) / xfer_bytes_per_s) * 1e3;
    r.output_ms += x;
    r.xfer_ms += x;
    ++r.transfers;
  }
  r.step_ms = r.embed_ms + r.output_ms;
  for (double x : r.layer_ms) r.step_ms += x;
  return r;
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds per call of `op` (n calls queued, then one wait), best of 3 rounds.
template <typename F>
Result<double> time_ops(Backend& be, int n, F&& op) {
  double best = 1e30;
  for (int round = 0; round < 4; ++round) {  // round 0 warms up
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) op();
    LOOM_TRY(be.synchronize());
    const double s = seconds_since(t0) / n;
    if (round > 0) best = std::min(best, s);
  }
  return best;
}

// Weight bandwidth: single-token matmuls over the matrices of successive
// layers, in a layer's order (the attention's smaller ones too, whose
// start-up a thread pool or a GPU pays as well: on the H200 machine's CPU,
// FFN matrices alone streamed at 131 GB/s where whole layers ran at about
// 92), until more than the stream size went through, so the weights come
// from memory as in a real decode step, not from a cache: host L3 caches
// reach hundreds of MB (the H200 machine's 300 MB made 768 MB read at 121
// GB/s, above its 100 GB/s), GPU L2 tens. The fixed cost per op: the larger
// of a small op repeated and what a small matmul takes beyond its bytes
// (a thread pool's fork and join, a dispatch's launch).
constexpr double kStreamBytes =
    768.0 * 1024 * 1024;  // device memory (uploaded for the measurement)
constexpr double kHostStreamBytes = 2048.0 * 1024 * 1024;  // host memory (read in place)

Result<UnitCost> measure_unit(const Model& m, Backend& be) {
  const HParams& hp = m.hp;
  std::vector<const Weight*> ws;
  double bytes = 0;
  const double stream = be.host_memory() ? kHostStreamBytes : kStreamBytes;
  for (int64_t i = 0; i < hp.n_layer && bytes < stream; ++i) {
    const LayerWeights& lw = m.layers[static_cast<size_t>((hp.n_layer / 2 + i) % hp.n_layer)];
    for (const Weight* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) {
      if (!w->present() || !be.supports(OpKind::kMatmul, w->dtype)) continue;
      ws.push_back(w);
      bytes += static_cast<double>(w->row_bytes) * static_cast<double>(w->n_out);
    }
  }
  if (ws.empty())
    return make_error(ErrorCode::kUnsupported, "%s has no matmul for the model's FFN weights",
                      be.name().c_str());
  std::vector<const Weight*> uploaded;
  auto release = [&] {
    for (const Weight* w : uploaded) be.release_weight(*w);
  };
  for (size_t i = 0; i < ws.size(); ++i) {
    if (!be.host_memory() && !be.has_weight(OpKind::kMatmul, *ws[i])) {
      if (!be.upload_weight(*ws[i]).ok()) {  // the budget: measure on what fits
        ws.resize(i);
        break;
      }
      uploaded.push_back(ws[i]);
    }
  }
  if (ws.empty())
    return make_error(ErrorCode::kOutOfMemory, "no room on %s to measure a matmul",
                      be.name().c_str());
  const LayerWeights& l0 = m.layers[0];
  Status s = be.upload_weight(l0.attn_norm);
  int64_t max_in = hp.n_embd, max_out = hp.n_embd;
  for (const Weight* w : ws)
    max_in = std::max(max_in, w->n_in), max_out = std::max(max_out, w->n_out);
  auto xbuf = be.alloc_act(max_in);
  auto ybuf = be.alloc_act(max_out);
  if (!s.ok() || !xbuf.ok() || !ybuf.ok()) {
    release();
    return !s.ok() ? s.error() : (!xbuf.ok() ? xbuf.error() : ybuf.error());
  }
  std::vector<float> ones(static_cast<size_t>(max_in), 0.01f);
  s = be.upload(ones.data(), (*xbuf)->view(1, max_in));
  bytes = 0;
  for (const Weight* w : ws)
    bytes += static_cast<double>(w->row_bytes) * static_cast<double>(w->n_out);
  auto pass = [&] {
    for (const Weight* w : ws)
      be.matmul(*w, (*xbuf)->view(1, w->n_in), (*ybuf)->view(1, w->n_out), nullptr);
  };
  Result<double> all = s.ok() ? time_ops(be, 1, pass) : Result<double>(s.error());
  Act n_in = (*xbuf)->view(1, hp.n_embd), n_out = (*ybuf)->view(1, hp.n_embd);
  Result<double> small =
      time_ops(be, 32, [&] { be.rms_norm(n_in, l0.attn_norm, hp.rms_eps, n_out); });
  // A small matmul (layer 0's K projection, a few MB) repeated: its time
  // beyond its bytes at the streaming rate is the per-op cost matmuls pay.
  const Weight& wk = l0.wk;
  const bool small_mm = wk.present() && be.supports(OpKind::kMatmul, wk.dtype) &&
                        wk.n_in <= max_in && wk.n_out <= max_out &&
                        (be.host_memory() || be.upload_weight(wk).ok());
  Result<double> mm = small_mm ? time_ops(be, 16,
                                          [&] {
                                            be.matmul(wk, (*xbuf)->view(1, wk.n_in),
                                                      (*ybuf)->view(1, wk.n_out), nullptr);
                                          })
                               : Result<double>(0.0);
  if (small_mm && !be.host_memory()) be.release_weight(wk);
  release();
  if (!all.ok()) return all.error();
  if (!small.ok()) return small.error();
  if (!mm.ok()) return mm.error();
  UnitCost c;
  const double per_op = *all / static_cast<double>(ws.size());
  c.bytes_per_s = bytes / static_cast<double>(ws.size()) / std::max(per_op - *small, per_op * 0.05);
  const double wk_bytes = static_cast<double>(wk.row_bytes) * static_cast<double>(wk.n_out);
  c.op_s = std::max(*small, small_mm ? *mm - wk_bytes / c.bytes_per_s : 0.0);
  return c;
}
}  // namespace

// A GPU layer in the middle of CPU work, as the executor meets it: a CPU
// matmul (through the CPU backend's thread pool), then the GPU round trip
// (upload the residual row, one single-token FFN matmul, download), then the
// next CPU matmul. Each part is timed back to back too (best of 6); what the
// sequence takes beyond those (median of 7) — the GPU starting cold and
// slow, the fence wait's wake-up, the pool's workers waking after it — is
// what every such round trip costs beyond the modelled copies and ops.
constexpr double kHostWork = 1e-3;

static Result<double> measure_switch(const Model& m, Backend& cpu, Backend& gpu, Act x) {
  // On the GPU an FFN matrix (tens of MB: what a GPU segment of a hybrid
  // step starts with after an idle spell, when its clocks may have dropped),
  // on the CPU the Q projection, read in place (every dtype supported).
  const Weight& w = m.layers[0].w_gate;
  const Weight& wc = m.layers[0].wq;
  if (!w.present() || !gpu.supports(OpKind::kMatmul, w.dtype) || w.n_in != x.cols ||
      !wc.present() || !cpu.supports(OpKind::kMatmul, wc.dtype))
    return 0.0;
  const bool had = gpu.has_weight(OpKind::kMatmul, w);
  if (!had && !gpu.upload_weight(w).ok()) return 0.0;  // no room: leave it unmeasured
  auto ybuf = gpu.alloc_act(w.n_out);
  auto cx = cpu.alloc_act(wc.n_in), cy = cpu.alloc_act(wc.n_out);
  if (!ybuf.ok() || !cx.ok() || !cy.ok()) {
    if (!had) gpu.release_weight(w);
    return !ybuf.ok() ? ybuf.error() : (!cx.ok() ? cx.error() : cy.error());
  }
  Act ax = (*cx)->view(1, wc.n_in), ay = (*cy)->view(1, wc.n_out);
  std::fill(ax.data, ax.data + wc.n_in, 0.01f);
  std::vector<float> host(static_cast<size_t>(std::max(w.n_in, w.n_out)), 0.01f);
  auto cpu_op = [&] {
    const auto t0 = Clock::now();
    cpu.matmul(wc, ax, ay, nullptr);
    return seconds_since(t0);
  };
  auto trip = [&]() -> Result<double> {
    const auto t0 = Clock::now();
    LOOM_TRY(gpu.upload(host.data(), x));
    gpu.matmul(w, x, (*ybuf)->view(1, w.n_out), nullptr);
    LOOM_TRY(gpu.download((*ybuf)->view(1, w.n_out), host.data()));
    return seconds_since(t0);
  };
  double warm = 1e30, warm_cpu = 1e30;
  std::vector<double> extra;
  Status st;
  for (int r = 0; r < 7 && st.ok(); ++r) {
    auto t = trip();
    if (!t.ok())
      st = t.error();
    else if (r > 0)
      warm = std::min(warm, *t);
    const double c = cpu_op();
    if (r > 0) warm_cpu = std::min(warm_cpu, c);
  }
  for (int r = 0; r < 7 && st.ok(); ++r) {
    // CPU layers: the pool busy and the GPU idle for about a millisecond.
    const auto h0 = Clock::now();
    while (seconds_since(h0) < kHostWork) (void)cpu_op();
    auto t = trip();
    if (!t.ok()) {
      st = t.error();
      break;
    }
    const double after = cpu_op();
    extra.push_back(*t - warm + after - warm_cpu);
  }
  if (!had) gpu.release_weight(w);
  if (!st.ok()) return st;
  std::sort(extra.begin(), extra.end());
  return std::max(0.0, extra[extra.size() / 2]);
}

Result<CostModel> calibrate(const Model& m, Backend& cpu, Backend* gpu) {
  CostModel c = CostModel::defaults();
  LOOM_ASSIGN_OR_RETURN(c.unit[0], measure_unit(m, cpu));
  if (gpu) {
    LOOM_ASSIGN_OR_RETURN(c.unit[1], measure_unit(m, *gpu));
    // Activation copies: a row of n_embd floats (latency), and 1M floats (bandwidth), up and back.
    const int64_t big = int64_t{1} << 20;
    LOOM_ASSIGN_OR_RETURN(auto buf, gpu->alloc_act(big));
    std::vector<float> host(static_cast<size_t>(big), 1.0f);
    auto round_trip = [&](int64_t n) -> Result<double> {
      double best = 1e30;
      for (int r = 0; r < 6; ++r) {
        const auto t0 = Clock::now();
        LOOM_TRY(gpu->upload(host.data(), buf->view(1, n)));
        LOOM_TRY(gpu->download(buf->view(1, n), host.data()));
        if (r > 0) best = std::min(best, seconds_since(t0) / 2);
      }
      return best;
    };
    LOOM_ASSIGN_OR_RETURN(double t_small, round_trip(m.hp.n_embd));
    LOOM_ASSIGN_OR_RETURN(double t_big, round_trip(big));
    c.xfer_latency_s = t_small;
    c.xfer_bytes_per_s = 4.0 * static_cast<double>(big) / std::max(t_big - t_small, 1e-7);
    LOOM_ASSIGN_OR_RETURN(c.switch_s, measure_switch(m, cpu, *gpu, buf->view(1, m.hp.n_embd)));
  }
  c.measured = true;
  return c;
}

}  // namespace loom
