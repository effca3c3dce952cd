// Models already on the machine: GGUF files and Hugging Face folders in the
// places other local-LLM tools keep them (the Hugging Face hub cache, LM
// Studio, Ollama, llama.cpp's cache) and in folders the user adds. What
// `loom models` and the app's start screen list. Only headers are read (a
// GGUF's metadata and tensor table, a folder's config.json): listing is fast
// and loads nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct FoundModel {
  std::string path;    ///< a GGUF file, or a Hugging Face model folder
  std::string format;  ///< "gguf" or "hf"
  std::string source;  ///< "Hugging Face cache", "LM Studio", "Ollama", "llama.cpp cache", "folder"
  std::string name;    ///< general.name, the repository ("org/name"), or Ollama's "name:tag"
  std::string arch;    ///< llama, qwen2, phi3... (empty when unreadable)
  std::string quant;   ///< Q4_K_M, Q8_0, F16, BF16... (the file type, or the largest dtype)
  uint64_t size_bytes = 0;  ///< the file, or a folder's safetensors together
  std::string error;        ///< non-empty: listed, but its header could not be read (why)
};

/// One place searched, and what kind of place it is.
struct ModelPlace {
  std::string source;
  std::string dir;
};

struct DiscoveryOptions {
  std::string home;  ///< the user's home folder (standard places are under it)
  /// Environment overrides, as the tools themselves read them (empty: unset).
  std::string hf_hub_cache, hf_home, xdg_cache_home, lmstudio_home, ollama_models, llama_cache;
  std::vector<std::string> extra_dirs;  ///< folders the user added (searched 3 levels deep)
  bool standard_places = true;          ///< false: only extra_dirs
  size_t max_models = 2000;             ///< stop after this many

  /// Home and overrides from this process's environment (HOME, HF_HUB_CACHE,
  /// HF_HOME, XDG_CACHE_HOME, LMSTUDIO_HOME, OLLAMA_MODELS, LLAMA_CACHE).
  static DiscoveryOptions from_environment();
};

/// The places discover_models() looks in (those that exist).
std::vector<ModelPlace> model_places(const DiscoveryOptions& o);

/// Every model found, sorted by name; a path reached from two places is listed once.
std::vector<FoundModel> discover_models(const DiscoveryOptions& o);

/// What a GGUF file or model folder is, from its header alone (`error` set
/// when it cannot be read).
FoundModel describe_model_path(const std::string& path, const std::string& source);

/// "1.2 GiB", "640 MiB".
std::string format_model_size(uint64_t bytes);

}  // namespace loom
