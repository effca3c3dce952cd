// `loom serve`'s HTTP side: an OpenAI-compatible API over the Scheduler.
//   POST /v1/chat/completions, /v1/completions  (SSE when "stream": true)
//   GET  /v1/models, /health, /metrics (Prometheus text)
// Errors use OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
// With an API key, every route but /health needs `Authorization: Bearer KEY`.
// No route reads or writes files: prompts are text or token ids, nothing else.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "engine/core/status.h"
#include "tools/serve/metrics.h"
#include "tools/serve/scheduler.h"

namespace loom::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";    ///< loopback unless asked otherwise
  int port = 8080;                   ///< 0: any free port (see Server::port())
  std::string api_key;               ///< empty: no authentication
  std::string model_id;              ///< the name /v1/models lists and requests must use
  size_t max_body_bytes = 4u << 20;  ///< larger request bodies get 413
  int http_threads = 0;              ///< 0: slots + queue bound + 4
};

class Server {
 public:
  /// The scheduler and metrics outlive the server.
  Server(Scheduler& sched, Metrics& metrics, const ServerOptions& o);
  ~Server();  ///< stop()s

  /// Binds the socket (then port() is known) and serves on a thread of its own.
  Status start();
  /// Binds and serves on the calling thread until stop() (from another thread or a signal).
  Status run();
  void stop();
  int port() const { return port_; }
  const std::string& model_id() const { return o_.model_id; }

 private:
  struct Impl;
  Status bind();
  std::unique_ptr<Impl> impl_;
  ServerOptions o_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace loom::serve
