// The main window: sidebar (chats, model), chat area (or the start screen),
// engine panel (placement, performance, devices, chat settings). It owns the
// engine worker's thread, the GUI thread's store connection and the live
// stats, wires them together, and handles model loading and the screenshot mode.
#pragma once

#include <QMainWindow>
#include <QThread>
#include <memory>

#include "app/app_options.h"
#include "app/app_types.h"
#include "app/device_info.h"
#include "app/placement_model.h"
#include "app/placement_planner.h"
#include "storage/store.h"

class ChatController;
class ChatListModel;
class Composer;
class ElidedLabel;
class EnginePanel;
class EngineWorker;
class LiveStats;
class PresetListModel;
class QAction;
class QLabel;
class QSplitter;
class QProgressBar;
class QPushButton;
class QFrame;
class QStackedWidget;
class QToolButton;
class Sidebar;
class StartScreen;
class TranscriptView;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  /// Opens the store (a failure is shown, and chats are then not kept). Call
  /// start() once shown.
  explicit MainWindow(const AppOptions& options, QWidget* parent = nullptr);
  ~MainWindow() override;

  /// Opens what the options ask for (a model, the demo) and, with
  /// --screenshot, renders and quits when done.
  void start();

  // Parts, for tests.
  ChatController* chat() const { return m_chat; }
  TranscriptView* transcript() const { return m_transcript; }
  Composer* composer() const { return m_composer; }
  Sidebar* sidebar() const { return m_sidebar; }
  EnginePanel* enginePanel() const { return m_engine; }
  PlacementModel* placement() const { return m_placement; }
  PresetListModel* presets() const { return m_presets; }
  /// The loaded model's planner (null before a model is loaded).
  const PlannerPtr& planner() const { return m_planner; }
  bool isPlacing() const { return m_placing; }
  StartScreen* startScreen() const { return m_start; }
  const ModelSummary* model() const { return m_hasModel ? &m_model : nullptr; }
  bool isLoading() const { return m_loadRequest != 0; }
  QString errorText() const;
  /// The three columns' widths (sidebar, chat, engine panel).
  QList<int> panelWidths() const;
  QSplitter* splitter() const { return m_split; }
  QAction* quitAction() const { return m_quit; }
  /// View > Engine panel (F9): whether the right panel is shown.
  QAction* enginePanelAction() const { return m_panelAction; }
  bool isEnginePanelShown() const;
  /// Where the window's size and the panels' widths are kept (window.ini next to the store).
  QString layoutFile() const;

 public slots:
  void openModelDialog();
  void showAbout();
  void loadModel(const QString& path);
  /// A remote engine as the model source (an OpenAI-compatible server):
  /// chats go there until a local model is opened again.
  void connectRemote(const QString& url, const QString& apiKey, const QString& model);
  /// File > Connect to a server…: asks for the address, key and model.
  void connectRemoteDialog();
  void loadDemoModel();
  void cancelLoad();
  /// Asks the engine for the grid's pending placement (live while a reply streams).
  void applyPlacement();
  /// Saves the grid's pending placement as a preset.
  void savePreset(const QString& name);
  /// Puts a preset in the grid and applies it.
  void applyPreset(qint64 presetId);
  void deletePreset(qint64 presetId);
  /// Writes the open chat to `path` (JSON for *.json, else Markdown); no model needed.
  bool exportCurrentChat(const QString& path, QString* error = nullptr);
  void exportChatDialog(bool json);
  /// Shows or folds away the engine panel (the window's minimum width follows).
  void setEnginePanelShown(bool shown);

 signals:
  void modelReady(const ModelSummary& model);
  void modelFailed(const QString& message);
  void placementDone(bool ok, const QString& note);
  /// The load banner changed: its text and percent (< 0: busy, no figure).
  void loadProgressShown(const QString& stage, int percent);

 signals:  // to the worker (queued)
  void workerLoad(quint64 requestId, const QString& path, bool isDemo);
  void workerLoadDemo(quint64 requestId, const QString& path);
  void workerConnectRemote(quint64 requestId, const QString& url, const QString& apiKey,
                           const QString& model);
  void workerOpenStore();
  void workerProbeDevices();
  void workerSetKvTiers(quint64 requestId, const KvTierSettings& tiers);
  void workerDiscoverModels();
  void workerCheckPrecision(quint64 requestId, const PlacementPlan& plan);

 protected:
  void closeEvent(QCloseEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  void buildUi();
  void restoreLayout();
  void updateMinimumSize();
  void saveLayout();
  void setDevices(const QVector<DeviceInfo>& devices);
  void showDevices();
  void connectWorker();
  void onRemoteConnected(quint64 requestId, const ModelSummary& model, const QString& note);
  void onModelLoaded(quint64 requestId, const ModelSummary& model, const PlacementPlan& placement,
                     const PlannerPtr& planner, const QString& note);
  void onPlacementApplied(quint64 requestId, const PlacementPlan& plan, const QString& note);
  /// The adaptive auto moved the placement (or could not): the grid follows.
  void onPlacementAdapted(const PlacementPlan& plan, const QString& what, bool moved);
  void onPlacementFailed(quint64 requestId, const QString& message);
  void updateEstimate();
  void onLoadFailed(quint64 requestId, const QString& message);
  void onLoadProgress(quint64 requestId, const QString& stage, int percent);
  void showError(const QString& title, const QString& message);
  /// "KV memory…": the dialog, then the worker makes the session again.
  void editKvTiers();
  void hideError();
  void refreshRecent();
  void updateHeader();
  void planStrategy(const QString& strategy, int gpuLayers, int budgetMiB);
  /// The largest N for "First N layers on GPU" whose GPU bytes fit `budgetMiB` (0: none).
  int largestGpuLayersThatFit(int budgetMiB) const;
  void confirmDeleteChat(qint64 chatId);
  void stopWorker();
  // --screenshot
  void screenshotStep();
  void finishScreenshot();

  AppOptions m_options;
  std::unique_ptr<loom::storage::Store> m_store;
  std::shared_ptr<LiveStats> m_stats;
  QThread m_thread;
  EngineWorker* m_worker = nullptr;
  ChatListModel* m_chats = nullptr;
  PlacementModel* m_placement = nullptr;
  PresetListModel* m_presets = nullptr;
  PlannerPtr m_planner;
  ChatController* m_chat = nullptr;

  Sidebar* m_sidebar = nullptr;
  QSplitter* m_split = nullptr;
  QAction* m_quit = nullptr;
  QAction* m_panelAction = nullptr;
  QToolButton* m_panelToggle = nullptr;
  QList<int> m_userSizes;  ///< the widths the user dragged to (empty: never dragged)
  QStackedWidget* m_center = nullptr;
  StartScreen* m_start = nullptr;
  QWidget* m_chatArea = nullptr;
  TranscriptView* m_transcript = nullptr;
  Composer* m_composer = nullptr;
  EnginePanel* m_engine = nullptr;
  ElidedLabel* m_chatTitle = nullptr;
  QLabel* m_modelDot = nullptr;
  ElidedLabel* m_modelChip = nullptr;
  QLabel* m_status = nullptr;
  QFrame* m_loadBanner = nullptr;
  QLabel* m_loadText = nullptr;
  QProgressBar* m_loadBar = nullptr;
  QFrame* m_errorBanner = nullptr;
  QLabel* m_errorTitle = nullptr;
  QLabel* m_errorText = nullptr;

  QVector<DeviceInfo> m_devices;  ///< as found (showDevices adds what the placement uses)
  ModelSummary m_model;
  bool m_hasModel = false;
  quint64 m_loadRequest = 0;  ///< the load the UI waits for (0: none)
  quint64 m_nextLoad = 1;
  bool m_placing = false;
  quint64 m_placeRequest = 0;  ///< the placement the UI waits for (0: none)
  quint64 m_nextPlace = 1;
  KvTierSettings m_kvTiers;    ///< the KV tier settings in force (window.ini)
  quint64 m_kvRequest = 0;     ///< the KV tier change the UI waits for (0: none)
  quint64 m_checkRequest = 0;  ///< the precision check the UI waits for (0: none)
  bool m_stopped = false;
  bool m_browsing = false;  ///< a chat was picked in the sidebar (shown even with no model)
  int m_screenshotStage = 0;
};
