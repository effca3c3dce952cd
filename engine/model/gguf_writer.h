// Streaming GGUF v3 writer: metadata and tensor infos first, then tensor data
// streamed in order (in as many pieces as the caller likes), so a model far
// larger than memory can be written with a small buffer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/model/gguf.h"

namespace loom {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Metadata (a key set twice keeps its last value, in its first position).
  void set_string(const std::string& key, std::string value);
  void set_u32(const std::string& key, uint32_t value);
  void set_i32(const std::string& key, int32_t value);
  void set_u64(const std::string& key, uint64_t value);
  void set_f32(const std::string& key, float value);
  void set_bool(const std::string& key, bool value);
  void set_string_array(const std::string& key, std::vector<std::string> values);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& values);
  void set_f32_array(const std::string& key, const std::vector<float>& values);
  /// Copies a value read by GgufFile (any type, arrays included; nested arrays are not supported).
  void set_value(const std::string& key, const GgufValue& value);

  /// Declares a tensor; `shape[0]` is the contiguous dimension. Errors on a bad shape.
  Status add_tensor(const std::string& name, const std::vector<int64_t>& shape, DType dtype);
  size_t tensor_count() const { return tensors_.size(); }
  uint64_t tensor_bytes(size_t index) const { return tensors_[index].n_bytes; }

  /// Creates the file and writes header, metadata and tensor infos.
  Status open(const std::string& path);
  /// Appends data to the current tensor (tensors are filled in declaration order).
  Status write_data(const void* data, size_t n_bytes);
  /// Checks every tensor was filled, flushes and closes. The file is removed on failure.
  Status close();

 private:
  struct Kv {
    std::string key;
    GgufValue value;
  };
  struct TensorDecl {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype;
    uint64_t n_bytes;
    uint64_t offset;
  };
  Kv& slot(const std::string& key);
  void put(const void* p, size_t n);
  Status put_padding(uint64_t written);
  Status io_error(const char* what);

  uint32_t alignment_;
  std::vector<Kv> kv_;
  std::vector<TensorDecl> tensors_;
  std::string path_;
  FILE* f_ = nullptr;
  bool failed_ = false;
  size_t current_ = 0;         ///< tensor being filled
  uint64_t current_done_ = 0;  ///< bytes of it written so far
};

}  // namespace loom
