#include "engine/backends/cuda/cuda_backend.h"

#include <cinttypes>
#include <cmath>
#include <cstring>

#include "cpu/ref/ops_ref.h"
#include "engine/backends/cuda/cuda_ops.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

namespace {

constexpr uint64_t kRingBytes = 4ull << 20;  // host inputs per batch, grown when one needs more
constexpr uint64_t kRingAlign = 256;

uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace

/// An activation buffer: one cudaMalloc'd range, freed (after the queued work) on destruction.
class CudaActBuffer final : public ActBuffer {
 public:
  CudaActBuffer(CudaBackend* owner, void* p, int64_t n) : owner_(owner), p_(p) {
    base_.buffer = p;
    base_.offset = 0;
    base_.rows = 1;
    base_.cols = n;
  }
  ~CudaActBuffer() override {
    (void)cudaSetDevice(owner_->device_);
    (void)cudaStreamSynchronize(owner_->stream_);
    (void)cudaFree(p_);
  }

 private:
  CudaBackend* owner_;
  void* p_;
};

// ---- creation -------------------------------------------------------------------

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const CudaOptions& opts) {
  LOOM_ASSIGN_OR_RETURN(auto devs, list_cuda_devices());
  if (devs.empty())
    return make_error(ErrorCode::kUnsupported, "the NVIDIA driver reports no CUDA devices");
  const CudaDeviceInfo* pick = nullptr;
  if (opts.device >= 0) {
    if (opts.device >= static_cast<int>(devs.size()))
      return make_error(ErrorCode::kInvalidArgument,
                        "CUDA device %d does not exist (%zu devices; see `loom devices`)",
                        opts.device, devs.size());
    pick = &devs[static_cast<size_t>(opts.device)];
    if (!pick->usable)
      return make_error(ErrorCode::kUnsupported, "CUDA device %d (%s) is not usable: %s",
                        pick->index, pick->name.c_str(), pick->why_not.c_str());
  } else {
    for (const auto& d : devs) {
      if (d.usable) {
        pick = &d;
        break;
      }
    }
    if (!pick)
      return make_error(ErrorCode::kUnsupported, "no usable CUDA device: %s (device 0)",
                        devs[0].why_not.c_str());
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->info_ = *pick;
  LOOM_TRY(b->init(opts));
  return b;
}

Status CudaBackend::init(const CudaOptions& opts) {
  device_ = info_.index;
  LOOM_CUDA_TRY(cudaSetDevice(device_), "select the device");
  LOOM_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create a stream");
  LOOM_ASSIGN_OR_RETURN(matmul_, cuda::Matmul::create(device_));
  attn_scratch_ = cuda::AttentionScratch::create();
  budget_.limit = opts.memory_limit;
  LOOM_CUDA_TRY(cudaMallocHost(&ring_host_, kRingBytes), "allocate the pinned input ring");
  LOOM_TRY(cuda::device_alloc(&ring_dev_, kRingBytes, "the input ring"));
  ring_bytes_ = kRingBytes;
  return {};
}

CudaBackend::~CudaBackend() {
  if (stream_) {
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
  }
  for (auto& [begin, r] : weights_) (void)cudaFree(r.dev);
  weights_.clear();
  matmul_.reset();
  attn_scratch_.reset();
  for (const Mark& m : marks_) (void)cudaEventDestroy(m.ev);
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  if (ring_host_) (void)cudaFreeHost(ring_host_);
  if (ring_dev_) (void)cudaFree(ring_dev_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
  return "cuda (" + info_.name + ")";
}

bool CudaBackend::supports(OpKind op, DType dtype) const {
  switch (op) {
    case OpKind::kMatmul:
    case OpKind::kGetRows: return cuda::matmul_supported(dtype);
    case OpKind::kKvStore:
    case OpKind::kAttention: return dtype == DType::kF16 || dtype == DType::kQ8_0;
    default: return dtype == DType::kF32;
  }
}

uint64_t CudaBackend::device_bytes() const {
  return budget_.used + matmul_->scratch_bytes() + attn_scratch_->bytes() + ring_bytes_;
}

bool CudaBackend::ready() {
  if (!status_.ok()) return false;
  const cudaError_t e = cudaSetDevice(device_);
  if (e != cudaSuccess) {
    fail(cuda::cuda_status(e, "select the device"));
    return false;
  }
  return true;
}

// ---- memory ---------------------------------------------------------------------

Result<std::unique_ptr<ActBuffer>> CudaBackend::alloc_act(int64_t n_floats) {
  if (n_floats <= 0)
    return make_error(ErrorCode::kInvalidArgument, "CUDA alloc_act: %" PRId64 " floats", n_floats);
  LOOM_CUDA_TRY(cudaSetDevice(device_), "select the device");
  void* p = nullptr;
  LOOM_TRY(cuda::device_alloc(&p, static_cast<uint64_t>(n_floats) * sizeof(float), "activations"));
  return std::unique_ptr<ActBuffer>(std::make_unique<CudaActBuffer>(this, p, n_floats));
}

Status CudaBackend::upload(const float* src, Act dst) {
  if (!ready()) return status_;
  if (!dst.buffer)
    return make_error(ErrorCode::kInternal, "CUDA upload: the destination is not device memory");
  const uint64_t bytes = static_cast<uint64_t>(dst.rows * dst.cols) * sizeof(float);
  // Pageable source: the call returns once the bytes are staged, so `src` may be reused.
  LOOM_CUDA_TRY(cudaMemcpyAsync(dev(dst), src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  return {};
}

Status CudaBackend::download(Act src, float* dst) {
  if (!ready()) return status_;
  if (!src.buffer)
    return make_error(ErrorCode::kInternal, "CUDA download: the source is not device memory");
  const uint64_t bytes = static_cast<uint64_t>(src.rows * src.cols) * sizeof(float);
  cudaError_t e = cudaMemcpyAsync(dst, dev(src), bytes, cudaMemcpyDeviceToHost, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) fail(cuda::cuda_status(e, "download (or a kernel queued before it)"));
  ring_used_ = 0;
  return status_;
}

Status CudaBackend::synchronize() {
  if (!ready()) return status_;
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) fail(cuda::cuda_status(e, "a queued kernel"));
  ring_used_ = 0;
  return status_;
}

const void* CudaBackend::put(const void* data, uint64_t bytes) {
  const uint64_t need = align_up(bytes, kRingAlign);
  if (ring_used_ + need > ring_bytes_) {
    // Every earlier copy out of the ring must be done before it is rewritten.
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) {
      fail(cuda::cuda_status(e, "a queued kernel"));
      return nullptr;
    }
    ring_used_ = 0;
    if (need > ring_bytes_) {
      (void)cudaFreeHost(ring_host_);
      (void)cudaFree(ring_dev_);
      ring_host_ = ring_dev_ = nullptr;
      ring_bytes_ = 0;
      const uint64_t grown = align_up(need * 2, kRingAlign);
      e = cudaMallocHost(&ring_host_, grown);
      if (e != cudaSuccess) {
        fail(cuda::cuda_status(e, "grow the pinned input ring"));
        return nullptr;
      }
      Status st = cuda::device_alloc(&ring_dev_, grown, "the input ring");
      if (!st.ok()) {
        fail(st);
        return nullptr;
      }
      ring_bytes_ = grown;
    }
  }
  auto* h = static_cast<uint8_t*>(ring_host_) + ring_used_;
  auto* d = static_cast<uint8_t*>(ring_dev_) + ring_used_;
  std::memcpy(h, data, bytes);
  const cudaError_t e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_);
  if (e != cudaSuccess) {
    fail(cuda::cuda_status(e, "copy op inputs"));
    return nullptr;
  }
  ring_used_ += need;
  return d;
}

// ---- weights --------------------------------------------------------------------

CudaBackend::Source CudaBackend::weight_source(const Weight& w) {
  Source s;
  s.begin = static_cast<const uint8_t*>(w.tensor_begin());
  s.bytes =
      w.tensor && w.tensor->data ? w.tensor->n_bytes : static_cast<uint64_t>(w.n_out) * w.row_bytes;
  // FNV-1a over the size and 64 bytes at the start, middle and end.
  uint64_t h = 1469598103934665603ull ^ s.bytes;
  auto mix = [&](uint64_t off) {
    for (uint64_t i = off; i < off + 64 && i < s.bytes; ++i) {
      h ^= s.begin[i];
      h *= 1099511628211ull;
    }
  };
  mix(0);
  if (s.bytes > 64) mix(s.bytes / 2);
  if (s.bytes > 64) mix(s.bytes - 64);
  s.fingerprint = h;
  return s;
}

const CudaBackend::Resident* CudaBackend::find_weight(const void* p, const uint8_t** begin) const {
  const auto* b = static_cast<const uint8_t*>(p);
  auto it = weights_.upper_bound(b);
  if (it == weights_.begin()) return nullptr;
  --it;
  if (b >= it->second.end) return nullptr;
  *begin = it->first;
  return &it->second;
}

void CudaBackend::drop(std::map<const uint8_t*, Resident>::iterator it) {
  (void)cudaSetDevice(device_);
  (void)cudaStreamSynchronize(stream_);  // queued kernels may read it
  (void)cudaFree(it->second.dev);
  budget_.give(it->second.bytes);
  weight_bytes_ -= it->second.bytes;
  weights_.erase(it);
}

Status CudaBackend::upload_weight(const Weight& w) {
  if (!w.present()) return {};
  if (!status_.ok()) return status_;
  LOOM_CUDA_TRY(cudaSetDevice(device_), "select the device");
  const Source src = weight_source(w);
  auto it = weights_.find(src.begin);
  if (it != weights_.end() && it->second.bytes == src.bytes &&
      it->second.fingerprint == src.fingerprint)
    return {};
  // Copies overlapping these bytes belong to a tensor that is gone.
  for (auto o = weights_.begin(); o != weights_.end();) {
    const bool overlaps = o->first < src.begin + src.bytes && src.begin < o->second.end;
    auto next = std::next(o);
    if (overlaps) drop(o);
    o = next;
  }
  const std::string what = "weight '" + w.name() + "'";
  LOOM_TRY(budget_.take(src.bytes, what.c_str()));
  void* d = nullptr;
  Status st = cuda::device_alloc(&d, src.bytes, what.c_str());
  if (st.ok()) {
    const cudaError_t e = cudaMemcpy(d, src.begin, src.bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
      (void)cudaFree(d);
      st = cuda::cuda_status(e, "weight upload");
    }
  }
  if (!st.ok()) {
    budget_.give(src.bytes);
    return st;
  }
  weights_[src.begin] = Resident{src.begin + src.bytes, d, src.bytes, src.fingerprint};
  weight_bytes_ += src.bytes;
  return {};
}

void CudaBackend::release_weights() {
  while (!weights_.empty()) drop(weights_.begin());
}

void CudaBackend::release_weight(const Weight& w) {
  auto it = weights_.find(static_cast<const uint8_t*>(w.tensor_begin()));
  if (it != weights_.end()) drop(it);
}

bool CudaBackend::has_weight(OpKind op, const Weight& w) const {
  if (!supports(op, w.dtype)) return false;
  const uint8_t* begin = nullptr;
  return find_weight(w.data, &begin) != nullptr;
}

const void* CudaBackend::weight_ptr(const Weight& w, const char* op) {
  const uint8_t* begin = nullptr;
  const Resident* r = find_weight(w.data, &begin);
  if (r && !(w.tensor && w.tensor->data)) {
    // Memory that is not a mapped file's (a caller's buffer) can be freed and
    // handed out again at the same address with other contents: a copy counts
    // only while its range and fingerprint still match. (A model's tensors
    // are uploaded, and checked, when it is placed; the app releases them when
    // the model changes.)
    const Source src = weight_source(w);
    if (begin != src.begin || r->bytes != src.bytes || r->fingerprint != src.fingerprint)
      r = nullptr;
  }
  if (!r) {
    // Not uploaded by the caller (tests, small vectors), or stale: upload it now.
    Status st = upload_weight(w);
    if (!st.ok()) {
      fail(make_error(st.error().code(), "CUDA %s: weight '%s' is not on the device: %s", op,
                      w.name().c_str(), st.message().c_str()));
      return nullptr;
    }
    r = find_weight(w.data, &begin);
    if (!r) {
      fail(make_error(ErrorCode::kInternal, "CUDA %s: weight '%s' is not on the device", op,
                      w.name().c_str()));
      return nullptr;
    }
  }
  const uint64_t off = static_cast<uint64_t>(static_cast<const uint8_t*>(w.data) - begin);
  return static_cast<const uint8_t*>(r->dev) + off;
}

bool CudaBackend::dev_matrix(const Weight& w, const char* op, cuda::DevMatrix* m) {
  if (!cuda::matmul_supported(w.dtype)) {
    fail(make_error(ErrorCode::kUnsupported, "CUDA %s: weight '%s' is %s, which has no kernel", op,
                    w.name().c_str(), std::string(dtype_name(w.dtype)).c_str()));
    return false;
  }
  const void* p = weight_ptr(w, op);
  if (!p) return false;
  *m = cuda::DevMatrix{p, w.dtype, w.n_out, w.n_in, w.row_bytes};
  return true;
}

bool CudaBackend::check_act(const Act& a, const char* op) {
  if (a.buffer && !a.data) return true;
  fail(make_error(ErrorCode::kInternal, "CUDA %s: an activation is not in this backend's memory",
                  op));
  return false;
}

Result<std::unique_ptr<KvStorage>> CudaBackend::create_kv_storage(const KvCacheConfig& cfg) {
  LOOM_CUDA_TRY(cudaSetDevice(device_), "select the device");
  LOOM_ASSIGN_OR_RETURN(auto s, cuda::CudaKvStorage::create(cfg, stream_, &budget_));
  return std::unique_ptr<KvStorage>(std::move(s));
}

// ---- scope timing ---------------------------------------------------------------

void CudaBackend::set_scope_timing(bool on) {
  scope_on_ = on;
}

void CudaBackend::begin_scope(int32_t id) {
  if (!scope_on_ || !ready()) return;
  if (!marks_.empty() && marks_.back().starts < 0 && id < 0) return;  // nothing open, none opened
  cudaEvent_t ev = nullptr;
  if (!free_events_.empty()) {
    ev = free_events_.back();
    free_events_.pop_back();
  } else if (cudaEventCreate(&ev) != cudaSuccess) {
    return;  // timing is best effort
  }
  if (cudaEventRecord(ev, stream_) != cudaSuccess) {
    free_events_.push_back(ev);
    return;
  }
  marks_.push_back(Mark{id, ev});
}

void CudaBackend::take_scope_times(std::vector<ScopeTime>* out) {
  if (marks_.empty()) return;
  (void)cudaSetDevice(device_);
  size_t done = 0;  // marks whose scope was read (their events can be reused)
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    if (cudaEventQuery(marks_[i + 1].ev) != cudaSuccess) break;  // not reached yet
    if (marks_[i].starts >= 0) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, marks_[i].ev, marks_[i + 1].ev) == cudaSuccess)
        out->push_back(ScopeTime{marks_[i].starts, static_cast<uint64_t>(ms * 1e6)});
    }
    done = i + 1;
  }
  for (size_t i = 0; i < done; ++i) free_events_.push_back(marks_[i].ev);
  marks_.erase(marks_.begin(), marks_.begin() + static_cast<std::ptrdiff_t>(done));
}

// ---- ops ------------------------------------------------------------------------

void CudaBackend::get_rows(const Weight& w, const int32_t* ids, Act out) {
  if (!ready() || !check_act(out, "get_rows")) return;
  for (int64_t t = 0; t < out.rows; ++t) {
    if (ids[t] < 0 || ids[t] >= w.n_out) {
      fail(make_error(ErrorCode::kOutOfRange,
                      "CUDA get_rows: id %d outside '%s' (%" PRId64 " rows)", ids[t],
                      w.name().c_str(), w.n_out));
      return;
    }
  }
  cuda::DevMatrix m;
  if (!dev_matrix(w, "get_rows", &m)) return;
  const auto* d_ids = static_cast<const int32_t*>(put(ids, out.rows * sizeof(int32_t)));
  if (!d_ids) return;
  fail(cuda::dequantize_rows(m, d_ids, out.rows, dev(out), stream_));
}

void CudaBackend::rms_norm(Act x, const Weight& w, float eps, Act out) {
  if (!ready() || !check_act(x, "rms_norm") || !check_act(out, "rms_norm")) return;
  if (w.dtype != DType::kF32) {
    fail(make_error(ErrorCode::kUnsupported, "CUDA rms_norm: weight '%s' is not F32",
                    w.name().c_str()));
    return;
  }
  const auto* wp = static_cast<const float*>(weight_ptr(w, "rms_norm"));
  if (!wp) return;
  fail(cuda::rms_norm(dev(x), wp, eps, dev(out), x.rows, x.cols, stream_));
}

void CudaBackend::matmul(const Weight& w, Act x, Act out, const Weight* bias) {
  if (!ready() || !check_act(x, "matmul") || !check_act(out, "matmul")) return;
  cuda::DevMatrix m;
  if (!dev_matrix(w, "matmul", &m)) return;
  const float* b = nullptr;
  if (bias && bias->present()) {
    b = static_cast<const float*>(weight_ptr(*bias, "matmul bias"));
    if (!b) return;
  }
  fail(matmul_->run(m, dev(x), x.rows, dev(out), b, false, stream_));
}

void CudaBackend::matmul_add(const Weight& w, Act x, Act y, Act tmp) {
  (void)tmp;
  if (!ready() || !check_act(x, "matmul_add") || !check_act(y, "matmul_add")) return;
  cuda::DevMatrix m;
  if (!dev_matrix(w, "matmul_add", &m)) return;
  fail(matmul_->run(m, dev(x), x.rows, dev(y), nullptr, true, stream_));
}

void CudaBackend::matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) {
  if (gate.dtype != up.dtype || gate.n_in != up.n_in || gate.n_out != up.n_out) {
    Backend::matmul_glu(gate, up, x, out, tmp);
    return;
  }
  if (!ready() || !check_act(x, "matmul_glu") || !check_act(out, "matmul_glu")) return;
  cuda::DevMatrix g, u;
  if (!dev_matrix(gate, "matmul_glu", &g) || !dev_matrix(up, "matmul_glu", &u)) return;
  fail(matmul_->run_glu(g, u, dev(x), x.rows, dev(out), stream_));
}

void CudaBackend::matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, const Weight& bq,
                             const Weight& bk, const Weight& bv, Act x, Act q, Act k, Act v) {
  if (!ready() || !check_act(x, "matmul_qkv") || !check_act(q, "matmul_qkv") ||
      !check_act(k, "matmul_qkv") || !check_act(v, "matmul_qkv"))
    return;
  cuda::DevMatrix ws[3];
  if (!dev_matrix(wq, "matmul_qkv", &ws[0]) || !dev_matrix(wk, "matmul_qkv", &ws[1]) ||
      !dev_matrix(wv, "matmul_qkv", &ws[2]))
    return;
  const float* biases[3] = {nullptr, nullptr, nullptr};
  const Weight* bw[3] = {&bq, &bk, &bv};
  for (int i = 0; i < 3; ++i) {
    if (!bw[i]->present()) continue;
    biases[i] = static_cast<const float*>(weight_ptr(*bw[i], "matmul_qkv bias"));
    if (!biases[i]) return;
  }
  float* ys[3] = {dev(q), dev(k), dev(v)};
  fail(matmul_->run_multi(ws, biases, ys, 3, dev(x), x.rows, stream_));
}

void CudaBackend::rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                       const cpu::RopeParams& p) {
  if (!ready() || !check_act(x, "rope")) return;
  const int64_t n_rot = p.n_rot, n_pairs = n_rot / 2, T = x.rows;
  if (n_rot % 2 != 0 || n_rot > head_dim || n_rot < 0) {
    fail(make_error(ErrorCode::kInvalidArgument, "CUDA rope: %" PRId64 " rotated of %" PRId64,
                    n_rot, head_dim));
    return;
  }
  if (n_pairs == 0) return;
  // cos/sin per token and pair, with the float expressions of cpu::rope, so
  // the rotation matches the CPU's to the last bit of its inputs.
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_rot));
  float corr[2];
  ref::rope_yarn_corr_dims(n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
  const float ramp_denom = 0.001f > corr[1] - corr[0] ? 0.001f : corr[1] - corr[0];
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  rope_cs_.resize(static_cast<size_t>(2 * T * n_pairs));
  for (int64_t t = 0; t < T; ++t) {
    float theta = static_cast<float>(pos[t]);
    float* cs = rope_cs_.data() + 2 * t * n_pairs;
    for (int64_t i = 0; i < n_pairs; ++i) {
      const float theta_extrap = p.freq_factors ? theta / p.freq_factors[i] : theta;
      const float theta_interp = p.freq_scale * theta_extrap;
      float angle = theta_interp;
      if (p.ext_factor != 0.0f) {
        const float y = (static_cast<float>(i) - corr[0]) / ramp_denom;
        const float mix = (1.0f - (y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y))) * p.ext_factor;
        angle = theta_interp * (1 - mix) + theta_extrap * mix;
      }
      cs[2 * i] = std::cos(angle) * mscale;
      cs[2 * i + 1] = std::sin(angle) * mscale;
      theta *= theta_scale;
    }
  }
  const auto* d_cs =
      static_cast<const float*>(put(rope_cs_.data(), rope_cs_.size() * sizeof(float)));
  if (!d_cs) return;
  fail(cuda::rope(dev(x), T, n_heads, head_dim, n_pairs, p.neox, d_cs, stream_));
}

bool CudaBackend::kv_layer(KvCache& kv, int64_t layer, const char* op, cuda::DevKvLayer* out) {
  auto* st = dynamic_cast<cuda::CudaKvStorage*>(kv.storage());
  if (!st || !st->layer_resident(layer)) {
    fail(make_error(ErrorCode::kInternal,
                    "CUDA %s: layer %" PRId64 "'s K/V are not in this backend's memory", op,
                    layer));
    return false;
  }
  *out = st->layer(layer);
  return true;
}

void CudaBackend::kv_store(KvCache& kv, int64_t layer, Act k, Act v, const int32_t* pos) {
  if (!ready() || !check_act(k, "kv_store") || !check_act(v, "kv_store")) return;
  cuda::DevKvLayer l;
  if (!kv_layer(kv, layer, "kv_store", &l)) return;
  for (int64_t t = 0; t < k.rows; ++t) {
    if (pos[t] < 0 || pos[t] >= l.capacity) {
      fail(make_error(ErrorCode::kOutOfRange,
                      "CUDA kv_store: position %d outside the %" PRId64 " tokens reserved", pos[t],
                      l.capacity));
      return;
    }
  }
  const auto* d_pos = static_cast<const int32_t*>(put(pos, k.rows * sizeof(int32_t)));
  if (!d_pos) return;
  fail(cuda::kv_store(l, dev(k), dev(v), k.rows, d_pos, stream_));
}

void CudaBackend::attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                            float scale, Act out) {
  if (!ready() || !check_act(q, "attention") || !check_act(out, "attention")) return;
  cuda::DevKvLayer l;
  if (!kv_layer(kv, layer, "attention", &l)) return;
  int64_t max_pos = -1;
  for (int64_t t = 0; t < q.rows; ++t) max_pos = pos[t] > max_pos ? pos[t] : max_pos;
  const auto* d_pos = static_cast<const int32_t*>(put(pos, q.rows * sizeof(int32_t)));
  if (!d_pos) return;
  fail(cuda::attention(l, dev(q), q.rows, d_pos, max_pos, n_heads, scale, dev(out), *attn_scratch_,
                       stream_));
}

void CudaBackend::silu_mul(Act gate, Act up, Act out) {
  if (!ready() || !check_act(gate, "silu_mul") || !check_act(up, "silu_mul") ||
      !check_act(out, "silu_mul"))
    return;
  fail(cuda::silu_mul(dev(gate), dev(up), dev(out), out.rows * out.cols, stream_));
}

void CudaBackend::add(Act a, Act b, Act out) {
  if (!ready() || !check_act(a, "add") || !check_act(b, "add") || !check_act(out, "add")) return;
  fail(cuda::add(dev(a), dev(b), dev(out), out.rows * out.cols, stream_));
}

}  // namespace loom
