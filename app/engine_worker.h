// The engine on its own thread. One EngineWorker lives on a QThread; the GUI
// talks to it only through queued signals and slots, plus the few atomic
// flags below that must work while a slot is busy (stop, cancel a load).
//
// The worker owns the model, the CPU backend and the session, and its own
// connection to the store: while a reply streams it saves the text every
// batch (~16 ms), so killing the app loses at most the last batch, and it
// finalizes the message (state, stats) itself before telling the GUI.
#pragma once

#include <QObject>
#include <QString>

#include <atomic>
#include <memory>

#include "app/app_types.h"
#include "app/device_info.h"
#include "app/placement_model.h"

class LiveStats;
namespace loom {
struct Model;
class CpuBackend;
class Session;
class LayerStats;
namespace storage {
class Store;
}
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
  void requestStop(quint64 requestId) { m_stopRequest.store(requestId); }
  /// Discards the result of load `requestId` when it arrives.
  void cancelLoad(quint64 requestId) { m_cancelLoad.store(requestId); }
  /// Closing: stop whatever runs, as soon as possible.
  void shutdown() { m_shutdown.store(true); }
  /// @}

  int threads() const { return m_nThreads; }

  /// How often pieces are sent to the GUI (and saved): about one frame.
  static constexpr int kBatchMs = 16;

 public slots:
  /// Loads a GGUF file; replaces the current model only when it succeeds.
  void loadModel(quint64 requestId, const QString& path, bool isDemo);
  /// Writes the built-in demo model to `path` when absent (progress), then loads it.
  void loadDemoModel(quint64 requestId, const QString& path);
  void generate(const GenerationRequest& request);
  /// Re-places the model; the conversation survives (it lives in the store,
  /// and the next reply re-reads it into the new KV cache).
  void applyPlacement(const PlacementPlan& plan);
  /// Opens the worker's own store connection (on this thread).
  void openStore();
  /// Asks every backend for its devices (slow for GPUs: here, not on the GUI thread).
  void probeDevices();

 signals:
  void loadProgress(quint64 requestId, const QString& stage, int percent);  // percent < 0: unknown
  void modelLoaded(quint64 requestId, const ModelSummary& model, const PlacementPlan& placement);
  void modelLoadFailed(quint64 requestId, const QString& message);
  void modelLoadCancelled(quint64 requestId);
  /// The whole text so far of a streaming reply (not a delta: a view that
  /// reloads the chat meanwhile cannot double or drop pieces).
  void textUpdated(quint64 requestId, qint64 messageId, const QString& text);
  void generationFinished(const GenerationResult& result);
  void placementApplied(const PlacementPlan& placement, const QString& note);
  void placementFailed(const QString& message);
  void devicesFound(const QVector<DeviceInfo>& devices);
  /// A problem that is not tied to a request (the store could not be opened...).
  void warning(const QString& message);

 private:
  bool createSession(int nCtx, const QString& kvDtype, QString* error);
  void publishMemory();
  PlacementPlan currentPlacement() const;
  bool stopWanted(quint64 requestId) const {
    return m_shutdown.load(std::memory_order_relaxed) || m_stopRequest.load(std::memory_order_relaxed) == requestId;
  }

  QString m_dbPath;
  int m_threadsAsked;  ///< --threads (0: automatic)
  int m_nThreads;      ///< the machine's threads, or --threads
  std::shared_ptr<LiveStats> m_stats;
  std::unique_ptr<loom::storage::Store> m_store;
  std::unique_ptr<loom::Model> m_model;
  std::unique_ptr<loom::CpuBackend> m_backend;
  std::unique_ptr<loom::Session> m_session;
  std::shared_ptr<loom::LayerStats> m_layerStats;
  ModelSummary m_summary;
  QString m_kvDtype = QStringLiteral("F16");
  int m_sessionCtx = 0;  ///< the n_ctx asked for when the session was made (0: default)

  std::atomic<quint64> m_stopRequest{0};
  std::atomic<quint64> m_cancelLoad{0};
  std::atomic<bool> m_shutdown{false};
};
