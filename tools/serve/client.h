// A client of OpenAI-compatible servers (Loom, llama-server, vLLM, TGI):
// streamed chat completions (SSE) and the model list. `loom loadtest` times
// requests through it; the app's remote engine chats through it.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace loom::serve {

struct ClientOptions {
  std::string url;      ///< scheme, host and port (a trailing "/v1" is allowed)
  std::string api_key;  ///< sent as "Authorization: Bearer KEY"; empty: none
  int connect_timeout_s = 10;
  int read_timeout_s = 300;
};

/// What the server reported at the end of a streamed chat completion (-1: not said).
struct ChatUsage {
  int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = -1;
  std::string finish_reason;        ///< "stop", "length", ... (empty: the stream ended without one)
  double server_ttft_ms = -1;       ///< the server's own TTFT (Loom's `timings.ttft_ms`)
  double server_tokens_per_s = -1;  ///< llama-server's `timings.predicted_per_second`
};

/// Streams POST /v1/chat/completions with `body` (a JSON object as text;
/// "stream" and "stream_options.include_usage" are set here). `on_text` gets
/// each piece of text as it comes and returns false to stop (the connection
/// is closed: Loom cancels the request). Errors: the server unreachable
/// (kIo, naming the URL), an HTTP error (its status and the server's message),
/// a stream that ends without [DONE] (kIo).
Result<ChatUsage> stream_chat(const ClientOptions& o, const std::string& body,
                              const std::function<bool(const std::string& text)>& on_text);

/// GET /metrics (at the server's root, whatever the URL's API prefix): the
/// unlabelled samples of its Prometheus text ("name value" lines); empty
/// when the server has none or does not answer.
std::map<std::string, double> fetch_metrics(const ClientOptions& o);

/// GET /health (at the server's root, as /metrics): whether it answered 200
/// within a second.
bool server_healthy(const ClientOptions& o);

/// GET /v1/models: the ids the server offers.
Result<std::vector<std::string>> list_models(const ClientOptions& o);

}  // namespace loom::serve
