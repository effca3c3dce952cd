// GGUF v2/v3 reader: header, typed metadata, tensor table, memory-mapped data.
//
// Every count, length, offset and dimension read from the file is checked
// before use; a bad file gives an Error naming the file, the field or tensor
// and the byte offset. Nothing is allocated in proportion to a count before
// the count has been checked against the bytes left in the file.
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

/// GGUF metadata value type ids (on-disk values).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

const char* gguf_type_name(GgufType t);

/// One metadata value. Scalars are widened: integers and bools into `i`
/// (unsigned 64-bit values above INT64_MAX keep their bits), floats into `f`.
/// Arrays keep their element type and hold one vector matching it.
struct GgufValue {
  GgufType type = GgufType::kU8;
  int64_t i = 0;
  double f = 0.0;
  std::string s;

  GgufType elem_type = GgufType::kU8;  ///< arrays only
  std::vector<int64_t> ints;           ///< integer/bool arrays
  std::vector<double> floats;          ///< f32/f64 arrays
  std::vector<std::string> strings;    ///< string arrays
  uint64_t n_nested = 0;               ///< arrays of arrays: element count (contents skipped)

  bool is_array() const { return type == GgufType::kArray; }
  bool is_integer() const;  ///< any integer or bool scalar
  bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
  uint64_t array_size() const;
};

/// One tensor of the file: name, shape (ne[0] is the contiguous dimension), dtype and data.
struct GgufTensor {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  DType dtype = DType::kF32;
  uint64_t offset = 0;  ///< from the start of the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  ///< into the mapping; valid while the GgufFile lives
  /// Where an assembled tensor came from ("model-00001-of-00002.safetensors:
  /// model.layers.0.self_attn.q_proj.weight"); empty for a GGUF file's own tensors.
  std::string origin;

  uint64_t n_elements() const { return static_cast<uint64_t>(ne[0]) * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  ///< "[4096, 32000]"
};

/// A parsed GGUF file. Tensor data stays in the memory map, never copied.
class GgufFile {
 public:
  /// Opens and memory-maps `path`, then parses it.
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  /// Parses bytes already in memory (not copied: `data` must outlive the result).
  /// `name` is used in error messages.
  static Result<std::unique_ptr<GgufFile>> from_memory(const uint8_t* data, size_t size,
                                                       std::string name);
  /// A model source assembled in memory from another format (a Hugging Face
  /// folder): metadata and tensors as given (GGUF names and keys), tensor data
  /// pointing into `storage`, which the result keeps alive. `size` is the
  /// source's size in bytes (file_size()).
  static std::unique_ptr<GgufFile> from_parts(std::string path,
                                              std::vector<std::pair<std::string, GgufValue>> kv,
                                              std::vector<GgufTensor> tensors,
                                              std::shared_ptr<const void> storage, uint64_t size);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  /// Metadata, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  /// Typed getters: nullopt when the key is absent; an Error when present with
  /// the wrong type or an out-of-range value.
  Result<std::optional<std::string>> get_string(std::string_view key) const;
  Result<std::optional<int64_t>> get_int(std::string_view key) const;   ///< any integer type
  Result<std::optional<double>> get_float(std::string_view key) const;  ///< f32/f64 (or integer)
  Result<std::optional<bool>> get_bool(std::string_view key) const;
  /// Array getters: nullptr when absent; Error when not an array of that kind.
  Result<const std::vector<std::string>*> get_string_array(std::string_view key) const;
  Result<const std::vector<int64_t>*> get_int_array(std::string_view key) const;
  Result<const std::vector<double>*> get_float_array(std::string_view key) const;

  /// "general.architecture", or "" when absent.
  std::string architecture() const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

  /// Unmaps this process's view of the whole pages in [p, p + n) of the
  /// file's mapping (MADV_DONTNEED): they stay in the page cache, and a
  /// later read maps them again. For tensors read from a copy instead (the
  /// CPU's resident weights), so they are not counted twice in the
  /// process's memory. Does nothing outside an owned mapping (from_memory,
  /// from_parts).
  void release_pages(const void* p, size_t n) const;
  /// Copies [p, p + n) of the file's data into `dst`: read() from the file
  /// (the same one as mapped, through the descriptor kept from open()) where
  /// p lies in an owned mapping, else memcpy. The read costs no page faults
  /// on the mapping: 617 MB onto huge pages in 0.1 s on the development VM,
  /// against 0.3-1.1 s for memcpy from the mapping. False on a read error
  /// (dst is then incomplete).
  bool copy_out(const void* p, size_t n, uint8_t* dst) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;              ///< owned mmap, or null for from_memory
  int fd_ = -1;                          ///< the mapped file, kept open for copy_out
  std::shared_ptr<const void> storage_;  ///< what from_parts' tensors point into
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace loom
