// `loom serve`: an OpenAI-compatible HTTP server (tools/serve/) over --parallel
// sessions of one model, until SIGINT or SIGTERM.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "tools/loom/engine_setup.h"
#include "tools/serve/server.h"

namespace loom::cli {

namespace {
serve::Server* g_server = nullptr;
extern "C" void on_stop_signal(int) {
  if (g_server) g_server->stop();  // httplib's stop() only shuts the listening socket down
}
}  // namespace

int cmd_serve(const ServeOptions& o) {
  const char* who = "loom serve";
  if (o.parallel < 1 || o.parallel > 256) {
    std::fprintf(stderr, "%s: --parallel must be between 1 and 256\n", who);
    return 2;
  }
  auto e = open_engine(o.engine, who);
  if (!e) return 1;
  // The scheduler steps its slots through append(), not generate(): the
  // adaptive auto would never be asked. Said, and detached.
  if (e->adaptive) {
    e->session->set_adaptive(nullptr);
    e->adaptive.reset();
    std::fprintf(stderr,
                 "%s: note: auto keeps its first placement under loom serve (the adaptive "
                 "controller runs in loom run, loom bench and the app)\n",
                 who);
  }
  for (const auto& w : e->model->warnings)
    std::fprintf(stderr, "%s: warning: %s\n", who, w.c_str());

  // One session per slot: the first is open_engine's; the others share its
  // forward pass (weights and placement once), each with a KV cache of its own.
  std::vector<std::unique_ptr<Session>> slots;
  slots.push_back(std::move(e->session));
  for (int i = 1; i < o.parallel; ++i) {
    SessionConfig sc;
    sc.n_ctx = slots[0]->n_ctx();
    sc.kv_tiers = e->kv_tiers;
    sc.kv_tiers.session = (static_cast<uint64_t>(getpid()) << 16) + static_cast<uint64_t>(i);
    auto s = Session::create_sharing(*slots[0], sc);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: slot %d: %s\n", who, i, s.message().c_str());
      return 1;
    }
    slots.push_back(std::move(s).value());
  }

  serve::Metrics metrics;
  serve::SchedulerOptions so;
  so.n_slots = o.parallel;
  so.queue_max = o.queue;
  so.prefill_chunk = o.engine.batch;
  so.itl_factor = o.itl_factor;
  so.sample_threads = e->cpu->n_threads();
  const int64_t n_ctx = slots[0]->n_ctx();
  serve::Scheduler sched(std::move(slots), so, &metrics);

  serve::ServerOptions sv;
  sv.host = o.host;
  sv.port = o.port;
  sv.api_key = o.api_key;
  sv.model_id =
      o.alias.empty() ? std::filesystem::path(o.engine.model).filename().string() : o.alias;
  sv.max_body_bytes = static_cast<size_t>(o.max_body_kib) * 1024;
  serve::Server server(sched, metrics, sv);
  g_server = &server;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::fprintf(stderr, "%s: %s | %s | %d slot%s of %lld tokens, queue %lld\n", who,
               e->model->describe().c_str(), e->backend_name().c_str(), o.parallel,
               o.parallel == 1 ? "" : "s", static_cast<long long>(n_ctx),
               static_cast<long long>(o.queue));
  std::fprintf(stderr, "%s: model '%s' at http://%s:%d/v1%s\n", who, sv.model_id.c_str(),
               o.host.c_str(), o.port, o.api_key.empty() ? "" : " (API key required)");
  if (o.host != "127.0.0.1" && o.host != "localhost" && o.host != "::1" && o.api_key.empty())
    std::fprintf(stderr, "%s: warning: listening on %s without --api-key\n", who, o.host.c_str());
  Status st = server.run();
  g_server = nullptr;
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, st.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "%s: stopped\n", who);
  return 0;
}

}  // namespace loom::cli
