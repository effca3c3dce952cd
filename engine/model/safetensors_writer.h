// safetensors writer: header first, then each tensor's bytes streamed in
// order. Tests use it to write real files (and then corrupt them);
// `loom synth --format safetensors` writes Hugging Face folders with it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace loom {

/// One tensor to write: either `data` (not owned, must outlive write()) or `owned`.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;           ///< "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;  ///< row-major, outermost first
  const void* data = nullptr;
  uint64_t n_bytes = 0;
  std::vector<uint8_t> owned;  ///< used when data is null
};

/// Writes `tensors` (in that order) with `metadata` as `__metadata__`. The
/// header is padded with spaces to a multiple of 8 bytes, so every tensor
/// starts 8-byte aligned when the tensors before it are multiples of 8.
/// Sizes are not checked against shapes: tests write lying headers on purpose
/// through the same function.
Status write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

/// The header JSON write_safetensors would write (without the length and padding).
std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace loom
