// `loom info FILE|DIR`: what a GGUF file or a Hugging Face folder holds,
// without reading any weights.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "engine/model/gguf.h"
#include "engine/model/hf_model.h"
#include "engine/tokenizer/vocab.h"
#include "tools/loom/commands.h"

namespace loom::cli {
namespace {

std::string human_bytes(uint64_t b) {
  char buf[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string value_string(const GgufValue& v) {
  char buf[64];
  switch (v.type) {
    case GgufType::kString:
      return v.s.size() > 80 ? "\"" + v.s.substr(0, 77) + "...\"" : "\"" + v.s + "\"";
    case GgufType::kF32:
    case GgufType::kF64: std::snprintf(buf, sizeof buf, "%g", v.f); return buf;
    case GgufType::kBool: return v.i ? "true" : "false";
    case GgufType::kU64:
      std::snprintf(buf, sizeof buf, "%" PRIu64, static_cast<uint64_t>(v.i));
      return buf;
    case GgufType::kArray:
      std::snprintf(buf, sizeof buf, "[%s × %" PRIu64 "]", gguf_type_name(v.elem_type),
                    v.array_size());
      return buf;
    default: std::snprintf(buf, sizeof buf, "%" PRId64, v.i); return buf;
  }
}

}  // namespace

int cmd_info(const InfoOptions& o) {
  // A Hugging Face folder is shown through the same GGUF view the engine
  // loads it as (GGUF keys and tensor names; --tensors gives each one's origin).
  std::unique_ptr<GgufFile> file;
  std::optional<HfFolder> hf;
  if (is_hf_folder(o.model)) {
    auto opened = open_hf_folder(o.model);
    if (!opened.ok()) {
      std::fprintf(stderr, "loom info: %s\n", opened.message().c_str());
      return 1;
    }
    hf = std::move(opened).value();
    file = std::move(hf->file);
  } else {
    auto opened = GgufFile::open(o.model);
    if (!opened.ok()) {
      std::fprintf(stderr, "loom info: %s\n", opened.message().c_str());
      return 1;
    }
    file = std::move(opened).value();
  }
  const GgufFile& f = *file;
  const std::string arch = f.architecture();

  std::printf("file:          %s\n", f.path().c_str());
  if (hf) {
    std::printf("format:        Hugging Face folder, %s of safetensors\n",
                human_bytes(f.file_size()).c_str());
  } else {
    std::printf("format:        GGUF v%u, %s, alignment %u, data at byte %" PRIu64 "\n",
                f.version(), human_bytes(f.file_size()).c_str(), f.alignment(), f.data_offset());
  }
  if (const GgufValue* n = f.find("general.name"); n && n->type == GgufType::kString) {
    std::printf("name:          %s\n", n->s.c_str());
  }
  std::printf("architecture:  %s\n", arch.empty() ? "(none)" : arch.c_str());

  // Hyper-parameters: every "<arch>.*" scalar key.
  if (!arch.empty()) {
    std::printf("hyper-parameters:\n");
    const std::string prefix = arch + ".";
    for (const auto& [key, v] : f.metadata()) {
      if (key.compare(0, prefix.size(), prefix) != 0) continue;
      std::printf("  %-40s %s\n", key.substr(prefix.size()).c_str(), value_string(v).c_str());
    }
  }

  // Tensors: count, parameters and bytes per dtype.
  std::map<std::string, std::pair<uint64_t, uint64_t>> per_dtype;  // name -> (tensors, bytes)
  uint64_t n_params = 0, n_bytes = 0;
  for (const GgufTensor& t : f.tensors()) {
    auto& e = per_dtype[std::string(dtype_name(t.dtype))];
    e.first += 1;
    e.second += t.n_bytes;
    n_params += t.n_elements();
    n_bytes += t.n_bytes;
  }
  std::printf("tensors:       %zu, %.3f M parameters, %s\n", f.tensors().size(),
              static_cast<double>(n_params) / 1e6, human_bytes(n_bytes).c_str());
  for (const auto& [name, e] : per_dtype) {
    std::printf("  %-8s %6" PRIu64 " tensors  %12s\n", name.c_str(), e.first,
                human_bytes(e.second).c_str());
  }

  // Tokenizer.
  const GgufValue* model = f.find("tokenizer.ggml.model");
  const GgufValue* pre = f.find("tokenizer.ggml.pre");
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (hf) {
    std::printf(
        "tokenizer:     tokenizer.json, %s, %d tokens, %d merges\n",
        hf->vocab.model() == TokenizerModel::kBpe ? "byte-level BPE" : "SentencePiece-style BPE",
        hf->vocab.n_tokens(), hf->vocab.n_merges());
    for (const std::string& n : hf->notes) std::printf("  note: %s\n", n.c_str());
  } else if (model && model->type == GgufType::kString) {
    std::printf("tokenizer:     %s", model->s.c_str());
    if (pre && pre->type == GgufType::kString) std::printf(" (pre: %s)", pre->s.c_str());
    if (tokens && tokens->is_array()) std::printf(", %" PRIu64 " tokens", tokens->array_size());
    std::printf("\n");
  } else {
    std::printf("tokenizer:     (none)\n");
  }
  const GgufValue* tmpl = f.find("tokenizer.chat_template");
  const bool has_tmpl = hf ? !hf->chat_template.empty() : tmpl && tmpl->type == GgufType::kString;
  std::printf("chat template: %s\n", has_tmpl ? "present" : "absent");

  if (o.list_metadata) {
    std::printf("metadata (%zu keys):\n", f.metadata().size());
    for (const auto& [key, v] : f.metadata())
      std::printf("  %-48s %s\n", key.c_str(), value_string(v).c_str());
  }
  if (o.list_tensors) {
    std::printf("tensor list:\n");
    for (const GgufTensor& t : f.tensors()) {
      if (!t.origin.empty()) {  // an HF tensor: its file and name, its absolute offset
        std::printf("  %-40s %-6s %-22s %12s  %s @%" PRIu64 "\n", t.name.c_str(),
                    std::string(dtype_name(t.dtype)).c_str(), t.shape_string().c_str(),
                    human_bytes(t.n_bytes).c_str(), t.origin.c_str(), t.offset);
        continue;
      }
      std::printf("  %-40s %-6s %-22s %12s  @%" PRIu64 "\n", t.name.c_str(),
                  std::string(dtype_name(t.dtype)).c_str(), t.shape_string().c_str(),
                  human_bytes(t.n_bytes).c_str(), f.data_offset() + t.offset);
    }
  }
  return 0;
}

}  // namespace loom::cli
