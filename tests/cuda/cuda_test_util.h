// Shared by the CUDA test suites: skip without a device, device buffers
// that free themselves, host <-> device copies.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::test {

/// Empty when a CUDA device with compute capability >= 9.0 can run Loom's
/// kernels (sm_90 code); else why not.
inline std::string cuda_unavailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorString(e));
  }
  if (n == 0) return "the driver reports no devices";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "cannot query device 0";
  if (p.major < 9)
    return std::string(p.name) + " has compute capability " + std::to_string(p.major) + "." +
           std::to_string(p.minor) + "; Loom's kernels are built for 9.0 and later";
  return {};
}

/// A CUDA stream, destroyed with the object (null when creation failed).
struct Stream {
  cudaStream_t s = nullptr;
  Stream() {
    if (cudaStreamCreate(&s) != cudaSuccess) s = nullptr;
  }
  ~Stream() {
    if (s) (void)cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

/// A device allocation of `n` T's, freed on destruction.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T) + 16) != cudaSuccess)
      p = nullptr;
  }
  explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size()) { upload(host); }
  ~DevBuf() {
    if (p) (void)cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

}  // namespace loom::test

/// Skips the current test, saying why, when there is no usable CUDA device.
#define LOOM_CUDA_OR_SKIP()                                                  \
  do {                                                                       \
    const std::string loom_why_ = ::loom::test::cuda_unavailable();          \
    if (!loom_why_.empty()) GTEST_SKIP() << "no CUDA device: " << loom_why_; \
  } while (0)

namespace loom::test {

/// ||a - b|| / ||b|| (b the reference, in double); 0 when both are zero.
inline double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : 1e30;
  return std::sqrt(num / den);
}

/// The Euclidean norm of v.
template <typename T>
double norm(const std::vector<T>& v) {
  double s = 0.0;
  for (const T x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

/// True when every value is finite.
inline bool all_finite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

/// Deterministic values in [-scale, scale) (xorshift).
inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& f : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    f = scale * (static_cast<float>(s >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f);
  }
  return v;
}

}  // namespace loom::test
