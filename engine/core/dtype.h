// Tensor element types: F32/F16/BF16 and the GGUF block formats.
// Ids are the GGUF on-disk type ids (ggml_type); block size and bytes per
// block are facts of the format.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

/// A tensor data type as stored in GGUF. Values equal the on-disk ids.
enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

/// Static facts about a dtype.
struct DTypeTraits {
  DType type;
  std::string_view name;  ///< GGUF/ggml spelling: "Q4_K", "F16"...
  uint32_t block_size;    ///< elements per block (1 for plain types)
  uint32_t block_bytes;   ///< bytes per block
  bool has_reference;     ///< cpu/ref has dequantize (and quantize) for it
};

/// Traits of a known GGUF type id, or nullopt for an id Loom does not know.
std::optional<DTypeTraits> dtype_traits(uint32_t id);
/// Traits of a known dtype (always present).
const DTypeTraits& traits(DType t);
inline std::string_view dtype_name(DType t) {
  return traits(t).name;
}
/// Parses "q4_k", "Q4_K", "f16"... (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);

/// Bytes needed for `n_elements` elements, or nullopt when n is not a
/// multiple of the block size or the product overflows.
std::optional<uint64_t> dtype_row_bytes(DType t, uint64_t n_elements);

}  // namespace loom
