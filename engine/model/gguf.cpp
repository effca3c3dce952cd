// GGUF reader. Layout (all little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv × { string key | u32 type | value }
//   n_tensors × { string name | u32 n_dims | n_dims × u64 ne | u32 dtype | u64 offset }
//   padding to general.alignment | tensor data (each tensor at an aligned offset)
// where string = u64 length + bytes, and array value = u32 elem type + u64 count + elements.
#include "engine/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace loom {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

// Smallest number of bytes one value of a type occupies in the file; used to
// bound element counts by the bytes left before anything is allocated.
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool: return 1;
    case GgufType::kU16:
    case GgufType::kI16: return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32: return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
    case GgufType::kString: return 8;
    case GgufType::kArray: return 12;
  }
  return 1;
}

bool known_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kF64);
}

// Bounds-checked little-endian reader over the file's bytes.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& name)
      : base_(base), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  Error truncated(const char* what, uint64_t need) const {
    return make_error(ErrorCode::kFormat,
                      "%s: truncated: %s needs %" PRIu64 " bytes at offset %" PRIu64
                      " but the file has %" PRIu64 " bytes: truncated download?",
                      name_.c_str(), what, need, pos_, size_);
  }

  template <typename T>
  Status read(T* out, const char* what) {
    if (left() < sizeof(T)) return truncated(what, sizeof(T));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return {};
  }

  Status skip(uint64_t n, const char* what) {
    if (left() < n) return truncated(what, n);
    pos_ += n;
    return {};
  }

  Status read_string(std::string* out, const char* what) {
    uint64_t at = pos_;
    uint64_t len = 0;
    LOOM_TRY(read(&len, what));
    if (len > left()) {
      return make_error(ErrorCode::kFormat,
                        "%s: %s at offset %" PRIu64 " claims %" PRIu64 " bytes but only %" PRIu64
                        " bytes are left in the file: truncated or corrupt",
                        name_.c_str(), what, at, len, left());
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return {};
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

// One value of type T from the file, stored as Out (GgufValue's int64 or double).
template <class T, class Out>
Status read_as(Cursor& c, Out* out, const char* what) {
  T x;
  LOOM_TRY(c.read(&x, what));
  *out = static_cast<Out>(x);
  return {};
}

Status read_scalar(Cursor& c, GgufType t, GgufValue* v, const char* what) {
  v->type = t;
  switch (t) {
    case GgufType::kU8: return read_as<uint8_t>(c, &v->i, what);
    case GgufType::kI8: return read_as<int8_t>(c, &v->i, what);
    case GgufType::kU16: return read_as<uint16_t>(c, &v->i, what);
    case GgufType::kI16: return read_as<int16_t>(c, &v->i, what);
    case GgufType::kU32: return read_as<uint32_t>(c, &v->i, what);
    case GgufType::kI32: return read_as<int32_t>(c, &v->i, what);
    case GgufType::kU64: return read_as<uint64_t>(c, &v->i, what);
    case GgufType::kI64: return read_as<int64_t>(c, &v->i, what);
    case GgufType::kF32: return read_as<float>(c, &v->f, what);
    case GgufType::kF64: return read_as<double>(c, &v->f, what);
    case GgufType::kBool: {
      uint8_t x;
      LOOM_TRY(c.read(&x, what));
      v->i = x ? 1 : 0;
      return {};
    }
    case GgufType::kString: return c.read_string(&v->s, what);
    case GgufType::kArray: break;
  }
  return make_error(ErrorCode::kInternal, "read_scalar on an array");
}

// Skips an array's contents (used for arrays of arrays, which no model key needs).
Status skip_array(Cursor& c, const std::string& file, const std::string& key, int depth) {
  if (depth > kMaxArrayDepth) {
    return make_error(ErrorCode::kFormat,
                      "%s: key '%s': arrays nested deeper than %d at offset %" PRIu64, file.c_str(),
                      key.c_str(), kMaxArrayDepth, c.pos());
  }
  uint32_t et = 0;
  uint64_t n = 0;
  uint64_t at = c.pos();
  LOOM_TRY(c.read(&et, "array element type"));
  if (!known_type(et)) {
    return make_error(ErrorCode::kFormat,
                      "%s: key '%s': unknown array element type %u at offset %" PRIu64,
                      file.c_str(), key.c_str(), et, at);
  }
  LOOM_TRY(c.read(&n, "array length"));
  auto t = static_cast<GgufType>(et);
  if (n > c.left() / min_value_bytes(t)) {
    return make_error(ErrorCode::kFormat,
                      "%s: key '%s': array at offset %" PRIu64 " claims %" PRIu64
                      " elements but only %" PRIu64 " bytes are left: truncated or corrupt",
                      file.c_str(), key.c_str(), at, n, c.left());
  }
  for (uint64_t k = 0; k < n; ++k) {
    if (t == GgufType::kArray) {
      LOOM_TRY(skip_array(c, file, key, depth + 1));
    } else if (t == GgufType::kString) {
      uint64_t len = 0;
      LOOM_TRY(c.read(&len, "string length"));
      LOOM_TRY(c.skip(len, "string"));
    } else {
      LOOM_TRY(c.skip(min_value_bytes(t), "array element"));
    }
  }
  return {};
}

Status read_array(Cursor& c, const std::string& file, const std::string& key, GgufValue* v) {
  v->type = GgufType::kArray;
  uint64_t at = c.pos();
  uint32_t et = 0;
  uint64_t n = 0;
  LOOM_TRY(c.read(&et, "array element type"));
  if (!known_type(et)) {
    return make_error(ErrorCode::kFormat,
                      "%s: key '%s': unknown array element type %u at offset %" PRIu64,
                      file.c_str(), key.c_str(), et, at);
  }
  LOOM_TRY(c.read(&n, "array length"));
  auto t = static_cast<GgufType>(et);
  v->elem_type = t;
  // Every element needs at least min_value_bytes in the file: this bounds what we allocate.
  if (n > c.left() / min_value_bytes(t)) {
    return make_error(ErrorCode::kFormat,
                      "%s: key '%s': array at offset %" PRIu64 " claims %" PRIu64
                      " elements of %s but only %" PRIu64 " bytes are left: truncated or corrupt",
                      file.c_str(), key.c_str(), at, n, gguf_type_name(t), c.left());
  }
  if (t == GgufType::kArray) {
    v->n_nested = n;
    for (uint64_t k = 0; k < n; ++k) LOOM_TRY(skip_array(c, file, key, 1));
    return {};
  }
  // No reserve(n): storage grows with what is actually read, so a corrupt
  // count can never make us allocate more than the bytes behind it.
  GgufValue e;
  if (t == GgufType::kString) {
    for (uint64_t k = 0; k < n; ++k) {
      LOOM_TRY(c.read_string(&e.s, "array string"));
      v->strings.push_back(std::move(e.s));
    }
  } else if (t == GgufType::kF32 || t == GgufType::kF64) {
    for (uint64_t k = 0; k < n; ++k) {
      LOOM_TRY(read_scalar(c, t, &e, "array element"));
      v->floats.push_back(e.f);
    }
  } else {
    for (uint64_t k = 0; k < n; ++k) {
      LOOM_TRY(read_scalar(c, t, &e, "array element"));
      v->ints.push_back(e.i);
    }
  }
  return {};
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kBool: return true;
    default: return false;
  }
}

uint64_t GgufValue::array_size() const {
  if (!is_array()) return 0;
  if (elem_type == GgufType::kArray) return n_nested;
  if (elem_type == GgufType::kString) return strings.size();
  if (elem_type == GgufType::kF32 || elem_type == GgufType::kF64) return floats.size();
  return ints.size();
}

std::string GgufTensor::shape_string() const {
  std::string s = "[";
  for (uint32_t d = 0; d < n_dims; ++d) {
    if (d) s += ", ";
    s += std::to_string(ne[d]);
  }
  return s + "]";
}

GgufFile::~GgufFile() {
  if (mapping_) munmap(mapping_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::release_pages(const void* p, size_t n) const {
  if (!mapping_ || n == 0) return;
  const auto lo = reinterpret_cast<uintptr_t>(mapping_);
  const uintptr_t hi = lo + static_cast<uintptr_t>(size_);
  auto a = reinterpret_cast<uintptr_t>(p);
  uintptr_t b = a + n;
  if (a < lo || b > hi) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  a = (a + page - 1) / page * page;  // whole pages inside the range only
  b = b / page * page;
  if (b > a) (void)madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

bool GgufFile::copy_out(const void* p, size_t n, uint8_t* dst) const {
  const auto* src = static_cast<const uint8_t*>(p);
  const auto* lo = static_cast<const uint8_t*>(mapping_);
  if (!mapping_ || fd_ < 0 || src < lo || src + n > lo + size_) {
    std::memcpy(dst, src, n);
    return true;
  }
  auto off = static_cast<off_t>(src - lo);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, dst, std::min<size_t>(n, size_t{1} << 30), off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    dst += r;
    off += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(ErrorCode::kIo, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kIo, "%s: not a regular file", path.c_str());
  }
  if (st.st_size == 0) {
    ::close(fd);
    return make_error(ErrorCode::kFormat, "%s: the file is empty (0 bytes)", path.c_str());
  }
  void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  if (m == MAP_FAILED) {
    ::close(fd);
    return make_error(ErrorCode::kIo, "%s: cannot memory-map %lld bytes: %s", path.c_str(),
                      static_cast<long long>(st.st_size), std::strerror(err));
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->mapping_ = m;
  f->fd_ = fd;
  f->base_ = static_cast<const uint8_t*>(m);
  f->size_ = static_cast<uint64_t>(st.st_size);
  LOOM_TRY(f->parse());
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_memory(const uint8_t* data, size_t size,
                                                        std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->base_ = data;
  f->size_ = size;
  LOOM_TRY(f->parse());
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_parts(std::string path,
                                               std::vector<std::pair<std::string, GgufValue>> kv,
                                               std::vector<GgufTensor> tensors,
                                               std::shared_ptr<const void> storage, uint64_t size) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(path);
  f->size_ = size;
  f->storage_ = std::move(storage);
  f->kv_ = std::move(kv);
  for (size_t i = 0; i < f->kv_.size(); ++i) f->kv_index_.emplace(f->kv_[i].first, i);
  f->tensors_ = std::move(tensors);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->tensor_index_.emplace(f->tensors_[i].name, i);
  return f;
}

Status GgufFile::parse() {
  const std::string& name = path_;
  Cursor c(base_, size_, name);

  uint8_t magic[4] = {};
  if (size_ < 4) return c.truncated("magic \"GGUF\"", 4);
  std::memcpy(magic, base_, 4);
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return make_error(
        ErrorCode::kFormat,
        "%s: not a GGUF file: bad magic %02x %02x %02x %02x at offset 0 (expected \"GGUF\")",
        name.c_str(), magic[0], magic[1], magic[2], magic[3]);
  }
  LOOM_TRY(c.skip(4, "magic"));
  LOOM_TRY(c.read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: GGUF version %u at offset 4 is not supported (only 2 and 3)",
                      name.c_str(), version_);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  LOOM_TRY(c.read(&n_tensors, "tensor count"));
  LOOM_TRY(c.read(&n_kv, "metadata count"));
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 (value) bytes;
  // a tensor info at least 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.left() / 13) {
    return make_error(ErrorCode::kFormat,
                      "%s: metadata count %" PRIu64 " at offset 16 cannot fit in the %" PRIu64
                      " bytes left: truncated or corrupt",
                      name.c_str(), n_kv, c.left());
  }
  if (n_tensors > c.left() / 32) {
    return make_error(ErrorCode::kFormat,
                      "%s: tensor count %" PRIu64 " at offset 8 cannot fit in the %" PRIu64
                      " bytes left: truncated or corrupt",
                      name.c_str(), n_tensors, c.left());
  }

  for (uint64_t k = 0; k < n_kv; ++k) {
    uint64_t at = c.pos();
    std::string key;
    LOOM_TRY(c.read_string(&key, "metadata key"));
    if (kv_index_.count(key)) {
      return make_error(ErrorCode::kFormat, "%s: duplicate metadata key '%s' at offset %" PRIu64,
                        name.c_str(), key.c_str(), at);
    }
    uint32_t type = 0;
    uint64_t type_at = c.pos();
    LOOM_TRY(c.read(&type, "metadata value type"));
    if (!known_type(type)) {
      return make_error(ErrorCode::kFormat,
                        "%s: key '%s': unknown value type %u at offset %" PRIu64, name.c_str(),
                        key.c_str(), type, type_at);
    }
    GgufValue v;
    if (static_cast<GgufType>(type) == GgufType::kArray) {
      LOOM_TRY(read_array(c, name, key, &v));
    } else {
      LOOM_TRY(read_scalar(c, static_cast<GgufType>(type), &v, "metadata value"));
    }
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->type == GgufType::kBool || a->i <= 0 || a->i > (1 << 30) ||
        (a->i & (a->i - 1)) != 0) {
      return make_error(ErrorCode::kFormat,
                        "%s: general.alignment must be a power of two up to 2^30, got %" PRId64,
                        name.c_str(), a->i);
    }
    alignment_ = static_cast<uint32_t>(a->i);
  }

  for (uint64_t k = 0; k < n_tensors; ++k) {
    uint64_t at = c.pos();
    GgufTensor t;
    LOOM_TRY(c.read_string(&t.name, "tensor name"));
    if (tensor_index_.count(t.name)) {
      return make_error(ErrorCode::kFormat, "%s: duplicate tensor name '%s' at offset %" PRIu64,
                        name.c_str(), t.name.c_str(), at);
    }
    LOOM_TRY(c.read(&t.n_dims, "tensor dimension count"));
    if (t.n_dims == 0 || t.n_dims > kMaxDims) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensor '%s' at offset %" PRIu64 " has %u dimensions (1 to %u allowed)",
                        name.c_str(), t.name.c_str(), at, t.n_dims, kMaxDims);
    }
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      uint64_t ne = 0;
      LOOM_TRY(c.read(&ne, "tensor dimension"));
      if (ne > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(n_elem, ne, &n_elem) ||
          n_elem > static_cast<uint64_t>(INT64_MAX)) {
        return make_error(ErrorCode::kFormat,
                          "%s: tensor '%s' at offset %" PRIu64 ": dimension %u (%" PRIu64
                          ") makes the element count overflow",
                          name.c_str(), t.name.c_str(), at, d, ne);
      }
      t.ne[d] = static_cast<int64_t>(ne);
    }
    uint32_t dtype = 0;
    uint64_t dtype_at = c.pos();
    LOOM_TRY(c.read(&dtype, "tensor dtype"));
    auto tr = dtype_traits(dtype);
    if (!tr) {
      return make_error(ErrorCode::kUnsupported,
                        "%s: tensor '%s' has unknown dtype id %u at offset %" PRIu64, name.c_str(),
                        t.name.c_str(), dtype, dtype_at);
    }
    t.dtype = tr->type;
    if (t.ne[0] % tr->block_size != 0) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensor '%s' %s: first dimension %" PRId64
                        " is not a multiple of %s's block size %u",
                        name.c_str(), t.name.c_str(), t.shape_string().c_str(), t.ne[0],
                        std::string(tr->name).c_str(), tr->block_size);
    }
    auto bytes = dtype_row_bytes(t.dtype, n_elem);
    if (!bytes) {
      return make_error(ErrorCode::kFormat, "%s: tensor '%s' %s: byte size overflows", name.c_str(),
                        t.name.c_str(), t.shape_string().c_str());
    }
    t.n_bytes = *bytes;
    LOOM_TRY(c.read(&t.offset, "tensor data offset"));
    if (t.offset % alignment_ != 0) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensor '%s' data offset %" PRIu64
                        " is not a multiple of the alignment %u",
                        name.c_str(), t.name.c_str(), t.offset, alignment_);
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t pos = c.pos();
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > size_) {
    return make_error(ErrorCode::kFormat,
                      "%s: tensor data should start at byte %" PRIu64 " but the file has %" PRIu64
                      " bytes: truncated download?",
                      name.c_str(), data_offset_, size_);
  }
  for (GgufTensor& t : tensors_) {
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_offset_, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.n_bytes, &end) || end > size_) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensor '%s' %s %s ends at byte %" PRIu64 " but the file has %" PRIu64
                        " bytes: truncated download?",
                        name.c_str(), t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                        t.shape_string().c_str(), end < begin ? UINT64_MAX : end, size_);
    }
    t.data = base_ + begin;
  }
  return {};
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Error wrong_type(const std::string& file, std::string_view key, const char* want,
                 const GgufValue& v) {
  std::string got = gguf_type_name(v.type);
  if (v.is_array()) got += std::string(" of ") + gguf_type_name(v.elem_type);
  return make_error(ErrorCode::kFormat, "%s: key '%.*s' should be %s but is %s", file.c_str(),
                    static_cast<int>(key.size()), key.data(), want, got.c_str());
}
}  // namespace

Result<std::optional<std::string>> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<std::string>();
  if (v->type != GgufType::kString) return wrong_type(path_, key, "a string", *v);
  return std::optional<std::string>(v->s);
}

Result<std::optional<int64_t>> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<int64_t>();
  if (!v->is_integer()) return wrong_type(path_, key, "an integer", *v);
  if (v->type == GgufType::kU64 && v->i < 0) {
    return make_error(ErrorCode::kOutOfRange, "%s: key '%.*s' value is too large", path_.c_str(),
                      static_cast<int>(key.size()), key.data());
  }
  return std::optional<int64_t>(v->i);
}

Result<std::optional<double>> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<double>();
  if (v->is_float()) return std::optional<double>(v->f);
  if (v->is_integer() && v->type != GgufType::kBool)
    return std::optional<double>(static_cast<double>(v->i));
  return wrong_type(path_, key, "a number", *v);
}

Result<std::optional<bool>> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<bool>();
  if (!v->is_integer()) return wrong_type(path_, key, "a bool", *v);
  return std::optional<bool>(v->i != 0);
}

Result<const std::vector<std::string>*> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return static_cast<const std::vector<std::string>*>(nullptr);
  if (!v->is_array() || v->elem_type != GgufType::kString) {
    return wrong_type(path_, key, "an array of string", *v);
  }
  return &v->strings;
}

Result<const std::vector<int64_t>*> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return static_cast<const std::vector<int64_t>*>(nullptr);
  if (!v->is_array() || v->elem_type == GgufType::kString || v->elem_type == GgufType::kArray ||
      v->elem_type == GgufType::kF32 || v->elem_type == GgufType::kF64) {
    return wrong_type(path_, key, "an array of integers", *v);
  }
  return &v->ints;
}

Result<const std::vector<double>*> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return static_cast<const std::vector<double>*>(nullptr);
  if (!v->is_array() || (v->elem_type != GgufType::kF32 && v->elem_type != GgufType::kF64)) {
    return wrong_type(path_, key, "an array of floats", *v);
  }
  return &v->floats;
}

std::string GgufFile::architecture() const {
  const GgufValue* v = find("general.architecture");
  return (v && v->type == GgufType::kString) ? v->s : std::string();
}

}  // namespace loom
