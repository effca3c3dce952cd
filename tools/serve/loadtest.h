// `loom loadtest`: an OpenAI-compatible server measured in three phases, over
// real HTTP (streaming chat completions):
//   1. cold start: with a server command, from starting that process to the
//      first token of the first request (the process is stopped at the end);
//      without one, the first request to the running server;
//   2. steady: N sequential requests, P50/P99 of TTFT and ITL;
//   3. concurrency: for each level C, C clients each sending requests back to
//      back for a while: tokens/s over all, TTFT and ITL P50/P99.
// Works against any server with /v1/chat/completions (Loom, llama-server, vLLM).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace loom::serve {

struct LoadtestOptions {
  std::string url = "http://127.0.0.1:8080";  ///< scheme, host and port
  std::string api_key;
  std::string model;  ///< "model" in requests; empty: left out
  std::string prompt = "Write a short story about a lighthouse keeper.";
  int64_t max_tokens = 64;
  bool ignore_eos = true;  ///< ask for max_tokens in every answer (see loadtest.cpp)
  int64_t steady_requests = 20;
  std::vector<int> levels = {1, 8, 32};
  double level_seconds = 10;  ///< each concurrency level runs this long
  /// A shell command that starts the server at `url` (e.g. "loom serve -m M --port 8080");
  /// empty: the server is already running.
  std::string server_cmd;
};

/// Figures of one phase, in milliseconds (and tokens/s).
struct PhaseResult {
  std::string name;
  int clients = 1;
  int64_t requests = 0, failed = 0, tokens = 0;
  double seconds = 0, tokens_per_s = 0;
  double start_ms = 0;  ///< cold start: process start to the server answering /health
  double ttft_p50 = 0, ttft_p99 = 0, itl_p50 = 0, itl_p99 = 0;
  /// The server's own account of the phase, from its /metrics before and
  /// after (Loom's step counters; 0 when the server has none): batched steps,
  /// token rows per step, and per step the forward pass's and the
  /// scheduler's own milliseconds.
  int64_t steps = 0;
  double rows_per_step = 0, forward_ms = 0, host_ms = 0;
};

/// Runs the three phases; `log` gets a line per phase as it ends.
Result<std::vector<PhaseResult>> run_loadtest(const LoadtestOptions& o,
                                              void (*log)(const PhaseResult&) = nullptr);

}  // namespace loom::serve
