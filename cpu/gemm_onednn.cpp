// Dense prefill matmuls through oneDNN or our own kernel; see gemm_onednn.h.
#include "cpu/gemm_onednn.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"
#include "cpu/ref/fp16.h"

#if LOOM_HAVE_DNNL
#include <dlfcn.h>

#include <compare>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <vector>
#endif

// F16 -> F32 row widening (F16C), in the ISA-flagged files.
namespace loom::cpu::avx2 {
void f16_to_f32(const uint16_t* src, float* dst, int64_t n);
}  // namespace loom::cpu::avx2
namespace loom::cpu::avx512 {
void f16_to_f32(const uint16_t* src, float* dst, int64_t n);
}  // namespace loom::cpu::avx512

namespace loom::cpu {
namespace {

// Bytes per element of a dense weight dtype (its activations have the same
// size), or 0 for any other dtype.
size_t dense_elem_bytes(DType w) {
  switch (w) {
    case DType::kF32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    default: return 0;
  }
}

Status check_args(DType w, const void* W, size_t w_row_bytes, const void* X, size_t x_row_bytes,
                  int64_t T, const float* Y, int64_t ldy, int64_t n, int64_t rows) {
  const size_t eb = dense_elem_bytes(w);
  const std::string what = "dense matmul (" + std::string(dtype_name(w)) +
                           ", T=" + std::to_string(T) + ", n=" + std::to_string(n) +
                           ", rows=" + std::to_string(rows) + "): ";
  if (eb == 0) return Error(ErrorCode::kUnsupported, what + "weights are not F32, F16 or BF16");
  if (T < 0 || n <= 0 || rows < 0)
    return Error(ErrorCode::kInvalidArgument, what + "sizes out of range");
  if (T == 0 || rows == 0) return {};
  if (W == nullptr || X == nullptr || Y == nullptr)
    return Error(ErrorCode::kInvalidArgument, what + "null buffer");
  if (w_row_bytes % eb != 0 || x_row_bytes % eb != 0) {
    return Error(ErrorCode::kInvalidArgument, what + "row strides " + std::to_string(w_row_bytes) +
                                                  " / " + std::to_string(x_row_bytes) +
                                                  " bytes are not whole elements");
  }
  const uint64_t row_bytes = static_cast<uint64_t>(n) * eb;
  if ((rows > 1 && w_row_bytes < row_bytes) || (T > 1 && x_row_bytes < row_bytes)) {
    return Error(ErrorCode::kInvalidArgument,
                 what + "row stride shorter than a row of " + std::to_string(row_bytes) + " bytes");
  }
  if (T > 1 && ldy < rows) {
    return Error(ErrorCode::kInvalidArgument, what + "ldy " + std::to_string(ldy) + " < rows");
  }
  return {};
}

}  // namespace

// ---- oneDNN ---------------------------------------------------------------

#if LOOM_HAVE_DNNL
namespace {

// Debian's libdnnl uses OpenMP (DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP): the
// thread count is the calling thread's omp nthreads-var. libgomp is loaded
// as a dependency of libdnnl but not linked into our targets, so its two
// setters are looked up at run time; null when this oneDNN is not built on
// OpenMP (then it uses all cores).
struct OmpControl {
  void (*set_num_threads)(int) = nullptr;
  int (*get_max_threads)() = nullptr;
};

OmpControl omp_control() {
  static const OmpControl control = [] {
    OmpControl c;
    c.set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    c.get_max_threads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    return c;
  }();
  return control;
}

// Sets the calling thread's OpenMP thread count for one scope.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int n) {
    const OmpControl c = omp_control();
    if (c.set_num_threads == nullptr || c.get_max_threads == nullptr) return;
    previous_ = c.get_max_threads();
    if (previous_ != n)
      c.set_num_threads(n);
    else
      previous_ = 0;
  }
  ~OmpThreadsScope() {
    if (previous_ > 0) omp_control().set_num_threads(previous_);
  }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int previous_ = 0;
};

// One cached primitive's shape: what its memory descriptors and its thread
// split were made for (strides in elements).
struct PrimKey {
  int dtype = 0;
  int64_t T = 0, n = 0, rows = 0, x_stride = 0, w_stride = 0, ldy = 0;
  int threads = 0;
  auto operator<=>(const PrimKey&) const = default;
};

// Rows of F16 weights widened to f32 per oneDNN call (rows x n floats of scratch).
constexpr int64_t kF16RowChunk = 128;
constexpr size_t kMaxPrimitives = 64;

void widen_f16(const uint16_t* src, float* dst, int64_t n) {
  switch (active_isa()) {
    case Isa::kAvx512: avx512::f16_to_f32(src, dst, n); return;
    case Isa::kAvx2: avx2::f16_to_f32(src, dst, n); return;
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = ref::fp16_to_fp32(src[i]);
  }
}

}  // namespace

struct OneDnnMatmul::Impl {
  dnnl::engine engine;
  bool ok = false;
  mutable std::mutex mu;
  struct Entry {
    dnnl::matmul prim;
    uint64_t last_use = 0;
  };
  std::map<PrimKey, Entry> cache;  // guarded by mu
  uint64_t clock = 0;              // guarded by mu

  // The primitive for `key`, made (with key.threads OpenMP threads current:
  // the thread split is fixed at creation) if not cached. Throws dnnl::error.
  dnnl::matmul primitive(const PrimKey& key, dnnl::memory::data_type dt) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = cache.find(key);
      if (it != cache.end()) {
        it->second.last_use = ++clock;
        return it->second.prim;
      }
    }
    using dims = dnnl::memory::dims;
    // X [T, n] row-major; W^T as [n, rows] with W's rows as columns; Y [T, rows].
    const dnnl::memory::desc src({key.T, key.n}, dt, dims{key.x_stride, 1});
    const dnnl::memory::desc wei({key.n, key.rows}, dt, dims{1, key.w_stride});
    const dnnl::memory::desc dst({key.T, key.rows}, dnnl::memory::data_type::f32, dims{key.ldy, 1});
    const dnnl::matmul::desc desc(src, wei, dst);
    const dnnl::matmul::primitive_desc pd(desc, engine);
    dnnl::matmul prim(pd);
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() >= kMaxPrimitives) {
      auto oldest = cache.begin();
      for (auto it = cache.begin(); it != cache.end(); ++it) {
        if (it->second.last_use < oldest->second.last_use) oldest = it;
      }
      cache.erase(oldest);
    }
    cache[key] = Entry{prim, ++clock};
    return prim;
  }

  // One f32 or bf16 matmul. Throws dnnl::error.
  void execute(dnnl::memory::data_type dt, const void* W, int64_t w_stride, const void* X,
               int64_t x_stride, int64_t T, float* Y, int64_t ldy, int64_t n, int64_t rows,
               int threads) {
    const int dt_id = static_cast<int>(dt);
    const PrimKey key{dt_id, T, n, rows, x_stride, w_stride, ldy, threads};
    dnnl::matmul prim = primitive(key, dt);
    using dims = dnnl::memory::dims;
    // oneDNN takes non-const handles; it does not write src or weights.
    dnnl::memory src({{T, n}, dt, dims{x_stride, 1}}, engine, const_cast<void*>(X));
    dnnl::memory wei({{n, rows}, dt, dims{1, w_stride}}, engine, const_cast<void*>(W));
    dnnl::memory dst({{T, rows}, dnnl::memory::data_type::f32, dims{ldy, 1}}, engine, Y);
    dnnl::stream stream(engine);
    prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
};

OneDnnMatmul::OneDnnMatmul() : impl_(std::make_unique<Impl>()) {
  try {
    impl_->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    impl_->ok = true;
  } catch (const dnnl::error&) {
    impl_->ok = false;
  }
}

OneDnnMatmul::~OneDnnMatmul() = default;

bool OneDnnMatmul::available() const {
  return impl_->ok;
}

size_t OneDnnMatmul::cached_primitives() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.size();
}

Status OneDnnMatmul::run(DType w, const void* W, size_t w_row_bytes, const void* X,
                         size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n,
                         int64_t rows, int n_threads) {
  if (Status s = check_args(w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, rows); !s) return s;
  if (!impl_->ok) return Error(ErrorCode::kUnsupported, "oneDNN: no CPU engine");
  if (T == 0 || rows == 0) return {};
  const int threads = n_threads < 1 ? 1 : n_threads;
  const OmpThreadsScope omp_threads(threads);
  const auto eb = static_cast<int64_t>(dense_elem_bytes(w));
  const int64_t ws = static_cast<int64_t>(w_row_bytes) / eb,
                xs = static_cast<int64_t>(x_row_bytes) / eb;
  // A single row or token has no stride of its own; give oneDNN a dense one.
  const int64_t w_stride = rows > 1 ? ws : n, x_stride = T > 1 ? xs : n,
                y_stride = T > 1 ? ldy : rows;
  try {
    switch (w) {
      case DType::kF32:
        impl_->execute(dnnl::memory::data_type::f32, W, w_stride, X, x_stride, T, Y, y_stride, n,
                       rows, threads);
        return {};
      case DType::kBF16:
        impl_->execute(dnnl::memory::data_type::bf16, W, w_stride, X, x_stride, T, Y, y_stride, n,
                       rows, threads);
        return {};
      case DType::kF16: {
        // No f16 matmul in oneDNN 2.6 on CPU: widen X once and W in chunks of
        // rows to f32 (exact), and run the f32 primitive on each chunk.
        thread_local std::vector<float> xbuf, wbuf;
        xbuf.resize(static_cast<size_t>(T * n));
        wbuf.resize(static_cast<size_t>((rows < kF16RowChunk ? rows : kF16RowChunk) * n));
        const auto* x16 = static_cast<const uint16_t*>(X);
        const auto* w16 = static_cast<const uint16_t*>(W);
        for (int64_t t = 0; t < T; ++t) widen_f16(x16 + t * x_stride, xbuf.data() + t * n, n);
        for (int64_t c0 = 0; c0 < rows; c0 += kF16RowChunk) {
          const int64_t nr = rows - c0 < kF16RowChunk ? rows - c0 : kF16RowChunk;
          for (int64_t r = 0; r < nr; ++r)
            widen_f16(w16 + (c0 + r) * w_stride, wbuf.data() + r * n, n);
          impl_->execute(dnnl::memory::data_type::f32, wbuf.data(), n, xbuf.data(), n, T, Y + c0,
                         y_stride, n, nr, threads);
        }
        return {};
      }
      default: return Error(ErrorCode::kInternal, "oneDNN: unreachable dtype");
    }
  } catch (const dnnl::error& e) {
    return Error(ErrorCode::kInternal, std::string("oneDNN matmul (") + std::string(dtype_name(w)) +
                                           ", T=" + std::to_string(T) + ", n=" + std::to_string(n) +
                                           ", rows=" + std::to_string(rows) + "): " + e.what());
  }
}

bool onednn_available() {
  static const bool available = [] {
    try {
      dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

#else  // !LOOM_HAVE_DNNL

struct OneDnnMatmul::Impl {};
OneDnnMatmul::OneDnnMatmul() : impl_(std::make_unique<Impl>()) {}
OneDnnMatmul::~OneDnnMatmul() = default;
bool OneDnnMatmul::available() const {
  return false;
}
size_t OneDnnMatmul::cached_primitives() const {
  return 0;
}
Status OneDnnMatmul::run(DType w, const void* W, size_t w_row_bytes, const void* X,
                         size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n,
                         int64_t rows, int /*n_threads*/) {
  if (Status s = check_args(w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, rows); !s) return s;
  return Error(ErrorCode::kUnsupported, "oneDNN: Loom was built without it");
}
bool onednn_available() {
  return false;
}

#endif  // LOOM_HAVE_DNNL

// ---- choice and our kernel -------------------------------------------------

const char* dense_impl_name(DenseImpl impl) {
  return impl == DenseImpl::kOneDnn ? "onednn" : "loom";
}

// ---- which implementation ---------------------------------------------------
//
// Measured with tools/bench/dense_bench.cpp on TinyLlama's shapes (n x rows =
// 2048 x 2048, 2048 x 5632, 5632 x 2048), weights rotating through 1 GiB,
// median of >= 300 ms, pinned to 1 and 2 cores of an idle 16-core Emerald
// Rapids host (AVX-512 BF16 + AMX; the 2-core development VM, also an AMX
// Xeon by its flags, was too loaded by parallel builds to give stable
// figures). Ours / oneDNN:
//
//   GEMV (T = 1), GB/s of weights      1 thread              2 threads
//     F32                              11.3-13.2 / 8.3-9.9   22.9-24.3 / 16.8-17.9
//     F16                              9.4-11.7 / 4.0-6.6    20.6-22.8 / 4.1-4.6
//     BF16                             10.4-11.2 / 6.7-9.9   16.3-18.1 / 6.9-14.8
//   T = 16, GFLOP/s
//     F32                              45-50 / 53-58         80-85 / 86-101
//     F16                              63-78 / 40-48         81-110 / 32-34
//     BF16                             44-69 / 79-122 (AMX)  72-94 / 101-225
//   T = 128
//     F32                              101-128 / 111-121     161-164 / 183-194
//     F16                              115-128 / 103-107     166-169 / 92-103
//     BF16                             94-117 / 284-426      157-165 / 400-491
//   T = 512
//     F32                              112-125 / 119-138     176-180 / 197-207
//     F16                              108-121 / 125-131     167-171 / 151-169
//     BF16                             80-114 / 246-644      140-162 / 515-564
//
// oneDNN 2.6 has no f16 matmul on CPU: its F16 figures include widening X and
// W to f32 on the calling thread, which is why it loses below T = 512 and
// does not scale with threads. BF16 goes to AMX; limited to AVX-512 BF16
// (DNNL_MAX_CPU_ISA=AVX512_CORE_BF16, as on CPUs without AMX) it measured
// the same as ours (43-78 GFLOP/s, 1 thread, both on vdpbf16ps; ours now
// widens to fp32 FMA on Intel, see cpu/matmul_dense.cpp).
//
// One more cost decides the 2-thread cases: oneDNN runs on libgomp's
// workers, which by default spin for milliseconds after each parallel region
// (GOMP_SPINCOUNT 300000 pause loops) and then compete with ThreadPool's
// workers for the same cores. Our kernel right after each oneDNN call took
// +44% to +187% longer (F32, T = 16 and 128, 2 threads on 2 cores); with
// OMP_WAIT_POLICY=passive (or GOMP_SPINCOUNT=1000) in the environment the
// penalty was gone (-26% to +4%) and oneDNN was no slower. libgomp reads
// these when it loads, before main, so only the launcher can set them.
//
// The same run on the 2-core development VM while other builds ran (load 5-9)
// was noisy but said the same for one thread, and showed oneDNN's OpenMP team
// collapsing under oversubscription with two: F16 GEMV 0.2 GB/s (ours 3-11),
// F16 T = 16 2-4 GFLOP/s (ours 18-68), while ours degraded gracefully.
//
// Limited to AVX2 (--isa avx2, DNNL_MAX_CPU_ISA=AVX2, 1 thread, T = 128):
// F32 ours 34-40 / oneDNN 50-56 GFLOP/s, F16 42-54 / 63-68; GEMV F32 13.7-14.8
// / 13.9-14.8 GB/s, F16 10.2-11.0 / 3.9-6.4. oneDNN has no bf16 below AVX-512.
//
// Hence the rules below: oneDNN where it won, but with several threads only
// when its workers sleep, unless the win is AMX's 2.5-5x. Shapes below 1M
// weights were not measured and stay ours (oneDNN's fixed cost per call is
// tens of microseconds).

namespace {

constexpr int64_t kMinTokensForOneDnn = 7;         // T <= 6 is the GEMV path: ours by 1.2-5x
constexpr int64_t kMinWeightsForOneDnn = 1 << 20;  // n * rows
constexpr int64_t kF16MinTokensForOneDnn = 256;    // T = 512: oneDNN 3-20% ahead on one thread

// True when libgomp's workers were told to sleep at once after a region.
bool omp_workers_sleep() {
  static const bool sleep = [] {
    if (const char* p = std::getenv("OMP_WAIT_POLICY")) {
      std::string v(p);
      for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (v == "passive") return true;
    }
    if (const char* c = std::getenv("GOMP_SPINCOUNT")) {
      char* end = nullptr;
      const long long spins = std::strtoll(c, &end, 10);
      if (end != c && *end == '\0' && spins <= 10000) return true;
    }
    return false;
  }();
  return sleep;
}

#if LOOM_HAVE_DNNL
// True when oneDNN runs bf16 matmuls on AMX here (it picks the ISA itself;
// the implementation name says which).
bool onednn_bf16_uses_amx() {
  static const bool amx = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      using dims = dnnl::memory::dims;
      const auto bf16 = dnnl::memory::data_type::bf16;
      const dnnl::memory::desc src({64, 256}, bf16, dims{256, 1});
      const dnnl::memory::desc wei({256, 256}, bf16, dims{1, 256});
      const dnnl::memory::desc dst({64, 256}, dnnl::memory::data_type::f32, dims{256, 1});
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), engine);
      return std::string(pd.impl_info_str()).find("amx") != std::string::npos;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return amx;
}
#else
bool onednn_bf16_uses_amx() {
  return false;
}
#endif

}  // namespace

DenseImpl dense_prefill_choice(DType w, int64_t T, int64_t n, int64_t rows, int n_threads) {
  if (T < kMinTokensForOneDnn || n * rows < kMinWeightsForOneDnn || !onednn_available())
    return DenseImpl::kLoom;
  const bool shared_cores_ok = n_threads <= 1 || omp_workers_sleep();
  switch (w) {
    case DType::kF32:
      // oneDNN 7-20% ahead (one case -6%): less than the spin penalty when it is there.
      return shared_cores_ok ? DenseImpl::kOneDnn : DenseImpl::kLoom;
    case DType::kF16:
      // Below AVX-512 our F16 GEMM is the dot-product tile of cpu/avx2: oneDNN's
      // widen-then-AVX2 f32 matmul led at T = 128 on one thread (63-68 vs 42-54 GFLOP/s).
      if (active_isa() < Isa::kAvx512 && n_threads <= 1) return DenseImpl::kOneDnn;
      return T >= kF16MinTokensForOneDnn && n_threads <= 1 ? DenseImpl::kOneDnn : DenseImpl::kLoom;
    case DType::kBF16:
      // AMX: 2.5-5x, worth the penalty; without it oneDNN only ties ours.
      return onednn_bf16_uses_amx() ? DenseImpl::kOneDnn : DenseImpl::kLoom;
    default: return DenseImpl::kLoom;
  }
}

Status dense_matmul_loom(DType w, const void* W, size_t w_row_bytes, const void* X,
                         size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n,
                         int64_t rows, ThreadPool& pool) {
  if (Status s = check_args(w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, rows); !s) return s;
  if (T == 0 || rows == 0) return {};
  const Isa isa = active_isa();
  // Multiples of 16 rows: each thread writes whole 64-byte lines of Y.
  pool.parallel_for(rows, 16, [&](int64_t r0, int64_t r1, int) {
    detail::matmul_rows_dense(isa, w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, r0, r1);
  });
  return {};
}

Status dense_matmul_prefill(DType w, const void* W, size_t w_row_bytes, const void* X,
                            size_t x_row_bytes, int64_t T, float* Y, int64_t ldy, int64_t n,
                            int64_t rows, ThreadPool& pool, OneDnnMatmul* onednn) {
  if (Status s = check_args(w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, rows); !s) return s;
  if (onednn != nullptr && onednn->available() &&
      dense_prefill_choice(w, T, n, rows, pool.size()) == DenseImpl::kOneDnn) {
    if (onednn->run(w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, rows, pool.size())) return {};
    // oneDNN refused this shape (kInternal): ours handles every shape.
  }
  return dense_matmul_loom(w, W, w_row_bytes, X, x_row_bytes, T, Y, ldy, n, rows, pool);
}

}  // namespace loom::cpu
