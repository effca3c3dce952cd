// `loom convert`: a GGUF file or Hugging Face folder to a GGUF file, each
// matrix in --dtype or in the precision a placement's op group names
// (--plan); streaming (engine/model/convert.h). Prints the tensors per
// dtype, the bytes, the time and the peak resident memory.
#include <chrono>
#include <cstdio>

#include "engine/model/convert.h"
#include "engine/placement/placement.h"
#include "tools/loom/engine_setup.h"

namespace loom::cli {

int cmd_convert(const ConvertCliOptions& o) {
  const char* who = "loom convert";
  ConvertOptions co;
  co.input = o.input;
  co.output = o.output;
  if (!o.dtype.empty() && o.dtype != "keep") {
    auto d = dtype_from_name(o.dtype);
    if (!d) {
      std::fprintf(stderr, "%s: unknown dtype '%s' (f32 f16 bf16 q8_0 q4_0 q4_k ...)\n", who,
                   o.dtype.c_str());
      return 1;
    }
    co.dtype = *d;
  }
  Placement plan;
  if (!o.plan.empty()) {
    auto n = model_block_count(o.input);
    if (!n.ok()) {
      std::fprintf(stderr, "%s: %s\n", who, n.message().c_str());
      return 1;
    }
    auto p = Placement::load(o.plan, *n);
    if (!p.ok()) {
      std::fprintf(stderr, "%s: %s\n", who, p.message().c_str());
      return 1;
    }
    plan = std::move(p).value();
    co.dtype_for = [&plan](const std::string& name) {
      return placement_dtype_for_tensor(plan, name);
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  int last_pct = -1;
  co.progress = [&](uint64_t done, uint64_t total) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (o.progress && pct / 10 != last_pct / 10) {
      std::fprintf(stderr, "%s: %d%%\n", who, pct);
      last_pct = pct;
    }
    return true;
  };
  auto r = convert_model(co);
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, r.message().c_str());
    return 1;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& n : r->notes) std::fprintf(stderr, "%s: note: %s\n", who, n.c_str());
  std::string types;
  for (const auto& [d, n] : r->by_dtype)
    types += (types.empty() ? "" : ", ") + std::to_string(n) + " " + std::string(dtype_name(d));
  std::printf(
      "%s: wrote %s: %lld tensors (%s), %.1f MiB -> %.1f MiB in %.1f s, peak RSS %.1f MiB\n", who,
      o.output.c_str(), static_cast<long long>(r->n_tensors), types.c_str(),
      static_cast<double>(r->bytes_in) / 1048576.0, static_cast<double>(r->bytes_out) / 1048576.0,
      s, static_cast<double>(peak_rss_bytes()) / 1048576.0);
  return 0;
}

}  // namespace loom::cli
