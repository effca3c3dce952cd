#include "tools/serve/client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::serve {

namespace {
using json = nlohmann::json;

// "http://host:port/v1" -> ("http://host:port", "/v1"); no path -> "/v1".
std::pair<std::string, std::string> split_url(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t path = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  std::string base = path == std::string::npos ? url : url.substr(0, path);
  std::string prefix = path == std::string::npos ? std::string() : url.substr(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.empty()) prefix = "/v1";
  return {base, prefix};
}

httplib::Headers auth(const ClientOptions& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

// The server's error message from an OpenAI-shaped error body, or the body.
std::string error_message(int status, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  std::string msg;
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    msg = e.is_object()   ? e.value("message", std::string())
          : e.is_string() ? e.get<std::string>()
                          : "";
  }
  if (msg.empty()) msg = body.substr(0, 200);
  return "HTTP " + std::to_string(status) + (msg.empty() ? "" : ": " + msg);
}

// A client of the server's root (whatever API prefix the URL names).
httplib::Client root_client(const ClientOptions& o, int connect_s, int read_s) {
  httplib::Client c(split_url(o.url).first);
  c.set_connection_timeout(connect_s, 0);
  c.set_read_timeout(read_s, 0);
  return c;
}
}  // namespace

std::map<std::string, double> fetch_metrics(const ClientOptions& o) {
  std::map<std::string, double> m;
  httplib::Client c = root_client(o, o.connect_timeout_s, o.read_timeout_s);
  auto r = c.Get("/metrics", auth(o));
  if (!r || r->status != 200) return m;
  std::istringstream in(r->body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find('{') < sp) continue;
    try {
      m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    } catch (...) {
    }
  }
  return m;
}

bool server_healthy(const ClientOptions& o) {
  httplib::Client c = root_client(o, 1, 1);
  auto r = c.Get("/health");
  return r && r->status == 200;
}

Result<ChatUsage> stream_chat(const ClientOptions& o, const std::string& body,
                              const std::function<bool(const std::string& text)>& on_text) {
  json b = json::parse(body, nullptr, false);
  if (!b.is_object())
    return make_error(ErrorCode::kInvalidArgument, "stream_chat: body is not JSON");
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  const auto [base, prefix] = split_url(o.url);
  httplib::Client c(base);
  c.set_connection_timeout(o.connect_timeout_s, 0);
  c.set_read_timeout(o.read_timeout_s, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = prefix + "/chat/completions";
  req.headers = auth(o);
  req.body = b.dump();
  req.set_header("Content-Type", "application/json");
  ChatUsage u;
  std::string buf, err_body;
  bool done = false, stopped = false;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    size_t p;
    while ((p = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, p);
      buf.erase(0, p + 2);
      if (ev.rfind("data: ", 0) != 0) {
        err_body += ev;  // an error answer is plain JSON, not events
        continue;
      }
      ev.erase(0, 6);
      if (ev == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(ev, nullptr, false);
      if (!j.is_object()) continue;
      if (j.contains("usage") && j["usage"].is_object()) {
        const json& us = j["usage"];
        u.prompt_tokens = us.value("prompt_tokens", int64_t{-1});
        u.completion_tokens = us.value("completion_tokens", int64_t{-1});
        if (us.contains("prompt_tokens_details") && us["prompt_tokens_details"].is_object())
          u.cached_tokens = us["prompt_tokens_details"].value("cached_tokens", int64_t{-1});
      }
      if (j.contains("timings") && j["timings"].is_object()) {
        const json& t = j["timings"];
        if (t.contains("ttft_ms") && t["ttft_ms"].is_number())
          u.server_ttft_ms = t["ttft_ms"].get<double>();
        if (t.contains("predicted_per_second") && t["predicted_per_second"].is_number())
          u.server_tokens_per_s = t["predicted_per_second"].get<double>();
      }
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      const json& ch = j["choices"][0];
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        u.finish_reason = ch["finish_reason"].get<std::string>();
      const json& delta = ch.value("delta", json::object());
      if (delta.contains("content") && delta["content"].is_string()) {
        const std::string text = delta["content"].get<std::string>();
        if (!text.empty() && !on_text(text)) {
          stopped = true;
          return false;
        }
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error e = httplib::Error::Success;
  const bool sent = c.send(req, res, e);
  if (stopped) {
    u.finish_reason = "cancelled";
    return u;
  }
  if (!sent && res.status <= 0) {
    return make_error(ErrorCode::kIo, "cannot reach %s: %s", o.url.c_str(),
                      httplib::to_string(e).c_str());
  }
  if (res.status != 200)
    return make_error(ErrorCode::kIo, "%s: %s", o.url.c_str(),
                      error_message(res.status, err_body + buf).c_str());
  if (!done) return make_error(ErrorCode::kIo, "%s: the stream ended before [DONE]", o.url.c_str());
  return u;
}

Result<std::vector<std::string>> list_models(const ClientOptions& o) {
  const auto [base, prefix] = split_url(o.url);
  httplib::Client c(base);
  c.set_connection_timeout(o.connect_timeout_s, 0);
  c.set_read_timeout(o.read_timeout_s, 0);
  auto r = c.Get(prefix + "/models", auth(o));
  if (!r)
    return make_error(ErrorCode::kIo, "cannot reach %s: %s", o.url.c_str(),
                      httplib::to_string(r.error()).c_str());
  if (r->status != 200)
    return make_error(ErrorCode::kIo, "%s: %s", o.url.c_str(),
                      error_message(r->status, r->body).c_str());
  json j = json::parse(r->body, nullptr, false);
  std::vector<std::string> ids;
  if (j.is_object() && j.contains("data") && j["data"].is_array()) {
    for (const json& m : j["data"])
      if (m.is_object() && m.contains("id") && m["id"].is_string())
        ids.push_back(m["id"].get<std::string>());
  }
  if (ids.empty()) return make_error(ErrorCode::kIo, "%s lists no models", o.url.c_str());
  return ids;
}

}  // namespace loom::serve
