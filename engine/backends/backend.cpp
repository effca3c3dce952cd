// Host-memory defaults of the Backend memory calls (what the CPU backend uses).
#include "engine/backends/backend.h"

#include <cstring>
#include <new>

namespace loom {

namespace {
class HostActBuffer final : public ActBuffer {
 public:
  explicit HostActBuffer(std::unique_ptr<float[]> mem, int64_t n) : mem_(std::move(mem)) {
    base_.data = mem_.get();
    base_.rows = 1;
    base_.cols = n;
  }

 private:
  std::unique_ptr<float[]> mem_;
};
}  // namespace

Result<std::unique_ptr<ActBuffer>> Backend::alloc_act(int64_t n_floats) {
  if (n_floats < 0) return make_error(ErrorCode::kInvalidArgument, "alloc_act: negative size");
  // Zero-filled, as the std::vector buffers this replaces were.
  std::unique_ptr<float[]> mem(
      new (std::nothrow) float[static_cast<size_t>(n_floats > 0 ? n_floats : 1)]());
  if (!mem) {
    return make_error(ErrorCode::kOutOfMemory,
                      "out of host memory allocating %lld floats of activations",
                      static_cast<long long>(n_floats));
  }
  return std::unique_ptr<ActBuffer>(new HostActBuffer(std::move(mem), n_floats));
}

Status Backend::upload(const float* src, Act dst) {
  if (!dst.data)
    return make_error(ErrorCode::kInternal, "upload: the destination is not host memory");
  std::memmove(dst.data, src, static_cast<size_t>(dst.rows * dst.cols) * sizeof(float));
  return {};
}

Status Backend::download(Act src, float* dst) {
  if (!src.data) return make_error(ErrorCode::kInternal, "download: the source is not host memory");
  std::memmove(dst, src.data, static_cast<size_t>(src.rows * src.cols) * sizeof(float));
  return {};
}

}  // namespace loom
