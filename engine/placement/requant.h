// Weights in another precision than the file's: a placement may ask for a
// group's weights in, say, Q4_0 on the CPU while the file holds Q8_0. Each
// tensor is requantized once per target type (dequantize to F32, quantize with
// the reference quantizer, rows split over threads) and kept while the store
// lives; the requantized tensor gets its own GgufTensor record so backends key
// it like a tensor of the file.
//
// The store also keeps resident copies: a tensor the CPU runs, copied in its
// own dtype from the file's mapping (4 KiB pages of the page cache) onto
// huge pages (engine/core/huge_pages.h), where streaming it each decode step
// costs a few TLB entries instead of one a page. Requantized copies are on
// huge pages too.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "engine/core/huge_pages.h"
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
  /// `w` read from a resident copy of its whole tensor, in w's own dtype, on
  /// huge pages: made on the first call for the tensor, kept like a
  /// requantized copy (key: the tensor's first byte and w.dtype). `w` itself
  /// for vectors, absent weights, and where no huge page can be had (THP
  /// off, out of memory, under AddressSanitizer): the copy is for speed
  /// only, so nothing here is an error.
  /// `copy(dst, src, n)` fills the copy (memcpy when empty; false on an
  /// error, and `w` itself is returned).
  using CopyFn = std::function<bool(uint8_t* dst, const uint8_t* src, size_t n)>;
  Weight resident(const Weight& w, const CopyFn& copy = {});
  /// Bytes resident() would copy for `w` now (0 when it has its copy or
  /// would make none).
  uint64_t resident_cost(const Weight& w) const;
  /// Drops copies no longer used (those whose (tensor, dtype) is not in `keep`).
  void retain(const std::vector<std::pair<const void*, DType>>& keep);
  /// Bytes held in copies (requantized and resident).
  uint64_t bytes() const;

 private:
  struct Entry {
    GgufTensor tensor;  ///< name, shape and dtype of the copy; data points into `bytes`
    HugeBuffer bytes;
    const uint8_t* src_begin = nullptr;  ///< the source tensor's first byte
  };
  mutable std::mutex mu_;
  std::map<std::pair<const void*, DType>, std::unique_ptr<Entry>>
      copies_;  ///< by (source tensor data, dtype)
};

}  // namespace loom
