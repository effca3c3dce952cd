#include "engine/placement/requant.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu/ref/quants.h"

namespace loom {

namespace {

// The whole tensor `w` is a row range of (fused tensors are used as row
// ranges of it): its first byte, its row count and w's first row in it.
struct Extent {
  const uint8_t* begin;
  int64_t n_rows;
  int64_t row0;
};

Extent extent_of(const Weight& w) {
  Extent e{static_cast<const uint8_t*>(w.data), w.n_out, 0};
  if (w.tensor && w.tensor->data && w.row_bytes) {
    e.begin = w.tensor->data;
    e.n_rows = static_cast<int64_t>(w.tensor->n_bytes / w.row_bytes);
  }
  e.row0 = (static_cast<const uint8_t*>(w.data) - e.begin) / static_cast<int64_t>(w.row_bytes);
  return e;
}

// Runs work(t) for t in [0, n) on n threads (the caller's one of them).
template <typename F>
void on_threads(int n, F&& work) {
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(work, t);
  work(0);
  for (auto& th : threads) th.join();
}

int copy_threads(int64_t units, int64_t per_thread) {
  return static_cast<int>(std::clamp<int64_t>(units / per_thread, 1,
                                              std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace

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
  // (Plain variables, not a structured binding: the lambdas below use them.)
  const Extent x = extent_of(w);
  const uint8_t* begin = x.begin;
  const int64_t n_rows = x.n_rows, row0 = x.row0;

  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(static_cast<const void*>(begin), to);
  auto it = copies_.find(key);
  if (it == copies_.end()) {
    auto e = std::make_unique<Entry>();
    const uint64_t bytes = *dst_row * static_cast<uint64_t>(n_rows);
    if (!e->bytes.allocate(bytes)) {
      return make_error(ErrorCode::kOutOfMemory,
                        "out of memory requantizing tensor '%s' to %s (%" PRIu64 " bytes)",
                        w.name().c_str(), std::string(dtype_name(to)).c_str(), bytes);
    }
    if (w.tensor) e->tensor = *w.tensor;
    e->tensor.name =
        (w.tensor ? w.tensor->name : std::string("tensor")) + "@" + std::string(dtype_name(to));
    e->tensor.dtype = to;
    e->tensor.n_bytes = bytes;
    e->tensor.data = e->bytes.data();
    e->src_begin = begin;
    // Rows split over threads; each thread dequantizes and quantizes its rows.
    const int n_threads = copy_threads(n_rows, 64);
    std::vector<Status> errs(static_cast<size_t>(n_threads));
    auto work = [&](int t) {
      std::vector<float> tmp(static_cast<size_t>(w.n_in));
      for (int64_t r = n_rows * t / n_threads; r < n_rows * (t + 1) / n_threads; ++r) {
        Status s = ref::dequantize_row(w.dtype, begin + static_cast<size_t>(r) * w.row_bytes,
                                       tmp.data(), w.n_in);
        if (s.ok())
          s = ref::quantize_row(to, tmp.data(), e->bytes.data() + static_cast<size_t>(r) * *dst_row,
                                w.n_in);
        if (!s.ok()) {
          errs[static_cast<size_t>(t)] = s;
          return;
        }
      }
    };
    on_threads(n_threads, work);
    for (const Status& s : errs) LOOM_TRY(s);
    it = copies_.emplace(key, std::move(e)).first;
  }
  Weight out = w;
  out.dtype = to;
  out.row_bytes = static_cast<size_t>(*dst_row);
  out.tensor = &it->second->tensor;
  out.data = it->second->bytes.data() + static_cast<size_t>(row0) * out.row_bytes;
  return out;
}

uint64_t RequantStore::resident_cost(const Weight& w) const {
  if (!w.present() || w.n_out <= 1 || w.row_bytes == 0) return 0;
  const Extent x = extent_of(w);
  std::lock_guard<std::mutex> lock(mu_);
  if (copies_.count({static_cast<const void*>(x.begin), w.dtype})) return 0;
  const uint64_t bytes = static_cast<uint64_t>(x.n_rows) * w.row_bytes;
  return HugeBuffer::would_map(static_cast<size_t>(bytes)) ? bytes : 0;  // else none is made
}

Weight RequantStore::resident(const Weight& w, const CopyFn& copy) {
  if (!w.present() || w.n_out <= 1 || w.row_bytes == 0) return w;
  const Extent x = extent_of(w);
  const uint8_t* begin = x.begin;
  const int64_t n_rows = x.n_rows, row0 = x.row0;
  // 4 KiB pages buy nothing: only where the copy gets huge pages.
  if (!HugeBuffer::would_map(static_cast<size_t>(n_rows) * w.row_bytes)) return w;
  std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_pair(static_cast<const void*>(begin), w.dtype);
  auto it = copies_.find(key);
  if (it == copies_.end()) {
    auto e = std::make_unique<Entry>();
    const uint64_t bytes = static_cast<uint64_t>(n_rows) * w.row_bytes;
    if (!e->bytes.allocate(bytes) || !e->bytes.huge()) return w;  // e.g. map_huge failed
    if (w.tensor) e->tensor = *w.tensor;
    e->tensor.n_bytes = bytes;
    e->tensor.data = e->bytes.data();
    e->src_begin = begin;
    // Page faults of the source (a file read, when not cached) and the copy, over threads.
    const int n_threads = copy_threads(static_cast<int64_t>(bytes), int64_t{32} << 20);
    std::vector<char> ok(static_cast<size_t>(n_threads), 1);
    on_threads(n_threads, [&](int t) {
      const uint64_t b0 = bytes * static_cast<uint64_t>(t) / static_cast<uint64_t>(n_threads);
      const uint64_t b1 = bytes * static_cast<uint64_t>(t + 1) / static_cast<uint64_t>(n_threads);
      if (copy)
        ok[static_cast<size_t>(t)] = copy(e->bytes.data() + b0, begin + b0, b1 - b0);
      else
        std::memcpy(e->bytes.data() + b0, begin + b0, b1 - b0);
    });
    if (std::find(ok.begin(), ok.end(), 0) != ok.end()) return w;
    it = copies_.emplace(key, std::move(e)).first;
  }
  Weight out = w;
  out.tensor = &it->second->tensor;
  out.data = it->second->bytes.data() + static_cast<size_t>(row0) * out.row_bytes;
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
