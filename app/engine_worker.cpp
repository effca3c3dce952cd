#include "app/engine_worker.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>

#include <chrono>
#include <string>
#include <thread>

#include "app/engine_bridge.h"
#include "app/live_stats.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/model/synth.h"
#include "engine/runtime/session.h"
#include "storage/store.h"

namespace {

using Clock = std::chrono::steady_clock;

QString qstr(const std::string& s) { return QString::fromStdString(s); }

int defaultThreads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Below this size a matmul is a few microseconds of work: handing pieces of it
// to other threads costs more than it saves (and a busy machine can keep a
// helper thread waiting for milliseconds), so tiny models run on one thread.
constexpr uint64_t kTinyModelBytes = 32ull << 20;

}  // namespace

EngineWorker::EngineWorker(QString dbPath, int nThreads, std::shared_ptr<LiveStats> stats)
    : m_dbPath(std::move(dbPath)),
      m_threadsAsked(nThreads),
      m_nThreads(defaultThreads(nThreads)),
      m_stats(std::move(stats)) {}

// The session refers to the model and the backend: it goes first.
EngineWorker::~EngineWorker() {
  m_session.reset();
  m_model.reset();
  m_backend.reset();
}

void EngineWorker::openStore() {
  if (m_store || m_dbPath.isEmpty()) return;
  auto s = loom::storage::Store::open(m_dbPath.toStdString());
  if (!s.ok()) {
    emit warning(tr("Replies cannot be saved while they stream: %1").arg(qstr(s.message())));
    return;
  }
  m_store = std::move(s).value();
}

void EngineWorker::probeDevices() { emit devicesFound(detectDevices(m_nThreads, /*probeGpus=*/true)); }

// ---- models -------------------------------------------------------------------

void EngineWorker::loadDemoModel(quint64 requestId, const QString& path) {
  if (!QFileInfo::exists(path)) {
    QDir().mkpath(QFileInfo(path).absolutePath());
    loom::SynthSpec spec;
    const DemoModelSpec demo;
    if (loom::Status st = loom::apply_synth_preset(demo.preset.toStdString(), &spec); !st.ok()) {
      emit modelLoadFailed(requestId, qstr(st.message()));
      return;
    }
    spec.weight_type = demo.weightType.toStdString();
    spec.seed = demo.seed;
    // Written next to its final name and renamed, so a half-written file is never "the demo model".
    const QString part = path + QStringLiteral(".part");
    const QString stage = tr("Writing the demo model (random weights)…");
    emit loadProgress(requestId, stage, 0);
    int lastPercent = 0;
    auto report = loom::write_synthetic_model(spec, part.toStdString(), [&](uint64_t done, uint64_t total) {
      const int pct = total ? static_cast<int>(done * 100 / total) : 0;
      if (pct != lastPercent) emit loadProgress(requestId, stage, lastPercent = pct);
    });
    if (!report.ok()) {
      QFile::remove(part);
      emit modelLoadFailed(requestId, qstr(report.message()));
      return;
    }
    QFile::remove(path);
    if (!QFile::rename(part, path)) {
      emit modelLoadFailed(requestId, tr("Could not move the demo model into place at %1").arg(path));
      return;
    }
  }
  loadModel(requestId, path, /*isDemo=*/true);
}

void EngineWorker::loadModel(quint64 requestId, const QString& path, bool isDemo) {
  emit loadProgress(requestId, tr("Reading %1…").arg(QFileInfo(path).fileName()), -1);
  auto loaded = loom::load_model(path.toStdString());
  // load_model is one call: a cancel cannot interrupt it, so its result is dropped here.
  if (m_cancelLoad.load() == requestId || m_shutdown.load()) {
    emit modelLoadCancelled(requestId);
    return;
  }
  if (!loaded.ok()) {
    emit modelLoadFailed(requestId, qstr(loaded.message()));
    return;
  }
  std::unique_ptr<loom::Model> model = std::move(loaded).value();
  const int threads = m_threadsAsked > 0 ? m_threadsAsked : model->weight_bytes() < kTinyModelBytes ? 1 : m_nThreads;
  if (!m_backend || m_backend->n_threads() != threads) {
    m_session.reset();  // it refers to the old backend
    m_backend = std::make_unique<loom::CpuBackend>(threads);
  }

  // The new model gets its session before the old one is let go: a failure
  // leaves the previous model working (unless the thread count changed above).
  loom::SessionConfig sc;
  sc.kv_dtype = loom::DType::kF16;
  auto session = loom::Session::create(*model, *m_backend, sc);
  loom::Status prepared = session.ok() ? (*session)->forward().prepare() : session.status();
  if (!prepared.ok()) {
    // Keep the previous model usable if the backend was replaced for this one.
    QString ignored;
    if (m_model && !m_session) createSession(m_sessionCtx, m_kvDtype, &ignored);
    emit modelLoadFailed(requestId, qstr(prepared.message()));
    return;
  }
  m_session.reset();
  m_model = std::move(model);
  m_session = std::move(session).value();
  m_kvDtype = QStringLiteral("F16");
  m_sessionCtx = 0;
  m_summary = summarizeModel(*m_model, path, isDemo);
  m_summary.nCtx = static_cast<int>(m_session->n_ctx());
  m_summary.kvDtype = m_kvDtype;
  m_layerStats = m_stats->resetForModel(m_model->hp.n_layer);
  m_session->forward().set_layer_stats(m_layerStats.get());
  publishMemory();

  openStore();
  if (m_store) {
    loom::storage::RecentModel rm;
    rm.path = path.toStdString();
    rm.name = m_summary.name.toStdString();
    rm.description = m_summary.description.toStdString();
    rm.size_bytes = m_summary.fileBytes;
    (void)m_store->touch_recent_model(rm);  // a list for convenience: not worth failing a load over
  }
  emit modelLoaded(requestId, m_summary, currentPlacement());
}

bool EngineWorker::createSession(int nCtx, const QString& kvDtype, QString* error) {
  loom::SessionConfig sc;
  sc.n_ctx = nCtx;
  const auto dt = loom::dtype_from_name(kvDtype.toStdString());
  if (!dt) {
    *error = tr("Unknown KV cache precision %1").arg(kvDtype);
    return false;
  }
  sc.kv_dtype = *dt;
  auto session = loom::Session::create(*m_model, *m_backend, sc);
  loom::Status prepared = session.ok() ? (*session)->forward().prepare() : session.status();
  if (!prepared.ok()) {
    *error = qstr(prepared.message());
    return false;
  }
  m_session = std::move(session).value();
  m_session->forward().set_layer_stats(m_layerStats.get());
  m_kvDtype = kvDtype;
  m_sessionCtx = nCtx;
  m_summary.nCtx = static_cast<int>(m_session->n_ctx());
  m_summary.kvDtype = kvDtype;
  return true;
}

PlacementPlan EngineWorker::currentPlacement() const {
  QString note;
  const QStringList kv = kvPrecisionChoices(m_summary, &note);
  return PlacementPlan::allOn(QStringLiteral("cpu"), m_summary, m_kvDtype, kv, note);
}

void EngineWorker::publishMemory() {
  TierBytes ram;
  if (m_model) ram.weights = m_model->weight_bytes();  // memory-mapped: resident once read
  if (m_session) ram.kv = m_session->kv().allocated_bytes();
  // No GPU backend and no SSD KV tier in this engine yet: their rows say so.
  m_stats->setMemory(TierBytes{}, ram, TierBytes{}, /*gpuPresent=*/false, /*ssdPresent=*/false);
}

// ---- generation -----------------------------------------------------------------

void EngineWorker::generate(const GenerationRequest& req) {
  openStore();
  GenerationResult r;
  r.requestId = req.requestId;
  r.messageId = req.messageId;
  std::string text;

  auto save = [&](loom::storage::MessageState state, const std::string& meta) {
    if (!m_store || req.messageId <= 0) return;
    loom::Status st = m_store->update_message(req.messageId, text, state, meta);
    // kInvalidArgument: the row is gone (the user deleted the chat meanwhile): nothing to save to.
    if (!st.ok() && st.error().code() != loom::ErrorCode::kInvalidArgument) {
      emit warning(tr("Could not save the reply: %1").arg(qstr(st.message())));
    }
  };
  auto fail = [&](const QString& message) {
    r.error = message;
    r.text = QString::fromStdString(text);
    r.meta = tr("error: %1").arg(message);
    save(loom::storage::MessageState::kError, r.meta.toStdString());
    emit generationFinished(r);
  };

  if (!m_model || !m_session) return fail(tr("No model is loaded."));
  if (stopWanted(req.requestId)) {
    r.cancelled = true;
    r.stopReason = QString::fromLatin1(loom::stop_reason_text(loom::StopReason::kCancelled));
    r.meta = tr("stopped");
    save(loom::storage::MessageState::kStopped, r.meta.toStdString());
    emit generationFinished(r);
    return;
  }
  if (req.sampling.nCtx != m_sessionCtx) {
    QString err;
    if (!createSession(req.sampling.nCtx, m_kvDtype, &err)) return fail(err);
    m_stats->resetTimings();
  }

  std::vector<loom::ChatMessage> messages;
  for (const ChatTurn& t : req.turns) messages.push_back({t.role.toStdString(), t.content.toStdString()});
  auto prompt = m_session->tokenize_chat(messages);
  if (!prompt.ok()) return fail(qstr(prompt.message()));

  loom::GenerateParams gp;
  gp.sampling = toSamplerParams(req.sampling);
  gp.max_tokens = req.sampling.maxTokens;

  // Pieces are gathered and sent (and saved) about once a frame: the GUI
  // redraws once per batch, not per token, and the store sees ~60 writes/s at most.
  auto lastFlush = Clock::now();
  auto lastPiece = Clock::now();
  bool first = true;
  auto flush = [&] {
    save(loom::storage::MessageState::kStreaming, {});
    emit textUpdated(req.requestId, req.messageId, QString::fromStdString(text));
  };
  auto onPiece = [&](std::string_view piece) {
    const auto now = Clock::now();
    // Time between pieces (one per token, except where a UTF-8 character
    // spans tokens): the inter-token latency the user sees.
    m_stats->tokenGenerated(first ? 0 : static_cast<uint64_t>(std::chrono::nanoseconds(now - lastPiece).count()));
    first = false;
    lastPiece = now;
    text.append(piece);
    if (now - lastFlush >= std::chrono::milliseconds(kBatchMs)) {
      flush();
      lastFlush = now;
    }
    return !stopWanted(req.requestId);
  };

  m_stats->generationStarted();
  auto stats = m_session->generate(*prompt, gp, onPiece, &m_shutdown);
  if (!stats.ok()) {
    m_stats->generationFinished(0, 0);
    return fail(qstr(stats.message()));
  }
  const loom::GenerateStats& st = *stats;
  r.text = QString::fromStdString(text);
  r.cancelled = st.reason == loom::StopReason::kCancelled;
  r.stopReason = QString::fromLatin1(loom::stop_reason_text(st.reason));
  r.nPrompt = static_cast<int>(st.n_prompt);
  r.nReused = static_cast<int>(st.n_reused);
  r.nGenerated = static_cast<int>(st.n_generated);
  r.ttftMs = st.ttft_ms;
  r.tokensPerSecond = st.decode_ms > 0 && st.n_generated > 1 ? (st.n_generated - 1) * 1000.0 / st.decode_ms : 0.0;
  m_stats->generationFinished(r.ttftMs, r.tokensPerSecond);
  publishMemory();

  r.meta = tr("%1 tokens · %2 tok/s · first token %3 ms")
               .arg(r.nGenerated)
               .arg(r.tokensPerSecond, 0, 'f', 1)
               .arg(r.ttftMs, 0, 'f', 0);
  if (r.cancelled) r.meta += tr(" · stopped");
  else if (st.reason != loom::StopReason::kEndOfGeneration) r.meta += QStringLiteral(" · ") + r.stopReason;
  save(r.cancelled ? loom::storage::MessageState::kStopped : loom::storage::MessageState::kComplete,
       r.meta.toStdString());
  emit textUpdated(req.requestId, req.messageId, r.text);
  emit generationFinished(r);
}

// ---- placement ------------------------------------------------------------------

void EngineWorker::applyPlacement(const PlacementPlan& plan) {
  if (!m_model) return emit placementFailed(tr("No model is loaded."));
  for (const QString& b : plan.backendsUsed()) {
    if (b != QLatin1String("cpu")) {
      return emit placementFailed(
          tr("This engine build runs on the CPU only; %1 cannot be used (no GPU backend is built).").arg(b));
    }
  }
  const QString kv = plan.kvPrecision();
  if (kv.isEmpty()) return emit placementFailed(tr("The CPU engine keeps one KV precision for all layers."));
  // Weights run as the file stores them: only the KV precision can change here.
  const PlacementPlan now = currentPlacement();
  for (int r = 0; r < plan.rows.size() && r < now.rows.size(); ++r) {
    for (int c = 0; c < plan.rows[r].size(); ++c) {
      if (c != kColAttnKv && plan.rows[r][c].precision != now.rows[r][c].precision) {
        return emit placementFailed(tr("Re-quantizing weights is not built yet."));
      }
    }
  }
  QString note = tr("Placement unchanged.");
  if (kv != m_kvDtype) {
    const int kept = m_session ? static_cast<int>(m_session->tokens().size()) : 0;
    const QString before = m_kvDtype;
    QString err;
    if (!createSession(m_sessionCtx, kv, &err)) return emit placementFailed(err);
    note = tr("KV cache now %1 (was %2). The chat is kept; the next reply re-reads its %n token(s).", "", kept)
               .arg(kv, before);
  }
  m_stats->resetTimings();
  publishMemory();
  PlacementPlan applied = currentPlacement();
  applied.strategy = plan.strategy;
  applied.gpuLayers = plan.gpuLayers;
  applied.vramBudgetMiB = plan.vramBudgetMiB;
  emit placementApplied(applied, note);
}
