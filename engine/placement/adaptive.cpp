#include "engine/placement/adaptive.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace loom {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Correction factors stay within this range: a factor outside it is a
// broken measurement (a step that waited on something else), not a rate.
constexpr double kMinFactor = 0.2, kMaxFactor = 5.0;

}  // namespace

const char* adaptive_event_name(AdaptiveEvent::Kind k) {
  switch (k) {
    case AdaptiveEvent::Kind::kMeasured: return "measured";
    case AdaptiveEvent::Kind::kTry: return "try";
    case AdaptiveEvent::Kind::kKeep: return "keep";
    case AdaptiveEvent::Kind::kFailed: return "failed";
  }
  return "?";
}

std::string adaptive_event_text(const AdaptiveEvent& ev) {
  char buf[512];
  int n = std::snprintf(buf, sizeof(buf), "token %lld: %s %s", static_cast<long long>(ev.token),
                        adaptive_event_name(ev.kind), ev.label.c_str());
  std::string s(buf, static_cast<size_t>(std::max(0, n)));
  if (ev.measured_ms > 0) {
    std::snprintf(buf, sizeof(buf), ", measured %.2f ms", ev.measured_ms);
    s += buf;
  }
  if (ev.predicted_ms > 0) {
    std::snprintf(buf, sizeof(buf), ", predicted %.2f ms", ev.predicted_ms);
    s += buf;
  }
  if (!ev.why.empty()) s += " (" + ev.why + ")";
  return s;
}

CostModel correct_cost_model(const CostModel& base, const Model& m, const Placement& p,
                             int64_t n_past, DType kv_dtype, const Profiler::Snapshot& snap,
                             double step_ms) {
  CostModel c = base;
  const CostModel::Prediction pred = base.predict(m, p, n_past, kv_dtype);
  std::array<double, kNumUnits> meas{};
  std::array<bool, kNumUnits> seen{};
  auto add = [&](Unit u, const ProfileStat& s) {
    if (s.count == 0) return;
    meas[static_cast<size_t>(u)] += s.p50_ms;
    seen[static_cast<size_t>(u)] = true;
  };
  const size_t n_layer = std::min(snap.layers.size(), p.layers.size());
  for (size_t l = 0; l < n_layer; ++l) {
    for (size_t g = 0; g < static_cast<size_t>(kNumOpGroups); ++g)
      add(p.layers[l].g[g].unit, snap.layers[l][g]);
  }
  add(p.embed.unit, snap.embed);
  add(p.output.unit, snap.output);
  // Groups are timed on sampled steps, where each GPU group boundary drains
  // the queue: their sum can exceed the step they belong to. The step is the
  // figure that counts, so the units' shares are kept and scaled to fit in it.
  double sum = 0;
  for (size_t u = 0; u < meas.size(); ++u) sum += seen[u] ? meas[u] : pred.unit_ms[u];
  if (step_ms > 0 && sum > step_ms) {
    for (double& x : meas) x *= step_ms / sum;
  }
  for (size_t u = 0; u < meas.size(); ++u) {
    if (!seen[u] || meas[u] <= 0 || pred.unit_ms[u] <= 0) continue;
    const double f = std::clamp(meas[u] / pred.unit_ms[u], kMinFactor, kMaxFactor);
    c.unit[u].bytes_per_s /= f;
    c.unit[u].op_s *= f;
  }
  if (step_ms <= 0) return c;
  // What the step took beyond its units' compute goes to the copies: to the
  // switches back to the host when there are any (the fence wait and the
  // GPU's idle spell are what they stand for), else to the copies' latency.
  const CostModel::Prediction pc = c.predict(m, p, n_past, kv_dtype);
  double compute_ms = 0;
  for (double x : pc.unit_ms) compute_ms += x;
  const double copies_ms = step_ms - compute_ms;
  const double plain_ms = pc.xfer_ms - static_cast<double>(pc.switches) * c.switch_s * 1e3;
  if (pc.switches > 0) {
    c.switch_s = std::max(0.0, (copies_ms - plain_ms) / static_cast<double>(pc.switches)) * 1e-3;
  } else if (pc.transfers > 0 && plain_ms > 0 && copies_ms > 0) {
    const double f = std::clamp(copies_ms / plain_ms, kMinFactor, kMaxFactor);
    c.xfer_latency_s *= f;
    c.xfer_bytes_per_s /= f;
  }
  return c;
}

AdaptiveController::AdaptiveController(const Model& m, StrategyOptions o, CostModel cost,
                                       AdaptiveOptions ao)
    : m_(m), o_(std::move(o)), base_(cost), cost_(cost), ao_(ao) {
  ao_.window_tokens = std::max(2, ao_.window_tokens);
  ao_.max_candidates = std::max(1, ao_.max_candidates);
}

size_t AdaptiveController::arm_of(const Placement& p) {
  for (size_t i = 0; i < arms_.size(); ++i) {
    if (arms_[i].p.same_as(p)) return i;
  }
  arms_.push_back(Arm{p});
  return arms_.size() - 1;
}

void AdaptiveController::start(const Placement& current) {
  arms_.clear();
  for (PlacementCandidate& c : candidate_placements(m_, o_, base_))
    arms_.push_back(Arm{std::move(c.p), c.layers_n});
  current_ = arm_of(current);
  if (arms_[current_].p.strategy.empty()) arms_[current_].p.strategy = current.strategy;
  cost_ = base_;
  applying_.reset();
  window_.clear();
  skip_next_ = true;
  settled_ = arms_.size() < 2;
  explore_left_ = ao_.max_candidates - 1;
  extra_tries_ = 0;
  tokens_ = 0;
  move_scale_ = 1;
  moves_ = 0;
  next_check_ = ao_.recheck_tokens;
  events_.clear();
}

double AdaptiveController::predict(const Placement& p, int64_t n_past) const {
  return cost_.predict(m_, p, n_past, o_.kv_dtype).step_ms;
}

double AdaptiveController::measured_now(size_t i, int64_t n_past) const {
  const Arm& a = arms_[i];
  if (a.measured_at == n_past) return a.measured_ms;
  return a.measured_ms + predict(a.p, n_past) - predict(a.p, a.measured_at);
}

double AdaptiveController::move_estimate_ms(size_t i, int64_t n_past) const {
  if (cost_.xfer_bytes_per_s <= 0) return 0;
  const uint64_t kv_layer = kv_bytes_per_layer(m_, std::max<int64_t>(n_past, 1), o_.kv_dtype);
  const Placement &a = arms_[current_].p, &b = arms_[i].p;
  const PlacementBytes from = placement_bytes(m_, a, kv_layer),
                       to = placement_bytes(m_, b, kv_layer);
  auto up = [](const GroupPlace& x, const GroupPlace& y) {
    return y.unit != Unit::kCpu && (x.unit != y.unit || x.dtype != y.dtype);
  };
  double bytes = 0;
  if (up(a.embed, b.embed)) bytes += static_cast<double>(to.embed);
  if (up(a.output, b.output)) bytes += static_cast<double>(to.output);
  for (size_t l = 0; l < a.layers.size() && l < b.layers.size(); ++l) {
    for (size_t g = 0; g < static_cast<size_t>(kNumOpGroups); ++g) {
      const GroupPlace &x = a.layers[l].g[g], &y = b.layers[l].g[g];
      // KV moves whichever way its attention goes; weights cost on the way up.
      const bool kv = g == static_cast<size_t>(OpGroup::kAttn);
      if (kv ? x.unit != y.unit : up(x, y))
        bytes += static_cast<double>(std::max(from.layer[l][g], to.layer[l][g]));
    }
  }
  return bytes / cost_.xfer_bytes_per_s * 1e3 * move_scale_;
}

void AdaptiveController::record(AdaptiveEvent::Kind k, size_t arm, double predicted,
                                const std::string& why) {
  AdaptiveEvent e;
  e.kind = k;
  e.token = tokens_;
  e.label = arms_[arm].p.strategy;
  e.placement = arms_[arm].p;
  e.predicted_ms = predicted;
  e.measured_ms = arms_[arm].measured_ms;
  e.why = why;
  events_.push_back(e);
  if (listener_) listener_(events_.back());
}

std::optional<size_t> AdaptiveController::next_candidate(int64_t n_past, bool recheck) {
  auto untried = [this](size_t i) { return arms_[i].measured_ms == 0 && !arms_[i].failed; };
  // The most layers as one run on the GPU (layers:N for the largest N that
  // fits) is what a user would pick by hand: measured first.
  if (!recheck) {
    std::optional<size_t> most;
    int64_t most_n = -1;
    for (size_t i = 0; i < arms_.size(); ++i) {
      if (arms_[i].layers_n > most_n) most = i, most_n = arms_[i].layers_n;
    }
    if (most && untried(*most)) return most;
  }
  // The measured arm the corrected model would pick, as the yardstick.
  double ref = 0;
  for (size_t i = 0; i < arms_.size(); ++i) {
    if (arms_[i].measured_ms > 0 && !arms_[i].failed) {
      const double s = predict(arms_[i].p, n_past);
      if (ref == 0 || s < ref) ref = s;
    }
  }
  std::optional<size_t> best;
  double best_s = 0;
  for (size_t i = 0; i < arms_.size(); ++i) {
    if (!untried(i)) continue;
    const double s = predict(arms_[i].p, n_past);
    if (!best || s < best_s) best = i, best_s = s;
  }
  if (!best) return std::nullopt;
  // Exploring: a candidate the corrected model puts within a quarter of the
  // best measured one is worth a window. Rechecking: it must promise min_gain.
  const double limit = recheck ? ref * (1.0 - ao_.min_gain) : ref * 1.25;
  if (ref > 0 && best_s > limit) return std::nullopt;
  return best;
}

std::optional<Placement> AdaptiveController::switch_to(size_t arm, AdaptiveEvent::Kind k,
                                                       int64_t n_past, Profiler* prof,
                                                       const std::string& why) {
  record(k, arm, predict(arms_[arm].p, n_past), why);
  window_.clear();
  if (arm == current_) return std::nullopt;
  applying_ = arm;
  applying_at_ = n_past;
  skip_next_ = true;
  if (prof) prof->reset();  // its figures belong to the placement that ends
  return arms_[arm].p;
}

void AdaptiveController::step(double step_ms, int64_t n_past, Profiler* prof,
                              const std::function<Status(const Placement&)>& apply) {
  const std::optional<Placement> p = on_step(step_ms, n_past, prof);
  if (!p) return;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = apply(*p);
  applied(s,
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

void AdaptiveController::applied(const Status& s, double move_ms) {
  if (!applying_) return;
  const size_t arm = *applying_;
  applying_.reset();
  if (s.ok()) {
    const double est = move_estimate_ms(arm, applying_at_) / move_scale_;  // unscaled
    current_ = arm;
    if (move_ms > 0 && est > 0) move_scale_ += (move_ms / est - move_scale_) / ++moves_;
    return;
  }
  arms_[arm].failed = true;
  record(AdaptiveEvent::Kind::kFailed, arm, 0, s.message());
  skip_next_ = true;
}

std::optional<Placement> AdaptiveController::on_step(double step_ms, int64_t n_past,
                                                     Profiler* prof) {
  ++tokens_;
  if (arms_.empty() || applying_) return std::nullopt;
  if (paused()) {  // a user is editing the placement: nothing measured, nothing changed
    window_.clear();
    skip_next_ = true;
    return std::nullopt;
  }
  if (skip_next_) {  // the first step on a new placement pays for the change
    skip_next_ = false;
    return std::nullopt;
  }
  const size_t w = static_cast<size_t>(ao_.window_tokens - 1);
  window_.push_back(step_ms);
  if (window_.size() > w) window_.erase(window_.begin());
  if (window_.size() < w) return std::nullopt;
  if (settled_ && (ao_.recheck_tokens <= 0 || tokens_ < next_check_)) return std::nullopt;

  // A window ended: what the running placement measured, and the model corrected by it.
  Arm& cur = arms_[current_];
  cur.measured_ms = median(window_);
  // (The window's middle step: its median's context, near enough.)
  cur.measured_at = std::max<int64_t>(1, n_past - static_cast<int64_t>(window_.size() / 2));
  if (prof) {
    cost_ = correct_cost_model(base_, m_, cur.p, n_past, o_.kv_dtype, prof->snapshot(),
                               cur.measured_ms);
  }
  record(AdaptiveEvent::Kind::kMeasured, current_, predict(cur.p, n_past));
  window_.clear();

  if (settled_) {  // a recheck
    next_check_ = tokens_ + ao_.recheck_tokens;
    if (extra_tries_ >= ao_.max_extra_tries) return std::nullopt;
    const std::optional<size_t> c = next_candidate(n_past, /*recheck=*/true);
    if (!c) return std::nullopt;
    // There and perhaps back: two moves, repaid by the promised gain before
    // the next recheck, or the try is not worth it.
    const double gain = cur.measured_ms - predict(arms_[*c].p, n_past);
    if (gain * static_cast<double>(ao_.recheck_tokens) < 2 * move_estimate_ms(*c, n_past))
      return std::nullopt;
    ++extra_tries_;
    settled_ = false;
    explore_left_ = 0;
    return switch_to(*c, AdaptiveEvent::Kind::kTry, n_past, prof,
                     "the corrected model predicts it faster than the kept placement");
  }
  if (explore_left_ > 0) {
    if (const std::optional<size_t> c = next_candidate(n_past, /*recheck=*/false)) {
      --explore_left_;
      return switch_to(*c, AdaptiveEvent::Kind::kTry, n_past, prof, "exploring");
    }
  }
  // Exploration over: the fastest measured placement runs from here on,
  // the windows compared at this context length.
  size_t best = current_;
  double best_ms = measured_now(current_, n_past);
  for (size_t i = 0; i < arms_.size(); ++i) {
    if (arms_[i].measured_ms <= 0 || arms_[i].failed) continue;
    const double ms = measured_now(i, n_past);
    if (ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  settled_ = true;
  next_check_ = tokens_ + ao_.recheck_tokens;
  return switch_to(best, AdaptiveEvent::Kind::kKeep, n_past, prof, "fastest measured");
}

}  // namespace loom
