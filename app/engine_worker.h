// The engine on its own thread. One EngineWorker lives on a QThread; the GUI
// talks to it through queued signals and slots, plus the few thread-safe
// calls below that must work while a slot is busy (stop, cancel a load, ask
// for a placement while a reply streams).
//
// The worker owns the model, the CPU backend, the GPU backend (Vulkan, when a
// usable device exists) and the session, which runs on the GPU backend with
// the CPU as its other unit; a profiler records every decode step. It has its
// own connection to the store: while a reply streams it saves the text every
// batch (~16 ms), so killing the app loses at most the last batch, and it
// finalizes the message (state, stats) itself before telling the GUI.
//
// Placements: requestPlacement() hands the engine's Placement to
// Session::request_placement, which applies it between two tokens of the
// reply that is streaming (weights and KV move, generation goes on), or at
// once when nothing streams. A new KV precision needs a new KV cache: that
// waits for the reply to end. The outcome (the placement in force after
// fallbacks, the engine's notes, or its error with the previous placement
// kept) comes back as placementApplied / placementFailed.
#pragma once

#include <QObject>
#include <QString>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "app/app_types.h"
#include "app/device_info.h"
#include "app/placement_model.h"
#include "app/placement_planner.h"

class LiveStats;
namespace loom {
struct Model;
struct Placement;
class Backend;
class CpuBackend;
class Session;
class Profiler;
class AdaptiveController;
struct AdaptiveEvent;
namespace storage {
class Store;
enum class MessageState : int;
}  // namespace storage
}  // namespace loom

class EngineWorker : public QObject {
  Q_OBJECT
 public:
  /// `dbPath`: the store the worker saves streamed messages to. `nThreads`: CPU
  /// threads for the engine (0: all).
  EngineWorker(QString dbPath, int nThreads, std::shared_ptr<LiveStats> stats);
  ~EngineWorker() override;

  /// @name Any thread: flags read by the busy worker.
  /// @{
  /// Stops generation `requestId` at the next token (ignored if it already ended).
  void requestStop(quint64 requestId) {
    m_stopRequest.store(requestId);
    // Also between two tokens whose text is not out yet (a UTF-8 character split over tokens).
    if (m_generatingRequest.load() == requestId) m_cancelNow.store(true);
  }
  /// Stops load `requestId` at its next stage and discards its result.
  void cancelLoad(quint64 requestId) { m_cancelLoad.store(requestId); }
  /// Closing: stop whatever runs, as soon as possible.
  void shutdown() {
    m_shutdown.store(true);
    m_cancelNow.store(true);
  }
  /// @}

  /// Any thread: asks for `plan` (see the header comment). False, with the
  /// reason in `error`, when it cannot even be asked for (no model, a GPU cell
  /// without a GPU...); otherwise the answer comes later with `requestId`.
  /// `waitsForReply` says whether it waits for the streaming reply to end.
  bool requestPlacement(quint64 requestId, const PlacementPlan& plan, QString* error,
                        bool* waitsForReply = nullptr);
  /// The user is editing the placement (pending cells): the adaptive auto
  /// holds still until the edits are applied or dropped. Any thread.
  void setAdaptivePaused(bool paused);

  int threads() const { return m_nThreads; }

  /// How often pieces are sent to the GUI (and saved): about one frame.
  static constexpr int kBatchMs = 16;

 public slots:
  /// Loads a GGUF file; replaces the current model only when it succeeds.
  void loadModel(quint64 requestId, const QString& path, bool isDemo);
  /// Writes the built-in demo model to `path` when absent (progress), then loads it.
  void loadDemoModel(quint64 requestId, const QString& path);
  void generate(const GenerationRequest& request);
  /// A remote engine as the model source: chats go to an OpenAI-compatible
  /// server (vLLM, llama-server, another Loom) at `url` with `apiKey`, model
  /// `model` (empty: the first it lists). The local model, if any, is let go.
  /// Answers with remoteConnected or modelLoadFailed.
  void connectRemote(quint64 requestId, const QString& url, const QString& apiKey,
                     const QString& model);
  /// Opens the worker's own store connection (on this thread).
  void openStore();
  /// Where the KV cache spills (RAM budget, SSD folder, policy). Used by every
  /// session made from now on; a loaded model's session is made again at
  /// once (the chat's context is prefilled again at the next reply), and
  /// kvTiersApplied answers.
  void setKvTiers(quint64 requestId, const KvTierSettings& tiers);
  /// Looks for models already on the machine (the Hugging Face cache, LM
  /// Studio, Ollama, llama.cpp's cache: headers only) and emits modelsFound.
  void discoverModels();
  /// Asks every backend for its devices and opens the GPU backend (CUDA, else
  /// the best usable Vulkan device; slow: here, not on the GUI thread).
  void probeDevices();
  /// "Check precision": runs `plan` layer by layer on a short built-in text
  /// against the double reference (loom verify: each layer's error as placed)
  /// and probes the activations (loom probe: outlier shares), then emits
  /// precisionChecked. Slow on large models (the reference runs in double).
  void checkPrecision(quint64 requestId, const PlacementPlan& plan);

 signals:
  void loadProgress(quint64 requestId, const QString& stage, int percent);  // percent < 0: unknown
  void modelLoaded(quint64 requestId, const ModelSummary& model, const PlacementPlan& placement,
                   const PlannerPtr& planner, const QString& note);
  void modelLoadFailed(quint64 requestId, const QString& message);
  /// A remote engine is the model source now (`model.path` is its URL).
  void remoteConnected(quint64 requestId, const ModelSummary& model, const QString& note);
  void modelLoadCancelled(quint64 requestId);
  /// The whole text so far of a streaming reply (not a delta: a view that
  /// reloads the chat meanwhile cannot double or drop pieces).
  void textUpdated(quint64 requestId, qint64 messageId, const QString& text);
  void generationFinished(const GenerationResult& result);
  /// A requested placement is in force (`placement`: after the engine's
  /// fallbacks); `note` says what moved and what fell back.
  void placementApplied(quint64 requestId, const PlacementPlan& placement, const QString& note);
  /// It could not be applied; the previous placement stays, and so does the chat.
  void placementFailed(quint64 requestId, const QString& message);
  /// The adaptive auto moved the placement between two tokens (`moved`), or
  /// could not (`moved` false: `placement` is the one that stays). `what`:
  /// its log line.
  void placementAdapted(const PlacementPlan& placement, const QString& what, bool moved);
  /// How far the placement being applied is (weights re-quantized and moved), 0..100.
  void placementProgress(int percent);
  void devicesFound(const QVector<DeviceInfo>& devices);
  void modelsFound(const QVector<FoundModelInfo>& models);
  /// setKvTiers() is in force (ok), or could not be (the previous settings stay);
  /// `note` says what the session's KV may use now, or why not.
  void kvTiersApplied(quint64 requestId, bool ok, const QString& note);
  /// checkPrecision's figures (for the cells in `check.rows`).
  void precisionChecked(quint64 requestId, const PrecisionCheck& check);
  void precisionCheckFailed(quint64 requestId, const QString& message);
  /// A problem that is not tied to a request (the store could not be opened...).
  void warning(const QString& message);

 private:
  struct Wanted {
    quint64 requestId = 0;
    std::shared_ptr<loom::Placement> placement;
    QString kvDtype;
    std::shared_ptr<loom::AdaptiveController> adaptive;  ///< Auto (adaptive): runs once applied
    int vramBudgetMiB = 0;
  };
  /// The adaptive auto takes over the session's placement from here (null: none).
  /// (Worker thread; m_adaptive is written under m_mu.)
  void attachAdaptive(std::shared_ptr<loom::AdaptiveController> c, int vramBudgetMiB);
  /// A change by the adaptive auto (the generating thread): logged, marked, shown.
  void onAdaptiveEvent(const loom::AdaptiveEvent& e);
  /// Opens the GPU backend once: CUDA where it is built and a device is
  /// usable, else the best Vulkan device; m_gpuWhyNot says why neither.
  void ensureGpu();
  bool openCuda(QString* whyNot);
  void ensureVulkan();
  /// Saves with the reply what writes it: model, placement, KV cache, sampling.
  void recordOrigin(const GenerationRequest& req);
  /// A session for the current model: KV `kvDtype` for `nCtx` tokens, running
  /// `placement`. Null with the reason in `error`.
  /// `progress` (optional) hears the weights' placement (0..1) and may cancel it.
  std::unique_ptr<loom::Session> makeSession(const loom::Model& model, int nCtx,
                                             const QString& kvDtype,
                                             const loom::Placement& placement, QString* error,
                                             std::function<bool(double)> progress = {});
  /// Replaces the session (same model): new context or KV precision. The old
  /// one goes first (the GPU holds one copy of the weights); on failure a
  /// session like the old one is made again, so the model stays usable.
  /// `oldTiers`: the KV tier settings to go back to when the new session fails.
  bool rebuildSession(int nCtx, const QString& kvDtype, const loom::Placement* placement,
                      QString* error, const KvTierSettings* oldTiers = nullptr);
  void setSession(std::unique_ptr<loom::Session> s, const QString& kvDtype, int nCtxAsked);
  /// Lets the current session go, releasing its GPU memory.
  void dropSession();
  /// Applies a placement asked for while idle (queued by requestPlacement).
  void applyPendingPlacement();
  /// Applies a placement that needs a new KV cache (queued by requestPlacement).
  void applyWithNewKv();
  void onPlacementDone(quint64 requestId, bool ok, const QString& error);
  QString placementNote() const;
  PlacementPlan currentPlan() const;
  void publishMemory();
  /// Writes a reply's text, state and line to the store (a warning when it
  /// cannot; nothing when the chat was deleted meanwhile).
  void saveReply(qint64 messageId, const std::string& text, loom::storage::MessageState state,
                 const std::string& meta);
  /// generate() through the remote engine (engine_worker_remote.cpp).
  void generateRemote(const GenerationRequest& req);
  bool loadCancelled(quint64 requestId) const {
    return m_shutdown.load() || m_cancelLoad.load() == requestId;
  }
  bool stopWanted(quint64 requestId) const {
    return m_shutdown.load(std::memory_order_relaxed) ||
           m_stopRequest.load(std::memory_order_relaxed) == requestId;
  }

  QString m_dbPath;
  int m_threadsAsked;  ///< --threads (0: automatic)
  int m_nThreads;      ///< the machine's threads, or --threads
  std::shared_ptr<LiveStats> m_stats;
  std::unique_ptr<loom::storage::Store> m_store;
  std::shared_ptr<loom::Model> m_model;
  std::unique_ptr<loom::CpuBackend> m_cpu;
  std::unique_ptr<loom::Backend> m_gpu;
  bool m_gpuTried = false;
  QString m_gpuId;  ///< "vulkan:N" of the open GPU
  QString m_gpuName;
  QString m_gpuType;  ///< "discrete", "cpu" (a software renderer)...
  qint64 m_gpuMemory = 0;
  QString m_gpuWhyNot;  ///< when no GPU is open
  QVector<DeviceInfo> m_devices;
  std::shared_ptr<loom::Profiler> m_profiler;
  PlannerPtr m_planner;
  ModelSummary m_summary;
  int m_sessionCtx = 0;      ///< the n_ctx asked for when the session was made (0: default)
  KvTierSettings m_kvTiers;  ///< what the user set (worker thread only)
  struct Remote {
    QString url, apiKey, model;
  };
  std::optional<Remote> m_remote;  ///< set: chats go to this server, not a local model

  // Shared with requestPlacement (any thread).
  mutable std::mutex m_mu;
  /// Auto (adaptive), attached to m_session (declared first: outlives it).
  std::shared_ptr<loom::AdaptiveController> m_adaptive;
  int m_adaptiveBudgetMiB = 0;
  bool m_adaptivePaused = false;             ///< the user has pending edits in the grid
  std::unique_ptr<loom::Session> m_session;  ///< replaced (on this thread) under m_mu only
  QString m_kvDtype = QStringLiteral("F16");
  std::optional<Wanted> m_wanted;  ///< asked for, not answered yet

  std::atomic<quint64> m_stopRequest{0};
  std::atomic<quint64> m_generatingRequest{0};  ///< the request generate() runs (0: none)
  std::atomic<bool> m_cancelNow{false};         ///< the engine's cancel flag for that request
  std::atomic<quint64> m_cancelLoad{0};
  std::atomic<bool> m_shutdown{false};
  std::atomic<bool> m_generating{false};
};

/// The name a model's replies carry: its own, or "Loom demo".
QString modelDisplayName(const ModelSummary& m);
