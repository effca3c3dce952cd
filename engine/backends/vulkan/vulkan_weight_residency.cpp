// VulkanBackend's weights on the device: each tensor repacked once into
// device memory (vk_weights.h), keyed by the host range it mirrors and
// fingerprinted; a layer's weights uploaded as one group so they share a
// memory block (the fused matvecs need that); lookup and release.
#include <algorithm>

#include "engine/backends/vulkan/vk_weights.h"
#include "engine/backends/vulkan/vulkan_backend_impl.h"

namespace loom {

const VulkanBackend::Resident* VulkanBackend::find_weight(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  auto it = weights_.upper_bound(b);
  if (it == weights_.begin()) return nullptr;
  --it;
  return b < it->second.end ? &it->second : nullptr;
}

bool VulkanBackend::has_weight(OpKind op, const Weight& w) const {
  return supports(op, w.dtype) && find_weight(w.data) != nullptr;
}

namespace {
// FNV-1a over the shape and 16 evenly spaced 64-byte samples of the tensor:
// tells a tensor from another one later mapped at the same address (another
// model), without reading gigabytes.
uint64_t fingerprint(const Weight& w, const uint8_t* begin, uint64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  const uint64_t shape[4] = {static_cast<uint64_t>(w.dtype), static_cast<uint64_t>(w.n_in),
                             w.row_bytes, bytes};
  mix(shape, sizeof(shape));
  for (uint64_t i = 0; i < 16; ++i) {
    const uint64_t at = bytes > 64 ? (bytes - 64) / 15 * i : 0;
    mix(begin + at, static_cast<size_t>(std::min<uint64_t>(64, bytes)));
  }
  return h;
}
}  // namespace

void VulkanBackend::release_weights() {
  (void)flush();  // recorded work may still read them
  for (auto& [b, r] : weights_) device_pool_->free(r.alloc);
  weights_.clear();
  weight_bytes_ = 0;
}

void VulkanBackend::release_weight(const Weight& w) {
  // The resident tensor whose host range holds w (w may be a row range of it).
  const auto* p = static_cast<const uint8_t*>(w.data);
  auto it = weights_.upper_bound(p);
  if (!p || it == weights_.begin()) return;
  --it;
  if (p >= it->second.end) return;
  (void)flush();  // recorded work may still read it; an error stays in status_
  weight_bytes_ -= it->second.alloc.size;
  device_pool_->free(it->second.alloc);
  weights_.erase(it);
}

VulkanBackend::Source VulkanBackend::weight_source(const Weight& w) const {
  // The whole tensor (fused tensors are used as row ranges: one upload serves all).
  Source src;
  src.begin = static_cast<const uint8_t*>(w.data);
  src.n_rows = w.n_out;
  if (w.tensor && w.tensor->data && w.row_bytes) {
    src.begin = w.tensor->data;
    src.n_rows = static_cast<int64_t>(w.tensor->n_bytes / w.row_bytes);
  }
  src.bytes = static_cast<uint64_t>(src.n_rows) * w.row_bytes;
  src.fingerprint = fingerprint(w, src.begin, src.bytes);
  auto same = weights_.find(src.begin);
  src.resident = same != weights_.end() && same->second.fingerprint == src.fingerprint &&
                 same->second.end == src.begin + src.bytes;
  return src;
}

Status VulkanBackend::check_packable(const Weight& w, const vk::PackedLayout& l) const {
  if (!vk::packable(w.dtype)) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: tensor '%s' has type %s, which no shader reads", w.name().c_str(),
                      std::string(dtype_name(w.dtype)).c_str());
  }
  if (l.bytes == 0) {
    return make_error(ErrorCode::kUnsupported,
                      "Vulkan: tensor '%s' of type %s has rows of %" PRId64
                      " elements, which its blocks do not divide",
                      w.name().c_str(), std::string(dtype_name(w.dtype)).c_str(), w.n_in);
  }
  return {};
}

void VulkanBackend::drop_stale(const Source& src) {
  // Anything resident over these bytes is a stale copy of an unloaded tensor.
  bool stale = false;
  for (auto it = weights_.begin(); it != weights_.end();) {
    if (it->first < src.begin + src.bytes && src.begin < it->second.end) {
      if (!stale) (void)flush();  // recorded work may still read it; an error stays in status_
      stale = true;
      weight_bytes_ -= it->second.alloc.size;
      device_pool_->free(it->second.alloc);
      it = weights_.erase(it);
    } else {
      ++it;
    }
  }
}

Status VulkanBackend::upload_weight(const Weight& w) {
  if (!w.present()) return {};
  const Source src = weight_source(w);
  if (src.resident) return {};
  const vk::PackedLayout l = vk::packed_layout(w.dtype, w.n_in, src.n_rows);
  LOOM_TRY(check_packable(w, l));
  drop_stale(src);
  const std::string what = w.name().empty() ? std::string("a weight") : "tensor '" + w.name() + "'";
  LOOM_ASSIGN_OR_RETURN(Alloc a, device_pool_->alloc(l.bytes, what.c_str()));
  return upload_into(w, src, l, a);
}

Status VulkanBackend::upload_weights(const std::vector<const Weight*>& ws) {
  // The tensors not resident yet get one allocation, cut in pieces, so they
  // share a memory block (matmul_qkv and matmul_glu fuse only within one);
  // when that does not fit, each goes wherever it fits.
  struct Item {
    const Weight* w;
    Source src;
    vk::PackedLayout l;
    uint64_t size;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  for (const Weight* w : ws) {
    if (!w->present()) continue;
    const Source src = weight_source(*w);
    if (src.resident || std::any_of(items.begin(), items.end(),
                                    [&](const Item& i) { return i.src.begin == src.begin; }))
      continue;
    const vk::PackedLayout l = vk::packed_layout(w->dtype, w->n_in, src.n_rows);
    LOOM_TRY(check_packable(*w, l));
    const uint64_t size = vk::MemoryPool::aligned(l.bytes);
    items.push_back(Item{w, src, l, size});
    total += size;
  }
  if (items.size() < 2) return Backend::upload_weights(ws);
  for (const Item& i : items) drop_stale(i.src);
  auto group = device_pool_->alloc(total, "a layer's weights");
  if (!group.ok()) return Backend::upload_weights(ws);
  uint64_t at = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const Item& i = items[k];
    Status st = upload_into(*i.w, i.src, i.l, Alloc{group->block, group->offset + at, i.size});
    at += i.size;
    if (!st.ok()) {  // upload_into freed its piece; free the ones not used yet
      if (at < total) device_pool_->free(Alloc{group->block, group->offset + at, total - at});
      return st;
    }
  }
  return {};
}

Status VulkanBackend::upload_into(const Weight& w, const Source& src, const vk::PackedLayout& l,
                                  Alloc a) {
  std::vector<uint8_t> packed;
  try {
    packed.resize(l.bytes);
  } catch (const std::bad_alloc&) {
    device_pool_->free(a);
    return make_error(ErrorCode::kOutOfMemory,
                      "out of host memory repacking tensor '%s' for the GPU", w.name().c_str());
  }
  vk::pack_weight(w.dtype, src.begin, w.row_bytes, w.n_in, src.n_rows, l, packed.data());
  for (uint64_t at = 0; at < l.bytes && status_.ok();) {
    const uint64_t n = std::min(l.bytes - at, ring_.size);
    Status st = ring_reserve(n);
    if (!st.ok()) break;
    const uint64_t off = ring_put(packed.data() + at, n);
    copy_buffer(ring_.block, off, a.block, a.offset + at, n);
    at += n;
  }
  Status st = flush();
  if (!st.ok()) {
    device_pool_->free(a);
    return st;
  }
  Resident r;
  r.fingerprint = src.fingerprint;
  r.end = src.begin + src.bytes;
  r.alloc = a;
  r.dtype = w.dtype;
  r.src_row_bytes = w.row_bytes;
  r.n_in = w.n_in;
  r.n_rows = src.n_rows;
  r.row_units = l.row_units;
  r.off2 = l.off2;
  weights_.emplace(src.begin, r);
  weight_bytes_ += a.size;
  return {};
}

const VulkanBackend::Resident* VulkanBackend::whole_tensor(const Weight& w) const {
  const Resident* r = find_weight(w.data);
  return r && r->n_rows == w.n_out && r->n_in == w.n_in &&
                 static_cast<const uint8_t*>(w.data) == r->begin()
             ? r
             : nullptr;
}

}  // namespace loom
