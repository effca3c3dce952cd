// `loom serve` end to end: the HTTP server in process on an ephemeral port, a
// synthetic model, and httplib's client as the real HTTP client.
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "tests/test_util.h"
#include "tools/serve/client.h"
#include "tools/serve/loadtest.h"
#include "tools/serve/server.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
constexpr int64_t kCtx = 1024;

/// Waits up to 20 s for `cond`.
template <class C>
bool wait_for(C cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// A server over `slots` sessions of the suite's model.
struct Harness {
  std::unique_ptr<CpuBackend> be;
  serve::Metrics metrics;
  std::unique_ptr<serve::Scheduler> sched;
  std::unique_ptr<serve::Server> server;
  std::unique_ptr<httplib::Client> cli;

  Harness(const Model& m, int slots, int64_t queue_max, serve::ServerOptions so = {},
          bool shared = true) {
    be = std::make_unique<CpuBackend>(1);
    std::vector<std::unique_ptr<Session>> ss;
    for (int i = 0; i < slots; ++i) {
      SessionConfig c;
      c.n_ctx = kCtx;
      // One forward pass for all slots (batched steps), or one each (steps apart).
      auto s = i == 0 || !shared ? Session::create(m, *be, c) : Session::create_sharing(*ss[0], c);
      EXPECT_TRUE(s.ok()) << s.message();
      ss.push_back(std::move(s).value());
    }
    serve::SchedulerOptions o;
    o.n_slots = slots;
    o.queue_max = queue_max;
    o.prefill_chunk = 64;
    o.sample_threads = 3;  // a step's draws on three threads (ConcurrentStreamsAllComplete)
    sched = std::make_unique<serve::Scheduler>(std::move(ss), o, &metrics);
    so.host = "127.0.0.1";
    so.port = 0;
    if (so.model_id.empty()) so.model_id = "synth";
    server = std::make_unique<serve::Server>(*sched, metrics, so);
    Status st = server->start();
    EXPECT_TRUE(st.ok()) << st.message();
    cli = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    cli->set_read_timeout(60, 0);
  }
  ~Harness() {
    cli.reset();
    server.reset();
    sched.reset();
  }

  httplib::Result post(const std::string& path, const json& body, const httplib::Headers& h = {}) {
    return cli->Post(path.c_str(), h, body.dump(), "application/json");
  }

  /// A streaming request: the SSE events' JSON (without [DONE]), whether [DONE] came,
  /// and the status. `stop_after`: the client hangs up after that many events.
  struct Stream {
    int status = 0;
    std::vector<json> events;
    bool done = false;
    httplib::Error error = httplib::Error::Success;
  };
  static Stream stream(int port, const std::string& path, const json& body, int stop_after = -1) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    Stream out;
    std::string buf;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      buf.append(d, n);
      size_t p;
      while ((p = buf.find("\n\n")) != std::string::npos) {
        const std::string ev = buf.substr(0, p);
        buf.erase(0, p + 2);
        if (ev.rfind("data: ", 0) != 0) continue;
        const std::string data = ev.substr(6);
        if (data == "[DONE]") {
          out.done = true;
        } else {
          out.events.push_back(json::parse(data));
        }
        if (stop_after >= 0 && static_cast<int>(out.events.size()) >= stop_after) return false;
      }
      return true;
    };
    httplib::Response res;
    c.send(req, res, out.error);
    out.status = res.status;
    return out;
  }

  /// The text of a chat stream's deltas.
  static std::string chat_text(const Stream& s) {
    std::string t;
    for (const auto& e : s.events)
      for (const auto& ch : e["choices"])
        if (ch.contains("delta") && ch["delta"].contains("content"))
          t += ch["delta"]["content"].get<std::string>();
    return t;
  }
};

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SynthSpec s;
    s.n_layer = 2;
    s.n_embd = 64;
    s.n_ff = 128;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ctx = kCtx;
    s.seed = 3;
    dir_ = new std::string(test::temp_dir("serve_model"));
    const std::string path = *dir_ + "/m.gguf";
    ASSERT_TRUE(write_synthetic_model(s, path).ok());
    auto m = load_model(path);
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    if (dir_) {
      std::error_code ec;
      fs::remove_all(fs::path(*dir_).parent_path(), ec);  // the per-process folder
      delete dir_;
      dir_ = nullptr;
    }
  }

  /// What a plain Session generates greedily for a chat message (the reference).
  static std::string greedy(const std::string& user, int64_t max_tokens) {
    return greedy_msgs({{"user", user}}, max_tokens);
  }
  static std::string greedy_msgs(const std::vector<ChatMessage>& msgs, int64_t max_tokens) {
    return test::greedy_chat(*model_, msgs, max_tokens);
  }

  static json chat(const std::string& user, int64_t max_tokens, bool stream = false) {
    return {{"model", "synth"},
            {"messages", {{{"role", "user"}, {"content", user}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream}};
  }

  static Model* model_;
  static std::string* dir_;
};
Model* ServeTest::model_ = nullptr;
std::string* ServeTest::dir_ = nullptr;

TEST_F(ServeTest, HealthModelsAndMetrics) {
  Harness h(*model_, 1, 4);
  auto r = h.cli->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = h.cli->Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  json j = json::parse(r->body);
  EXPECT_EQ(j["data"][0]["id"], "synth");
  ASSERT_TRUE(h.post("/v1/chat/completions", chat("hi", 4)));
  // httplib counts a request (its logger) after the response went out: wait for it.
  const std::string counted = "loom_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 1";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    r = h.cli->Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  } while (r->body.find(counted) == std::string::npos &&
           std::chrono::steady_clock::now() < deadline);
  for (const char* want :
       {"loom_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 1",
        "loom_ttft_seconds_count 1", "loom_itl_seconds_bucket{le=\"+Inf\"}",
        "loom_kv_bytes{tier=\"ram\"}", "loom_queue_depth 0", "loom_generated_tokens_total"}) {
    EXPECT_NE(r->body.find(want), std::string::npos) << want << "\n" << r->body;
  }
}

TEST_F(ServeTest, ChatNonStreamingMatchesSessionGreedy) {
  Harness h(*model_, 2, 4);
  const std::string want = greedy("Tell me a story", 24);
  ASSERT_FALSE(want.empty());
  auto r = h.post("/v1/chat/completions", chat("Tell me a story", 24));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"].get<std::string>(), want);
  const auto& u = j["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(u["total_tokens"].get<int>(),
            u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  for (const char* k : {"queue_ms", "ttft_ms", "itl_ms_p50", "itl_ms_p99"})
    EXPECT_GE(j["timings"][k].get<double>(), 0.0) << k;
  const std::string fin = j["choices"][0]["finish_reason"];
  if (fin == "length") {
    EXPECT_EQ(u["completion_tokens"].get<int>(), 24);
  }
  // Again: the slot's cache gives the prompt's prefix back, the answer is the same.
  r = h.post("/v1/chat/completions", chat("Tell me a story", 24));
  ASSERT_TRUE(r);
  j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"].get<std::string>(), want);
  EXPECT_GT(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

TEST_F(ServeTest, ChatStreamingMatchesNonStreaming) {
  Harness h(*model_, 1, 4);
  const std::string want = greedy("Stream it", 20);
  json body = chat("Stream it", 20, true);
  body["stream_options"] = {{"include_usage", true}};
  auto s = Harness::stream(h.server->port(), "/v1/chat/completions", body);
  EXPECT_EQ(s.status, 200);
  EXPECT_TRUE(s.done);
  ASSERT_GE(s.events.size(), 3u);
  EXPECT_EQ(s.events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(s.events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(Harness::chat_text(s), want);
  // The last chunk carries the usage, before it one with the finish reason.
  EXPECT_TRUE(s.events.back()["choices"].empty());
  EXPECT_GT(s.events.back()["usage"]["completion_tokens"].get<int>(), 0);
  EXPECT_TRUE(s.events.back()["timings"].contains("itl_ms_p99"));
  EXPECT_FALSE(s.events[s.events.size() - 2]["choices"][0]["finish_reason"].is_null());
}

TEST_F(ServeTest, CompletionsRawPromptStreamAndNot) {
  Harness h(*model_, 1, 4);
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
  auto r = h.post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  const std::string text = j["choices"][0]["text"];
  body["stream"] = true;
  auto s = Harness::stream(h.server->port(), "/v1/completions", body);
  EXPECT_TRUE(s.done);
  std::string streamed;
  for (const auto& e : s.events) streamed += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, text);
  // Token ids as the prompt.
  body = {{"prompt", {1, 5, 9}}, {"max_tokens", 3}};
  r = h.post("/v1/completions", body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], 3);
}

TEST_F(ServeTest, StopStringsCutTheText) {
  Harness h(*model_, 1, 4);
  const std::string full = greedy("Where does it stop?", 40);
  // A piece from the middle of the greedy answer is a stop string that occurs there.
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(full.size() / 2, 3);
  const std::string want = full.substr(0, full.find(stop));
  json body = chat("Where does it stop?", 40);
  body["stop"] = {stop, "never-there-xyz"};
  auto r = h.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"].get<std::string>(), want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  body["stream"] = true;
  auto s = Harness::stream(h.server->port(), "/v1/chat/completions", body);
  EXPECT_EQ(Harness::chat_text(s), want);
}

TEST_F(ServeTest, Logprobs) {
  Harness h(*model_, 1, 4);
  json body = chat("logprobs please", 6);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto r = h.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  const auto& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), j["usage"]["completion_tokens"].get<size_t>());
  for (const auto& c : content) {
    ASSERT_EQ(c["top_logprobs"].size(), 3u);
    EXPECT_LE(c["logprob"].get<float>(), 0.0f);
    // Greedy: the chosen token is the most likely one.
    EXPECT_FLOAT_EQ(c["logprob"].get<float>(), c["top_logprobs"][0]["logprob"].get<float>());
  }
  // Completions: an integer, and the legacy shape. ignore_eos: four tokens whatever the
  // synthetic model's greedy choice is on this CPU's kernels (it may pick EOS early).
  r = h.post("/v1/completions",
             {{"prompt", "abc"}, {"max_tokens", 4}, {"logprobs", 2}, {"ignore_eos", true}});
  ASSERT_TRUE(r);
  j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 4u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
}

TEST_F(ServeTest, CancelledStreamFreesItsSlot) {
  Harness h(*model_, 1, 4);
  json body = chat("go on forever", -1, true);
  body.erase("max_tokens");  // chat: until the context is full
  body["ignore_eos"] = true;
  auto s = Harness::stream(h.server->port(), "/v1/chat/completions", body, /*stop_after=*/3);
  EXPECT_EQ(s.error, httplib::Error::Canceled);
  EXPECT_FALSE(s.done);
  // The server notices at its next write and stops generating (a bound, not a timing).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (h.metrics.cancelled() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(h.metrics.cancelled(), 1u);
  // The one slot is free again: the next request is served.
  auto r = h.post("/v1/chat/completions", chat("next", 4));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// A second server on a port in use fails to start, saying so (it must not
// share the port with the first and get half its clients).
TEST_F(ServeTest, PortInUseIsAnError) {
  Harness h(*model_, 1, 4);
  serve::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = h.server->port();
  so.model_id = "synth";
  serve::Server second(*h.sched, h.metrics, so);
  const Status st = second.start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot listen"), std::string::npos) << st.message();
  auto r = h.cli->Get("/health");  // the first goes on
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// The client the load test and the app's remote engine use: streamed text
// equal to a plain session's, usage filled in, the model list, a stop from
// the callback cancels on the server, and errors that name the cause.
TEST_F(ServeTest, ClientStreamsListsAndReportsErrors) {
  serve::ServerOptions so;
  so.api_key = "secret";
  Harness h(*model_, 2, 4, so);
  serve::ClientOptions co;
  co.url = "http://127.0.0.1:" + std::to_string(h.server->port()) + "/v1";
  co.api_key = "secret";
  auto ids = serve::list_models(co);
  ASSERT_TRUE(ids.ok()) << ids.message();
  EXPECT_EQ(*ids, std::vector<std::string>{"synth"});
  std::string text;
  auto u = serve::stream_chat(co, chat("Tell me a story", 16).dump(), [&](const std::string& t) {
    text += t;
    return true;
  });
  ASSERT_TRUE(u.ok()) << u.message();
  EXPECT_EQ(text, greedy("Tell me a story", 16));
  EXPECT_GT(u->prompt_tokens, 0);
  EXPECT_GT(u->completion_tokens, 0);
  EXPECT_FALSE(u->finish_reason.empty());
  EXPECT_GE(u->server_ttft_ms, 0);

  // Stopped by the caller: the server counts a cancelled generation.
  int pieces = 0;
  json forever = chat("go on forever", -1);
  forever.erase("max_tokens");  // until the context is full
  forever["ignore_eos"] = true;
  u = serve::stream_chat(co, forever.dump(), [&](const std::string&) { return ++pieces < 3; });
  ASSERT_TRUE(u.ok()) << u.message();
  EXPECT_EQ(u->finish_reason, "cancelled");
  EXPECT_TRUE(wait_for([&] { return h.metrics.cancelled() >= 1; }));

  serve::ClientOptions bad = co;
  bad.api_key = "wrong";
  u = serve::stream_chat(bad, chat("hi", 4).dump(), [](const std::string&) { return true; });
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.message().find("401"), std::string::npos) << u.message();
  bad.url = "http://127.0.0.1:1";
  ids = serve::list_models(bad);
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.message().find("cannot reach http://127.0.0.1:1"), std::string::npos)
      << ids.message();
}

TEST_F(ServeTest, ApiKey) {
  serve::ServerOptions so;
  so.api_key = "s3cret";
  Harness h(*model_, 1, 4, so);
  auto r = h.cli->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key");
  r = h.post("/v1/chat/completions", chat("hi", 2), {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = h.cli->Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = h.cli->Get("/health");  // open to probes
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = h.post("/v1/chat/completions", chat("hi", 2), {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServeTest, ErrorsHaveOpenAiShape) {
  serve::ServerOptions so;
  so.max_body_bytes = 4096;
  Harness h(*model_, 1, 4, so);
  auto check = [](const httplib::Result& r, int status, const std::string& needle) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j["error"]["message"].is_string()) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
  };
  // 413: a body over the limit.
  json big = chat(std::string(8000, 'a'), 2);
  check(h.post("/v1/chat/completions", big), 413, "too large");
  // 404: an unknown model.
  json body = chat("hi", 2);
  body["model"] = "gpt-4";
  check(h.post("/v1/chat/completions", body), 404, "gpt-4");
  // 400: a prompt longer than the context, saying by how much.
  std::vector<int> ids(kCtx + 9, 7);
  check(h.post("/v1/completions", {{"prompt", ids}}), 400, "10 tokens too many");
  // 400: bad JSON, bad parameters.
  auto r = h.cli->Post("/v1/chat/completions", "{not json", "application/json");
  check(r, 400, "JSON");
  body = chat("hi", 2);
  body["temperature"] = "hot";
  check(h.post("/v1/chat/completions", body), 400, "temperature");
  check(h.post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages");
  // 404: an unknown route.
  check(h.cli->Get("/v1/nothing"), 404, "no route");
}

TEST_F(ServeTest, QueueFullGives429WithRetryAfter) {
  Harness h(*model_, 1, /*queue_max=*/1);
  h.sched->set_paused(true);  // nothing is admitted: the requests stay queued
  const int port = h.server->port();
  std::vector<std::thread> ts;
  std::vector<Harness::Stream> res(2);
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&, i] {
      res[static_cast<size_t>(i)] =
          Harness::stream(port, "/v1/chat/completions", chat("q" + std::to_string(i), 4, true));
    });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (h.sched->queue_depth() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(h.sched->queue_depth(), 2);  // one for the free slot, one waiting
  auto r = h.post("/v1/chat/completions", chat("one too many", 4));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
  h.sched->set_paused(false);
  for (auto& t : ts) t.join();
  for (const auto& s : res) {
    EXPECT_EQ(s.status, 200);
    EXPECT_TRUE(s.done);
  }
}

// 32 clients on 4 slots, the slots sharing one forward pass (batched steps:
// more than one sequence per step on average) or each with its own (steps
// apart); every stream equals its own greedy run.
TEST_F(ServeTest, ConcurrentStreamsAllComplete) {
  constexpr int kClients = 32;
  std::vector<std::string> want(kClients);
  for (int i = 0; i < kClients; ++i)
    want[static_cast<size_t>(i)] = greedy("client " + std::to_string(i), 12);
  for (bool shared : {true, false}) {
    Harness h(*model_, 4, 64, {}, shared);
    std::vector<Harness::Stream> res(kClients);
    std::vector<std::thread> ts;
    const int port = h.server->port();
    for (int i = 0; i < kClients; ++i)
      ts.emplace_back([&, i] {
        res[static_cast<size_t>(i)] = Harness::stream(
            port, "/v1/chat/completions", chat("client " + std::to_string(i), 12, true));
      });
    for (auto& t : ts) t.join();
    for (int i = 0; i < kClients; ++i) {
      const auto& s = res[static_cast<size_t>(i)];
      EXPECT_EQ(s.status, 200) << i << " " << httplib::to_string(s.error);
      EXPECT_TRUE(s.done) << i;
      EXPECT_EQ(Harness::chat_text(s), want[static_cast<size_t>(i)]) << i << " shared " << shared;
    }
    EXPECT_EQ(h.metrics.ttft().count(), static_cast<uint64_t>(kClients)) << h.metrics.render();
    if (shared) {
      EXPECT_GT(h.metrics.step_seqs(), h.metrics.steps() * 3 / 2) << h.metrics.render();
    } else {
      EXPECT_EQ(h.metrics.step_seqs(), h.metrics.steps());
    }
  }
}

// A request whose system prompt another slot holds, while that slot is busy,
// takes the prompt's KV from it (copied, not evaluated) and answers as a
// plain session does.
TEST_F(ServeTest, SharedSystemPromptIsCopiedFromAnotherSlot) {
  Harness h(*model_, 2, 8);
  std::string sys;
  for (int i = 0; i < 12; ++i) sys += "You are a careful assistant who answers briefly. ";
  auto msgs = [&](const std::string& user, int64_t n) {
    json j = chat(user, n);
    j["messages"] = {{{"role", "system"}, {"content", sys}}, {{"role", "user"}, {"content", user}}};
    return j;
  };
  auto r = h.post("/v1/chat/completions", msgs("first question", 2));  // a slot holds sys
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(h.metrics.shared_prefix_tokens(), 0u);
  // Both admitted in one round: the longer one goes to the slot holding sys
  // (its own prefix), the other to the empty slot, which copies sys over.
  h.sched->set_paused(true);
  json a, b;
  std::thread ta([&] {
    auto x = h.post("/v1/chat/completions", msgs("first question, and more", 8));
    if (x) a = json::parse(x->body);
  });
  while (h.sched->queue_depth() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread tb([&] {
    httplib::Client c("127.0.0.1", h.server->port());
    c.set_read_timeout(60, 0);
    auto x = c.Post("/v1/chat/completions", msgs("second question", 16).dump(), "application/json");
    if (x) b = json::parse(x->body);
  });
  while (h.sched->queue_depth() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h.sched->set_paused(false);
  ta.join();
  tb.join();
  ASSERT_TRUE(b.contains("choices")) << b.dump();
  EXPECT_GT(h.metrics.shared_prefix_tokens(), 50u) << h.metrics.render();
  EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 50) << b.dump();
  EXPECT_EQ(b["choices"][0]["message"]["content"].get<std::string>(),
            greedy_msgs({{"system", sys}, {"user", "second question"}}, 16));
  EXPECT_EQ(a["choices"][0]["message"]["content"].get<std::string>(),
            greedy_msgs({{"system", sys}, {"user", "first question, and more"}}, 8));
}

TEST_F(ServeTest, LoadtestRunsItsPhases) {
  Harness h(*model_, 2, 16);
  serve::LoadtestOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(h.server->port());
  o.model = "synth";
  o.max_tokens = 6;
  o.steady_requests = 3;
  o.levels = {1, 4};
  o.level_seconds = 0.2;
  auto r = serve::run_loadtest(o);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_EQ(r->size(), 4u);  // first request, steady, two levels
  EXPECT_EQ((*r)[1].requests, 3);
  EXPECT_EQ((*r)[3].clients, 4);
  for (const auto& p : *r) {
    EXPECT_EQ(p.failed, 0) << p.name;
    EXPECT_GT(p.tokens, 0) << p.name;
  }
  // The levels carry the server's own account, from its /metrics.
  EXPECT_GT((*r)[3].steps, 0);
  EXPECT_GE((*r)[3].rows_per_step, 1.0);
  EXPECT_GT((*r)[3].forward_ms, 0.0);
  EXPECT_GE((*r)[3].host_ms, 0.0);
  // /health is asked at the server's root, also when the URL names the API's
  // prefix (a URL ending in /v1 once waited out its whole start timeout).
  serve::ClientOptions co;
  co.url = o.url + "/v1";
  EXPECT_TRUE(serve::server_healthy(co));
  // A server that is not there: an error, not a crash.
  o.url = co.url = "http://127.0.0.1:1";
  EXPECT_FALSE(serve::server_healthy(co));
  EXPECT_FALSE(serve::run_loadtest(o).ok());
}

}  // namespace
}  // namespace loom
