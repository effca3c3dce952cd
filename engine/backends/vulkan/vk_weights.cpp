#include "engine/backends/vulkan/vk_weights.h"

#include <cstring>

#include "cpu/ref/blocks.h"

namespace loom::vk {

namespace {
constexpr uint64_t kAlign = 256;
uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}
// Bytes of one GGUF block kept as they are, and the padded size on the device.
constexpr uint64_t kQ6KDeviceBytes = 212;  // 210 rounded up to a whole word
}  // namespace

bool packable(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return true;
    default: return false;
  }
}

PackedLayout packed_layout(DType t, int64_t n_in, int64_t n_rows) {
  PackedLayout l;
  if (!packable(t) || n_in <= 0 || n_rows <= 0) return l;
  const auto rows = static_cast<uint64_t>(n_rows);
  const auto units = static_cast<uint64_t>((n_in + 31) / 32);
  l.row_units = static_cast<uint32_t>(units);
  switch (t) {
    case DType::kF32: l.bytes = rows * units * 128; break;
    case DType::kF16: l.bytes = rows * units * 64; break;
    case DType::kQ8_0:
    case DType::kQ4_0: {
      if (n_in % 32) return PackedLayout{};
      const uint64_t qs = rows * units * (t == DType::kQ8_0 ? 32 : 16);
      l.off2 = round_up(qs, kAlign);
      l.bytes = l.off2 + round_up(rows * units * 2, 4);
      break;
    }
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: {
      if (n_in % 256) return PackedLayout{};
      const uint64_t per = t == DType::kQ4_K ? 144 : t == DType::kQ5_K ? 176 : kQ6KDeviceBytes;
      l.bytes = rows * (units / 8) * per;
      break;
    }
    default: return PackedLayout{};
  }
  return l;
}

void pack_weight(DType t, const uint8_t* src, size_t src_row_bytes, int64_t n_in, int64_t n_rows,
                 const PackedLayout& l, uint8_t* dst) {
  std::memset(dst, 0, l.bytes);
  const uint64_t units = l.row_units;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = src + static_cast<size_t>(r) * src_row_bytes;
    const auto ur = static_cast<uint64_t>(r) * units;  // first unit of the row in the tensor
    switch (t) {
      case DType::kF32: std::memcpy(dst + ur * 128, row, static_cast<size_t>(n_in) * 4); break;
      case DType::kF16: std::memcpy(dst + ur * 64, row, static_cast<size_t>(n_in) * 2); break;
      case DType::kQ8_0: {
        const auto* b = reinterpret_cast<const ref::BlockQ8_0*>(row);
        for (uint64_t u = 0; u < units; ++u) {
          std::memcpy(dst + (ur + u) * 32, b[u].qs, 32);
          std::memcpy(dst + l.off2 + (ur + u) * 2, &b[u].d, 2);
        }
        break;
      }
      case DType::kQ4_0: {
        const auto* b = reinterpret_cast<const ref::BlockQ4_0*>(row);
        for (uint64_t u = 0; u < units; ++u) {
          std::memcpy(dst + (ur + u) * 16, b[u].qs, 16);
          std::memcpy(dst + l.off2 + (ur + u) * 2, &b[u].d, 2);
        }
        break;
      }
      case DType::kQ4_K:
      case DType::kQ5_K: {
        const uint64_t per = t == DType::kQ4_K ? 144 : 176;
        std::memcpy(dst + static_cast<uint64_t>(r) * (units / 8) * per, row, (units / 8) * per);
        break;
      }
      case DType::kQ6_K: {
        for (uint64_t b = 0; b < units / 8; ++b) {
          std::memcpy(dst + (static_cast<uint64_t>(r) * (units / 8) + b) * kQ6KDeviceBytes,
                      row + b * 210, 210);
        }
        break;
      }
      default: break;
    }
  }
}

}  // namespace loom::vk
