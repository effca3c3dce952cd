// Weights in another precision than the file's: a placement may ask for a
// group's weights in, say, Q4_0 on the CPU while the file holds Q8_0. Each
// tensor is requantized once per target type (dequantize to F32, quantize with
// the reference quantizer, rows split over threads) and kept while the store
// lives; the requantized tensor gets its own GgufTensor record so backends key
// it like a tensor of the file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "engine/core/status.h"
#include "engine/model/gguf.h"
#include "engine/model/model.h"

namespace loom {

class RequantStore {
 public:
  /// `w` in `dtype`: `w` itself when dtype is empty, equal to w's own, or `w`
  /// is a vector (norms and biases stay F32); otherwise the same rows of a
  /// requantized copy of w's tensor. Errors: no quantizer for the pair, or a
  /// row length that is not a multiple of the block.
  Result<Weight> get(const Weight& w, std::optional<DType> dtype);
  /// Drops copies no longer used (those whose (tensor, dtype) is not in `keep`).
  void retain(const std::vector<std::pair<const void*, DType>>& keep);
  /// Bytes held in requantized copies.
  uint64_t bytes() const;

 private:
  struct Entry {
    GgufTensor tensor;  ///< name, shape and dtype of the copy; data points into `bytes`
    std::unique_ptr<uint8_t[]> bytes;
    const uint8_t* src_begin = nullptr;  ///< the source tensor's first byte
  };
  mutable std::mutex mu_;
  std::map<std::pair<const void*, DType>, std::unique_ptr<Entry>>
      copies_;  ///< by (source tensor data, dtype)
};

}  // namespace loom
