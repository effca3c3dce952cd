// loom_vulkan_bench: prefill and decode speed of the Vulkan backend on a model
// file or a synthetic model, with the GPU time of every shader variant
// (timestamp queries). A program that prints figures, not a test.
//
//   loom_vulkan_bench MODEL.gguf [n_prompt] [n_gen]
//   loom_vulkan_bench --synth PRESET DTYPE [n_prompt] [n_gen]   (writes
//   /tmp/loom-bench-PRESET-DTYPE.gguf)
//   --cpu also runs the CPU backend on the same prompt and compares the logits.
//   --sweep "WG,UNROLL,GROUPS,ROWS,TPR;..." then times decode again with each
//   single-token matvec tuning (0 = the default; see VulkanBackend::set_matvec_tuning).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/vulkan/vulkan_backend.h"
#include "engine/model/synth.h"
#include "engine/runtime/forward.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double nerr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool with_cpu = false, profile = true;
  uint32_t rows = 0;
  std::string sweep;
  for (size_t i = 0; i < args.size();) {
    if (args[i] == "--sweep" && i + 1 < args.size()) {
      sweep = args[i + 1];
      args.erase(args.begin() + static_cast<ptrdiff_t>(i),
                 args.begin() + static_cast<ptrdiff_t>(i) + 2);
      continue;
    }
    if (args[i] == "--cpu") {
      with_cpu = true;
    } else if (args[i] == "--no-profile") {
      profile = false;
    } else if (args[i] == "--rows" && i + 1 < args.size()) {
      rows = static_cast<uint32_t>(std::stoul(args[i + 1]));
      args.erase(args.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
      continue;
    }
    args.erase(args.begin() + static_cast<ptrdiff_t>(i));
  }
  if (args.empty()) {
    std::fprintf(stderr,
                 "usage: loom_vulkan_bench MODEL.gguf|--synth PRESET DTYPE [n_prompt] [n_gen] "
                 "[--cpu] [--no-profile]\n");
    return 2;
  }
  std::string path;
  size_t next = 1;
  if (args[0] == "--synth") {
    if (args.size() < 3) return 2;
    SynthSpec s;
    if (!apply_synth_preset(args[1], &s).ok()) {
      std::fprintf(stderr, "unknown preset %s\n", args[1].c_str());
      return 2;
    }
    s.weight_type = args[2];
    path = "/tmp/loom-bench-" + args[1] + "-" + args[2] + ".gguf";
    if (!load_model(path).ok()) {  // not written yet (or unreadable): write it
      const auto t0 = Clock::now();
      auto r = write_synthetic_model(s, path);
      if (!r.ok()) {
        std::fprintf(stderr, "synth: %s\n", r.message().c_str());
        return 1;
      }
      std::printf("synthesized %s (%.2f GB) in %.1f s\n", path.c_str(), r->n_bytes / 1e9,
                  ms_since(t0) / 1e3);
    }
    next = 3;
  } else {
    path = args[0];
  }
  const int64_t n_prompt = args.size() > next ? std::stoll(args[next]) : 512;
  const int64_t n_gen = args.size() > next + 1 ? std::stoll(args[next + 1]) : 128;

  auto m = load_model(path);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.message().c_str());
    return 1;
  }
  const Model& model = **m;
  VulkanOptions o;
  o.profile = profile;
  o.matvec_rows = rows;
  auto be = VulkanBackend::create(o);
  if (!be.ok()) {
    std::fprintf(stderr, "vulkan: %s\n", be.message().c_str());
    return 1;
  }
  const VulkanDeviceInfo& di = (*be)->device_info();
  if (rows) std::printf("matvec rows per row group: %u\n", rows);
  std::printf("model: %s\ndevice: %s (%s, %s), subgroup %u%s%s\n", model.describe().c_str(),
              di.name.c_str(), di.type.c_str(), di.driver.c_str(), di.subgroup_size,
              (*be)->caps().subgroup_arithmetic ? ", subgroup ops" : "",
              (*be)->caps().f16_storage ? ", 16-bit storage" : "");

  const int64_t n_ctx = n_prompt + n_gen + 8;
  KvCacheConfig kc{model.hp.n_layer, model.hp.n_head_kv, model.hp.head_dim, n_ctx, 32, DType::kF16};
  auto kv = KvCache::create(kc);
  if (!kv.ok()) return 1;
  ForwardPass fwd(model, **be, **kv, 512);
  auto t0 = Clock::now();
  Status st = fwd.prepare();
  if (!st.ok()) {
    std::fprintf(stderr, "prepare: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("upload: %.1f s, %.2f GB of device memory\n", ms_since(t0) / 1e3,
              (*be)->device_bytes() / 1e9);
  for (const auto& n : fwd.notes()) std::printf("note: %s\n", n.c_str());

  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (int64_t i = 0; i < n_prompt; ++i)
    prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % model.hp.n_vocab);
  std::vector<float> logits(static_cast<size_t>(model.hp.n_vocab));

  // Warm-up: pipelines are created on first use.
  if (!fwd.eval(std::span<const int32_t>(prompt.data(), std::min<int64_t>(n_prompt, 16)), 0,
                logits.data())
           .ok())
    return 1;
  (*kv)->clear();
  (*be)->reset_gpu_times();

  t0 = Clock::now();
  st = fwd.eval(prompt, 0, logits.data());
  const double prefill_ms = ms_since(t0);
  if (!st.ok()) {
    std::fprintf(stderr, "prefill: %s\n", st.message().c_str());
    return 1;
  }
  const std::vector<float> prefill_logits = logits;
  auto prefill_times = (*be)->gpu_times();
  (*be)->reset_gpu_times();
  const uint64_t subs0 = (*be)->submissions();
  std::vector<int32_t> generated;
  t0 = Clock::now();
  for (int64_t i = 0; i < n_gen; ++i) {
    const int32_t tok =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    generated.push_back(tok);
    st = fwd.eval(std::span<const int32_t>(&tok, 1), n_prompt + i, logits.data());
    if (!st.ok()) {
      std::fprintf(stderr, "decode: %s\n", st.message().c_str());
      return 1;
    }
  }
  const double decode_ms = ms_since(t0);
  std::printf("prefill: %lld tokens in %.1f ms = %.1f tokens/s\n", static_cast<long long>(n_prompt),
              prefill_ms, n_prompt / prefill_ms * 1e3);
  std::printf(
      "decode:  %lld tokens in %.1f ms = %.1f tokens/s (%.3f ms/token, %.1f submissions/token)\n",
      static_cast<long long>(n_gen), decode_ms, n_gen / decode_ms * 1e3, decode_ms / n_gen,
      double((*be)->submissions() - subs0) / n_gen);
  auto print_times = [](const char* what, const std::vector<GpuOpTime>& times, double per) {
    double total = 0;
    for (const auto& t : times) total += t.ms;
    std::printf("%s GPU time by shader (sum %.2f ms per %s):\n", what, total / per,
                per == 1 ? "run" : "token");
    for (const auto& t : times) {
      std::printf("  %-22s %9.3f ms %7llu calls %8.1f us/call\n", t.name.c_str(), t.ms / per,
                  static_cast<unsigned long long>(t.calls), t.ms * 1e3 / t.calls);
    }
  };
  if (profile) {
    print_times("prefill", prefill_times, 1);
    print_times("decode", (*be)->gpu_times(), static_cast<double>(n_gen));
  }

  // Decode again under each matvec tuning of --sweep.
  for (size_t at = 0; !sweep.empty() && at != std::string::npos;) {
    const size_t semi = sweep.find(';', at);
    const std::string item =
        sweep.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
    at = semi == std::string::npos ? semi : semi + 1;
    uint32_t v[5] = {0, 0, 0, 0, 0};
    if (std::sscanf(item.c_str(), "%u,%u,%u,%u,%u", &v[0], &v[1], &v[2], &v[3], &v[4]) < 1)
      continue;
    (*be)->set_matvec_tuning(VulkanBackend::MatvecTuning{v[0], v[1], v[2]});
    (*be)->set_matvec_rows(v[3]);
    (*be)->set_matvec_threads_per_row(v[4]);
    int32_t tok = 1;
    for (int rep = 0; rep < 2; ++rep) {  // the first pass makes the pipelines
      (*be)->reset_gpu_times();
      (*kv)->set_n_tokens(n_prompt);  // decode the same positions again
      t0 = Clock::now();
      for (int64_t i = 0; i < n_gen; ++i) {
        const Status e = fwd.eval(std::span<const int32_t>(&tok, 1), n_prompt + i, logits.data());
        if (!e.ok()) {
          std::fprintf(stderr, "sweep decode: %s\n", e.message().c_str());
          return 1;
        }
      }
    }
    const double ms = ms_since(t0) / n_gen;
    double mv = 0;
    std::string shapes;  // " label=us/call" per matvec shape
    for (const auto& t : (*be)->gpu_times()) {
      if (t.name.rfind("matvec1", 0) != 0) continue;
      mv += t.ms;
      char b[96];
      std::snprintf(b, sizeof b, " [%s]=%.1f", t.name.c_str(), t.ms * 1e3 / t.calls);
      shapes += b;
    }
    std::printf(
        "sweep wg,unroll,groups,rows,tpr = %-16s decode %.3f ms/token = %6.1f tokens/s, matvec1 "
        "GPU %.3f ms/token; us/call:%s\n",
        item.c_str(), ms, 1e3 / ms, mv / n_gen, shapes.c_str());
  }

  if (with_cpu) {
    CpuBackend cpu(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    auto ckv = KvCache::create(kc);
    ForwardPass cf(model, cpu, **ckv, 512);
    std::vector<float> cl(logits.size());
    if (!cf.eval(prompt, 0, cl.data()).ok()) return 1;
    std::printf("cpu vs vulkan, prefill logits: normalized difference %.2e\n",
                nerr(prefill_logits, cl));
    int64_t same = 0;
    for (int64_t i = 0; i < n_gen; ++i) {
      const int32_t tok = static_cast<int32_t>(std::max_element(cl.begin(), cl.end()) - cl.begin());
      if (tok != generated[static_cast<size_t>(i)]) break;
      ++same;
      if (!cf.eval(std::span<const int32_t>(&tok, 1), n_prompt + i, cl.data()).ok()) return 1;
    }
    std::printf("cpu vs vulkan, greedy: the first %lld of %lld tokens agree\n",
                static_cast<long long>(same), static_cast<long long>(n_gen));
  }
  return 0;
}
