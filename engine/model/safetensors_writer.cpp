#include "engine/model/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

namespace loom {

namespace {

uint64_t entry_bytes(const SafetensorsEntry& e) {
  return e.data ? e.n_bytes : e.owned.size();
}

}  // namespace

std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the tensors in file order, as the Python library does.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : tensors) {
    const uint64_t n = entry_bytes(e);
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  return h.dump();
}

Status write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::string header = safetensors_header(tensors, metadata);
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    return make_error(ErrorCode::kIo, "%s: cannot create: %s", path.c_str(), std::strerror(errno));
  }
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const SafetensorsEntry& e : tensors) {
    if (!ok) break;
    const uint64_t n = entry_bytes(e);
    const void* p = e.data ? e.data : e.owned.data();
    ok = n == 0 || std::fwrite(p, 1, n, f) == n;
  }
  const int err = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    return make_error(err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIo, "%s: write failed: %s",
                      path.c_str(), std::strerror(err));
  }
  return {};
}

}  // namespace loom
