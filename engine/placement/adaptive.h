// The adaptive `auto`: an online controller that learns the placement from
// what decode steps measure. The cost model is calibrated with each unit
// working alone at full clock; a hybrid step does not get that (a GPU that
// works in short bursts clocks down, a switch back to the host waits on a
// fence), so its choice can lose to a plain layers:N.
//
// The controller starts from auto's placement and, between decode tokens:
//   1. measures the running placement for a window of tokens (the median
//      step, the first step after a change left out);
//   2. corrects the cost model from the profiler's per-group P50s: each
//      unit's rate is scaled by measured/predicted time of the groups it
//      ran, and the switch cost takes what the step measured beyond its
//      groups and copies;
//   3. explores: the candidates (strategy.h's candidate_placements) ranked by
//      the corrected model, the best whole-layer run always among them, each
//      tried for one window, at most `max_candidates` placements in all (a
//      bandit's exploration budget);
//   4. keeps the fastest measured one. Every `recheck_tokens` it corrects the
//      model again from the kept placement and tries an untried candidate
//      when the corrected model predicts it `min_gain` faster.
// It runs only in decode steps (Session::generate calls it after a decode
// step, before the next token): never during a prefill, after a stop or
// while a user's own placement request waits. Every change is an event
// (events(), and the listener), for the log, `loom bench` and the GUI.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/placement/cost_model.h"
#include "engine/placement/placement.h"
#include "engine/placement/strategy.h"
#include "engine/profile/profiler.h"

namespace loom {

struct AdaptiveOptions {
  int window_tokens = 8;   ///< decode steps a placement runs to be measured (>= 2)
  int max_candidates = 4;  ///< placements measured in the first exploration, the start included
  double min_gain = 0.03;  ///< predicted gain that makes a recheck try a candidate
  int64_t recheck_tokens = 256;  ///< tokens between rechecks once settled (0: never)
  int max_extra_tries = 4;       ///< candidates rechecks may try in all
};

struct AdaptiveEvent {
  enum class Kind {
    kMeasured,  ///< a window ended: `measured_ms` of the running placement
    kTry,       ///< switching to an untried candidate
    kKeep,      ///< exploration over: the fastest measured placement runs
    kFailed,    ///< a candidate could not be applied (`why`); the old placement stays
  };
  Kind kind = Kind::kMeasured;
  int64_t token = 0;  ///< decode steps the controller had seen
  std::string label;  ///< the placement's name (Placement::strategy)
  Placement placement;
  double predicted_ms = 0;  ///< by the corrected model, at the step's context
  double measured_ms = 0;   ///< median step of its window (0: not measured)
  std::string why;
};
const char* adaptive_event_name(AdaptiveEvent::Kind k);  ///< "measured", "try", "keep", "failed"
/// One line: "token 8: try layers:16, predicted 27.10 ms (exploring)".
std::string adaptive_event_text(const AdaptiveEvent& e);

/// Scales `base` so that it predicts what was measured for placement `p`:
/// per unit, the groups' P50s in `snap` against the predicted compute; the
/// switch cost (or, without switches, the copy latency) so the whole
/// prediction meets `step_ms`. Units or parts without samples keep base's rates.
CostModel correct_cost_model(const CostModel& base, const Model& m, const Placement& p,
                             int64_t n_past, DType kv_dtype, const Profiler::Snapshot& snap,
                             double step_ms);

class AdaptiveController {
 public:
  /// `o`: the options auto planned under (budget, context, dtypes); `cost`:
  /// the calibrated model.
  AdaptiveController(const Model& m, StrategyOptions o, CostModel cost, AdaptiveOptions ao = {});

  /// The placement running now (auto's). Forgets earlier measurements.
  void start(const Placement& current);
  /// After a decode step of `step_ms` with `n_past` tokens in the context;
  /// `prof`: the profiler attached to the forward pass, or null. Returns the
  /// placement to apply before the next step, if any; then call applied().
  std::optional<Placement> on_step(double step_ms, int64_t n_past, Profiler* prof);
  /// The outcome of applying what on_step returned, and the time the move
  /// took (weights and KV between the units): a recheck tries a candidate
  /// only when its predicted gain repays two such moves before the next one.
  void applied(const Status& s, double move_ms = 0);
  /// on_step, then, when it returns a placement, `apply` (the forward pass's
  /// set_placement) timed and reported through applied().
  void step(double step_ms, int64_t n_past, Profiler* prof,
            const std::function<Status(const Placement&)>& apply);
  /// While paused (a user editing the placement), on_step measures nothing
  /// and changes nothing; the window starts again after. Any thread.
  void set_paused(bool paused) { paused_.store(paused, std::memory_order_relaxed); }
  bool paused() const { return paused_.load(std::memory_order_relaxed); }

  /// Called with each event as it happens (the generating thread).
  void set_listener(std::function<void(const AdaptiveEvent&)> f) { listener_ = std::move(f); }
  const std::vector<AdaptiveEvent>& events() const { return events_; }
  const CostModel& cost() const { return cost_; }
  const Model& model() const { return m_; }
  const Placement& current() const { return arms_[current_].p; }
  bool exploring() const { return !settled_; }
  int64_t tokens_seen() const { return tokens_; }

 private:
  struct Arm {
    Placement p;
    int64_t layers_n = -1;    ///< N where p is layers:N's (PlacementCandidate)
    double measured_ms = 0;   ///< 0: not measured
    int64_t measured_at = 0;  ///< context length (n_past) of that window
    bool failed = false;
  };
  size_t arm_of(const Placement& p);
  void record(AdaptiveEvent::Kind k, size_t arm, double predicted, const std::string& why = {});
  double predict(const Placement& p, int64_t n_past) const;
  /// Arm i's measured step brought to a context of n_past tokens: the
  /// corrected model's difference between the two lengths added (attention
  /// grows with the context, so a window measured earlier reads faster).
  double measured_now(size_t i, int64_t n_past) const;
  /// The time a move from the running placement to arm i should take: the
  /// bytes that go up to a GPU (weights and KV) over the copy bandwidth,
  /// scaled by what the moves so far measured against that estimate.
  double move_estimate_ms(size_t i, int64_t n_past) const;
  /// The next untried candidate worth a window, if any (the corrected model's ranking).
  std::optional<size_t> next_candidate(int64_t n_past, bool recheck);
  std::optional<Placement> switch_to(size_t arm, AdaptiveEvent::Kind k, int64_t n_past,
                                     Profiler* prof, const std::string& why);

  const Model& m_;
  StrategyOptions o_;
  CostModel base_, cost_;
  AdaptiveOptions ao_;
  std::vector<Arm> arms_;  ///< every candidate, tried or not
  size_t current_ = 0;
  std::optional<size_t> applying_;  ///< returned by on_step, applied() not called yet
  int64_t applying_at_ = 0;         ///< the context length then
  std::vector<double> window_;
  bool skip_next_ = false;  ///< the first step after a change is not measured
  bool settled_ = false;
  int explore_left_ = 0;  ///< candidates the running exploration may still try
  int extra_tries_ = 0;   ///< candidates tried by rechecks
  int64_t tokens_ = 0;
  double move_scale_ = 1;  ///< measured / estimated time of the moves so far (mean)
  int moves_ = 0;
  int64_t next_check_ = 0;
  std::vector<AdaptiveEvent> events_;
  std::function<void(const AdaptiveEvent&)> listener_;
  std::atomic<bool> paused_{false};
};

}  // namespace loom
