// `loom synth`: writes a synthetic (random-weight) model as GGUF, or as a
// Hugging Face folder (--format safetensors: written as GGUF next to it first,
// then converted by engine/model/hf_export.h).
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "engine/model/hf_export.h"
#include "engine/model/synth.h"
#include "tools/loom/commands.h"

namespace loom::cli {

int cmd_synth(const SynthOptions& o) {
  SynthSpec spec;
  if (!o.preset.empty()) {
    Status s = apply_synth_preset(o.preset, &spec);
    if (!s.ok()) {
      std::fprintf(stderr, "loom synth: %s\n", s.message().c_str());
      return 2;
    }
  }
  // Explicit options override the preset.
  if (o.preset.empty() || o.set_arch) spec.arch = o.arch;
  if (o.preset.empty() || o.set_layers) spec.n_layer = o.layers;
  if (o.preset.empty() || o.set_dim) spec.n_embd = o.dim;
  if (o.preset.empty() || o.set_ffn) spec.n_ff = o.ffn;
  if (o.preset.empty() || o.set_heads) spec.n_head = o.heads;
  if (o.preset.empty() || o.set_kv_heads) spec.n_head_kv = o.kv_heads;
  if (o.preset.empty() || o.set_vocab) spec.n_vocab = o.vocab;
  if (o.preset.empty() || o.set_ctx) spec.n_ctx = o.ctx;
  if (!o.vocab_from.empty() && !o.set_vocab) spec.n_vocab = 0;  // take the given tokenizer's size
  if (o.sliding_window > 0) spec.sliding_window = o.sliding_window;
  if (o.tied) spec.tied_output = true;
  spec.weight_type = o.dtype;
  spec.seed = o.seed;
  spec.vocab_from = o.vocab_from;

  const auto t0 = std::chrono::steady_clock::now();
  int last_pct = -1;
  auto progress = [&](uint64_t done, uint64_t total) {
    int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (pct / 10 != last_pct / 10 && total > (64u << 20)) {
      std::fprintf(stderr, "\rloom synth: %3d%%", pct);
      std::fflush(stderr);
    }
    last_pct = pct;
  };
  if (o.format != "gguf" && o.format != "safetensors") {
    std::fprintf(stderr, "loom synth: --format %s: expected gguf or safetensors\n",
                 o.format.c_str());
    return 2;
  }
  const bool hf = o.format == "safetensors";
  std::error_code ec;
  if (hf) std::filesystem::create_directories(o.out, ec);
  const std::string gguf_path = hf ? o.out + "/.loom-synth.gguf" : o.out;
  auto r = write_synthetic_model(spec, gguf_path, progress);
  if (r.ok() && hf) {
    HfExportOptions eo;
    eo.shard_bytes = o.shard_mib << 20;
    Status s = write_hf_folder(gguf_path, o.out, eo);
    std::filesystem::remove(gguf_path, ec);
    if (!s.ok()) r = s.error();
  }
  if (!r.ok()) {
    std::fprintf(stderr, "\nloom synth: %s\n", r.message().c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& n : r->notes) std::fprintf(stderr, "loom synth: note: %s\n", n.c_str());
  std::fprintf(stderr,
               "%sloom synth: wrote %s: %s, %lld layers, %.2f M parameters, %lld tokens, %.1f MiB "
               "in %.1f s\n",
               last_pct >= 0 && r->file_bytes > (64u << 20) ? "\n" : "", o.out.c_str(),
               spec.arch.c_str(), static_cast<long long>(spec.n_layer),
               static_cast<double>(r->n_params) / 1e6, static_cast<long long>(r->n_vocab),
               static_cast<double>(r->file_bytes) / (1024.0 * 1024.0), secs);
  return 0;
}

}  // namespace loom::cli
