// `loom models`: the GGUF files and Hugging Face folders already on this
// machine (engine/model/discovery.h), as a table or as JSON.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/model/discovery.h"
#include "tools/loom/commands.h"

namespace loom::cli {

int cmd_models(const ModelsOptions& o) {
  DiscoveryOptions d = DiscoveryOptions::from_environment();
  d.extra_dirs = o.dirs;
  d.standard_places = !o.only_dirs;
  const auto found = discover_models(d);
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const FoundModel& m : found) {
      out.push_back({{"name", m.name},
                     {"path", m.path},
                     {"format", m.format},
                     {"source", m.source},
                     {"arch", m.arch},
                     {"quant", m.quant},
                     {"size_bytes", m.size_bytes},
                     {"error", m.error}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  const auto places = model_places(d);
  if (places.empty()) {
    std::printf(
        "No model folders here (looked for the Hugging Face cache, LM Studio, Ollama and "
        "llama.cpp's cache; add one with --dir).\n");
    return 0;
  }
  std::printf("Looked in:\n");
  for (const ModelPlace& p : places) std::printf("  %-18s %s\n", p.source.c_str(), p.dir.c_str());
  if (found.empty()) {
    std::printf("\nNo GGUF files or Hugging Face model folders there.\n");
    return 0;
  }
  std::printf("\n%-36s %-8s %-8s %9s  %-18s %s\n", "NAME", "ARCH", "QUANT", "SIZE", "SOURCE",
              "PATH");
  for (const FoundModel& m : found) {
    std::printf("%-36s %-8s %-8s %9s  %-18s %s\n", m.name.c_str(),
                m.arch.empty() ? "?" : m.arch.c_str(), m.quant.empty() ? "?" : m.quant.c_str(),
                format_model_size(m.size_bytes).c_str(), m.source.c_str(), m.path.c_str());
    if (!m.error.empty()) std::printf("  cannot be read: %s\n", m.error.c_str());
  }
  std::printf("\n%zu model%s. Open one with: loom run -m PATH\n", found.size(),
              found.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace loom::cli
