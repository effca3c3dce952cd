#include "engine/placement/requant.h"

#include <algorithm>
#include <cinttypes>
#include <new>
#include <thread>
#include <vector>

#include "cpu/ref/quants.h"

namespace loom {

Result<Weight> RequantStore::get(const Weight& w, std::optional<DType> dtype) {
  if (!w.present() || !dtype || *dtype == w.dtype || w.n_out <= 1) return w;
  const DType to = *dtype;
  const auto dst_row = dtype_row_bytes(to, static_cast<uint64_t>(w.n_in));
  if (!dst_row || !ref::has_reference(to) || !ref::has_reference(w.dtype)) {
    return make_error(ErrorCode::kUnsupported,
                      "cannot requantize tensor '%s' (%s, rows of %" PRId64 ") to %s",
                      w.name().c_str(), std::string(dtype_name(w.dtype)).c_str(), w.n_in,
                      std::string(dtype_name(to)).c_str());
  }
  // The whole tensor (fused tensors are used as row ranges of it).
  const uint8_t* begin = static_cast<const uint8_t*>(w.data);
  int64_t n_rows = w.n_out;
  if (w.tensor && w.tensor->data && w.row_bytes) {
    begin = w.tensor->data;
    n_rows = static_cast<int64_t>(w.tensor->n_bytes / w.row_bytes);
  }
  const int64_t row0 =
      (static_cast<const uint8_t*>(w.data) - begin) / static_cast<int64_t>(w.row_bytes);

  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(static_cast<const void*>(begin), to);
  auto it = copies_.find(key);
  if (it == copies_.end()) {
    auto e = std::make_unique<Entry>();
    const uint64_t bytes = *dst_row * static_cast<uint64_t>(n_rows);
    e->bytes.reset(new (std::nothrow) uint8_t[bytes]);
    if (!e->bytes) {
      return make_error(ErrorCode::kOutOfMemory,
                        "out of memory requantizing tensor '%s' to %s (%" PRIu64 " bytes)",
                        w.name().c_str(), std::string(dtype_name(to)).c_str(), bytes);
    }
    if (w.tensor) e->tensor = *w.tensor;
    e->tensor.name =
        (w.tensor ? w.tensor->name : std::string("tensor")) + "@" + std::string(dtype_name(to));
    e->tensor.dtype = to;
    e->tensor.n_bytes = bytes;
    e->tensor.data = e->bytes.get();
    e->src_begin = begin;
    // Rows split over threads; each thread dequantizes and quantizes its rows.
    const int n_threads = static_cast<int>(
        std::clamp<int64_t>(n_rows / 64, 1, std::max(1u, std::thread::hardware_concurrency())));
    std::vector<Status> errs(static_cast<size_t>(n_threads));
    auto work = [&](int t) {
      std::vector<float> tmp(static_cast<size_t>(w.n_in));
      for (int64_t r = n_rows * t / n_threads; r < n_rows * (t + 1) / n_threads; ++r) {
        Status s = ref::dequantize_row(w.dtype, begin + static_cast<size_t>(r) * w.row_bytes,
                                       tmp.data(), w.n_in);
        if (s.ok())
          s = ref::quantize_row(to, tmp.data(), e->bytes.get() + static_cast<size_t>(r) * *dst_row,
                                w.n_in);
        if (!s.ok()) {
          errs[static_cast<size_t>(t)] = s;
          return;
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < n_threads; ++t) threads.emplace_back(work, t);
    work(0);
    for (auto& th : threads) th.join();
    for (const Status& s : errs) LOOM_TRY(s);
    it = copies_.emplace(key, std::move(e)).first;
  }
  Weight out = w;
  out.dtype = to;
  out.row_bytes = static_cast<size_t>(*dst_row);
  out.tensor = &it->second->tensor;
  out.data = it->second->bytes.get() + static_cast<size_t>(row0) * out.row_bytes;
  return out;
}

void RequantStore::retain(const std::vector<std::pair<const void*, DType>>& keep) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = copies_.begin(); it != copies_.end();) {
    if (std::find(keep.begin(), keep.end(), it->first) == keep.end())
      it = copies_.erase(it);
    else
      ++it;
  }
}

uint64_t RequantStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t b = 0;
  for (const auto& [k, e] : copies_) b += e->tensor.n_bytes;
  return b;
}

}  // namespace loom
