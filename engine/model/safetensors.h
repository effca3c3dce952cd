// safetensors reader: one file, or the shards of a Hugging Face model folder.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}), then the tensor data; offsets count from the end
// of the header. Every length, offset, shape and dtype is checked before use:
// the header against the file size, each tensor's byte range against the
// data section and against the others (no overlap), and shape x dtype size
// against that range. Errors name the file, the tensor and the byte offset.
// Tensor data stays in the memory map, never copied.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace loom {

/// One tensor of a safetensors file.
struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;      ///< as in the header: "BF16", "I64", ...
  std::optional<DType> dtype;  ///< F32, F16, BF16; nullopt for dtypes Loom does not compute in
  std::vector<int64_t> shape;  ///< row-major, outermost first (PyTorch order)
  uint64_t offset = 0;         ///< absolute byte offset of the data in its file
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  ///< into the mapping; valid while the file lives

  uint64_t n_elements() const;
  std::string shape_string() const;  ///< "[4096, 32000]" (row-major)
};

/// A parsed safetensors file.
class SafetensorsFile {
 public:
  /// Opens and memory-maps `path`, then parses it.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  /// Parses bytes already in memory (not copied: `data` must outlive the result).
  static Result<std::unique_ptr<SafetensorsFile>> from_memory(const uint8_t* data, size_t size,
                                                              std::string name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }
  /// `__metadata__` (string to string); empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Tensors in order of their data offsets.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find_tensor(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  ///< owned mmap, or null for from_memory
  uint64_t data_offset_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

/// All safetensors of a model folder: `model.safetensors.index.json` and the
/// shards it names, or else every `*.safetensors` in the folder.
class SafetensorsSet {
 public:
  /// Opens the folder's weights. Errors: no weights, an index that does not
  /// parse or names a shard that is missing (or a path outside the folder),
  /// a tensor the index places in a shard that lacks it, a tensor in two files.
  static Result<SafetensorsSet> open_folder(const std::string& dir);

  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  /// The tensor and the file that holds it; nullptr when absent.
  const SafetensorsTensor* find_tensor(std::string_view name) const;
  const SafetensorsFile* file_of(std::string_view name) const;
  /// Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;
  /// Bytes of all files.
  uint64_t total_bytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, const SafetensorsTensor*>, std::less<>> index_;
};

}  // namespace loom
