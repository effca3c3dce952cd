#include "tools/serve/loadtest.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "tools/serve/client.h"

namespace loom::serve {

namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

/// One streamed request's timings.
struct Sample {
  bool ok = false;
  double ttft_ms = 0;
  std::vector<double> itl_ms;
  int64_t tokens = 0;  ///< content chunks received (one per token on Loom and llama-server)
};

ClientOptions client_options(const LoadtestOptions& o) {
  ClientOptions co;
  co.url = o.url;
  co.api_key = o.api_key;
  return co;
}

Sample one_request(const LoadtestOptions& o, const std::string& body) {
  const ClientOptions co = client_options(o);
  Sample s;
  const auto t0 = Clock::now();
  auto last = t0;
  auto r = stream_chat(co, body, [&](const std::string&) {
    const auto now = Clock::now();
    if (s.tokens == 0)
      s.ttft_ms = ms_between(t0, now);
    else
      s.itl_ms.push_back(ms_between(last, now));
    last = now;
    ++s.tokens;
    return true;
  });
  s.ok = r.ok();
  return s;
}

/// What Loom's step counters say of the phase between two scrapes.
void add_server_side(const std::map<std::string, double>& before,
                     const std::map<std::string, double>& after, PhaseResult* r) {
  auto delta = [&](const char* name) {
    const auto a = after.find(name), b = before.find(name);
    return a == after.end() ? 0.0 : a->second - (b == before.end() ? 0.0 : b->second);
  };
  const double steps = delta("loom_step_forward_seconds_count");
  if (steps <= 0) return;
  r->steps = static_cast<int64_t>(steps);
  r->rows_per_step = delta("loom_batch_rows_total") / steps;
  r->forward_ms = delta("loom_step_forward_seconds_sum") * 1e3 / steps;
  r->host_ms = delta("loom_step_host_seconds_sum") * 1e3 / steps;
}

PhaseResult summarize(const std::string& name, int clients, const std::vector<Sample>& ss,
                      double seconds) {
  PhaseResult r;
  r.name = name;
  r.clients = clients;
  r.seconds = seconds;
  std::vector<double> ttft, itl;
  for (const auto& s : ss) {
    ++r.requests;
    if (!s.ok) {
      ++r.failed;
      continue;
    }
    r.tokens += s.tokens;
    ttft.push_back(s.ttft_ms);
    itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
  }
  r.tokens_per_s = seconds > 0 ? static_cast<double>(r.tokens) / seconds : 0;
  r.ttft_p50 = percentile(ttft, 0.50);
  r.ttft_p99 = percentile(ttft, 0.99);
  r.itl_p50 = percentile(itl, 0.50);
  r.itl_p99 = percentile(itl, 0.99);
  return r;
}
}  // namespace

Result<std::vector<PhaseResult>> run_loadtest(const LoadtestOptions& o,
                                              void (*log)(const PhaseResult&)) {
  auto body_for = [&](int client, int64_t i) {
    json b = {
        {"messages",
         {{{"role", "user"},
           {"content", o.prompt + " (" + std::to_string(client) + "." + std::to_string(i) + ")"}}}},
        {"max_tokens", o.max_tokens},
        {"stream", true},
        {"temperature", 0.7},
        {"seed", client * 100003 + i}};
    if (!o.model.empty()) b["model"] = o.model;
    // Every answer max_tokens long, whatever the model samples (Loom and
    // llama-server read it; others ignore it), so servers do equal work.
    if (o.ignore_eos) b["ignore_eos"] = true;
    return b.dump();
  };
  std::vector<PhaseResult> out;
  auto add = [&](PhaseResult r) {
    if (log) log(r);
    out.push_back(std::move(r));
  };

  // 1. Cold start: start the server (when given its command), wait for /health, first request.
  auto t0 = Clock::now();
  pid_t child = -1;
  double start_ms = 0;
  if (!o.server_cmd.empty()) {
    child = fork();
    if (child == 0) {
      setpgid(0, 0);  // its own group: stopping it stops what the shell started
      execl("/bin/sh", "sh", "-c", o.server_cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    if (child < 0) return make_error(ErrorCode::kIo, "cannot start '%s'", o.server_cmd.c_str());
    bool up = false;
    while (!up && ms_between(t0, Clock::now()) < 300e3) {
      int status = 0;
      if (waitpid(child, &status, WNOHANG) == child) break;  // it exited
      up = server_healthy(client_options(o));
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!up) {
      kill(-child, SIGTERM);
      waitpid(child, nullptr, 0);
      return make_error(ErrorCode::kIo, "'%s' did not answer %s/health", o.server_cmd.c_str(),
                        o.url.c_str());
    }
    start_ms = ms_between(t0, Clock::now());
  }
  auto stop_child = [&] {
    if (child > 0) {
      kill(-child, SIGTERM);
      waitpid(child, nullptr, 0);
      child = -1;
    }
  };
  const auto t_req = Clock::now();
  Sample first = one_request(o, body_for(0, 0));
  if (!first.ok) {
    stop_child();
    return make_error(ErrorCode::kIo, "the first request to %s failed: is the server up?",
                      o.url.c_str());
  }
  if (child > 0) first.ttft_ms += ms_between(t0, t_req);  // from the process's start
  PhaseResult cold = summarize(child > 0 ? "cold start" : "first request", 1, {first},
                               ms_between(t0, Clock::now()) * 1e-3);
  cold.start_ms = start_ms;
  add(cold);

  // 2. Steady: sequential requests.
  std::vector<Sample> seq;
  t0 = Clock::now();
  for (int64_t i = 0; i < o.steady_requests; ++i) seq.push_back(one_request(o, body_for(0, i + 1)));
  add(summarize("steady", 1, seq, ms_between(t0, Clock::now()) * 1e-3));

  // 3. Concurrency levels: C clients back to back for level_seconds.
  for (int c : o.levels) {
    if (c < 1) continue;
    std::mutex mu;
    std::vector<Sample> all;
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(o.level_seconds));
    ClientOptions co = client_options(o);
    co.connect_timeout_s = 2;
    co.read_timeout_s = 5;
    const auto before = fetch_metrics(co);
    std::vector<std::thread> ts;
    for (int k = 0; k < c; ++k) {
      ts.emplace_back([&, k] {
        for (int64_t i = 0; Clock::now() < end; ++i) {
          Sample s = one_request(o, body_for(k + 1, i));
          std::lock_guard<std::mutex> lock(mu);
          all.push_back(std::move(s));
        }
      });
    }
    for (auto& t : ts) t.join();
    PhaseResult r = summarize("concurrency", c, all, ms_between(start, Clock::now()) * 1e-3);
    add_server_side(before, fetch_metrics(co), &r);
    add(std::move(r));
  }
  stop_child();
  return out;
}

}  // namespace loom::serve
