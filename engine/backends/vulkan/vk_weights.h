// How weights are laid out in device memory (see shaders/dequant.glsl):
// rows stay rows, but blocks are reshaped so every shader load is aligned to
// 4 or 16 bytes (no 16-bit storage needed) and the quants of the 32-element
// formats are contiguous for vector loads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/core/dtype.h"

namespace loom::vk {

/// Device layout of an [n_rows, n_in] weight of dtype `t`.
struct PackedLayout {
  uint64_t bytes = 0;      ///< total
  uint64_t off2 = 0;       ///< start of the second array (Q8_0/Q4_0 scales), else 0
  uint32_t row_units = 0;  ///< 32-element units per row (ceil for F32/F16)
};

/// True for the dtypes the Vulkan shaders read (F32, F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
bool packable(DType t);

/// The layout, or bytes == 0 when `t` is not packable or n_in does not fit its blocks.
PackedLayout packed_layout(DType t, int64_t n_in, int64_t n_rows);

/// Writes rows [0, n_rows) of `src` (GGUF layout, rows `src_row_bytes` apart)
/// into `dst` (layout.bytes bytes) in the device layout.
void pack_weight(DType t, const uint8_t* src, size_t src_row_bytes, int64_t n_in, int64_t n_rows,
                 const PackedLayout& layout, uint8_t* dst);

}  // namespace loom::vk
