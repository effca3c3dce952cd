// Helpers of the CUDA backend suites: a backend (or the reason there is
// none) and host <-> device activations.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom::test {

/// A CUDA backend on the first usable device, or null with `why`.
inline std::unique_ptr<CudaBackend> cuda_backend(std::string* why, const CudaOptions& o = {}) {
  *why = cuda_unavailable();
  if (!why->empty()) return nullptr;
  auto b = CudaBackend::create(o);
  if (!b.ok()) {
    *why = b.message();
    return nullptr;
  }
  return std::move(b).value();
}

/// A device activation [rows, cols] holding `v` (uploaded), with its buffer.
struct DevAct {
  std::unique_ptr<ActBuffer> buf;
  Act act;
  DevAct(Backend& b, int64_t rows, int64_t cols, const std::vector<float>* v = nullptr) {
    auto r = b.alloc_act(rows * cols);
    EXPECT_TRUE(r.ok()) << r.message();
    buf = std::move(r).value();
    act = buf->view(rows, cols);
    if (v) {
      EXPECT_TRUE(b.upload(v->data(), act).ok());
    }
  }
  std::vector<float> get(Backend& b) const {
    std::vector<float> h(static_cast<size_t>(act.rows * act.cols));
    const Status s = b.download(act, h.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return h;
  }
};

/// ||a - b|| / ||b||, both float.
inline double rel_error_f(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> bd(b.begin(), b.end());
  return rel_error(a, bd);
}

}  // namespace loom::test

/// Declares `be` (std::unique_ptr<CudaBackend>) or skips, saying why.
#define LOOM_CUDA_BACKEND_OR_SKIP(be)              \
  std::string be##_why;                            \
  auto be = ::loom::test::cuda_backend(&be##_why); \
  if (!be) GTEST_SKIP() << "no CUDA device: " << be##_why
