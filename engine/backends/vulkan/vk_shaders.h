// The SPIR-V of every shader variant, embedded at build time
// (shaders/variants.txt -> glslc -> shaders/CMakeLists.txt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace loom::vk {

/// One compiled shader variant, e.g. "matvec1_q4_k_sg".
struct SpirvBlob {
  const char* name;
  const uint32_t* words;
  size_t n_words;
};

/// Every variant, sorted by name.
std::span<const SpirvBlob> all_shaders();

/// The variant called `name`, or null.
const SpirvBlob* find_shader(std::string_view name);

}  // namespace loom::vk
