// `loom loadtest --url URL`: the three-phase load test (tools/serve/loadtest.h)
// against a running OpenAI-compatible server; a table on stdout, or JSON.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tools/loom/commands.h"
#include "tools/serve/loadtest.h"

namespace loom::cli {

namespace {
void print_row(const serve::PhaseResult& r) {
  if (r.start_ms > 0)
    std::printf(
        "(cold start: the server answered /health %.1f ms after it was started; TTFT "
        "below counts from its start)\n",
        r.start_ms);
  std::printf("%-14s %7d %8lld %6lld %9.1f %9.1f %9.1f %8.2f %8.2f\n", r.name.c_str(), r.clients,
              static_cast<long long>(r.requests), static_cast<long long>(r.failed), r.tokens_per_s,
              r.ttft_p50, r.ttft_p99, r.itl_p50, r.itl_p99);
  if (r.steps > 0)
    std::printf(
        "  (server: %lld steps, %.1f rows each; per step %.2f ms forward, %.2f ms "
        "scheduler)\n",
        static_cast<long long>(r.steps), r.rows_per_step, r.forward_ms, r.host_ms);
  std::fflush(stdout);
}
void print_nothing(const serve::PhaseResult&) {}
}  // namespace

int cmd_loadtest(const LoadtestOptions& o) {
  serve::LoadtestOptions lo;
  lo.url = o.url;
  lo.api_key = o.api_key;
  lo.model = o.model;
  if (!o.prompt.empty()) lo.prompt = o.prompt;
  lo.max_tokens = o.max_tokens;
  lo.ignore_eos = o.ignore_eos;
  lo.steady_requests = o.requests;
  lo.level_seconds = o.seconds;
  lo.server_cmd = o.server_cmd;
  lo.levels.clear();
  std::stringstream ss(o.levels);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      lo.levels.push_back(std::stoi(item));
    } catch (...) {
      std::fprintf(stderr, "loom loadtest: --levels '%s': not a list of numbers\n",
                   o.levels.c_str());
      return 2;
    }
  }
  if (!o.json)
    std::printf("%-14s %7s %8s %6s %9s %9s %9s %8s %8s\n", "phase", "clients", "requests", "failed",
                "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99");
  auto r = serve::run_loadtest(lo, o.json ? print_nothing : print_row);
  if (!r.ok()) {
    std::fprintf(stderr, "loom loadtest: %s\n", r.message().c_str());
    return 1;
  }
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& p : *r)
      j.push_back({{"phase", p.name},
                   {"clients", p.clients},
                   {"requests", p.requests},
                   {"failed", p.failed},
                   {"tokens", p.tokens},
                   {"seconds", p.seconds},
                   {"server_start_ms", p.start_ms},
                   {"tokens_per_s", p.tokens_per_s},
                   {"ttft_ms_p50", p.ttft_p50},
                   {"ttft_ms_p99", p.ttft_p99},
                   {"itl_ms_p50", p.itl_p50},
                   {"itl_ms_p99", p.itl_p99},
                   {"server_steps", p.steps},
                   {"server_rows_per_step", p.rows_per_step},
                   {"server_forward_ms_per_step", p.forward_ms},
                   {"server_host_ms_per_step", p.host_ms}});
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("(times in ms; tok/s: content chunks per second over all clients)\n");
  }
  for (const auto& p : *r)
    if (p.failed) return 1;
  return 0;
}

}  // namespace loom::cli
