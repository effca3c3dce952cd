#include "tools/serve/server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

namespace loom::serve {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

/// JSON text; invalid UTF-8 (a token that is part of a character) becomes U+FFFD.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// An error as OpenAI's API writes it, with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
};

void send_error(httplib::Response& res, const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  res.status = e.status;
  res.set_content(dump(json{{"error", err}}), "application/json");
}

ApiError bad(const std::string& msg, const std::string& param = {}) {
  return ApiError{400, msg, "invalid_request_error", param, {}};
}

/// What a completion request asks for, once checked.
struct Parsed {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  std::shared_ptr<Request> req;
};

// Reads an optional number of the given kind; an error names the field.
template <typename T>
bool get_num(const json& body, const char* key, T* out, ApiError* err) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number()) {
    *err = bad(std::string("'") + key + "' must be a number", key);
    return false;
  }
  *out = it->get<T>();
  return true;
}

/// The prompt's tokens, sampling and limits from a request body; false with `err` set.
bool parse_request(const json& body, bool chat, const Model& model, const std::string& model_id,
                   int64_t n_ctx, Parsed* p, ApiError* err) {
  if (!body.is_object()) {
    *err = bad("the request body must be a JSON object");
    return false;
  }
  p->chat = chat;
  auto r = std::make_shared<Request>();
  p->req = r;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      *err = bad("'model' must be a string", "model");
      return false;
    }
    const std::string m = it->get<std::string>();
    if (!m.empty() && m != model_id) {
      *err = ApiError{404,
                      "the model '" + m + "' does not exist: this server serves '" + model_id +
                          "' (GET /v1/models)",
                      "invalid_request_error", "model", "model_not_found"};
      return false;
    }
  }
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      *err = bad("'stream' must be true or false", "stream");
      return false;
    }
    p->stream = it->get<bool>();
  }
  if (auto it = body.find("stream_options"); it != body.end() && it->is_object())
    p->include_usage = it->value("include_usage", false);
  int64_t n = 1;
  if (!get_num(body, "n", &n, err)) return false;
  if (n != 1) {
    *err = bad("only n = 1 is supported", "n");
    return false;
  }

  // Sampling: OpenAI's defaults (temperature 1, top_p 1, no top-k or min-p).
  SamplerParams& sp = r->sampling;
  sp.temperature = 1.0f;
  sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  sp.repeat_penalty = 1.0f;
  sp.seed = std::random_device{}();
  if (!get_num(body, "temperature", &sp.temperature, err) ||
      !get_num(body, "top_p", &sp.top_p, err) || !get_num(body, "top_k", &sp.top_k, err) ||
      !get_num(body, "min_p", &sp.min_p, err) ||
      !get_num(body, "repeat_penalty", &sp.repeat_penalty, err) ||
      !get_num(body, "seed", &sp.seed, err)) {
    return false;
  }
  if (sp.temperature < 0 || sp.temperature > 2) {
    *err = bad("'temperature' must be between 0 and 2", "temperature");
    return false;
  }
  if (sp.top_p <= 0 || sp.top_p > 1) {
    *err = bad("'top_p' must be in (0, 1]", "top_p");
    return false;
  }
  for (const char* k : {"frequency_penalty", "presence_penalty"}) {
    double v = 0;
    if (!get_num(body, k, &v, err)) return false;
    if (v != 0) {
      *err = bad(std::string("'") + k + "' is not supported (use repeat_penalty)", k);
      return false;
    }
  }
  if (auto it = body.find("ignore_eos"); it != body.end() && it->is_boolean())
    r->ignore_eos = it->get<bool>();

  // Limits: completions default to 16 tokens as OpenAI's do; chat runs to the context's end.
  r->max_tokens = chat ? -1 : 16;
  if (!get_num(body, "max_tokens", &r->max_tokens, err)) return false;
  if (chat && !get_num(body, "max_completion_tokens", &r->max_tokens, err)) return false;
  if (body.contains("max_tokens") && !body["max_tokens"].is_null() && r->max_tokens < 1) {
    *err = bad("'max_tokens' must be at least 1", "max_tokens");
    return false;
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r->stop.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 4) {
      for (const auto& s : *it) {
        if (!s.is_string()) {
          *err = bad("'stop' must be a string or up to 4 strings", "stop");
          return false;
        }
        r->stop.push_back(s.get<std::string>());
      }
    } else {
      *err = bad("'stop' must be a string or up to 4 strings", "stop");
      return false;
    }
  }

  // logprobs: chat has a flag and top_logprobs (0..20); completions an alternative count (0..5).
  if (auto it = body.find("logprobs"); it != body.end() && !it->is_null()) {
    if (chat) {
      if (!it->is_boolean()) {
        *err = bad("'logprobs' must be true or false", "logprobs");
        return false;
      }
      if (it->get<bool>()) {
        int top = 0;
        if (!get_num(body, "top_logprobs", &top, err)) return false;
        if (top < 0 || top > 20) {
          *err = bad("'top_logprobs' must be between 0 and 20", "top_logprobs");
          return false;
        }
        r->top_logprobs = top;
      }
    } else {
      if (!it->is_number_integer() || it->get<int>() < 0 || it->get<int>() > 5) {
        *err = bad("'logprobs' must be an integer between 0 and 5", "logprobs");
        return false;
      }
      r->top_logprobs = it->get<int>();
    }
  }

  // The prompt.
  const Tokenizer& tok = *model.tokenizer;
  if (chat) {
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty()) {
      *err = bad("'messages' must be a non-empty array", "messages");
      return false;
    }
    std::vector<ChatMessage> msgs;
    for (const auto& m : *it) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        *err = bad("each message needs a 'role' string", "messages");
        return false;
      }
      ChatMessage cm;
      cm.role = m["role"].get<std::string>();
      if (cm.role == "developer") cm.role = "system";
      const json& c = m.value("content", json(nullptr));
      if (c.is_string()) {
        cm.content = c.get<std::string>();
      } else if (c.is_array()) {  // content parts: only text ones
        for (const auto& part : c) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            *err = bad("only text content parts are supported", "messages");
            return false;
          }
          cm.content += part["text"].get<std::string>();
        }
      } else if (!c.is_null()) {
        *err = bad("a message's 'content' must be a string or an array of text parts", "messages");
        return false;
      }
      msgs.push_back(std::move(cm));
    }
    auto text = model.chat_template.apply(msgs, /*add_generation_prompt=*/true);
    if (!text.ok()) {
      *err = bad("the chat template cannot render these messages: " + text.message(), "messages");
      return false;
    }
    r->prompt = tok.encode(*text, !model.chat_template.adds_bos_text(), /*parse_special=*/true);
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) {
      *err = bad("'prompt' is required", "prompt");
      return false;
    }
    const json* pr = &*it;
    if (pr->is_array() && pr->size() == 1 && (*pr)[0].is_string()) pr = &(*pr)[0];
    if (pr->is_string()) {
      r->prompt = tok.encode(pr->get<std::string>(), /*add_special=*/true, false);
    } else if (pr->is_array() && !pr->empty() && (*pr)[0].is_number_integer()) {
      for (const auto& t : *pr) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() >= model.hp.n_vocab) {
          *err = bad("a prompt token id is out of the vocabulary's range", "prompt");
          return false;
        }
        r->prompt.push_back(t.get<int32_t>());
      }
    } else {
      *err = bad("'prompt' must be a string, one string in an array, or token ids", "prompt");
      return false;
    }
  }
  if (r->prompt.empty()) {
    *err = bad("the prompt is empty", chat ? "messages" : "prompt");
    return false;
  }
  const int64_t np = static_cast<int64_t>(r->prompt.size());
  if (np >= n_ctx) {
    *err =
        ApiError{400,
                 "the prompt is " + std::to_string(np) + " tokens but the context holds " +
                     std::to_string(n_ctx) + " (and one more is needed to answer): " +
                     std::to_string(np - n_ctx + 1) + " tokens too many",
                 "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"};
    return false;
  }
  return true;
}

json logprob_content(const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const auto& lp : lps) {
    json top = json::array();
    for (const auto& [t, v] : lp.top)
      top.push_back(
          {{"token", t}, {"logprob", v}, {"bytes", std::vector<uint8_t>(t.begin(), t.end())}});
    content.push_back({{"token", lp.token},
                       {"logprob", lp.logprob},
                       {"bytes", std::vector<uint8_t>(lp.token.begin(), lp.token.end())},
                       {"top_logprobs", top}});
  }
  return content;
}

/// Completions' logprobs object: tokens, token_logprobs, top_logprobs, text_offset.
json legacy_logprobs(const std::vector<TokenLogprob>& lps, size_t text_offset0) {
  json tokens = json::array(), token_lp = json::array(), top = json::array(), offs = json::array();
  size_t off = text_offset0;
  for (const auto& lp : lps) {
    tokens.push_back(lp.token);
    token_lp.push_back(lp.logprob);
    json t = json::object();
    for (const auto& [s, v] : lp.top) t[s] = v;
    top.push_back(t);
    offs.push_back(off);
    off += lp.token.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lp},
          {"top_logprobs", top},
          {"text_offset", offs}};
}

std::string make_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(
      buf, sizeof buf, "%s-%016llx%04llx", prefix,
      static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count()),
      static_cast<unsigned long long>(counter++ & 0xffff));
  return buf;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json usage_of(Request& r) {
  std::lock_guard<std::mutex> lock(r.mu);
  return {{"prompt_tokens", r.n_prompt},
          {"completion_tokens", r.n_generated},
          {"total_tokens", r.n_prompt + r.n_generated},
          {"prompt_tokens_details", {{"cached_tokens", r.n_reused}}}};
}

/// Per-request timings (Loom's extension, as llama-server's "timings"): queue wait,
/// time to first token, inter-token latency P50/P99, in milliseconds.
json timings_of(Request& r) {
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<double> itl = r.itl_ms;
  std::sort(itl.begin(), itl.end());
  auto pct = [&](double p) {
    return itl.empty() ? 0.0
                       : itl[std::min(itl.size() - 1,
                                      static_cast<size_t>(p * static_cast<double>(itl.size())))];
  };
  return {{"queue_ms", r.queue_ms},  {"ttft_ms", r.ttft_ms},   {"itl_ms_p50", pct(0.5)},
          {"itl_ms_p99", pct(0.99)}, {"n_reused", r.n_reused}, {"n_generated", r.n_generated}};
}

bool secure_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

}  // namespace

struct Server::Impl {
  Scheduler& sched;
  Metrics& metrics;
  httplib::Server http;
  int listen_fd = -1;  ///< the listening socket, to raise httplib's backlog of 5
  Impl(Scheduler& s, Metrics& m) : sched(s), metrics(m) {}
};

Server::Server(Scheduler& sched, Metrics& metrics, const ServerOptions& o)
    : impl_(std::make_unique<Impl>(sched, metrics)), o_(o) {
  httplib::Server& http = impl_->http;
  Impl* im = impl_.get();
  const std::string model_id = o_.model_id;
  const std::string api_key = o_.api_key;
  const int threads = o_.http_threads > 0 ? o_.http_threads : sched.n_slots() + 64 + 4;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(o_.max_body_bytes);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a
  // second server on a port in use binds too and the kernel splits the
  // clients between the two without a word. TCP_NODELAY (inherited by the accepted sockets): a
  // stream writes one small chunk per token, which Nagle's algorithm would hold back until the
  // client's delayed ACK of the one before.
  http.set_socket_options([im](int sock) {
    int yes = 1;
    (void)::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    (void)::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    im->listen_fd = sock;
  });
  http.set_tcp_nodelay(true);
  http.set_keep_alive_max_count(1000);

  http.set_pre_routing_handler([api_key](const httplib::Request& req, httplib::Response& res) {
    if (api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string want = "Bearer " + api_key;
    if (!secure_equal(auth, want)) {
      send_error(res,
                 ApiError{401,
                          auth.empty() ? "an API key is needed: send 'Authorization: Bearer KEY'"
                                       : "the API key is not valid",
                          "invalid_request_error",
                          {},
                          "invalid_api_key"});
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own errors (413 for a body over the limit, 404 for an unknown route) get OpenAI's
  // shape.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.status = res.status;
    if (res.status == 413) {
      e.message = "the request body is too large";
      e.code = "request_too_large";
    } else if (res.status == 404) {
      e.message = "no route " + req.method + " " + req.path;
      e.code = "not_found";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    send_error(res, e);
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError{500, what, "server_error", {}, {}});
      });
  http.set_logger([im](const httplib::Request& req, const httplib::Response& res) {
    static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                  "/health", "/metrics"};
    std::string route = "other";
    for (const char* k : known)
      if (req.path == k) route = k;
    im->metrics.count_request(route, res.status);
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [im](const httplib::Request&, httplib::Response& res) {
    res.set_content(im->metrics.render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [model_id, im](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", model_id},
              {"object", "model"},
              {"created", unix_now()},
              {"owned_by", "loom"},
              {"meta",
               {{"n_ctx", im->sched.n_ctx()},
                {"n_vocab", im->sched.model().hp.n_vocab},
                {"slots", im->sched.n_slots()}}}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });

  auto completion = [im, model_id](bool chat) {
    return [im, model_id, chat](const httplib::Request& req, httplib::Response& res) {
      json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded()) {
        send_error(res, bad("the request body is not valid JSON"));
        return;
      }
      Parsed p;
      ApiError err;
      if (!parse_request(body, chat, im->sched.model(), model_id, im->sched.n_ctx(), &p, &err)) {
        send_error(res, err);
        return;
      }
      std::shared_ptr<Request> r = p.req;
      if (Status s = im->sched.submit(r); !s.ok()) {
        send_error(res, ApiError{429, s.message(), "rate_limit_error", {}, "queue_full"});
        res.set_header("Retry-After", "1");
        return;
      }
      const std::string id = make_id(chat ? "chatcmpl" : "cmpl");
      const int64_t created = unix_now();
      const char* object = chat ? "chat.completion" : "text_completion";

      if (!p.stream) {
        std::string text;
        std::vector<TokenLogprob> lps;
        std::vector<Event> evs;
        while (r->wait_events(&evs, std::chrono::milliseconds(200))) {
          for (auto& e : evs) {
            text += e.text;
            for (auto& lp : e.logprobs) lps.push_back(std::move(lp));
          }
          evs.clear();
        }
        Finish f;
        std::string error;
        {
          std::lock_guard<std::mutex> lock(r->mu);
          f = r->finish;
          error = r->error;
        }
        if (f == Finish::kError || f == Finish::kCancelled) {
          send_error(res, ApiError{f == Finish::kError ? 500 : 503,
                                   f == Finish::kError ? error : "the server is shutting down",
                                   "server_error",
                                   {},
                                   {}});
          return;
        }
        json choice = {{"index", 0}, {"finish_reason", finish_reason_text(f)}};
        if (chat) {
          choice["message"] = {{"role", "assistant"}, {"content", text}};
          choice["logprobs"] =
              r->top_logprobs >= 0 ? json{{"content", logprob_content(lps)}} : json(nullptr);
        } else {
          choice["text"] = text;
          choice["logprobs"] = r->top_logprobs >= 0 ? legacy_logprobs(lps, 0) : json(nullptr);
        }
        json out = {{"id", id},
                    {"object", object},
                    {"created", created},
                    {"model", model_id},
                    {"choices", json::array({choice})},
                    {"usage", usage_of(*r)}};
        out["timings"] = timings_of(*r);
        res.set_content(dump(out), "application/json");
        return;
      }

      // Streaming: one SSE event per piece of text, then the finish reason, usage and [DONE].
      res.set_header("Cache-Control", "no-cache");
      const bool include_usage = p.include_usage;
      res.set_chunked_content_provider(
          "text/event-stream",
          [r, id, created, model_id, chat, include_usage](size_t, httplib::DataSink& sink) {
            const char* chunk_object = chat ? "chat.completion.chunk" : "text_completion";
            auto chunk = [&](json choice) {
              return json{{"id", id},
                          {"object", chunk_object},
                          {"created", created},
                          {"model", model_id},
                          {"choices", json::array({std::move(choice)})}};
            };
            auto send = [&](const json& j) {
              const std::string s = "data: " + dump(j) + "\n\n";
              return sink.write(s.data(), s.size());
            };
            auto give_up = [&] {
              r->cancel.store(true);
              return false;
            };
            if (chat && !send(chunk({{"index", 0},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}})))
              return give_up();
            size_t text_off = 0;
            std::vector<Event> evs;
            for (;;) {
              const bool more = r->wait_events(&evs, std::chrono::milliseconds(100));
              for (auto& e : evs) {
                if (e.text.empty() && e.logprobs.empty()) continue;
                json c = {{"index", 0}, {"finish_reason", nullptr}};
                if (chat) {
                  c["delta"] = {{"content", e.text}};
                  c["logprobs"] = r->top_logprobs >= 0
                                      ? json{{"content", logprob_content(e.logprobs)}}
                                      : json(nullptr);
                } else {
                  c["text"] = e.text;
                  c["logprobs"] =
                      r->top_logprobs >= 0 ? legacy_logprobs(e.logprobs, text_off) : json(nullptr);
                }
                text_off += e.text.size();
                if (!send(chunk(std::move(c)))) return give_up();
              }
              evs.clear();
              if (!more) break;
              if (!sink.is_writable()) return give_up();
            }
            Finish f;
            std::string error;
            {
              std::lock_guard<std::mutex> lock(r->mu);
              f = r->finish;
              error = r->error;
            }
            if (f == Finish::kError || f == Finish::kCancelled) {
              json e = {{"error",
                         {{"message", f == Finish::kError ? error : "the server is shutting down"},
                          {"type", "server_error"},
                          {"param", nullptr},
                          {"code", nullptr}}}};
              if (!send(e)) return give_up();
            } else {
              json c = {{"index", 0}, {"finish_reason", finish_reason_text(f)}};
              if (chat) {
                c["delta"] = json::object();
                c["logprobs"] = nullptr;
              } else {
                c["text"] = "";
                c["logprobs"] = nullptr;
              }
              json last = chunk(std::move(c));
              if (include_usage) last["usage"] = nullptr;
              if (!send(last)) return give_up();
              if (include_usage) {
                json u = {{"id", id},
                          {"object", chunk_object},
                          {"created", created},
                          {"model", model_id},
                          {"choices", json::array()},
                          {"usage", usage_of(*r)},
                          {"timings", timings_of(*r)}};
                if (!send(u)) return give_up();
              }
            }
            static const char kDone[] = "data: [DONE]\n\n";
            if (!sink.write(kDone, sizeof kDone - 1)) return give_up();
            sink.done();
            return true;
          },
          [r](bool) { r->cancel.store(true); });  // ended or abandoned: stop generating
    };
  };
  http.Post("/v1/chat/completions", completion(true));
  http.Post("/v1/completions", completion(false));
  // Paths without the /v1 prefix, as llama-server accepts them.
  http.Post("/chat/completions", completion(true));
  http.Post("/completions", completion(false));
}

Server::~Server() {
  stop();
}

Status Server::bind() {
  httplib::Server& http = impl_->http;
  if (o_.port == 0) {
    port_ = http.bind_to_any_port(o_.host);
    if (port_ <= 0) return make_error(ErrorCode::kIo, "cannot bind %s to a port", o_.host.c_str());
  } else {
    if (!http.bind_to_port(o_.host, o_.port))
      return make_error(ErrorCode::kIo, "cannot listen on %s:%d (in use, or not an address here?)",
                        o_.host.c_str(), o_.port);
    port_ = o_.port;
  }
  // httplib listens with a backlog of 5: a burst of clients connecting at once
  // overflows it and some connections are dropped. listen() again sets a deeper one.
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, 512);
  return {};
}

Status Server::start() {
  LOOM_TRY(bind());
  thread_ = std::thread([this] { impl_->http.listen_after_bind(); });
  // Wait until the server accepts (the socket already queues connections; this is for is_running).
  for (int i = 0; i < 500 && !impl_->http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return {};
}

Status Server::run() {
  LOOM_TRY(bind());
  if (!impl_->http.listen_after_bind())
    return make_error(ErrorCode::kIo, "the HTTP server stopped with an error");
  return {};
}

void Server::stop() {
  impl_->http.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace loom::serve
