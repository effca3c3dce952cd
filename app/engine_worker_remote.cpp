// EngineWorker's remote engine: an OpenAI-compatible server as the model
// source (tools/serve/client.h). Replies stream into the transcript and the
// store as local ones do; their line says what the server reported.
#include <QUrl>
#include <nlohmann/json.hpp>

#include "app/engine_worker.h"
#include "app/live_stats.h"
#include "storage/store.h"
#include "tools/serve/client.h"

namespace {
using Clock = std::chrono::steady_clock;

loom::serve::ClientOptions clientFor(const QString& url, const QString& key) {
  loom::serve::ClientOptions o;
  o.url = url.trimmed().toStdString();
  o.api_key = key.trimmed().toStdString();
  return o;
}
}  // namespace

void EngineWorker::connectRemote(quint64 requestId, const QString& url, const QString& apiKey,
                                 const QString& model) {
  const QUrl u(url.trimmed());
  if (!u.isValid() ||
      (u.scheme() != QLatin1String("http") && u.scheme() != QLatin1String("https")) ||
      u.host().isEmpty()) {
    emit modelLoadFailed(requestId, tr("'%1' is not an http:// or https:// address").arg(url));
    return;
  }
  emit loadProgress(requestId, tr("Asking %1 for its models…").arg(url), -1);
  auto ids = loom::serve::list_models(clientFor(url, apiKey));
  if (!ids.ok()) {
    emit modelLoadFailed(requestId, QString::fromStdString(ids.message()));
    return;
  }
  QString chosen = model.trimmed();
  if (chosen.isEmpty()) {
    chosen = QString::fromStdString(ids->front());
  } else if (std::find(ids->begin(), ids->end(), chosen.toStdString()) == ids->end()) {
    QStringList have;
    for (const auto& id : *ids) have << QString::fromStdString(id);
    emit modelLoadFailed(requestId, tr("%1 does not serve '%2' (it serves: %3)")
                                        .arg(url, chosen, have.join(QStringLiteral(", "))));
    return;
  }
  // The local model goes: its memory is the machine's again.
  dropSession();
  attachAdaptive(nullptr, 0);
  m_model.reset();
  m_planner.reset();
  m_remote = Remote{url.trimmed(), apiKey.trimmed(), chosen};
  ModelSummary s;
  s.path = url.trimmed();
  s.name = chosen;
  s.arch = QStringLiteral("remote");
  s.description = tr("%1 at %2 (remote engine)").arg(chosen, url.trimmed());
  m_summary = s;
  emit remoteConnected(requestId, s,
                       tr("Chats go to %1, model %2: its server decides placement, memory "
                          "and precision.")
                           .arg(url.trimmed(), chosen));
}

void EngineWorker::generateRemote(const GenerationRequest& req) {
  GenerationResult r;
  r.requestId = req.requestId;
  r.messageId = req.messageId;
  std::string text;
  auto save = [&](loom::storage::MessageState state, const std::string& meta) {
    saveReply(req.messageId, text, state, meta);
  };

  nlohmann::json body;
  body["model"] = m_remote->model.toStdString();
  body["messages"] = nlohmann::json::array();
  for (const ChatTurn& t : req.turns)
    body["messages"].push_back(
        {{"role", t.role.toStdString()}, {"content", t.content.toStdString()}});
  const SamplingSettings& sp = req.sampling;
  body["temperature"] = sp.temperature;
  body["top_p"] = sp.topP;
  // Not OpenAI's, but Loom, llama-server and vLLM read them.
  body["top_k"] = sp.topK;
  body["min_p"] = sp.minP;
  body["repeat_penalty"] = sp.repeatPenalty;
  if (sp.seed >= 0) body["seed"] = sp.seed;
  if (sp.maxTokens > 0) body["max_tokens"] = sp.maxTokens;

  const auto t0 = Clock::now();
  auto lastFlush = t0, lastPiece = t0, firstPiece = t0;
  int pieces = 0;
  m_stats->generationStarted();
  m_generating.store(true);
  m_generatingRequest.store(req.requestId);
  auto usage = loom::serve::stream_chat(
      clientFor(m_remote->url, m_remote->apiKey), body.dump(), [&](const std::string& piece) {
        const auto now = Clock::now();
        // Pieces stand for tokens here (one a chunk from Loom and llama-server).
        m_stats->tokenGenerated(
            pieces == 0 ? 0
                        : static_cast<uint64_t>(std::chrono::nanoseconds(now - lastPiece).count()));
        if (pieces++ == 0) firstPiece = now;
        lastPiece = now;
        text += piece;
        if (now - lastFlush >= std::chrono::milliseconds(kBatchMs)) {
          save(loom::storage::MessageState::kStreaming, {});
          emit textUpdated(req.requestId, req.messageId, QString::fromStdString(text));
          lastFlush = now;
        }
        return !stopWanted(req.requestId);
      });
  m_generatingRequest.store(0);
  m_generating.store(false);
  r.text = QString::fromStdString(text);
  if (!usage.ok()) {
    m_stats->generationFinished(0, 0);
    r.error = QString::fromStdString(usage.message());
    r.meta = tr("error: %1").arg(r.error);
    save(loom::storage::MessageState::kError, r.meta.toStdString());
    emit generationFinished(r);
    return;
  }
  const loom::serve::ChatUsage& u = *usage;
  r.cancelled = u.finish_reason == "cancelled";
  r.stopReason = QString::fromStdString(u.finish_reason);
  r.nPrompt = static_cast<int>(std::max<int64_t>(0, u.prompt_tokens));
  r.nReused = static_cast<int>(std::max<int64_t>(0, u.cached_tokens));
  r.nGenerated = static_cast<int>(u.completion_tokens >= 0 ? u.completion_tokens : pieces);
  r.ttftMs = pieces > 0 ? std::chrono::duration<double, std::milli>(firstPiece - t0).count() : 0;
  const double span = std::chrono::duration<double>(lastPiece - firstPiece).count();
  r.tokensPerSecond = u.server_tokens_per_s > 0      ? u.server_tokens_per_s
                      : span > 0 && r.nGenerated > 1 ? (r.nGenerated - 1) / span
                                                     : 0.0;
  m_stats->generationFinished(r.ttftMs, r.tokensPerSecond);
  r.meta = tr("%1 tokens · %2 tok/s · first token %3 ms · %4 at %5")
               .arg(r.nGenerated)
               .arg(r.tokensPerSecond, 0, 'f', 1)
               .arg(r.ttftMs, 0, 'f', 0)
               .arg(m_remote->model, QUrl(m_remote->url).host());
  if (r.cancelled)
    r.meta += tr(" · stopped");
  else if (u.finish_reason == "length")
    r.meta += tr(" · token limit reached");
  save(r.cancelled ? loom::storage::MessageState::kStopped : loom::storage::MessageState::kComplete,
       r.meta.toStdString());
  emit textUpdated(req.requestId, req.messageId, r.text);
  emit generationFinished(r);
}
