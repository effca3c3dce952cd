#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The safetensors library refuses headers over 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr int64_t kMaxDim = int64_t{1} << 40;

struct DtypeInfo {
  const char* name;
  uint32_t size;  ///< bytes per element (0: sub-byte, unused here)
  std::optional<DType> dtype;
};

// The dtypes the format defines. Only F32, F16 and BF16 are computed with; the
// others are parsed and checked so that a folder with an extra I64 buffer loads.
const DtypeInfo kDtypes[] = {
    {"F32", 4, DType::kF32}, {"F16", 2, DType::kF16}, {"BF16", 2, DType::kBF16},
    {"F64", 8, {}},          {"I64", 8, {}},          {"U64", 8, {}},
    {"I32", 4, {}},          {"U32", 4, {}},          {"I16", 2, {}},
    {"U16", 2, {}},          {"I8", 1, {}},           {"U8", 1, {}},
    {"BOOL", 1, {}},         {"F8_E4M3", 1, {}},      {"F8_E5M2", 1, {}},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const DtypeInfo& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

}  // namespace

uint64_t SafetensorsTensor::n_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string SafetensorsTensor::shape_string() const {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) munmap(mapping_, static_cast<size_t>(size_));
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(ErrorCode::kIo, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kIo, "%s: not a regular file", path.c_str());
  }
  if (st.st_size < 8) {
    ::close(fd);
    return make_error(ErrorCode::kFormat,
                      "%s: %lld bytes is too short for a safetensors file (8-byte header length "
                      "at offset 0): truncated download?",
                      path.c_str(), static_cast<long long>(st.st_size));
  }
  void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) {
    return make_error(ErrorCode::kIo, "%s: cannot memory-map %lld bytes: %s", path.c_str(),
                      static_cast<long long>(st.st_size), std::strerror(err));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->mapping_ = m;
  f->base_ = static_cast<const uint8_t*>(m);
  f->size_ = static_cast<uint64_t>(st.st_size);
  LOOM_TRY(f->parse());
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_memory(const uint8_t* data,
                                                                      size_t size,
                                                                      std::string name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(name);
  f->base_ = data;
  f->size_ = size;
  LOOM_TRY(f->parse());
  return f;
}

const SafetensorsTensor* SafetensorsFile::find_tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::parse() {
  const char* file = path_.c_str();
  if (size_ < 8) {
    return make_error(ErrorCode::kFormat,
                      "%s: %llu bytes is too short for a safetensors file (8-byte header length "
                      "at offset 0): truncated download?",
                      file, static_cast<unsigned long long>(size_));
  }
  uint64_t n_header = 0;
  for (int i = 7; i >= 0; --i) n_header = (n_header << 8) | base_[i];
  if (n_header < 2 || n_header > kMaxHeaderBytes) {
    return make_error(ErrorCode::kFormat,
                      "%s: header length %llu at offset 0 is out of range (2..%llu bytes): not a "
                      "safetensors file?",
                      file, static_cast<unsigned long long>(n_header),
                      static_cast<unsigned long long>(kMaxHeaderBytes));
  }
  if (n_header > size_ - 8) {
    return make_error(ErrorCode::kFormat,
                      "%s: the JSON header (bytes 8..%llu) runs past the end of the file (%llu "
                      "bytes): truncated download?",
                      file, static_cast<unsigned long long>(8 + n_header),
                      static_cast<unsigned long long>(size_));
  }
  data_offset_ = 8 + n_header;
  const char* text = reinterpret_cast<const char*>(base_ + 8);
  if (text[0] != '{') {
    return make_error(ErrorCode::kFormat,
                      "%s: the header at offset 8 does not start with '{' (byte 0x%02x): not a "
                      "safetensors file?",
                      file, static_cast<unsigned>(base_[8]));
  }
  json header;
  try {
    header = json::parse(text, text + n_header);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kFormat, "%s: the JSON header (bytes 8..%llu) does not parse: %s",
                      file, static_cast<unsigned long long>(data_offset_), e.what());
  }
  if (!header.is_object()) {
    return make_error(ErrorCode::kFormat, "%s: the JSON header is not an object", file);
  }
  const uint64_t data_size = size_ - data_offset_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return make_error(ErrorCode::kFormat, "%s: __metadata__ is not an object", file);
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return make_error(ErrorCode::kFormat, "%s: __metadata__ value '%s' is not a string", file,
                            m.key().c_str());
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const char* tname = name.c_str();
    if (!v.is_object()) {
      return make_error(ErrorCode::kFormat, "%s: tensor '%s': header entry is not an object", file,
                        tname);
    }
    SafetensorsTensor t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) {
      return make_error(ErrorCode::kFormat, "%s: tensor '%s' has no \"dtype\" string", file, tname);
    }
    t.dtype_name = dt->get<std::string>();
    const DtypeInfo* info = find_dtype(t.dtype_name);
    if (!info) {
      return make_error(ErrorCode::kFormat, "%s: tensor '%s' has unknown dtype '%s' (known: %s)",
                        file, tname, t.dtype_name.c_str(), known_dtypes().c_str());
    }
    t.dtype = info->dtype;
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array() || sh->size() > 8) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensor '%s' has no \"shape\" array of at most 8 dimensions", file,
                        tname);
    }
    // Element count with overflow checks: every dimension <= 2^40, the product
    // times the element size below 2^63.
    uint64_t n_elem = 1;
    for (const json& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxDim) {
        return make_error(ErrorCode::kFormat,
                          "%s: tensor '%s' has a dimension %s in shape %s (expected an integer "
                          "0..2^40)",
                          file, tname, d.dump().c_str(), sh->dump().c_str());
      }
      t.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(n_elem, static_cast<uint64_t>(t.shape.back()), &n_elem) ||
          n_elem > (uint64_t{1} << 60)) {
        return make_error(ErrorCode::kFormat, "%s: tensor '%s' has too many elements (shape %s)",
                          file, tname, sh->dump().c_str());
      }
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensor '%s' has no \"data_offsets\": [begin, end] of non-negative "
                        "integers",
                        file, tname);
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensor '%s' spans bytes %llu..%llu of the data section (at file "
                        "offset %llu), which has %llu bytes: truncated download?",
                        file, tname, static_cast<unsigned long long>(begin),
                        static_cast<unsigned long long>(end),
                        static_cast<unsigned long long>(data_offset_),
                        static_cast<unsigned long long>(data_size));
    }
    const uint64_t want = n_elem * info->size;  // < 2^63: n_elem <= 2^60, size <= 8
    if (want != end - begin) {
      return make_error(
          ErrorCode::kFormat,
          "%s: tensor '%s' is %s %s = %llu bytes, but its data_offsets %llu..%llu "
          "hold %llu bytes",
          file, tname, t.dtype_name.c_str(), t.shape_string().c_str(),
          static_cast<unsigned long long>(want), static_cast<unsigned long long>(begin),
          static_cast<unsigned long long>(end), static_cast<unsigned long long>(end - begin));
    }
    t.offset = data_offset_ + begin;
    t.n_bytes = end - begin;
    t.data = base_ + t.offset;
    tensors_.push_back(std::move(t));
  }

  // Byte ranges in order; two tensors may not share a byte.
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
            });
  // `last` is the tensor reaching furthest so far (an empty tensor may sit
  // inside another's range without sharing a byte).
  const SafetensorsTensor* last = nullptr;
  for (const SafetensorsTensor& b : tensors_) {
    if (b.n_bytes == 0) continue;
    if (last && last->offset + last->n_bytes > b.offset) {
      return make_error(ErrorCode::kFormat,
                        "%s: tensors '%s' (bytes %llu..%llu) and '%s' (from byte %llu) overlap",
                        file, last->name.c_str(), static_cast<unsigned long long>(last->offset),
                        static_cast<unsigned long long>(last->offset + last->n_bytes),
                        b.name.c_str(), static_cast<unsigned long long>(b.offset));
    }
    last = &b;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  return {};
}

// ---- folders ---------------------------------------------------------------

namespace {

Result<json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error(ErrorCode::kIo, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kFormat, "%s: does not parse as JSON: %s", path.c_str(), e.what());
  }
}

}  // namespace

Result<SafetensorsSet> SafetensorsSet::open_folder(const std::string& dir) {
  SafetensorsSet set;
  std::error_code ec;
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  if (fs::exists(index_path, ec)) {
    LOOM_ASSIGN_OR_RETURN(json index, read_json_file(index_path.string()));
    auto wm = index.is_object() ? index.find("weight_map") : index.end();
    if (wm == index.end() || !wm->is_object()) {
      return make_error(ErrorCode::kFormat, "%s: no \"weight_map\" object",
                        index_path.string().c_str());
    }
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return make_error(ErrorCode::kFormat, "%s: weight_map['%s'] is not a file name",
                          index_path.string().c_str(), it.key().c_str());
      }
      const std::string shard = it.value().get<std::string>();
      // A shard is a plain file name in this folder, never a path elsewhere.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        return make_error(ErrorCode::kFormat,
                          "%s: weight_map['%s'] = '%s' is not a file name in the folder",
                          index_path.string().c_str(), it.key().c_str(), shard.c_str());
      }
      weight_map[it.key()] = shard;
      if (std::find(shard_names.begin(), shard_names.end(), shard) == shard_names.end()) {
        shard_names.push_back(shard);
      }
    }
    std::sort(shard_names.begin(), shard_names.end());
    for (const std::string& shard : shard_names) {
      if (!fs::is_regular_file(root / shard, ec)) {
        std::string example;
        for (const auto& [tensor, s] : weight_map) {
          if (s == shard) {
            example = tensor;
            break;
          }
        }
        return make_error(ErrorCode::kIo,
                          "%s: shard '%s' (named by model.safetensors.index.json for tensor "
                          "'%s' and others) is missing: incomplete download?",
                          dir.c_str(), shard.c_str(), example.c_str());
      }
    }
  } else {
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() > 12 && name.ends_with(".safetensors") && it->is_regular_file(ec)) {
        shard_names.push_back(name);
      }
    }
    if (ec) {
      return make_error(ErrorCode::kIo, "%s: cannot list the folder: %s", dir.c_str(),
                        ec.message().c_str());
    }
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) {
      return make_error(ErrorCode::kFormat,
                        "%s: no *.safetensors files (and no model.safetensors.index.json)",
                        dir.c_str());
    }
  }

  for (const std::string& shard : shard_names) {
    LOOM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open((root / shard).string()));
    set.files_.push_back(std::move(file));
  }
  for (size_t i = 0; i < set.files_.size(); ++i) {
    for (const SafetensorsTensor& t : set.files_[i]->tensors()) {
      auto [it, inserted] = set.index_.try_emplace(t.name, i, &t);
      if (!inserted) {
        return make_error(ErrorCode::kFormat, "%s: tensor '%s' is in both %s and %s", dir.c_str(),
                          t.name.c_str(), set.files_[it->second.first]->path().c_str(),
                          set.files_[i]->path().c_str());
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    const SafetensorsFile* f = set.file_of(tensor);
    if (!f || fs::path(f->path()).filename().string() != shard) {
      return make_error(ErrorCode::kFormat,
                        "%s: model.safetensors.index.json puts tensor '%s' in '%s', but that "
                        "file has no such tensor",
                        dir.c_str(), tensor.c_str(), shard.c_str());
    }
  }
  return set;
}

const SafetensorsTensor* SafetensorsSet::find_tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.second;
}

const SafetensorsFile* SafetensorsSet::file_of(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : files_[it->second.first].get();
}

std::vector<std::string> SafetensorsSet::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, where] : index_) names.push_back(name);
  return names;
}

uint64_t SafetensorsSet::total_bytes() const {
  uint64_t b = 0;
  for (const auto& f : files_) b += f->file_size();
  return b;
}

}  // namespace loom
