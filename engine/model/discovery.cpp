#include "engine/model/discovery.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "engine/core/dtype.h"
#include "engine/model/gguf.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool has_ext(const fs::path& p, const char* ext) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e == ext;
}

// A split GGUF's later parts ("-00002-of-00003.gguf") are not models of their own.
bool later_split_part(const std::string& file) {
  const auto of = file.rfind("-of-");
  if (of == std::string::npos || of < 6) return false;
  const std::string part = file.substr(of - 5, 5);
  return std::all_of(part.begin(), part.end(), ::isdigit) && part != "00001";
}

// llama.cpp's general.file_type numbers (a fact of the GGUF convention).
std::string file_type_name(int64_t ft) {
  static const std::map<int64_t, const char*> names = {
      {0, "F32"},      {1, "F16"},      {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},
      {8, "Q5_0"},     {9, "Q5_1"},     {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"},
      {13, "Q3_K_L"},  {14, "Q4_K_S"},  {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"},
      {18, "Q6_K"},    {19, "IQ2_XXS"}, {20, "IQ2_XS"}, {21, "Q2_K_S"}, {22, "IQ3_XS"},
      {23, "IQ3_XXS"}, {24, "IQ1_S"},   {25, "IQ4_NL"}, {26, "IQ3_S"},  {27, "IQ3_M"},
      {28, "IQ2_S"},   {29, "IQ2_M"},   {30, "IQ4_XS"}, {31, "IQ1_M"},  {32, "BF16"},
  };
  const auto it = names.find(ft);
  return it == names.end() ? std::string() : it->second;
}

uint64_t size_of(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);  // follows symlinks (the HF cache's blobs)
  return ec ? 0 : static_cast<uint64_t>(n);
}

FoundModel describe_gguf(const fs::path& p, const std::string& source) {
  FoundModel m;
  m.path = p.string();
  m.format = "gguf";
  m.source = source;
  m.size_bytes = size_of(p);
  m.name = p.stem().string();
  auto f = GgufFile::open(m.path);
  if (!f.ok()) {
    m.error = f.message();
    return m;
  }
  const GgufFile& g = **f;
  m.arch = g.architecture();
  if (auto n = g.get_string("general.name"); n.ok() && *n && !(*n)->empty()) m.name = **n;
  if (auto ft = g.get_int("general.file_type"); ft.ok() && *ft) m.quant = file_type_name(**ft);
  if (m.quant.empty()) {
    // The dtype holding most of the matrices' bytes.
    std::map<std::string, uint64_t> bytes;
    for (const GgufTensor& t : g.tensors()) {
      if (t.n_dims >= 2) bytes[std::string(dtype_name(t.dtype))] += t.n_bytes;
    }
    uint64_t best = 0;
    for (const auto& [name, n] : bytes) {
      if (n > best) {
        best = n;
        m.quant = name;
      }
    }
  }
  return m;
}

bool is_hf_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "config.json", ec)) return false;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (has_ext(it->path(), ".safetensors")) return true;
  }
  return false;
}

FoundModel describe_hf(const fs::path& dir, const std::string& source, const std::string& name) {
  FoundModel m;
  m.path = dir.string();
  m.format = "hf";
  m.source = source;
  m.name = name.empty() ? dir.filename().string() : name;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (has_ext(it->path(), ".safetensors")) m.size_bytes += size_of(it->path());
  }
  std::ifstream in(dir / "config.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    m.error = (dir / "config.json").string() + ": not a JSON object";
    return m;
  }
  if (j.contains("model_type") && j["model_type"].is_string()) m.arch = j["model_type"];
  std::string dt;
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) dt = j["torch_dtype"];
  if (dt.empty() && j.contains("dtype") && j["dtype"].is_string()) dt = j["dtype"];
  if (dt == "bfloat16") m.quant = "BF16";
  if (dt == "float16") m.quant = "F16";
  if (dt == "float32") m.quant = "F32";
  return m;
}

struct Walker {
  const DiscoveryOptions& o;
  std::vector<FoundModel> found;
  std::set<std::string> seen;  // canonical paths

  bool full() const { return found.size() >= o.max_models; }

  void add(FoundModel m) {
    std::error_code ec;
    const fs::path canon = fs::weakly_canonical(m.path, ec);
    if (!seen.insert(ec ? m.path : canon.string()).second) return;
    found.push_back(std::move(m));
  }

  // GGUF files and HF folders under `dir`, `depth` levels down.
  void scan(const fs::path& dir, const std::string& source, int depth) {
    if (full() || !is_dir(dir)) return;
    if (is_hf_folder(dir)) add(describe_hf(dir, source, {}));
    std::error_code ec;
    std::vector<fs::path> subdirs;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end && !full(); it.increment(ec)) {
      const fs::path& p = it->path();
      const std::string file = p.filename().string();
      if (!file.empty() && file[0] == '.') continue;
      std::error_code e2;
      if (it->is_directory(e2)) {
        subdirs.push_back(p);
      } else if (has_ext(p, ".gguf") && !later_split_part(file)) {
        add(describe_gguf(p, source));
      }
    }
    if (depth <= 0) return;
    std::sort(subdirs.begin(), subdirs.end());
    for (const fs::path& d : subdirs) scan(d, source, depth - 1);
  }

  // The hub cache: models--org--name/snapshots/<revision>/; the revision refs/main names.
  void scan_hf_cache(const fs::path& hub) {
    std::error_code ec;
    for (fs::directory_iterator it(hub, ec), end; !ec && it != end && !full(); it.increment(ec)) {
      const std::string dir = it->path().filename().string();
      if (dir.rfind("models--", 0) != 0) continue;
      std::string repo = dir.substr(8);
      if (const auto sep = repo.find("--"); sep != std::string::npos) repo.replace(sep, 2, "/");
      const fs::path snaps = it->path() / "snapshots";
      fs::path snap;
      std::string rev;
      std::ifstream ref(it->path() / "refs" / "main");
      if (ref && std::getline(ref, rev) && is_dir(snaps / rev)) {
        snap = snaps / rev;
      } else {  // no refs/main: the newest snapshot
        fs::file_time_type newest{};
        std::error_code e2;
        for (fs::directory_iterator s(snaps, e2), send; !e2 && s != send; s.increment(e2)) {
          std::error_code e3;
          const auto t = fs::last_write_time(s->path(), e3);
          if (!e3 && (snap.empty() || t > newest)) {
            newest = t;
            snap = s->path();
          }
        }
      }
      if (snap.empty()) continue;
      if (is_hf_folder(snap)) add(describe_hf(snap, "Hugging Face cache", repo));
      std::error_code e4;
      for (fs::recursive_directory_iterator f(snap, e4), fend; !e4 && f != fend && !full();
           f.increment(e4)) {
        const std::string file = f->path().filename().string();
        if (has_ext(f->path(), ".gguf") && !later_split_part(file)) {
          FoundModel m = describe_gguf(f->path(), "Hugging Face cache");
          if (m.error.empty() && m.name == f->path().stem().string()) m.name = repo + ": " + file;
          add(std::move(m));
        }
      }
    }
  }

  // Ollama: manifests/<registry>/<namespace>/<model>/<tag> (JSON) name their
  // model layer by digest; the blob is blobs/sha256-<hex>, a GGUF file.
  void scan_ollama(const fs::path& root) {
    const fs::path manifests = root / "manifests";
    std::error_code ec;
    for (fs::recursive_directory_iterator it(manifests, ec), end; !ec && it != end && !full();
         it.increment(ec)) {
      std::error_code e2;
      if (!it->is_regular_file(e2)) continue;
      const fs::path rel = fs::relative(it->path(), manifests, e2);
      std::vector<std::string> parts;
      for (const auto& part : rel) parts.push_back(part.string());
      if (parts.size() < 4) continue;  // registry/namespace/model/tag
      const std::string& ns = parts[parts.size() - 3];
      std::string name = parts[parts.size() - 2] + ":" + parts.back();
      if (ns != "library") name = ns + "/" + name;
      std::ifstream in(it->path());
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array()) continue;
      for (const auto& layer : j["layers"]) {
        if (!layer.is_object() ||
            layer.value("mediaType", "") != "application/vnd.ollama.image.model")
          continue;
        std::string digest = layer.value("digest", "");
        if (const auto colon = digest.find(':'); colon != std::string::npos) digest[colon] = '-';
        // A digest is hex: nothing in it may leave the blobs folder.
        if (digest.empty() || digest.find('/') != std::string::npos ||
            digest.find("..") != std::string::npos)
          continue;
        const fs::path blob = root / "blobs" / digest;
        FoundModel m = describe_gguf(blob, "Ollama");
        if (!fs::exists(blob, e2)) m.error = "the manifest names a blob that is missing: " + digest;
        m.name = name;
        add(std::move(m));
      }
    }
  }
};

}  // namespace

DiscoveryOptions DiscoveryOptions::from_environment() {
  DiscoveryOptions o;
  o.home = env("HOME");
  o.hf_hub_cache = env("HF_HUB_CACHE");
  o.hf_home = env("HF_HOME");
  o.xdg_cache_home = env("XDG_CACHE_HOME");
  o.lmstudio_home = env("LMSTUDIO_HOME");
  o.ollama_models = env("OLLAMA_MODELS");
  o.llama_cache = env("LLAMA_CACHE");
  return o;
}

std::vector<ModelPlace> model_places(const DiscoveryOptions& o) {
  std::vector<ModelPlace> out;
  auto add = [&](const char* source, const fs::path& dir) {
    if (dir.empty() || !is_dir(dir)) return;
    for (const auto& p : out) {
      if (p.dir == dir.string()) return;
    }
    out.push_back({source, dir.string()});
  };
  if (o.standard_places) {
    const fs::path home = o.home;
    const fs::path cache = !o.xdg_cache_home.empty() ? fs::path(o.xdg_cache_home)
                           : home.empty()            ? fs::path()
                                                     : home / ".cache";
    const fs::path hub = !o.hf_hub_cache.empty() ? fs::path(o.hf_hub_cache)
                         : !o.hf_home.empty()    ? fs::path(o.hf_home) / "hub"
                         : cache.empty()         ? fs::path()
                                                 : cache / "huggingface" / "hub";
    add("Hugging Face cache", hub);
    if (!o.lmstudio_home.empty()) add("LM Studio", fs::path(o.lmstudio_home) / "models");
    if (!home.empty()) add("LM Studio", home / ".lmstudio" / "models");
    if (!cache.empty()) add("LM Studio", cache / "lm-studio" / "models");
    if (!o.ollama_models.empty()) add("Ollama", o.ollama_models);
    if (!home.empty()) add("Ollama", home / ".ollama" / "models");
    add("Ollama", "/usr/share/ollama/.ollama/models");
    if (!o.llama_cache.empty()) add("llama.cpp cache", o.llama_cache);
    if (!cache.empty()) add("llama.cpp cache", cache / "llama.cpp");
  }
  for (const auto& d : o.extra_dirs) add("folder", d);
  return out;
}

std::vector<FoundModel> discover_models(const DiscoveryOptions& o) {
  Walker w{o, {}, {}};
  for (const ModelPlace& p : model_places(o)) {
    if (p.source == "Hugging Face cache") {
      w.scan_hf_cache(p.dir);
    } else if (p.source == "Ollama") {
      w.scan_ollama(p.dir);
    } else {
      w.scan(p.dir, p.source, p.source == "llama.cpp cache" ? 0 : 3);
    }
  }
  std::sort(w.found.begin(), w.found.end(), [](const FoundModel& a, const FoundModel& b) {
    return a.name != b.name ? a.name < b.name : a.path < b.path;
  });
  return w.found;
}

FoundModel describe_model_path(const std::string& path, const std::string& source) {
  if (is_dir(path)) return describe_hf(path, source, {});
  return describe_gguf(path, source);
}

std::string format_model_size(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(bytes) / (1ull << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.0f KiB", static_cast<double>(bytes) / 1024.0);
  }
  return buf;
}

}  // namespace loom
