#include "engine/runtime/forward.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <thread>
#include <unordered_set>
#include <utility>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/core/huge_pages.h"
#include "engine/runtime/arch_ops.h"

namespace loom {

namespace {
uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
constexpr uint8_t bit(Unit u) {
  return static_cast<uint8_t>(1u << static_cast<unsigned>(u));
}
constexpr Unit kUnits[] = {Unit::kCpu, Unit::kGpu};
// [T, n * head_dim] as [T * n, head_dim]: one row per head (host or device alike).
Act heads(Act a, int64_t rows, int64_t head_dim) {
  a.rows = rows;
  a.cols = head_dim;
  return a;
}

}  // namespace

ForwardPass::ForwardPass(const Model& model, Backend& backend, KvCache& kv, int64_t max_chunk)
    : m_(model), caches_{&kv}, max_chunk_(max_chunk < 1 ? 1 : max_chunk) {
  const HParams& hp = m_.hp;
  rope_.n_rot = hp.n_rot;
  rope_.neox = hp.rope_neox;
  rope_.freq_base = hp.rope_freq_base;
  if (hp.rope_scaling == RopeScaling::kLinear || hp.rope_scaling == RopeScaling::kYarn) {
    rope_.freq_scale = 1.0f / hp.rope_scale_factor;
  }
  if (hp.rope_scaling == RopeScaling::kYarn) {
    rope_.ext_factor = 1.0f;
    rope_.attn_factor = hp.yarn_attn_factor;
    rope_.beta_fast = hp.yarn_beta_fast;
    rope_.beta_slow = hp.yarn_beta_slow;
  }
  rope_.n_ctx_orig = hp.rope_n_ctx_orig;
  if (m_.rope_freqs.present()) rope_.freq_factors = static_cast<const float*>(m_.rope_freqs.data);
  pos_.resize(static_cast<size_t>(max_chunk_));
  layer_ns_.resize(static_cast<size_t>(hp.n_layer));

  const Unit primary = backend.host_memory() ? Unit::kCpu : Unit::kGpu;
  units_[static_cast<size_t>(primary)] = &backend;
  placement_ = Placement::uniform(hp.n_layer, primary);
}

ForwardPass::~ForwardPass() {
  // The device copies this pass uploaded go (a later pass uploads its own).
  if (Backend* gpu = unit(Unit::kGpu)) {
    (void)gpu->synchronize();
    for (auto& [key, w] : gpu_tensors_) gpu->release_weight(w);
  }
  // Device buffers go back to their backend before it may be destroyed.
  for (auto& ua : acts_) {
    for (auto& b : ua.buf) b.reset();
    ua.logits.reset();
  }
}

void ForwardPass::set_profiler(Profiler* p) {
  prof_ = p;
  Backend* gpu = unit(Unit::kGpu);
  if (gpu) gpu->set_scope_timing(p != nullptr);
}

Status ForwardPass::ensure_unit(Unit u) {
  if (unit(u)) return {};
  if (u == Unit::kGpu) {
    return make_error(ErrorCode::kUnsupported,
                      "the placement puts work on the GPU, but no GPU backend is open");
  }
  own_cpu_ = std::make_unique<CpuBackend>(
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  units_[0] = own_cpu_.get();
  return {};
}

int64_t ForwardPass::act_cols(ActId a) const {
  const HParams& hp = m_.hp;
  switch (a) {
    case kX:
    case kXb: return hp.n_embd;
    case kQ:
    case kAtt: return hp.n_head * hp.head_dim;
    case kK:
    case kV: return hp.n_head_kv * hp.head_dim;
    case kHb:
    case kHb2: return hp.n_ff;
    default: return 0;
  }
}

Status ForwardPass::alloc_acts(Unit u) {
  UnitActs& ua = acts_[static_cast<size_t>(u)];
  for (int a = 0; a < kNumActs; ++a) {
    if (ua.buf[static_cast<size_t>(a)]) continue;
    auto b = be(u).alloc_act(max_chunk_ * act_cols(static_cast<ActId>(a)));
    if (!b.ok()) return b.error();
    ua.buf[static_cast<size_t>(a)] = std::move(b).value();
  }
  if (!be(u).host_memory() &&
      !ua.logits) {  // the last token's logits, before download (grown for all_logits)
    auto b = be(u).alloc_act(m_.hp.n_vocab);
    if (!b.ok()) return b.error();
    ua.logits = std::move(b).value();
  }
  return {};
}

Status ForwardPass::build_weights(const Placement& p, Weights* out) {
  out->layers = m_.layers;
  for (size_t l = 0; l < out->layers.size(); ++l) {
    // Requantization is the slow part of a CPU placement: first half of the progress.
    if (progress_ &&
        !progress_(0.5 * static_cast<double>(l) / static_cast<double>(out->layers.size()))) {
      return make_error(ErrorCode::kCancelled, "loading cancelled");
    }
    LayerWeights& w = out->layers[l];
    for (auto [g, list] :
         {std::pair{OpGroup::kAttnW, std::array<Weight*, 4>{&w.wq, &w.wk, &w.wv, &w.wo}},
          {OpGroup::kFfn, std::array<Weight*, 4>{&w.w_gate, &w.w_up, &w.w_down, nullptr}}}) {
      for (Weight* x : list) {
        if (!x) continue;
        LOOM_ASSIGN_OR_RETURN(*x, requant_.get(*x, p.layers[l][g].dtype));
      }
    }
  }
  LOOM_ASSIGN_OR_RETURN(out->tok_embd, requant_.get(m_.tok_embd, p.embed.dtype));
  LOOM_ASSIGN_OR_RETURN(out->output, requant_.get(m_.output, p.output.dtype));
  out->output_norm = m_.output_norm;
  out->rope_freqs = m_.rope_freqs;
  return {};
}

std::array<std::pair<const Weight*, Weight*>, 7> ForwardPass::matmul_pairs(const LayerWeights& a,
                                                                           LayerWeights& b) {
  return {{{&a.wq, &b.wq},
           {&a.wk, &b.wk},
           {&a.wv, &b.wv},
           {&a.wo, &b.wo},
           {&a.w_gate, &b.w_gate},
           {&a.w_up, &b.w_up},
           {&a.w_down, &b.w_down}}};
}

void ForwardPass::make_resident(const Placement& p, Weights* nw) {
  if (!huge_pages_enabled()) return;                    // copies on 4 KiB pages buy nothing
  std::vector<std::pair<const Weight*, Weight*>> todo;  // (the file's, the placement's)
  for (size_t l = 0; l < nw->layers.size(); ++l) {
    const LayerPlace& lp = p.layers[l];
    const auto pairs = matmul_pairs(m_.layers[l], nw->layers[l]);
    for (size_t i = 0; i < pairs.size(); ++i) {
      const OpGroup g = i < 4 ? OpGroup::kAttnW : OpGroup::kFfn;  // wq wk wv wo, then the FFN's
      if (lp[g].unit == Unit::kCpu) todo.push_back(pairs[i]);
    }
  }
  if (p.output.unit == Unit::kCpu) todo.emplace_back(&m_.output, &nw->output);
  // Requantized copies are on huge pages already.
  std::erase_if(todo, [](const auto& xy) {
    return !xy.first->present() || xy.second->data != xy.first->data;
  });
  // Only while the copies fit in half the memory the kernel calls available
  // (the file's page cache counts there, and can go once copied).
  uint64_t need = 0;
  std::unordered_set<const void*> seen;
  for (const auto& [x, y] : todo) {
    if (seen.insert(x->tensor_begin()).second) need += requant_.resident_cost(*y);
  }
  const uint64_t avail = available_memory_bytes();
  if (need > 0 && (avail == 0 || need > avail / 2)) return;
  seen.clear();
  RequantStore::CopyFn copy;
  if (m_.file) {
    copy = [f = m_.file.get()](uint8_t* dst, const uint8_t* src, size_t n) {
      return f->copy_out(src, n, dst);
    };
  }
  for (const auto& [x, y] : todo) {
    *y = requant_.resident(*y, copy);
    // The file's pages of a copied tensor leave this process's memory (they stay cached).
    if (y->data != x->data && m_.file && x->tensor && seen.insert(x->tensor_begin()).second)
      m_.file->release_pages(x->tensor->data, static_cast<size_t>(x->tensor->n_bytes));
  }
}

Status ForwardPass::upload_group(std::vector<const Weight*> ws, OpKind op,
                                 const std::string& where) {
  Backend& gpu = be(Unit::kGpu);
  std::erase_if(ws, [](const Weight* w) { return !w->present(); });
  for (const Weight* w : ws) {
    if (!gpu.supports(op, w->dtype)) {
      return make_error(ErrorCode::kUnsupported, "%s has no kernel for tensor '%s' of type %s (%s)",
                        gpu.name().c_str(), w->name().c_str(),
                        std::string(dtype_name(w->dtype)).c_str(), where.c_str());
    }
  }
  LOOM_TRY(gpu.upload_weights(ws));
  for (const Weight* w : ws) gpu_tensors_.emplace(w->tensor_begin(), *w);
  return {};
}

Status ForwardPass::apply(const Placement& requested) {
  LOOM_TRY(validate_placement(m_, requested));
  // What the GPU backends cannot run yet for this model stays on the CPU, said so.
  Placement want = requested;
  const bool host_moved = keep_host_ops_on_cpu(m_, &want);
  // Activations before weights: weights can move to the CPU when device
  // memory runs out, activations cannot.
  for (Unit u : kUnits) {
    if (!want.uses(u)) continue;
    LOOM_TRY(ensure_unit(u));
    LOOM_TRY(alloc_acts(u));
  }
  // Queued device work may still read weights or KV that are about to move.
  for (Unit u : kUnits) {
    if (unit(u)) LOOM_TRY(be(u).synchronize());
  }
  Placement p = want;
  std::vector<std::string> notes;
  if (host_moved) notes.push_back("attention runs on the CPU: " + m_.host_attention_reason());
  const int64_t L = m_.hp.n_layer;
  Backend* gpu = unit(Unit::kGpu);
  auto fall_back = [&](GroupPlace& g, const std::string& what, const Status& why) {
    g.unit = Unit::kCpu;
    notes.push_back(what + " runs on the CPU: " + why.message());
  };
  auto recoverable = [](const Status& s) {
    return s.error().code() == ErrorCode::kOutOfMemory ||
           s.error().code() == ErrorCode::kUnsupported;
  };

  // 1. KV of layers leaving the GPU comes back first (frees device memory).
  for (int64_t l = 0; l < L; ++l) {
    if (p.layers[static_cast<size_t>(l)][OpGroup::kAttn].unit == Unit::kGpu) continue;
    for (KvCache* kv : caches_) {
      if (kv->on_device(l)) LOOM_TRY(kv->move_layer(l, false));
    }
  }
  // 2. Weights in the requested precisions (requantized copies made once).
  Weights nw;
  LOOM_TRY(build_weights(p, &nw));
  // 3. Device copies no longer wanted go (before new uploads need the room).
  std::unordered_map<const void*, Weight> old_gpu = std::move(gpu_tensors_);
  gpu_tensors_.clear();
  if (gpu) {
    {
      std::unordered_set<const void*> wanted;
      auto want_w = [&wanted](const Weight& w) {
        if (w.present()) wanted.insert(w.tensor_begin());
      };
      for (int64_t l = 0; l < L; ++l) {
        const LayerPlace& lp = p.layers[static_cast<size_t>(l)];
        for (OpGroup g : {OpGroup::kNorm, OpGroup::kAttnW, OpGroup::kFfn}) {
          if (lp[g].unit != Unit::kGpu) continue;
          for (const Weight* x : group_weights(nw.layers[static_cast<size_t>(l)], g)) want_w(*x);
        }
        if (lp[OpGroup::kNorm].unit == Unit::kGpu) want_w(nw.rope_freqs);
      }
      if (p.embed.unit == Unit::kGpu) want_w(nw.tok_embd);
      if (p.output.unit == Unit::kGpu) {
        want_w(nw.output);
        want_w(nw.output_norm);
      }
      for (auto& [key, w] : old_gpu) {
        if (!wanted.count(key)) gpu->release_weight(w);
      }
    }
    // 4. Upload what the GPU runs; a group that does not fit or has no kernel moves to the CPU.
    auto place = [&](GroupPlace& g, std::vector<const Weight*> ws, OpKind op,
                     const std::string& what) -> Status {
      if (g.unit != Unit::kGpu) return {};
      Status s = upload_group(ws, op, what);
      if (s.ok()) return {};
      if (!recoverable(s)) return s;
      for (const Weight* w : ws) gpu->release_weight(*w);
      fall_back(g, what, s);
      return {};
    };
    for (int64_t l = 0; l < L; ++l) {
      if (progress_ && !progress_(0.5 + 0.5 * static_cast<double>(l) / static_cast<double>(L))) {
        return make_error(ErrorCode::kCancelled, "loading cancelled");
      }
      LayerPlace& lp = p.layers[static_cast<size_t>(l)];
      const LayerWeights& w = nw.layers[static_cast<size_t>(l)];
      const std::string at = "layer " + std::to_string(l) + " ";
      // Norm weights and RoPE factors are small vectors: they go first.
      LOOM_TRY(place(lp[OpGroup::kNorm],
                     {&w.attn_norm, &w.ffn_norm, &w.q_norm, &w.k_norm, &w.post_attn_norm,
                      &w.post_ffn_norm, static_cast<const Weight*>(&nw.rope_freqs)},
                     OpKind::kRmsNorm, at + "norm"));
      if (lp[OpGroup::kAttnW].unit == Unit::kGpu) {
        Status s = upload_group({&w.bq, &w.bk, &w.bv}, OpKind::kAdd, at + "attn_w");
        if (s.ok()) s = upload_group({&w.wq, &w.wk, &w.wv, &w.wo}, OpKind::kMatmul, at + "attn_w");
        if (!s.ok()) {
          if (!recoverable(s)) return s;
          for (const Weight* x : group_weights(w, OpGroup::kAttnW)) gpu->release_weight(*x);
          fall_back(lp[OpGroup::kAttnW], at + "attn_w", s);
        }
      }
      LOOM_TRY(
          place(lp[OpGroup::kFfn], group_weights(w, OpGroup::kFfn), OpKind::kMatmul, at + "ffn"));
    }
    LOOM_TRY(place(p.embed, {&nw.tok_embd}, OpKind::kGetRows, "the embedding"));
    if (p.output.unit == Unit::kGpu) {
      Status s = upload_group({&nw.output_norm}, OpKind::kRmsNorm, "output");
      if (s.ok()) s = upload_group({&nw.output}, OpKind::kMatmul, "output");
      if (!s.ok()) {
        if (!recoverable(s)) return s;
        fall_back(p.output, "the output matrix", s);
      }
    }
    // 5. KV of layers whose attention runs on the GPU.
    bool want_gpu_kv = gpu_attn_layers(p) > 0;
    for (KvCache* kv : caches_) {
      if (!want_gpu_kv) break;
      const Status why = ensure_kv_storage(*gpu, *kv);
      if (why.ok()) continue;
      for (auto& lp : p.layers) {
        if (lp[OpGroup::kAttn].unit == Unit::kGpu) lp[OpGroup::kAttn].unit = Unit::kCpu;
      }
      notes.push_back("attention runs on the CPU: " + why.message());
      want_gpu_kv = false;
    }
    const int64_t n_gpu_attn = gpu_attn_layers(p);  // they share the device tier's budget
    for (KvCache* kv : caches_) kv->set_device_layers(n_gpu_attn);
    for (int64_t l = 0; l < L; ++l) {
      GroupPlace& g = p.layers[static_cast<size_t>(l)][OpGroup::kAttn];
      if (g.unit != Unit::kGpu) continue;
      // Every sequence's KV of the layer moves, or none does.
      Status s;
      size_t moved = 0;
      for (; moved < caches_.size() && s.ok(); ++moved) {
        KvCache& kv = *caches_[moved];
        if (!kv.on_device(l)) s = kv.move_layer(l, true);
      }
      if (s.ok()) continue;
      if (!recoverable(s)) return s;
      for (size_t i = 0; i + 1 < moved; ++i) LOOM_TRY(caches_[i]->move_layer(l, false));
      if (s.error().code() == ErrorCode::kUnsupported &&
          caches_.front()->tier_config().device_budget > 0) {
        s = make_error(ErrorCode::kUnsupported,
                       "the device KV tier (--kv-gpu) is not supported on %s yet (%s)",
                       gpu->name().c_str(), s.message().c_str());
      }
      fall_back(g, "layer " + std::to_string(l) + " attention (KV cache)", s);
    }
  }
  // 6. What the CPU streams every decode step, from resident copies on huge pages.
  if (resident_weights_) make_resident(p, &nw);
  // Copies (requantized or resident) no placement group uses any more.
  std::vector<std::pair<const void*, DType>> keep;
  auto src_key = [](const Weight& orig, const Weight& now) {
    return std::make_pair(orig.tensor_begin(), now.dtype);
  };
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    for (auto [x, y] : matmul_pairs(m_.layers[l], nw.layers[l])) {
      if (x->present() && x->data != y->data) keep.push_back(src_key(*x, *y));
    }
  }
  if (m_.tok_embd.dtype != nw.tok_embd.dtype) keep.push_back(src_key(m_.tok_embd, nw.tok_embd));
  if (m_.output.present() && m_.output.data != nw.output.data)
    keep.push_back(src_key(m_.output, nw.output));
  requant_.retain(keep);

  for (Unit u : kUnits) {
    if (!p.uses(u)) continue;
    LOOM_TRY(ensure_unit(u));  // groups that fell back may need a CPU unit the request did not
    LOOM_TRY(alloc_acts(u));
  }
  valid_.fill(0);
  // Steps alternate between the units: the GPU may keep busy (its clocks up) meanwhile.
  if (unit(Unit::kGpu)) be(Unit::kGpu).set_keep_busy(p.uses(Unit::kGpu) && p.uses(Unit::kCpu));
  placement_ = std::move(p);
  w_ = std::move(nw);
  notes_ = std::move(notes);
  if (prof_) prof_->reset();
  if (layer_stats_) layer_stats_->reset();
  if (progress_) (void)progress_(1.0);
  return {};
}

Status ForwardPass::prepare() {
  if (prepared_) return {};
  LOOM_TRY(apply(placement_));
  prepared_ = true;
  return {};
}

Status ForwardPass::set_placement(const Placement& p) {
  if (!prepared_) {
    LOOM_TRY(validate_placement(m_, p));
    placement_ = p;
    return {};
  }
  const Placement before = placement_;
  Status s = apply(p);
  if (s.ok()) return {};
  // Put the previous placement back (its weights are still where they were, or come back).
  std::vector<std::string> keep_notes = notes_;
  std::function<bool(double)> cb =
      std::exchange(progress_, nullptr);  // the way back is not cancellable
  Status back = apply(before);
  progress_ = std::move(cb);
  if (!back.ok())
    return make_error(s.error().code(), "%s (and the previous placement could not be restored: %s)",
                      s.message().c_str(), back.message().c_str());
  notes_ = keep_notes;
  return s;
}

Status ForwardPass::transfer(Act src, Unit from, Act dst, Unit to) {
  Backend& a = be(from);
  Backend* bp = unit(to);  // null: plain host memory (the caller's logits when no CPU unit is open)
  const bool to_host = !bp || bp->host_memory();
  uint64_t t0 = 0;
  if (profiling_) {
    // Time the copy itself, not the queued work it would wait for.
    if (!a.host_memory()) {
      a.begin_scope(-1);
      const uint64_t w0 = now_ns();
      LOOM_TRY(a.synchronize());
      cur_xfer_ns_ += now_ns() - w0;  // the wait is the device's work, timed on its own clock
    }
    t0 = now_ns();
  }
  Status s;
  if (a.host_memory() && to_host) {
    std::copy(src.data, src.data + src.rows * src.cols, dst.data);
  } else if (a.host_memory()) {
    s = bp->upload(src.data, dst);
  } else if (to_host) {
    s = a.download(src, dst.data);
  } else {
    staging_.resize(static_cast<size_t>(src.rows * src.cols));
    s = a.download(src, staging_.data());
    if (s.ok()) s = bp->upload(staging_.data(), dst);
  }
  if (profiling_) {
    const uint64_t ns = now_ns() - t0;
    prof_->record_xfer(cur_layer_, ns);
    cur_xfer_ns_ += ns;
    if (cur_layer_ >= 0) layer_ns_[static_cast<size_t>(cur_layer_)] += ns;
  }
  return s;
}

Act ForwardPass::in(ActId a, Unit u, int64_t T) {
  const auto ai = static_cast<size_t>(a);
  Act dst = acts_[static_cast<size_t>(u)].buf[ai]->view(T, act_cols(a));
  if (valid_[ai] & bit(u)) return dst;
  if (valid_[ai]) {
    const Unit from = (valid_[ai] & bit(Unit::kCpu)) ? Unit::kCpu : Unit::kGpu;
    Status s =
        transfer(acts_[static_cast<size_t>(from)].buf[ai]->view(T, act_cols(a)), from, dst, u);
    if (!s.ok() && op_status_.ok()) op_status_ = s;
  }
  valid_[ai] |= bit(u);
  return dst;
}

Act ForwardPass::out(ActId a, Unit u, int64_t T) {
  valid_[static_cast<size_t>(a)] = bit(u);
  return acts_[static_cast<size_t>(u)].buf[static_cast<size_t>(a)]->view(T, act_cols(a));
}

void ForwardPass::group_begin(int32_t scope, Unit u) {
  if (!profiling_) return;
  const bool dev = !be(u).host_memory() && be(u).device_timing();
  if (cur_scope_ >= 0) {
    const bool prev_dev = !be(cur_unit_).host_memory() && be(cur_unit_).device_timing();
    if (prev_dev && dev && cur_unit_ == u) {
      cur_scope_ = scope;  // begin_scope below closes the previous scope on the same clock
      cur_xfer_ns_ = 0;
      be(u).begin_scope(scope);
      return;
    }
    group_end();
  }
  cur_scope_ = scope;
  cur_unit_ = u;
  cur_xfer_ns_ = 0;
  if (dev)
    be(u).begin_scope(scope);
  else
    cur_t0_ = now_ns();
}

void ForwardPass::group_end() {
  if (!profiling_ || cur_scope_ < 0) return;
  Backend& b = be(cur_unit_);
  if (!b.host_memory() && b.device_timing()) {
    b.begin_scope(-1);
  } else {
    const uint64_t t = now_ns() - cur_t0_;
    const uint64_t ns = t > cur_xfer_ns_ ? t - cur_xfer_ns_ : 0;
    prof_->record_scope(cur_scope_, ns);
    const int64_t layer = cur_scope_ / kNumOpGroups;
    if (layer < m_.hp.n_layer) layer_ns_[static_cast<size_t>(layer)] += ns;
  }
  cur_scope_ = -1;
}

void ForwardPass::flush_device_times() {
  Backend* gpu = unit(Unit::kGpu);
  if (gpu && gpu->device_timing()) {
    scope_times_.clear();
    gpu->take_scope_times(&scope_times_);
    for (const auto& st : scope_times_) {
      prof_->record_scope(st.id, st.ns);
      const int64_t layer = st.id / kNumOpGroups;
      if (st.id >= 0 && layer < m_.hp.n_layer) layer_ns_[static_cast<size_t>(layer)] += st.ns;
    }
  }
  for (int64_t l = 0; l < m_.hp.n_layer; ++l) {
    if (layer_ns_[static_cast<size_t>(l)])
      prof_->record_layer(l, layer_ns_[static_cast<size_t>(l)]);
  }
}

Status ForwardPass::check_tokens(std::span<const int32_t> tokens) const {
  const int32_t n_vocab = static_cast<int32_t>(m_.hp.n_vocab);
  for (int32_t id : tokens) {
    if (id < 0 || id >= n_vocab) {
      return make_error(ErrorCode::kInvalidArgument,
                        "token id %d is outside the vocabulary (0..%d)", id, n_vocab - 1);
    }
  }
  return {};
}

int64_t ForwardPass::gpu_attn_layers(const Placement& p) {
  int64_t n = 0;
  for (const auto& lp : p.layers) n += lp[OpGroup::kAttn].unit == Unit::kGpu;
  return n;
}

Status ForwardPass::ensure_kv_storage(Backend& gpu, KvCache& kv) {
  if (kv.storage()) return {};
  auto st = gpu.create_kv_storage(kv.config());
  if (!st.ok()) return st.status();
  if (!*st) return make_error(ErrorCode::kUnsupported, "%s keeps no KV cache", gpu.name().c_str());
  return kv.attach_storage(std::move(st).value());
}

Status ForwardPass::attach_kv(KvCache& kv) {
  if (std::find(caches_.begin(), caches_.end(), &kv) != caches_.end()) return {};
  const KvCacheConfig& a = kv.config();
  if (a.n_layer != m_.hp.n_layer || a.n_kv_heads != m_.hp.n_head_kv ||
      a.head_dim != m_.hp.head_dim) {
    return make_error(ErrorCode::kInvalidArgument,
                      "attach_kv: the cache's shape does not match the model's");
  }
  if (prepared_) {  // put its layers where their attention runs now
    const int64_t n_gpu_attn = gpu_attn_layers(placement_);
    if (n_gpu_attn > 0) {
      Backend& gpu = be(Unit::kGpu);
      LOOM_TRY(gpu.synchronize());
      LOOM_TRY(ensure_kv_storage(gpu, kv));
      kv.set_device_layers(n_gpu_attn);
      for (int64_t l = 0; l < m_.hp.n_layer; ++l) {
        const bool dev =
            placement_.layers[static_cast<size_t>(l)][OpGroup::kAttn].unit == Unit::kGpu;
        if (dev != kv.on_device(l)) LOOM_TRY(kv.move_layer(l, dev));
      }
    }
  }
  caches_.push_back(&kv);
  return {};
}

void ForwardPass::detach_kv(KvCache& kv) {
  if (Backend* gpu = unit(Unit::kGpu)) (void)gpu->synchronize();  // queued work may read it
  std::erase(caches_, &kv);
}

Status ForwardPass::eval(std::span<const int32_t> tokens, int64_t pos0, float* logits,
                         bool all_logits) {
  if (caches_.empty()) return make_error(ErrorCode::kInternal, "eval: no KV cache attached");
  return eval(*caches_.front(), tokens, pos0, logits, all_logits);
}

Status ForwardPass::eval(KvCache& kv, std::span<const int32_t> tokens, int64_t pos0, float* logits,
                         bool all_logits) {
  const auto T = static_cast<int64_t>(tokens.size());
  if (T == 0) return make_error(ErrorCode::kInvalidArgument, "eval: no tokens");
  if (pos0 != kv.n_tokens()) {
    return make_error(ErrorCode::kInternal,
                      "eval at position %" PRId64 " but the cache holds %" PRId64 " tokens", pos0,
                      kv.n_tokens());
  }
  if (std::find(caches_.begin(), caches_.end(), &kv) == caches_.end())
    return make_error(ErrorCode::kInternal, "eval: the KV cache is not attached to this pass");
  LOOM_TRY(check_tokens(tokens));
  LOOM_TRY(prepare());
  if (pos0 + T > kv.capacity()) LOOM_TRY(kv.reserve(pos0 + T));  // the error names the limit
  if (!kv.tiered()) LOOM_TRY(kv.reserve(pos0 + T));
  const uint64_t t_step = now_ns();
  const int64_t chunk = std::min(max_chunk_, kv.max_step_tokens());
  for (int64_t c = 0; c < T; c += chunk) {
    const int64_t n = std::min(chunk, T - c);
    if (kv.tiered()) LOOM_TRY(kv.reserve(pos0 + c + n));
    const bool last = c + n == T;
    float* out = nullptr;
    if (all_logits)
      out = logits + c * m_.hp.n_vocab;
    else if (last)
      out = logits;
    segs_.assign(1, Seg{&kv, 0, n});
    for (int64_t t = 0; t < n; ++t)
      pos_[static_cast<size_t>(t)] = static_cast<int32_t>(pos0 + c + t);
    LOOM_TRY(eval_rows(tokens.data() + c, n, all_logits ? 0 : n - 1, out));
    kv.set_n_tokens(pos0 + c + n);
    LOOM_TRY(kv.rebalance());
  }
  kv.prefetch_first_layer();  // read while the caller samples the next token
  LOOM_TRY(finish_step());
  if (prof_ && T == 1) prof_->record_step(now_ns() - t_step);
  return {};
}

Status ForwardPass::eval_batch(std::span<const SeqStep> seqs) {
  if (seqs.empty()) return make_error(ErrorCode::kInvalidArgument, "eval_batch: no sequences");
  int64_t R = 0;
  for (const SeqStep& q : seqs) {
    const auto n = static_cast<int64_t>(q.tokens.size());
    if (!q.kv || n == 0)
      return make_error(ErrorCode::kInvalidArgument, "eval_batch: a sequence without tokens");
    if (std::find(caches_.begin(), caches_.end(), q.kv) == caches_.end())
      return make_error(ErrorCode::kInternal, "eval_batch: a KV cache not attached to this pass");
    for (const SeqStep& o : seqs) {
      if (&o != &q && o.kv == q.kv)
        return make_error(ErrorCode::kInvalidArgument, "eval_batch: one cache twice in a step");
    }
    if (n > q.kv->max_step_tokens()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "eval_batch: %" PRId64 " tokens of one sequence, its cache takes %" PRId64
                        " in a step",
                        n, q.kv->max_step_tokens());
    }
    LOOM_TRY(check_tokens(q.tokens));
    R += n;
  }
  if (R > max_chunk_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "eval_batch: %" PRId64 " tokens in one step, at most %" PRId64, R,
                      max_chunk_);
  }
  LOOM_TRY(prepare());
  // Rows of the step: each sequence's tokens in turn, at its cache's positions.
  batch_tokens_.clear();
  segs_.clear();
  int64_t first_out = R;  // logits are computed from the first row that needs them to the last
  for (const SeqStep& q : seqs) {
    const int64_t pos0 = q.kv->n_tokens(), n = static_cast<int64_t>(q.tokens.size());
    LOOM_TRY(q.kv->reserve(pos0 + n));  // the error names the limit
    const int64_t r0 = static_cast<int64_t>(batch_tokens_.size());
    for (int64_t t = 0; t < n; ++t)
      pos_[static_cast<size_t>(r0 + t)] = static_cast<int32_t>(pos0 + t);
    batch_tokens_.insert(batch_tokens_.end(), q.tokens.begin(), q.tokens.end());
    segs_.push_back(Seg{q.kv, r0, n});
    if (q.logits) first_out = std::min(first_out, r0 + n - 1);
  }
  row_kvs_.clear();
  for (const Seg& g : segs_) row_kvs_.push_back(g.kv);
  const int64_t V = m_.hp.n_vocab;
  float* out = nullptr;
  if (first_out < R) {
    batch_logits_.resize(static_cast<size_t>((R - first_out) * V));
    out = batch_logits_.data();
  }
  LOOM_TRY(eval_rows(batch_tokens_.data(), R, first_out, out));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seg& g = segs_[i];
    if (seqs[i].logits) {
      const float* row = batch_logits_.data() + (g.r0 + g.n - 1 - first_out) * V;
      std::copy(row, row + V, seqs[i].logits);
    }
    g.kv->set_n_tokens(g.kv->n_tokens() + g.n);
    LOOM_TRY(g.kv->rebalance());
    g.kv->prefetch_first_layer();
  }
  return finish_step();
}

Status ForwardPass::finish_step() {
  for (Unit u : kUnits) {
    if (unit(u) && placement_.uses(u)) LOOM_TRY(be(u).synchronize());
  }
  if (profiling_) {
    flush_device_times();
    profiling_ = false;
  }
  return {};
}

Status ForwardPass::eval_layer(int64_t l, const float* x, int64_t T, float* y) {
  const HParams& hp = m_.hp;
  if (l < 0 || l >= hp.n_layer || T < 1 || T > max_chunk_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "eval_layer: layer %" PRId64 " of %" PRId64 ", %" PRId64
                      " tokens (1..%" PRId64 ")",
                      l, hp.n_layer, T, max_chunk_);
  }
  if (caches_.empty()) return make_error(ErrorCode::kInternal, "eval_layer: no KV cache attached");
  KvCache& kv = *caches_.front();
  if (kv.n_tokens() != 0) {
    return make_error(ErrorCode::kInternal, "eval_layer: the cache holds %" PRId64 " tokens",
                      kv.n_tokens());
  }
  LOOM_TRY(prepare());
  LOOM_TRY(kv.reserve(T));
  for (int64_t t = 0; t < T; ++t) pos_[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  segs_.assign(1, Seg{&kv, 0, T});
  profiling_ = false;
  const Unit un = placement_.layers[static_cast<size_t>(l)][OpGroup::kNorm].unit;
  Act xa = out(kX, un, T);
  if (be(un).host_memory())
    std::copy(x, x + T * hp.n_embd, xa.data);
  else
    LOOM_TRY(be(un).upload(x, xa));
  layer(l, T);
  const Unit from = (valid_[kX] & bit(Unit::kCpu)) ? Unit::kCpu : Unit::kGpu;
  Act xr = acts_[static_cast<size_t>(from)].buf[kX]->view(T, hp.n_embd);
  Status s = std::exchange(op_status_, Status());
  if (s.ok()) s = transfer(xr, from, Act{y, T, hp.n_embd}, Unit::kCpu);
  for (Unit u : kUnits) {
    if (s.ok() && unit(u) && placement_.uses(u)) s = be(u).synchronize();
  }
  kv.clear();
  valid_.fill(0);
  return s;
}

Status ForwardPass::eval_rows(const int32_t* tokens, int64_t T, int64_t first, float* logits) {
  const HParams& hp = m_.hp;
  profiling_ =
      prof_ != nullptr && T == 1 &&
      decode_steps_++ % static_cast<uint64_t>(prof_->sample_every(placement_.uses(Unit::kGpu))) ==
          0;
  // (Tiered KV too: the backend ends the step where a layer's attention needs
  // the host, and the KV blocks move only between steps.)
  if (T == 1 && !profiling_ && unit(Unit::kGpu) && !placement_.uses(Unit::kCpu))
    unit(Unit::kGpu)->begin_step();
  if (profiling_) std::fill(layer_ns_.begin(), layer_ns_.end(), 0);
  cur_layer_ = -1;
  {
    OpTimer timer(stats_, OpLabel::kEmbed);
    const Unit ue = placement_.embed.unit;
    group_begin(prof_ ? prof_->embed_scope() : 0, ue);
    be(ue).get_rows(w_.tok_embd, tokens, out(kX, ue, T));
    if (hp.embd_scale > 0 && be(ue).host_memory()) host_scale(in(kX, ue, T), hp.embd_scale);
  }
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    LayerTimer timer(layer_stats_, l, T);
    cur_layer_ = l;
    layer(l, T);
  }
  cur_layer_ = -1;
  if (!op_status_.ok()) {
    group_end();
    return std::exchange(op_status_, Status());
  }
  if (!logits) {
    group_end();
    return {};
  }

  OpTimer timer(stats_, OpLabel::kOutput);
  const Unit uo = placement_.output.unit;
  // Only the rows whose logits are wanted go through the output matrix.
  const int64_t rows = T - first;
  group_begin(prof_ ? prof_->output_scope() : 0, uo);
  Act x = in(kX, uo, T).rows_view(first, rows);
  Act xb = out(kXb, uo, rows);
  be(uo).rms_norm(x, w_.output_norm, hp.rms_eps, xb);
  if (be(uo).host_memory()) {  // the CPU writes straight into the caller's array
    be(uo).matmul(w_.output, xb, Act{logits, rows, hp.n_vocab}, nullptr);
    host_softcap(Act{logits, rows, hp.n_vocab}, hp.final_softcap);
    group_end();
    return std::exchange(op_status_, Status());
  }
  UnitActs& ua = acts_[static_cast<size_t>(uo)];
  if (!ua.logits || ua.logits->capacity() < rows * hp.n_vocab) {
    ua.logits.reset();
    auto b = be(uo).alloc_act(rows * hp.n_vocab);
    if (!b.ok()) return b.error();
    ua.logits = std::move(b).value();
  }
  Act o = ua.logits->view(rows, hp.n_vocab);
  be(uo).matmul(w_.output, xb, o, nullptr);
  group_end();
  LOOM_TRY(std::exchange(op_status_, Status()));
  LOOM_TRY(transfer(o, uo, Act{logits, rows, hp.n_vocab}, Unit::kCpu));
  host_softcap(Act{logits, rows, hp.n_vocab}, hp.final_softcap);  // gemma2
  return {};
}

void ForwardPass::layer(int64_t l, int64_t T) {
  const HParams& hp = m_.hp;
  const LayerWeights& w = w_.layers[static_cast<size_t>(l)];
  const LayerPlace& P = placement_.layers[static_cast<size_t>(l)];
  const Unit uw = P[OpGroup::kAttnW].unit, ua = P[OpGroup::kAttn].unit, uf = P[OpGroup::kFfn].unit,
             un = P[OpGroup::kNorm].unit;
  auto scope = [&](OpGroup g) { return prof_ ? prof_->scope(l, g) : 0; };

  {
    OpTimer timer(stats_, OpLabel::kNorm);
    group_begin(scope(OpGroup::kNorm), un);
    Act x = in(kX, un, T);
    be(un).rms_norm(x, w.attn_norm, hp.rms_eps, out(kXb, un, T));
  }
  // Projections, RoPE and the KV store in one op where all three run on one
  // unit (timed with attn_w), else apart; apart too where q and k get their
  // per-head norms first (qwen3), or where the step holds several sequences.
  const bool qk_norm = w.q_norm.present();
  const bool qkv_rope = segs_.size() == 1 && uw == ua && un == ua && !qk_norm;
  {
    OpTimer timer(stats_, OpLabel::kQkv);
    group_begin(scope(OpGroup::kAttnW), uw);
    Act xb = in(kXb, uw, T);
    if (qkv_rope) {
      be(uw).matmul_qkv_rope_kv(w.wq, w.wk, w.wv, w.bq, w.bk, w.bv, xb, out(kQ, uw, T),
                                out(kK, uw, T), out(kV, uw, T), *segs_[0].kv, l, hp.n_head,
                                hp.n_head_kv, hp.head_dim, pos_.data(), rope_);
    } else {
      be(uw).matmul_qkv(w.wq, w.wk, w.wv, w.bq, w.bk, w.bv, xb, out(kQ, uw, T), out(kK, uw, T),
                        out(kV, uw, T));
    }
  }
  if (qk_norm) {
    // q, k = rms_norm of each head's head_dim values * q_norm, k_norm (qwen3).
    OpTimer timer(stats_, OpLabel::kNorm);
    group_begin(scope(OpGroup::kNorm), un);
    Act q = in(kQ, un, T), k = in(kK, un, T);
    valid_[kQ] = valid_[kK] = bit(un);
    const Act qh = heads(q, T * hp.n_head, hp.head_dim),
              kh = heads(k, T * hp.n_head_kv, hp.head_dim);
    be(un).rms_norm(qh, w.q_norm, hp.rms_eps, qh);
    be(un).rms_norm(kh, w.k_norm, hp.rms_eps, kh);
  }
  if (qkv_rope) {
    group_begin(scope(OpGroup::kAttn), ua);
  } else if (un == ua) {
    // RoPE and the KV store in one op where the backend fuses them (timed with attention).
    OpTimer timer(stats_, OpLabel::kKvStore);
    group_begin(scope(OpGroup::kAttn), ua);
    Act q = in(kQ, ua, T), k = in(kK, ua, T), v = in(kV, ua, T);
    valid_[kQ] = valid_[kK] = bit(ua);
    // The single rows at the step's end (decoding sequences) in one go where the backend can.
    size_t end = segs_.size();
    if (const size_t first = row_tail(); first + 1 < segs_.size()) {
      const int64_t r0 = segs_[first].r0, n = static_cast<int64_t>(segs_.size() - first);
      if (be(ua).rope_qk_kv_rows(q.rows_view(r0, n), k.rows_view(r0, n), v.rows_view(r0, n),
                                 std::span<KvCache* const>(row_kvs_).subspan(first), l, hp.n_head,
                                 hp.n_head_kv, hp.head_dim, pos_.data() + r0, rope_))
        end = first;
    }
    for (size_t i = 0; i < end; ++i) {
      const Seg& g = segs_[i];
      be(ua).rope_qk_kv(q.rows_view(g.r0, g.n), k.rows_view(g.r0, g.n), v.rows_view(g.r0, g.n),
                        *g.kv, l, hp.n_head, hp.n_head_kv, hp.head_dim, pos_.data() + g.r0, rope_);
    }
  } else {
    {
      OpTimer timer(stats_, OpLabel::kRope);
      group_begin(scope(OpGroup::kNorm), un);
      Act q = in(kQ, un, T), k = in(kK, un, T);
      valid_[kQ] = valid_[kK] = bit(un);
      be(un).rope_qk(q, k, hp.n_head, hp.n_head_kv, hp.head_dim, pos_.data(), rope_);
    }
    OpTimer timer(stats_, OpLabel::kKvStore);
    group_begin(scope(OpGroup::kAttn), ua);
    Act k = in(kK, ua, T), v = in(kV, ua, T);
    for (const Seg& g : segs_)
      be(ua).kv_store(*g.kv, l, k.rows_view(g.r0, g.n), v.rows_view(g.r0, g.n), pos_.data() + g.r0);
  }
  {
    OpTimer timer(stats_, OpLabel::kAttention);
    // Each sequence of the step attends over its own cache.
    Act q = in(kQ, ua, T), att = out(kAtt, ua, T);
    const float scale =
        hp.attn_scale > 0 ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
    // gemma2: soft-capped scores, a window on every swa_every-th layer (the CPU's, see apply).
    const bool swa = hp.sliding_window > 0 && hp.swa_every > 0 && l % hp.swa_every == 0;
    const bool host_attn = hp.attn_softcap > 0 || swa;
    size_t end = segs_.size(), fetched_from = segs_.size();
    if (const size_t first = row_tail(); first + 1 < segs_.size() && !host_attn) {
      bool fetched = true;
      for (size_t i = first; i < segs_.size() && fetched; ++i)
        fetched = segs_[i].kv->fetch_layer(l).ok();
      if (fetched) fetched_from = first;  // else the loop fetches again and reports
      const int64_t r0 = segs_[first].r0, n = static_cast<int64_t>(segs_.size() - first);
      if (fetched && be(ua).attention_rows(std::span<KvCache* const>(row_kvs_).subspan(first), l,
                                           q.rows_view(r0, n), pos_.data() + r0, hp.n_head, scale,
                                           att.rows_view(r0, n)))
        end = first;
    }
    for (size_t i = 0; i < end; ++i) {
      const Seg& g = segs_[i];
      KvCache& kv = *g.kv;
      // Spilled KV blocks of a host layer come back from the SSD to be read.
      if (i < fetched_from) {
        if (Status s = kv.fetch_layer(l); !s.ok() && op_status_.ok()) op_status_ = s;
      }
      const Act qg = q.rows_view(g.r0, g.n), ag = att.rows_view(g.r0, g.n);
      const int32_t* pos = pos_.data() + g.r0;
      if (ua == Unit::kGpu && kv.device_tiered(l)) {
        // The device tier: the GPU over its slots, the CPU over the host blocks, merged.
        // (The CPU unit is made when first needed: an all-GPU placement has none.)
        auto* cpu =
            ensure_unit(Unit::kCpu).ok() ? dynamic_cast<CpuBackend*>(unit(Unit::kCpu)) : nullptr;
        HostAttentionFn host = [&](const float* qh, int64_t n, const int32_t* hpos,
                                   const float* dev_ml, float* part, float* mass, int64_t nb) {
          cpu->attention_host_part(kv, l, qh, n, hpos, hp.n_head, scale, dev_ml, part, mass, nb);
        };
        Status s = cpu ? be(ua).attention_split(kv, l, qg, pos, hp.n_head, scale, ag, host)
                       : make_error(ErrorCode::kInternal,
                                    "the device KV tier needs the CPU backend for the host blocks");
        if (!s.ok() && op_status_.ok()) op_status_ = s;
      } else if (host_attn) {  // (on the CPU: keep_host_ops_on_cpu)
        auto* cpu = dynamic_cast<CpuBackend*>(&be(ua));
        if (cpu) {
          cpu->attention(kv, l, qg, pos, hp.n_head, scale, ag,
                         cpu::AttnMods{hp.attn_softcap, swa ? hp.sliding_window : 0});
        } else if (op_status_.ok()) {
          op_status_ = make_error(ErrorCode::kInternal,
                                  "layer %" PRId64 ": %s runs on the CPU only, not on %s", l,
                                  m_.host_attention_reason().c_str(), be(ua).name().c_str());
        }
      } else {
        be(ua).attention(kv, l, qg, pos, hp.n_head, scale, ag);
      }
    }
  }
  if (uw == un && !w.post_attn_norm.present()) {
    // One op where the backend fuses them: x += wo att (timed with attn_w).
    OpTimer timer(stats_, OpLabel::kAttnOut);
    group_begin(scope(OpGroup::kAttnW), uw);
    Act att = in(kAtt, uw, T), x = in(kX, uw, T);
    valid_[kX] = bit(uw);
    be(uw).matmul_add(w.wo, att, x, out(kXb, uw, T));
  } else {
    {
      OpTimer timer(stats_, OpLabel::kAttnOut);
      group_begin(scope(OpGroup::kAttnW), uw);
      Act att = in(kAtt, uw, T);
      be(uw).matmul(w.wo, att, out(kXb, uw, T), nullptr);
    }
    OpTimer timer(stats_, OpLabel::kAdd);
    group_begin(scope(OpGroup::kNorm), un);
    Act x = in(kX, un, T), xb = in(kXb, un, T);
    valid_[kX] = bit(un);
    // gemma2: the attention's output normed before it joins the residual.
    if (w.post_attn_norm.present()) be(un).rms_norm(xb, w.post_attn_norm, hp.rms_eps, xb);
    be(un).add(x, xb, x);
  }
  {
    OpTimer timer(stats_, OpLabel::kNorm);
    be(un).rms_norm(in(kX, un, T), w.ffn_norm, hp.rms_eps, out(kXb, un, T));
  }
  {
    OpTimer timer(stats_, OpLabel::kFfnUpGate);
    group_begin(scope(OpGroup::kFfn), uf);
    Act xb = in(kXb, uf, T);
    if (hp.ffn_gelu) {  // gemma2's GeGLU: gelu(gate) * up
      Act hb = out(kHb, uf, T), hb2 = out(kHb2, uf, T);
      be(uf).matmul(w.w_gate, xb, hb, nullptr);
      be(uf).matmul(w.w_up, xb, hb2, nullptr);
      be(uf).gelu_mul(hb, hb2, hb);
    } else {
      // silu(gate) * up, one op where the backend fuses it.
      be(uf).matmul_glu(w.w_gate, w.w_up, xb, out(kHb, uf, T), out(kHb2, uf, T));
    }
  }
  if (uf == un && !w.post_ffn_norm.present()) {
    // x += w_down hb, fused where the backend can (timed with ffn)
    OpTimer timer(stats_, OpLabel::kFfnDown);
    Act hb = in(kHb, uf, T), x = in(kX, uf, T);
    valid_[kX] = bit(uf);
    be(uf).matmul_add(w.w_down, hb, x, out(kXb, uf, T));
    return;
  }
  {
    OpTimer timer(stats_, OpLabel::kFfnDown);
    be(uf).matmul(w.w_down, in(kHb, uf, T), out(kXb, uf, T), nullptr);
  }
  OpTimer timer(stats_, OpLabel::kAdd);
  group_begin(scope(OpGroup::kNorm), un);
  Act x = in(kX, un, T), xb = in(kXb, un, T);
  valid_[kX] = bit(un);
  if (w.post_ffn_norm.present()) be(un).rms_norm(xb, w.post_ffn_norm, hp.rms_eps, xb);  // gemma2
  be(un).add(x, xb, x);
}

}  // namespace loom
