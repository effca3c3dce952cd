#include "engine/model/gguf_writer.h"

#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace loom {

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment_ != 32) set_u32("general.alignment", alignment_);
}

GgufWriter::~GgufWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(path_.c_str());
  }
}

GgufWriter::Kv& GgufWriter::slot(const std::string& key) {
  for (Kv& kv : kv_) {
    if (kv.key == key) {
      kv.value = GgufValue();
      return kv;
    }
  }
  kv_.push_back({key, GgufValue()});
  return kv_.back();
}

void GgufWriter::set_string(const std::string& key, std::string value) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kString;
  v.s = std::move(value);
}
void GgufWriter::set_u32(const std::string& key, uint32_t value) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kU32;
  v.i = value;
}
void GgufWriter::set_i32(const std::string& key, int32_t value) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kI32;
  v.i = value;
}
void GgufWriter::set_u64(const std::string& key, uint64_t value) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kU64;
  v.i = static_cast<int64_t>(value);
}
void GgufWriter::set_f32(const std::string& key, float value) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kF32;
  v.f = value;
}
void GgufWriter::set_bool(const std::string& key, bool value) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kBool;
  v.i = value ? 1 : 0;
}
void GgufWriter::set_string_array(const std::string& key, std::vector<std::string> values) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kArray;
  v.elem_type = GgufType::kString;
  v.strings = std::move(values);
}
void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& values) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kArray;
  v.elem_type = GgufType::kI32;
  v.ints.assign(values.begin(), values.end());
}
void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& values) {
  GgufValue& v = slot(key).value;
  v.type = GgufType::kArray;
  v.elem_type = GgufType::kF32;
  v.floats.assign(values.begin(), values.end());
}
void GgufWriter::set_value(const std::string& key, const GgufValue& value) {
  slot(key).value = value;
  if (key == "general.alignment" && value.is_integer()) alignment_ = static_cast<uint32_t>(value.i);
}

Status GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& shape,
                              DType dtype) {
  if (f_) return make_error(ErrorCode::kInternal, "add_tensor('%s') after open()", name.c_str());
  if (shape.empty() || shape.size() > 4) {
    return make_error(ErrorCode::kInvalidArgument, "tensor '%s': %zu dimensions (1 to 4 allowed)",
                      name.c_str(), shape.size());
  }
  for (const TensorDecl& t : tensors_) {
    if (t.name == name)
      return make_error(ErrorCode::kInvalidArgument, "duplicate tensor '%s'", name.c_str());
  }
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return make_error(ErrorCode::kInvalidArgument, "tensor '%s': bad dimension %" PRId64,
                        name.c_str(), d);
    }
  }
  if (shape[0] % traits(dtype).block_size != 0) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "tensor '%s': first dimension %" PRId64 " is not a multiple of %s's block size %u",
        name.c_str(), shape[0], std::string(dtype_name(dtype)).c_str(), traits(dtype).block_size);
  }
  auto bytes = dtype_row_bytes(dtype, n);
  if (!bytes)
    return make_error(ErrorCode::kInvalidArgument, "tensor '%s': size overflows", name.c_str());
  uint64_t offset = 0;
  if (!tensors_.empty()) {
    const TensorDecl& last = tensors_.back();
    offset = (last.offset + last.n_bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  tensors_.push_back({name, shape, dtype, *bytes, offset});
  return {};
}

void GgufWriter::put(const void* p, size_t n) {
  if (failed_ || n == 0) return;
  if (std::fwrite(p, 1, n, f_) != n) failed_ = true;
}

Status GgufWriter::io_error(const char* what) {
  int err = errno;
  return make_error(ErrorCode::kIo, "%s: %s failed: %s", path_.c_str(), what,
                    err ? std::strerror(err) : "write error (disk full?)");
}

namespace {
template <typename T>
void put_pod(std::vector<uint8_t>& out, T v) {
  size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put_pod<uint64_t>(out, s.size());
  size_t at = out.size();
  out.resize(at + s.size());
  if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());
}
void put_scalar(std::vector<uint8_t>& out, GgufType t, int64_t i, double f, const std::string& s) {
  switch (t) {
    case GgufType::kU8: put_pod(out, static_cast<uint8_t>(i)); break;
    case GgufType::kI8: put_pod(out, static_cast<int8_t>(i)); break;
    case GgufType::kU16: put_pod(out, static_cast<uint16_t>(i)); break;
    case GgufType::kI16: put_pod(out, static_cast<int16_t>(i)); break;
    case GgufType::kU32: put_pod(out, static_cast<uint32_t>(i)); break;
    case GgufType::kI32: put_pod(out, static_cast<int32_t>(i)); break;
    case GgufType::kU64: put_pod(out, static_cast<uint64_t>(i)); break;
    case GgufType::kI64: put_pod(out, static_cast<int64_t>(i)); break;
    case GgufType::kF32: put_pod(out, static_cast<float>(f)); break;
    case GgufType::kF64: put_pod(out, f); break;
    case GgufType::kBool: put_pod(out, static_cast<uint8_t>(i != 0)); break;
    case GgufType::kString: put_str(out, s); break;
    case GgufType::kArray: break;
  }
}
}  // namespace

Status GgufWriter::open(const std::string& path) {
  path_ = path;
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) return io_error("create");
  std::vector<uint8_t> head;
  head.insert(head.end(), {'G', 'G', 'U', 'F'});
  put_pod<uint32_t>(head, 3);
  put_pod<uint64_t>(head, tensors_.size());
  put_pod<uint64_t>(head, kv_.size());
  static const std::string kEmpty;
  for (const Kv& kv : kv_) {
    put_str(head, kv.key);
    put_pod<uint32_t>(head, static_cast<uint32_t>(kv.value.type));
    if (!kv.value.is_array()) {
      put_scalar(head, kv.value.type, kv.value.i, kv.value.f, kv.value.s);
      continue;
    }
    const GgufValue& v = kv.value;
    put_pod<uint32_t>(head, static_cast<uint32_t>(v.elem_type));
    put_pod<uint64_t>(head, v.array_size());
    if (v.elem_type == GgufType::kString) {
      for (const auto& s : v.strings) put_str(head, s);
    } else if (v.elem_type == GgufType::kF32 || v.elem_type == GgufType::kF64) {
      for (double x : v.floats) put_scalar(head, v.elem_type, 0, x, kEmpty);
    } else {
      for (int64_t x : v.ints) put_scalar(head, v.elem_type, x, 0.0, kEmpty);
    }
  }
  for (const TensorDecl& t : tensors_) {
    put_str(head, t.name);
    put_pod<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put_pod<uint64_t>(head, static_cast<uint64_t>(d));
    put_pod<uint32_t>(head, static_cast<uint32_t>(t.dtype));
    put_pod<uint64_t>(head, t.offset);
  }
  put(head.data(), head.size());
  LOOM_TRY(put_padding(head.size()));
  if (failed_) return io_error("write header");
  current_ = 0;
  current_done_ = 0;
  return {};
}

Status GgufWriter::put_padding(uint64_t written) {
  static const uint8_t kZeros[64] = {};
  uint64_t pad = (alignment_ - written % alignment_) % alignment_;
  while (pad > 0) {
    size_t n = static_cast<size_t>(pad < sizeof(kZeros) ? pad : sizeof(kZeros));
    put(kZeros, n);
    pad -= n;
  }
  return {};
}

Status GgufWriter::write_data(const void* data, size_t n_bytes) {
  if (!f_) return make_error(ErrorCode::kInternal, "write_data() before open()");
  const auto* p = static_cast<const uint8_t*>(data);
  while (n_bytes > 0) {
    if (current_ >= tensors_.size()) {
      return make_error(ErrorCode::kInternal, "%s: more tensor data written than declared",
                        path_.c_str());
    }
    const TensorDecl& t = tensors_[current_];
    uint64_t room = t.n_bytes - current_done_;
    size_t n = static_cast<size_t>(n_bytes < room ? n_bytes : room);
    put(p, n);
    p += n;
    n_bytes -= n;
    current_done_ += n;
    if (current_done_ == t.n_bytes) {
      if (current_ + 1 < tensors_.size()) LOOM_TRY(put_padding(t.offset + t.n_bytes));
      ++current_;
      current_done_ = 0;
    }
    if (failed_) return io_error("write tensor data");
  }
  return {};
}

Status GgufWriter::close() {
  if (!f_) return make_error(ErrorCode::kInternal, "close() before open()");
  // Zero-sized tensors at the end are complete without any write.
  while (current_ < tensors_.size() && tensors_[current_].n_bytes == 0 && current_done_ == 0)
    ++current_;
  if (current_ != tensors_.size()) {
    return make_error(ErrorCode::kInternal, "%s: tensor '%s' was not fully written", path_.c_str(),
                      tensors_[current_].name.c_str());
  }
  bool ok = !failed_ && std::fflush(f_) == 0;
  if (std::fclose(f_) != 0) ok = false;
  f_ = nullptr;
  if (!ok) {
    Status s = io_error("flush");
    std::remove(path_.c_str());
    return s;
  }
  return {};
}

}  // namespace loom
