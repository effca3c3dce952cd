#include "engine/backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cpu/ref/ops_ref.h"
#include "engine/backends/cuda/cuda_ops.h"
#include "engine/backends/cuda/launch_key.h"
#include "engine/runtime/kv_cache.h"

namespace loom {

using namespace launch_key;  // NOLINT(google-build-using-namespace)

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
    owner_->finish_step();
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
  const char* fuse = std::getenv("LOOM_CUDA_FUSE_NORM");
  fuse_norm_ = !(fuse && std::strcmp(fuse, "0") == 0);
  const char* fuse_rope = std::getenv("LOOM_CUDA_FUSE_ROPE");
  fuse_rope_ = !(fuse_rope && std::strcmp(fuse_rope, "0") == 0);
  // LOOM_CUDA_ROWS=0: a batched step's decoding rows one sequence at a time.
  const char* rows = std::getenv("LOOM_CUDA_ROWS");
  row_ops_ = !(rows && std::strcmp(rows, "0") == 0);
  const char* fuse_attn = std::getenv("LOOM_CUDA_FUSE_ATTN");
  fuse_attn_ = !(fuse_attn && std::strcmp(fuse_attn, "0") == 0);
  const char* stage = std::getenv("LOOM_CUDA_KV_STAGE");
  tier_stage_ = !(stage && std::strcmp(stage, "0") == 0);
  if (const char* gr = std::getenv("LOOM_CUDA_KV_GPU_READ_MIB"))
    tier_gpu_read_ = std::strtoull(gr, nullptr, 10) << 20;
  if (const char* gs = std::getenv("LOOM_CUDA_KV_GPU_SHARE"))
    tier_gpu_share_ = std::clamp<int64_t>(std::strtoll(gs, nullptr, 10), 0, 100);
  LOOM_CUDA_TRY(cudaMallocHost(&ring_host_, kRingBytes), "allocate the pinned input ring");
  LOOM_TRY(cuda::device_alloc(&ring_dev_, kRingBytes, "the input ring"));
  ring_bytes_ = kRingBytes;
  return {};
}

CudaBackend::~CudaBackend() {
  if (stream_) {
    (void)cudaSetDevice(device_);
    finish_step();
    (void)cudaStreamSynchronize(stream_);
  }
  drop_graphs();
  for (auto& [begin, r] : weights_) (void)cudaFree(r.dev);
  weights_.clear();
  matmul_.reset();
  attn_scratch_.reset();
  for (const Mark& m : marks_) (void)cudaEventDestroy(m.ev);
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  if (norm_xq_) (void)cudaFree(norm_xq_);
  if (norm_xd_) (void)cudaFree(norm_xd_);
  if (tier_host_) (void)cudaFreeHost(tier_host_);
  if (gather_) (void)cudaFree(gather_);
  if (tier_event_) (void)cudaEventDestroy(tier_event_);
  if (copy_stream_) (void)cudaStreamSynchronize(copy_stream_);
  for (TierStage& st : stage_) {
    if (st.dev) (void)cudaFree(st.dev);
    if (st.ready) (void)cudaEventDestroy(st.ready);
    if (st.done) (void)cudaEventDestroy(st.done);
  }
  if (copy_join_) (void)cudaEventDestroy(copy_join_);
  if (copy_stream_) (void)cudaStreamDestroy(copy_stream_);
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
  const uint64_t norm =
      norm_cols_ > 0 ? cuda::kMaxMatvecTokens * (cuda::q8_token_bytes(norm_cols_) + norm_cols_ / 4)
                     : 0;
  return budget_.used + matmul_->scratch_bytes() + attn_scratch_->bytes() + ring_bytes_ + norm;
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
  finish_step();
  void* p = nullptr;
  LOOM_TRY(cuda::device_alloc(&p, static_cast<uint64_t>(n_floats) * sizeof(float), "activations"));
  return std::unique_ptr<ActBuffer>(std::make_unique<CudaActBuffer>(this, p, n_floats));
}

Status CudaBackend::upload(const float* src, Act dst) {
  if (!ready()) return status_;
  if (!dst.buffer)
    return make_error(ErrorCode::kInternal, "CUDA upload: the destination is not device memory");
  finish_step();
  const uint64_t bytes = static_cast<uint64_t>(dst.rows * dst.cols) * sizeof(float);
  // Pageable source: the call returns once the bytes are staged, so `src` may be reused.
  LOOM_CUDA_TRY(cudaMemcpyAsync(dev(dst), src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  return {};
}

Status CudaBackend::download(Act src, float* dst) {
  if (!ready()) return status_;
  if (!src.buffer)
    return make_error(ErrorCode::kInternal, "CUDA download: the source is not device memory");
  finish_step();
  if (!status_.ok()) return status_;
  const uint64_t bytes = static_cast<uint64_t>(src.rows * src.cols) * sizeof(float);
  cudaError_t e = cudaMemcpyAsync(dst, dev(src), bytes, cudaMemcpyDeviceToHost, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) fail(cuda::cuda_status(e, "download (or a kernel queued before it)"));
  ring_restart();
  return status_;
}

Status CudaBackend::synchronize() {
  if (!ready()) {
    stepping_ = false;
    step_ops_.clear();
    return status_;
  }
  finish_step();
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) fail(cuda::cuda_status(e, "a queued kernel"));
  ring_restart();
  return status_;
}

void CudaBackend::ring_restart() {
  ring_used_ = 0;
  // The copies of the pass before are forgotten; the next one goes to
  // entry 0, so entries [0, put_cache_n_) are always this pass's own.
  put_cache_n_ = 0;
  put_cache_next_ = 0;
}

const void* CudaBackend::put(const void* data, uint64_t bytes) {
  const uint64_t need = align_up(bytes, kRingAlign);
  if (ring_used_ + need > ring_bytes_) {
    finish_step();  // the ring starts over: a step's copies must be issued first
    // Every earlier copy out of the ring must be done before it is rewritten.
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) {
      fail(cuda::cuda_status(e, "a queued kernel"));
      return nullptr;
    }
    ring_restart();
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
  // The same input again since the ring started over (a layer's positions
  // for kv_store and attention, every layer's RoPE table): its first copy.
  for (int i = 0; i < put_cache_n_; ++i) {
    const PutCopy& c = put_cache_[i];
    if (c.bytes == bytes && std::memcmp(c.host, data, bytes) == 0) return c.dev;
  }
  auto* h = static_cast<uint8_t*>(ring_host_) + ring_used_;
  auto* d = static_cast<uint8_t*>(ring_dev_) + ring_used_;
  std::memcpy(h, data, bytes);
  ring_used_ += need;
  put_cache_[put_cache_next_] = PutCopy{h, d, bytes};
  put_cache_next_ = (put_cache_next_ + 1) % kPutCache;
  if (put_cache_n_ < kPutCache) ++put_cache_n_;
  launch({kOpPut, u(d), bytes}, [this, d, h, bytes]() -> Status {
    return cuda::cuda_status(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_),
                             "copy op inputs");
  });
  return status_.ok() ? d : nullptr;
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
  finish_step();
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
  float* o = dev(out);
  const int64_t T = out.rows;
  launch({kOpGetRows, u(m), u(d_ids), u(T), u(o)},
         [this, m, d_ids, T, o] { return cuda::dequantize_rows(m, d_ids, T, o, stream_); });
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
  const float* xp = dev(x);
  float* o = dev(out);
  const int64_t rows = x.rows, cols = x.cols;
  const bool fused = fuse_norm_ && rows >= 1 && rows <= cuda::kMaxMatvecTokens && cols % 32 == 0 &&
                     out.rows == rows && out.cols == cols;
  if (fused && cols > norm_cols_) {
    // Grown once per model width: the launches kept so far run first (they
    // may read the old buffers), and the step goes on op by op.
    finish_step();
    fail(cuda::cuda_status(cudaStreamSynchronize(stream_), "synchronize before growing scratch"));
    if (norm_xq_) (void)cudaFree(norm_xq_);
    if (norm_xd_) (void)cudaFree(norm_xd_);
    norm_xq_ = norm_xd_ = nullptr;
    norm_cols_ = 0;
    const uint64_t n = static_cast<uint64_t>(cuda::kMaxMatvecTokens);
    fail(cuda::device_alloc(&norm_xq_, n * cuda::q8_token_bytes(cols), "the norm's Q8 copy"));
    if (!status_.ok()) return;
    fail(cuda::device_alloc(&norm_xd_, n * static_cast<uint64_t>(cols / 32) * sizeof(float2),
                            "the norm's Q8 scales"));
    if (!status_.ok()) return;
    norm_cols_ = cols;
  }
  if (!fused) {
    launch({kOpNorm, u(xp), u(wp), u(eps), u(o), u(rows), u(cols)},
           [=, this] { return cuda::rms_norm(xp, wp, eps, o, rows, cols, stream_); });
    return;
  }
  auto* xq = static_cast<int8_t*>(norm_xq_);
  auto* xd = static_cast<float2*>(norm_xd_);
  launch({kOpNormQ8, u(xp), u(wp), u(eps), u(o), u(rows), u(cols), u(xq), u(xd)},
         [=, this] { return cuda::rms_norm_q8(xp, wp, eps, o, rows, cols, xq, xd, stream_); });
  norm_q8_ = NormQ8{o, rows, cols, op_seq_};
}

bool CudaBackend::norm_q8_for(const float* x, const Act& a, cuda::Q8Act* q) const {
  if (norm_q8_.seq != op_seq_ || norm_q8_.out != x || norm_q8_.rows != a.rows ||
      norm_q8_.cols != a.cols)
    return false;
  *q = cuda::Q8Act{static_cast<const int8_t*>(norm_xq_), static_cast<const float2*>(norm_xd_)};
  return true;
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
  const float* xp = dev(x);
  float* o = dev(out);
  const int64_t T = x.rows;
  cuda::Q8Act q8;
  const bool pre = norm_q8_for(xp, x, &q8);
  launch({kOpMatmul, u(m), u(xp), u(T), u(o), u(b), u(q8.q)},
         [=, this] { return matmul_->run(m, xp, T, o, b, false, stream_, pre ? &q8 : nullptr); });
}

void CudaBackend::matmul_add(const Weight& w, Act x, Act y, Act tmp) {
  (void)tmp;
  if (!ready() || !check_act(x, "matmul_add") || !check_act(y, "matmul_add")) return;
  cuda::DevMatrix m;
  if (!dev_matrix(w, "matmul_add", &m)) return;
  const float* xp = dev(x);
  float* yp = dev(y);
  const int64_t T = x.rows;
  cuda::Q8Act q8;
  const bool pre = norm_q8_for(xp, x, &q8);
  launch({kOpMatmulAdd, u(m), u(xp), u(T), u(yp), u(q8.q)}, [=, this] {
    return matmul_->run(m, xp, T, yp, nullptr, true, stream_, pre ? &q8 : nullptr);
  });
}

void CudaBackend::matmul_glu(const Weight& gate, const Weight& up, Act x, Act out, Act tmp) {
  if (gate.dtype != up.dtype || gate.n_in != up.n_in || gate.n_out != up.n_out) {
    Backend::matmul_glu(gate, up, x, out, tmp);
    return;
  }
  if (!ready() || !check_act(x, "matmul_glu") || !check_act(out, "matmul_glu")) return;
  cuda::DevMatrix g, u;
  if (!dev_matrix(gate, "matmul_glu", &g) || !dev_matrix(up, "matmul_glu", &u)) return;
  const float* xp = dev(x);
  float* o = dev(out);
  const int64_t T = x.rows;
  cuda::Q8Act q8;
  const bool pre = norm_q8_for(xp, x, &q8);
  launch({kOpGlu, loom::u(g), loom::u(u), loom::u(xp), loom::u(T), loom::u(o), loom::u(q8.q)},
         [=, this] { return matmul_->run_glu(g, u, xp, T, o, stream_, pre ? &q8 : nullptr); });
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
  struct Args {
    cuda::DevMatrix ws[3];
    const float* biases[3];
    float* ys[3];
  } a{{ws[0], ws[1], ws[2]}, {biases[0], biases[1], biases[2]}, {dev(q), dev(k), dev(v)}};
  const float* xp = dev(x);
  const int64_t T = x.rows;
  cuda::Q8Act q8;
  const bool pre = norm_q8_for(xp, x, &q8);
  launch({kOpQkv, u(ws[0]), u(ws[1]), u(ws[2]), u(biases[0]), u(biases[1]), u(biases[2]),
          u(a.ys[0]), u(a.ys[1]), u(a.ys[2]), u(xp), u(T), u(q8.q)},
         [=, this] {
           return matmul_->run_multi(a.ws, a.biases, a.ys, 3, xp, T, stream_, pre ? &q8 : nullptr);
         });
}

const float* CudaBackend::rope_table(int64_t T, const int32_t* pos, const cpu::RopeParams& p) {
  const int64_t n_pairs = p.n_rot / 2;
  // cos/sin per token and pair as cpu::rope has them, so the rotation
  // matches the CPU's to the last bit of its inputs.
  rope_cs_.resize(static_cast<size_t>(2 * T * n_pairs));
  for (int64_t t = 0; t < T; ++t) cpu::rope_cos_sin(pos[t], p, rope_cs_.data() + 2 * t * n_pairs);
  return static_cast<const float*>(put(rope_cs_.data(), rope_cs_.size() * sizeof(float)));
}

bool CudaBackend::rope_params_ok(const cpu::RopeParams& p, int64_t head_dim) {
  return p.n_rot % 2 == 0 && p.n_rot <= head_dim && p.n_rot >= 0;
}

bool CudaBackend::check_rope(const cpu::RopeParams& p, int64_t head_dim) {
  if (rope_params_ok(p, head_dim)) return true;
  fail(make_error(ErrorCode::kInvalidArgument, "CUDA rope: %" PRId64 " rotated of %" PRId64,
                  static_cast<int64_t>(p.n_rot), head_dim));
  return false;
}

void CudaBackend::rope(Act x, int64_t n_heads, int64_t head_dim, const int32_t* pos,
                       const cpu::RopeParams& p) {
  if (!ready() || !check_act(x, "rope") || !check_rope(p, head_dim)) return;
  const int64_t n_pairs = p.n_rot / 2, T = x.rows;
  if (n_pairs == 0) return;
  const float* d_cs = rope_table(T, pos, p);
  if (!d_cs) return;
  float* xp = dev(x);
  const bool neox = p.neox;
  launch({kOpRope, u(xp), u(T), u(n_heads), u(head_dim), u(n_pairs), neox, u(d_cs)},
         [=, this] { return cuda::rope(xp, T, n_heads, head_dim, n_pairs, neox, d_cs, stream_); });
}

void CudaBackend::rope_qk(Act q, Act k, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                          const int32_t* pos, const cpu::RopeParams& p) {
  if (!ready() || !check_act(q, "rope") || !check_act(k, "rope") || !check_rope(p, head_dim))
    return;
  const int64_t n_pairs = p.n_rot / 2, T = q.rows;
  if (n_pairs == 0) return;
  const float* d_cs = rope_table(T, pos, p);
  if (!d_cs) return;
  float* qp = dev(q);
  float* kp = dev(k);
  const bool neox = p.neox;
  launch({kOpRope, u(qp), u(kp), u(T), u(n_heads), u(n_kv_heads), u(head_dim), u(n_pairs), neox,
          u(d_cs)},
         [=, this] {
           return cuda::rope_qk(qp, n_heads, kp, n_kv_heads, T, head_dim, n_pairs, neox, d_cs,
                                stream_);
         });
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
  std::vector<int32_t> rows;
  bool to_host = false;
  const int32_t* d_pos = store_rows(kv, layer, l, pos, k.rows, &rows, &to_host);
  if (!d_pos) return;
  const float* kp = dev(k);
  const float* vp = dev(v);
  const int64_t T = k.rows;
  launch({kOpKvStore, u(l.k), u(l.v), u(l.capacity), l.row_bytes, u(l.head_dim), u(l.n_kv_heads),
          static_cast<uint64_t>(l.dtype), u(kp), u(vp), u(T), u(d_pos)},
         [=, this] { return cuda::kv_store(l, kp, vp, T, d_pos, stream_); });
  if (to_host) store_host_rows(kv, layer, k, v, pos, rows);
}

void CudaBackend::rope_qk_kv(Act q, Act k, Act v, KvCache& kv, int64_t layer, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim, const int32_t* pos,
                             const cpu::RopeParams& p) {
  if (!ready() || !check_act(q, "rope_qk_kv") || !check_act(k, "rope_qk_kv") ||
      !check_act(v, "rope_qk_kv") || !check_rope(p, head_dim))
    return;
  cuda::DevKvLayer l;
  if (!kv_layer(kv, layer, "rope_qk_kv", &l)) return;
  const int64_t n_pairs = p.n_rot / 2, T = q.rows;
  if (!fuse_rope_ || n_pairs == 0 || l.n_kv_heads != n_kv_heads ||
      !cuda::rope_kv_store_fits(l, head_dim)) {
    Backend::rope_qk_kv(q, k, v, kv, layer, n_heads, n_kv_heads, head_dim, pos, p);
    return;
  }
  std::vector<int32_t> rows;
  bool to_host = false;
  const int32_t* d_pos = store_rows(kv, layer, l, pos, T, &rows, &to_host);
  if (!d_pos) return;
  const float* d_cs = rope_table(T, pos, p);
  if (!d_cs) return;
  float* qp = dev(q);
  float* kp = dev(k);
  const float* vp = dev(v);
  const bool neox = p.neox;
  launch({kOpRopeKv, u(l.k), u(l.v), u(l.capacity), l.row_bytes, u(l.head_dim), u(l.n_kv_heads),
          static_cast<uint64_t>(l.dtype), u(qp), u(kp), u(vp), u(T), u(n_heads), u(n_pairs), neox,
          u(d_cs), u(d_pos)},
         [=, this] {
           return cuda::rope_kv_store(l, qp, n_heads, kp, vp, T, n_pairs, neox, d_cs, d_pos,
                                      stream_);
         });
  if (to_host) store_host_rows(kv, layer, k, v, pos, rows);
}

cuda::Q8Out CudaBackend::attention_q8(const cuda::DevKvLayer& l, int64_t n_heads, Act out) const {
  const int64_t width = n_heads * l.head_dim, T = out.rows;
  if (!fuse_attn_ || width > norm_cols_ || out.cols != width || T > cuda::kMaxMatvecTokens ||
      !cuda::attention_writes_q8(l, T, *attn_scratch_))
    return {};
  return cuda::Q8Out{static_cast<int8_t*>(norm_xq_), static_cast<float2*>(norm_xd_),
                     cuda::q8_token_bytes(width)};
}

int64_t CudaBackend::attention_plan(int64_t max_pos) {
  // The split plan is for a bucket of keys, so that a step's graph serves
  // every position up to it; op by op the same plan, so both give the same
  // sums. Buckets: powers of two from 256, in eighths of an octave past 2048
  // (a power of two just past the keys left half the splits idle: at 32832
  // keys the 65536-key plan ran 33 of its 66 splits).
  int64_t plan = 256;
  while (plan < max_pos + 1) plan *= 2;
  if (plan > 2048) {
    const int64_t step = plan / 16;
    plan = (max_pos + step) / step * step;
  }
  return plan;
}

void CudaBackend::attention(KvCache& kv, int64_t layer, Act q, const int32_t* pos, int64_t n_heads,
                            float scale, Act out) {
  if (!ready() || !check_act(q, "attention") || !check_act(out, "attention")) return;
  cuda::DevKvLayer l;
  if (!kv_layer(kv, layer, "attention", &l)) return;
  if (kv.device_tiered(layer)) return attention_slotted(kv, layer, l, q, pos, n_heads, scale, out);
  int64_t max_pos = -1;
  for (int64_t t = 0; t < q.rows; ++t) max_pos = pos[t] > max_pos ? pos[t] : max_pos;
  const auto* d_pos = static_cast<const int32_t*>(put(pos, q.rows * sizeof(int32_t)));
  if (!d_pos) return;
  const int64_t plan = attention_plan(max_pos);
  const float* qp = dev(q);
  float* o = dev(out);
  const int64_t T = q.rows;
  // The decode kernels also write the Q8 activations of the o product.
  const int64_t width = n_heads * l.head_dim;
  const cuda::Q8Out q8o = attention_q8(l, n_heads, out);
  const bool q8 = q8o.q != nullptr;
  launch({kOpAttention, u(l.k), u(l.v), u(l.capacity), l.row_bytes, u(l.head_dim), u(l.n_kv_heads),
          static_cast<uint64_t>(l.dtype), u(qp), u(T), u(d_pos), u(n_heads), u(scale), u(o),
          u(plan), u(q8o.q)},
         [=, this] {
           return cuda::attention(l, qp, T, d_pos, max_pos, n_heads, scale, o, *attn_scratch_,
                                  stream_, plan, q8 ? &q8o : nullptr);
         });
  if (q8) norm_q8_ = NormQ8{o, T, width, op_seq_};
}

void CudaBackend::silu_mul(Act gate, Act up, Act out) {
  if (!ready() || !check_act(gate, "silu_mul") || !check_act(up, "silu_mul") ||
      !check_act(out, "silu_mul"))
    return;
  const float* gp = dev(gate);
  const float* upp = dev(up);
  float* o = dev(out);
  const int64_t n = out.rows * out.cols;
  launch({kOpSiluMul, u(gp), u(upp), u(o), u(n)},
         [=, this] { return cuda::silu_mul(gp, upp, o, n, stream_); });
}

void CudaBackend::gelu_mul(Act gate, Act up, Act out) {
  if (!ready() || !check_act(gate, "gelu_mul") || !check_act(up, "gelu_mul") ||
      !check_act(out, "gelu_mul"))
    return;
  const float* gp = dev(gate);
  const float* upp = dev(up);
  float* o = dev(out);
  const int64_t n = out.rows * out.cols;
  launch({kOpGeluMul, u(gp), u(upp), u(o), u(n)},
         [=, this] { return cuda::gelu_mul(gp, upp, o, n, stream_); });
}

void CudaBackend::add(Act a, Act b, Act out) {
  if (!ready() || !check_act(a, "add") || !check_act(b, "add") || !check_act(out, "add")) return;
  const float* ap = dev(a);
  const float* bp = dev(b);
  float* o = dev(out);
  const int64_t n = out.rows * out.cols;
  launch({kOpAdd, u(ap), u(bp), u(o), u(n)},
         [=, this] { return cuda::add(ap, bp, o, n, stream_); });
}

}  // namespace loom
