#include "app/main_window.h"

#include <QAction>
#include <QCloseEvent>
#include <QCoreApplication>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDir>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QIcon>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QSettings>
#include <QShortcut>
#include <QSplitter>
#include <QStackedWidget>
#include <QTabBar>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>
#include <cstdio>

#include "app/charts_panel.h"
#include "app/chat_controller.h"
#include "app/chat_export.h"
#include "app/chat_list_model.h"
#include "app/chat_settings_panel.h"
#include "app/composer.h"
#include "app/device_info.h"
#include "app/elided_label.h"
#include "app/engine_bridge.h"
#include "app/engine_panel.h"
#include "app/engine_worker.h"
#include "app/kv_tiers_dialog.h"
#include "app/live_stats.h"
#include "app/placement_panel.h"
#include "app/preset_list_model.h"
#include "app/server_panel.h"
#include "app/sidebar.h"
#include "app/start_screen.h"
#include "app/theme.h"
#include "app/transcript_view.h"
#include "engine/core/version.h"
#include "engine/runtime/kv_cache.h"

namespace {

void registerTypes() {
  qRegisterMetaType<ModelSummary>();
  qRegisterMetaType<GenerationRequest>();
  qRegisterMetaType<GenerationResult>();
  qRegisterMetaType<KvTierSettings>();
  qRegisterMetaType<QVector<FoundModelInfo>>();
  qRegisterMetaType<PlacementPlan>();
  qRegisterMetaType<PrecisionCheck>();
  qRegisterMetaType<PlannerPtr>();
  qRegisterMetaType<QVector<DeviceInfo>>();
}

// Column minimums (px): the window's minimum size is their sum.
constexpr int kSidebarMin = 240;
constexpr int kCenterMin = 320;
constexpr int kEngineMin = 420;
constexpr int kWindowMinHeight = 640;

// A GGUF file, or a Hugging Face model folder (config.json beside the weights).
bool isModelFile(const QUrl& url) {
  if (!url.isLocalFile()) return false;
  const QString path = url.toLocalFile();
  if (QFileInfo(path).isDir()) return QFileInfo::exists(QDir(path).filePath("config.json"));
  return path.endsWith(QStringLiteral(".gguf"), Qt::CaseInsensitive);
}

}  // namespace

MainWindow::MainWindow(const AppOptions& options, QWidget* parent)
    : QMainWindow(parent), m_options(options) {
  registerTypes();
  setWindowTitle(QStringLiteral("Loom"));
  setWindowIcon(QIcon(QStringLiteral(":/loom/loom.svg")));
  setAcceptDrops(true);

  // The store of this (GUI) thread. If it cannot be opened the app still
  // works, on a throw-away file, and says so.
  QString dbPath = m_options.dbPath();
  QString storeError;
  QDir().mkpath(QFileInfo(dbPath).absolutePath());
  auto store = loom::storage::Store::open(dbPath.toStdString());
  if (!store.ok()) {
    storeError = QString::fromStdString(store.message());
    dbPath = QDir::temp().filePath(
        QStringLiteral("loom-unsaved-%1.db").arg(QCoreApplication::applicationPid()));
    QFile::remove(dbPath);
    store = loom::storage::Store::open(dbPath.toStdString());
  }
  if (store.ok()) {
    m_store = std::move(store).value();
    // Replies that were streaming when an earlier run died are marked interrupted.
    (void)m_store->recover_interrupted();
  }

  m_stats = std::make_shared<LiveStats>();
  m_worker = new EngineWorker(dbPath, m_options.threads, m_stats);
  m_worker->moveToThread(&m_thread);
  m_thread.setObjectName(QStringLiteral("loom-engine"));
  m_thread.start();

  // The CPU now; GPUs once the worker has asked their backends (devicesFound).
  const QVector<DeviceInfo> devices = detectDevices(m_worker->threads(), /*probeGpus=*/false);
  m_placement = new PlacementModel(this);
  m_chats = new ChatListModel(m_store.get(), this);
  m_presets = new PresetListModel(m_store.get(), this);

  buildUi();
  restoreLayout();
  setDevices(devices);
  m_chat = new ChatController(m_store.get(), m_worker, m_chats, m_sidebar, m_transcript, m_composer,
                              m_engine->chatSettings(), this);
  connectWorker();
  m_chat->setModelReady(false, {});
  refreshRecent();
  m_chat->openChat(m_chats->chatIdAt(0));
  updateHeader();
  emit workerOpenStore();
  emit workerProbeDevices();
  emit workerDiscoverModels();
  // Before any model loads (the worker takes its queued calls in order).
  m_kvTiers = KvTiersDialog::load(layoutFile());
  emit workerSetKvTiers(0, m_kvTiers);
  m_engine->placementPanel()->setKvTiersSummary(
      KvTiersDialog::summary(m_kvTiers, QString::fromStdString(loom::default_kv_spill_dir())));
  if (!storeError.isEmpty()) {
    showError(tr("Chats cannot be saved"),
              tr("%1\nThis session uses a temporary file instead.").arg(storeError));
  }
}

MainWindow::~MainWindow() {
  stopWorker();
}

void MainWindow::buildUi() {
  auto* central = new QWidget(this);
  central->setObjectName(QStringLiteral("Central"));
  auto* h = new QHBoxLayout(central);
  h->setContentsMargins(0, 0, 0, 0);
  h->setSpacing(0);
  auto* split = new QSplitter(Qt::Horizontal, central);
  m_split = split;
  split->setObjectName(QStringLiteral("MainSplitter"));
  split->setHandleWidth(1);
  split->setChildrenCollapsible(false);
  h->addWidget(split);

  m_sidebar = new Sidebar(m_chats, split);
  m_sidebar->setMinimumWidth(kSidebarMin);

  auto* center = new QWidget(split);
  auto* cv = new QVBoxLayout(center);
  cv->setContentsMargins(0, 0, 0, 0);
  cv->setSpacing(0);
  // Load progress, with Cancel.
  m_loadBanner = new QFrame(center);
  m_loadBanner->setObjectName(QStringLiteral("LoadBanner"));
  auto* lb = new QHBoxLayout(m_loadBanner);
  lb->setContentsMargins(20, 10, 20, 10);
  m_loadText = new QLabel(m_loadBanner);
  m_loadBar = new QProgressBar(m_loadBanner);
  m_loadBar->setTextVisible(false);
  m_loadBar->setFixedHeight(8);
  m_loadBar->setMaximumWidth(220);
  auto* cancel = new QPushButton(tr("Cancel"), m_loadBanner);
  connect(cancel, &QPushButton::clicked, this, &MainWindow::cancelLoad);
  lb->addWidget(m_loadText, 1);
  lb->addWidget(m_loadBar);
  lb->addWidget(cancel);
  cv->addWidget(m_loadBanner);
  m_loadBanner->hide();
  // Errors: the engine's own words, selectable, until dismissed.
  m_errorBanner = new QFrame(center);
  m_errorBanner->setObjectName(QStringLiteral("ErrorBanner"));
  auto* eb = new QHBoxLayout(m_errorBanner);
  eb->setContentsMargins(20, 10, 20, 10);
  auto* et = new QVBoxLayout;
  m_errorTitle = new QLabel(m_errorBanner);
  m_errorTitle->setStyleSheet(QStringLiteral("font-weight:700;color:#991b1b;"));
  m_errorText = new QLabel(m_errorBanner);
  m_errorText->setObjectName(QStringLiteral("ErrorText"));
  m_errorText->setWordWrap(true);
  m_errorText->setTextInteractionFlags(Qt::TextSelectableByMouse);
  et->addWidget(m_errorTitle);
  et->addWidget(m_errorText);
  auto* dismiss = new QPushButton(tr("Dismiss"), m_errorBanner);
  connect(dismiss, &QPushButton::clicked, this, &MainWindow::hideError);
  eb->addLayout(et, 1);
  eb->addWidget(dismiss, 0, Qt::AlignTop);
  cv->addWidget(m_errorBanner);
  m_errorBanner->hide();

  m_center = new QStackedWidget(center);
  m_start = new StartScreen(m_center);
  m_center->addWidget(m_start);
  m_chatArea = new QWidget(m_center);
  auto* ca = new QVBoxLayout(m_chatArea);
  ca->setContentsMargins(0, 0, 0, 0);
  ca->setSpacing(0);
  auto* header = new QWidget(m_chatArea);
  header->setObjectName(QStringLiteral("ChatHeader"));
  header->setAttribute(Qt::WA_StyledBackground, true);
  auto* hh = new QHBoxLayout(header);
  hh->setContentsMargins(24, 12, 20, 12);
  // Every label here elides (the whole text in its tooltip) and the status has
  // the width of its longest word: what they say never moves the splitter.
  m_chatTitle = new ElidedLabel(header);
  m_chatTitle->setObjectName(QStringLiteral("ChatTitle"));
  m_modelDot = new QLabel(QStringLiteral("●"), header);
  m_modelChip = new ElidedLabel(header);
  m_modelChip->setObjectName(QStringLiteral("ModelChip"));
  m_status = new QLabel(header);
  m_status->setObjectName(QStringLiteral("Muted"));
  m_status->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
  {
    const QFontMetrics fm(m_status->font());
    m_status->setFixedWidth(
        std::max(fm.horizontalAdvance(tr("Generating…")), fm.horizontalAdvance(tr("Ready"))) + 8);
  }
  hh->addWidget(m_chatTitle, 3);
  hh->addSpacing(12);
  hh->addWidget(m_modelDot);
  hh->addWidget(m_modelChip, 2);
  hh->addSpacing(12);
  hh->addWidget(m_status);
  // Narrow windows: the engine panel folds away (View > Engine panel, F9, or
  // this button) and the window may then be as narrow as the chat allows.
  m_panelToggle = new QToolButton(header);
  m_panelToggle->setObjectName(QStringLiteral("PanelToggle"));
  m_panelToggle->setAutoRaise(true);
  hh->addWidget(m_panelToggle);
  ca->addWidget(header);
  m_transcript = new TranscriptView(m_chatArea);
  ca->addWidget(m_transcript, 1);
  auto* composerRow = new QHBoxLayout;
  composerRow->setContentsMargins(24, 6, 24, 18);
  m_composer = new Composer(m_chatArea);
  m_composer->setMaximumWidth(860);
  composerRow->addWidget(m_composer);
  ca->addLayout(composerRow);
  m_center->addWidget(m_chatArea);
  cv->addWidget(m_center, 1);

  m_engine = new EnginePanel(m_placement, m_presets, m_stats, split);
  // Wide enough for its four tabs without scroll arrows, and for the grid's columns.
  m_engine->ensurePolished();
  m_engine->setMinimumWidth(std::max(kEngineMin, m_engine->tabBar()->sizeHint().width() + 4));
  center->setMinimumWidth(kCenterMin);
  split->addWidget(m_sidebar);
  split->addWidget(center);
  split->addWidget(m_engine);
  // A window that grows or shrinks changes the chat's width only; the side
  // panels keep theirs until the user drags a handle (saved, see saveLayout).
  split->setStretchFactor(0, 0);
  split->setStretchFactor(1, 1);
  split->setStretchFactor(2, 0);
  split->setSizes({260, 640, 540});
  connect(split, &QSplitter::splitterMoved, this, [this] { m_userSizes = m_split->sizes(); });
  setCentralWidget(central);
  updateMinimumSize();

  // The menu bar: what the desktop expects (File > Quit is Ctrl+Q).
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QMenu* view = menuBar()->addMenu(tr("&View"));
  QMenu* help = menuBar()->addMenu(tr("&Help"));
  m_panelAction = new QAction(tr("Engine panel"), this);
  m_panelAction->setObjectName(QStringLiteral("EnginePanelAction"));
  m_panelAction->setCheckable(true);
  m_panelAction->setChecked(true);
  m_panelAction->setShortcut(QKeySequence(Qt::Key_F9));
  m_panelAction->setToolTip(
      tr("Show or hide the engine panel: placement, performance, devices, chat settings (F9)"));
  connect(m_panelAction, &QAction::toggled, this, &MainWindow::setEnginePanelShown);
  addAction(m_panelAction);
  view->addAction(m_panelAction);
  // The header's button: two characters, so the title keeps the room.
  auto syncToggle = [this](bool shown) {
    m_panelToggle->setText(shown ? QStringLiteral("»") : QStringLiteral("«"));
    m_panelToggle->setToolTip(shown ? tr("Fold the engine panel away (F9)")
                                    : tr("Show the engine panel (F9)"));
  };
  connect(m_panelAction, &QAction::toggled, this, syncToggle);
  connect(m_panelToggle, &QToolButton::clicked, m_panelAction, &QAction::trigger);
  syncToggle(true);

  // Keyboard: Ctrl+N new chat, Ctrl+O open a model, Esc stops a reply.
  auto* newChat = new QAction(tr("New chat"), this);
  newChat->setShortcut(QKeySequence::New);
  connect(newChat, &QAction::triggered, this, [this] { m_chat->newChat(); });
  addAction(newChat);
  file->addAction(newChat);
  auto* open = new QAction(tr("Open model…"), this);
  open->setShortcut(QKeySequence::Open);
  connect(open, &QAction::triggered, this, &MainWindow::openModelDialog);
  addAction(open);
  file->addAction(open);
  auto* openDir = new QAction(tr("Open Hugging Face model folder…"), this);
  openDir->setToolTip(
      tr("A folder with config.json, *.safetensors and tokenizer.json or tokenizer.model"));
  connect(openDir, &QAction::triggered, this, [this] {
    const QString start = m_hasModel ? QFileInfo(m_model.path).absolutePath() : QDir::homePath();
    const QString dir = QFileDialog::getExistingDirectory(this, tr("Open a model folder"), start);
    if (!dir.isEmpty()) loadModel(dir);
  });
  file->addAction(openDir);
  auto* remote = new QAction(tr("Connect to a server…"), this);
  remote->setToolTip(
      tr("Chat through an OpenAI-compatible server: vLLM, llama-server, another Loom"));
  connect(remote, &QAction::triggered, this, &MainWindow::connectRemoteDialog);
  file->addAction(remote);
  file->addSeparator();
  // Exports read the store: they work with no model loaded.
  auto* exportMd = new QAction(tr("Export chat as Markdown…"), this);
  connect(exportMd, &QAction::triggered, this, [this] { exportChatDialog(false); });
  file->addAction(exportMd);
  auto* exportJson = new QAction(tr("Export chat as JSON…"), this);
  connect(exportJson, &QAction::triggered, this, [this] { exportChatDialog(true); });
  file->addAction(exportJson);
  file->addSeparator();
  m_quit = new QAction(QIcon::fromTheme(QStringLiteral("application-exit")), tr("&Quit"), this);
  m_quit->setObjectName(QStringLiteral("QuitAction"));
  // The platform's Quit keys; where the platform names none (the offscreen
  // one, some desktops), Ctrl+Q.
  QList<QKeySequence> quitKeys = QKeySequence::keyBindings(QKeySequence::Quit);
  if (quitKeys.isEmpty()) quitKeys << QKeySequence(Qt::CTRL | Qt::Key_Q);
  m_quit->setShortcuts(quitKeys);
  m_quit->setShortcutContext(Qt::ApplicationShortcut);
  m_quit->setMenuRole(QAction::QuitRole);
  // Closing the window stops a reply at its next token and saves it (closeEvent).
  connect(m_quit, &QAction::triggered, this, &QWidget::close);
  addAction(m_quit);
  file->addAction(m_quit);
  auto* about = new QAction(tr("About Loom"), this);
  about->setShortcut(QKeySequence::HelpContents);
  connect(about, &QAction::triggered, this, &MainWindow::showAbout);
  addAction(about);
  help->addAction(about);
  connect(m_sidebar, &Sidebar::aboutRequested, this, &MainWindow::showAbout);
  auto* esc = new QShortcut(QKeySequence(Qt::Key_Escape), this);
  connect(esc, &QShortcut::activated, this, [this] { m_chat->stop(); });

  connect(m_start, &StartScreen::openModelRequested, this, &MainWindow::openModelDialog);
  connect(m_start, &StartScreen::demoModelRequested, this, &MainWindow::loadDemoModel);
  connect(m_start, &StartScreen::recentModelRequested, this, &MainWindow::loadModel);
  connect(m_sidebar, &Sidebar::openModelRequested, this, &MainWindow::openModelDialog);
  connect(m_sidebar, &Sidebar::recentModelRequested, this, &MainWindow::loadModel);
  connect(m_sidebar, &Sidebar::demoModelRequested, this, &MainWindow::loadDemoModel);
  connect(m_sidebar, &Sidebar::deleteChatRequested, this, &MainWindow::confirmDeleteChat);
  connect(m_sidebar, &Sidebar::chatSelected, this, [this] {
    m_browsing = true;
    updateHeader();
  });
  connect(m_chats, &ChatListModel::errorOccurred, this,
          [this](const QString& e) { showError(tr("Chats"), e); });

  PlacementPanel* pp = m_engine->placementPanel();
  connect(pp, &PlacementPanel::strategyChosen, this, &MainWindow::planStrategy);
  connect(pp, &PlacementPanel::applyRequested, this, &MainWindow::applyPlacement);
  connect(pp, &PlacementPanel::kvTiersRequested, this, &MainWindow::editKvTiers);
  connect(pp, &PlacementPanel::precisionCheckRequested, this, [this] {
    if (!m_hasModel || m_checkRequest) return;
    m_checkRequest = m_nextPlace++;
    m_engine->placementPanel()->setChecking(true);
    emit workerCheckPrecision(m_checkRequest, m_placement->pending());  // on the worker's thread
  });
  connect(pp, &PlacementPanel::savePresetRequested, this, &MainWindow::savePreset);
  connect(pp, &PlacementPanel::presetChosen, this, &MainWindow::applyPreset);
  connect(pp, &PlacementPanel::deletePresetRequested, this, &MainWindow::deletePreset);
  connect(m_placement, &PlacementModel::pendingChanged, this, &MainWindow::updateEstimate);
  connect(m_presets, &PresetListModel::errorOccurred, this,
          [this](const QString& e) { showError(tr("Presets"), e); });
}

void MainWindow::connectWorker() {
  EngineWorker* w = m_worker;
  connect(this, &MainWindow::workerLoad, w, &EngineWorker::loadModel);
  connect(this, &MainWindow::workerLoadDemo, w, &EngineWorker::loadDemoModel);
  connect(this, &MainWindow::workerConnectRemote, w, &EngineWorker::connectRemote);
  connect(w, &EngineWorker::remoteConnected, this, &MainWindow::onRemoteConnected);
  connect(this, &MainWindow::workerOpenStore, w, &EngineWorker::openStore);
  connect(this, &MainWindow::workerProbeDevices, w, &EngineWorker::probeDevices);
  connect(this, &MainWindow::workerSetKvTiers, w, &EngineWorker::setKvTiers);
  connect(this, &MainWindow::workerDiscoverModels, w, &EngineWorker::discoverModels);
  connect(this, &MainWindow::workerCheckPrecision, w, &EngineWorker::checkPrecision);
  connect(w, &EngineWorker::precisionChecked, this,
          [this](quint64 id, const PrecisionCheck& check) {
            if (id != m_checkRequest) return;
            m_checkRequest = 0;
            m_engine->placementPanel()->setChecking(false);
            m_placement->setPrecisionCheck(check);
            if (!m_placement->hasPrecisionCheck()) {
              m_engine->placementPanel()->setNote(
                  tr("The placement changed while it was checked: check it again."));
            }
          });
  connect(w, &EngineWorker::precisionCheckFailed, this, [this](quint64 id, const QString& e) {
    if (id != m_checkRequest) return;
    m_checkRequest = 0;
    m_engine->placementPanel()->setChecking(false);
    m_engine->placementPanel()->setNote(tr("Precision check failed: %1").arg(e), true);
  });
  connect(w, &EngineWorker::modelsFound, m_start, &StartScreen::setFoundModels);
  connect(w, &EngineWorker::kvTiersApplied, this, [this](quint64 id, bool ok, const QString& note) {
    if (id == 0 || id != m_kvRequest) return;
    m_kvRequest = 0;
    PlacementPanel* panel = m_engine->placementPanel();
    if (!ok) {
      // The engine kept the previous settings: so does the window.
      m_kvTiers = KvTiersDialog::load(layoutFile());
      panel->setKvTiersSummary(
          KvTiersDialog::summary(m_kvTiers, QString::fromStdString(loom::default_kv_spill_dir())));
      panel->setNote(tr("KV memory not changed: %1").arg(note), true);
      showError(tr("KV cache memory"), note);
      return;
    }
    KvTiersDialog::save(layoutFile(), m_kvTiers);
    panel->setNote(note);
  });
  connect(w, &EngineWorker::devicesFound, this, &MainWindow::setDevices);
  connect(m_chat, &ChatController::generateRequested, w, &EngineWorker::generate);

  connect(w, &EngineWorker::loadProgress, this, &MainWindow::onLoadProgress);
  connect(w, &EngineWorker::modelLoaded, this, &MainWindow::onModelLoaded);
  connect(w, &EngineWorker::modelLoadFailed, this, &MainWindow::onLoadFailed);
  connect(w, &EngineWorker::modelLoadCancelled, this, [this](quint64 id) {
    if (id == m_loadRequest) m_loadRequest = 0;
  });
  connect(w, &EngineWorker::textUpdated, m_chat, &ChatController::onTextUpdated);
  connect(w, &EngineWorker::generationFinished, m_chat, &ChatController::onGenerationFinished);
  connect(w, &EngineWorker::warning, this,
          [this](const QString& m) { showError(tr("Warning"), m); });
  connect(w, &EngineWorker::placementApplied, this, &MainWindow::onPlacementApplied);
  connect(w, &EngineWorker::placementFailed, this, &MainWindow::onPlacementFailed);
  connect(w, &EngineWorker::placementAdapted, this, &MainWindow::onPlacementAdapted);
  // Pending edits in the grid: the adaptive auto holds still (it would drop them).
  connect(m_placement, &PlacementModel::pendingChanged, this,
          [this] { m_worker->setAdaptivePaused(m_placement->isDirty()); });
  connect(w, &EngineWorker::placementProgress, this, [this](int percent) {
    if (m_placing && percent < 100)
      m_engine->placementPanel()->setNote(tr("Applying… %1%").arg(percent));
  });

  // Placements apply while a reply streams (between two tokens): Apply does not wait for it.
  connect(m_chat, &ChatController::busyChanged, this, [this] { updateHeader(); });
  connect(m_chat, &ChatController::chatChanged, this, [this] { updateHeader(); });
  connect(m_chat, &ChatController::errorOccurred, this,
          [this](const QString& e) { showError(tr("Something went wrong"), e); });
}

void MainWindow::setDevices(const QVector<DeviceInfo>& devices) {
  m_devices = devices;
  m_placement->setBackends(backendsFromDevices(devices));
  m_placement->setStrategies(strategiesFor(m_placement->backends()));
  m_engine->placementPanel()->refreshChoices();
  showDevices();
}

void MainWindow::showDevices() {
  // "In use" only where the applied placement puts an op group.
  const QVector<DeviceInfo> devices = devicesUnderPlacement(
      m_devices, m_hasModel ? m_placement->applied().backendsUsed() : QStringList());
  m_engine->setDevices(devices);
  // What the engine runs on, in one line under the strategy (the details in its tooltip).
  QString units;
  QStringList whyNot, details;
  bool looking = false;
  for (const DeviceInfo& d : devices) {
    if (d.backendId == QLatin1String("cpu")) continue;
    if (d.inUse && d.idle) {
      units = tr("The CPU and the GPU %1 (%2%3) are open; the applied placement runs everything on "
                 "the CPU, so the GPU is idle.")
                  .arg(d.name, d.kind,
                       d.memTotal > 0 ? tr(", %1").arg(formatBytes(d.memTotal)) : QString());
    } else if (d.inUse) {
      units = tr("Runs on the CPU and the GPU: %1 (%2%3).")
                  .arg(d.name, d.kind,
                       d.memTotal > 0 ? tr(", %1").arg(formatBytes(d.memTotal)) : QString());
    } else if (d.status == tr("looking…")) {
      looking = true;
    } else {
      whyNot << QStringLiteral("%1: %2").arg(d.kind, d.status);
    }
    details << QStringLiteral("%1 — %2: %3").arg(d.kind, d.name, d.status) +
                   (d.details.isEmpty()
                        ? QString()
                        : QStringLiteral("\n  ") + d.details.join(QStringLiteral("\n  ")));
  }
  if (units.isEmpty()) {
    units = looking ? tr("Looking for GPUs…")
                    : tr("CPU only: no usable GPU (%1). Every cell runs on the CPU.")
                          .arg(whyNot.join(QStringLiteral("; ")));
  }
  m_engine->placementPanel()->setUnitsText(units, details.join(QStringLiteral("\n")));
}

// ---- models -----------------------------------------------------------------------

void MainWindow::openModelDialog() {
  const QString dir = m_hasModel ? QFileInfo(m_model.path).absolutePath() : QDir::homePath();
  const QString path = QFileDialog::getOpenFileName(this, tr("Open a model"), dir,
                                                    tr("GGUF models (*.gguf);;All files (*)"));
  if (!path.isEmpty()) loadModel(path);
}

void MainWindow::showAbout() {
  QMessageBox::about(
      this, tr("About Loom"),
      tr("<h3>Loom %1</h3><p>Built from git commit <tt>%2</tt>, with Qt %3.</p>"
         "<p>A local LLM workstation: one model across the GPU and the CPU, "
         "each layer placed where it serves best.</p>")
          .arg(QString::fromUtf8(loom::version()), QString::fromUtf8(loom::git_commit()),
               QString::fromUtf8(qVersion())));
}

bool MainWindow::exportCurrentChat(const QString& path, QString* error) {
  QString e;
  const qint64 id = m_chat->currentChat();
  const bool ok =
      id ? exportChat(m_store.get(), id, path, &e) : (e = tr("No chat is open."), false);
  if (error) *error = e;
  return ok;
}

void MainWindow::exportChatDialog(bool json) {
  const auto* c = m_chats->chat(m_chat->currentChat());
  if (!c) return showError(tr("Export"), tr("No chat is open."));
  QString name = QString::fromStdString(c->title).simplified();
  name.replace(QRegularExpression(QStringLiteral("[^\\w .-]")), QStringLiteral("_"));
  const QString path = QFileDialog::getSaveFileName(
      this, json ? tr("Export chat as JSON") : tr("Export chat as Markdown"),
      QDir::home().filePath(name + (json ? QStringLiteral(".json") : QStringLiteral(".md"))),
      json ? tr("JSON (*.json)") : tr("Markdown (*.md)"));
  if (path.isEmpty()) return;
  QString error;
  if (!exportCurrentChat(path, &error)) showError(tr("Export"), error);
}

void MainWindow::loadModel(const QString& path) {
  if (m_chat->isBusy())
    m_chat->stop();  // the reply ends at its next token; the load waits behind it
  hideError();
  m_loadRequest = m_nextLoad++;
  onLoadProgress(m_loadRequest, tr("Opening %1…").arg(QFileInfo(path).fileName()), -1);
  emit workerLoad(m_loadRequest, path, /*isDemo=*/false);
}

void MainWindow::connectRemote(const QString& url, const QString& apiKey, const QString& model) {
  if (m_chat->isBusy()) m_chat->stop();
  hideError();
  m_loadRequest = m_nextLoad++;
  onLoadProgress(m_loadRequest, tr("Connecting to %1…").arg(url), -1);
  emit workerConnectRemote(m_loadRequest, url, apiKey, model);
}

void MainWindow::connectRemoteDialog() {
  QDialog d(this);
  d.setWindowTitle(tr("Connect to a server"));
  auto* form = new QFormLayout(&d);
  auto* url = new QLineEdit(&d);
  url->setPlaceholderText(QStringLiteral("http://127.0.0.1:8080/v1"));
  if (m_hasModel && m_model.arch == QLatin1String("remote")) url->setText(m_model.path);
  auto* key = new QLineEdit(&d);
  key->setEchoMode(QLineEdit::Password);
  key->setPlaceholderText(tr("none"));
  auto* model = new QLineEdit(&d);
  model->setPlaceholderText(tr("the first it lists"));
  form->addRow(tr("Address"), url);
  form->addRow(tr("API key"), key);
  form->addRow(tr("Model"), model);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &d);
  buttons->button(QDialogButtonBox::Ok)->setText(tr("Connect"));
  connect(buttons, &QDialogButtonBox::accepted, &d, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, &d, &QDialog::reject);
  form->addRow(buttons);
  if (d.exec() != QDialog::Accepted || url->text().trimmed().isEmpty()) return;
  connectRemote(url->text().trimmed(), key->text(), model->text());
}

void MainWindow::onRemoteConnected(quint64 requestId, const ModelSummary& model,
                                   const QString& note) {
  if (requestId != m_loadRequest) return;
  m_loadRequest = 0;
  m_loadBanner->hide();
  m_model = model;
  m_hasModel = true;
  m_planner.reset();  // no grid: the server places its own model
  m_placing = false;
  m_placeRequest = 0;
  m_placement->setApplied(PlacementPlan{});
  m_presets->setLayerCount(0);
  m_engine->placementPanel()->setNote(note);
  m_engine->serverPanel()->setModel({}, {});  // nothing local to serve
  m_sidebar->setModel(&m_model);
  m_chat->setModelReady(true, model.name);
  m_center->setCurrentWidget(m_chatArea);
  m_chat->openChat(m_chat->currentChat());
  updateHeader();
  m_composer->input()->setFocus();
  emit modelReady(m_model);
}

void MainWindow::loadDemoModel() {
  if (m_chat->isBusy()) m_chat->stop();
  hideError();
  m_loadRequest = m_nextLoad++;
  onLoadProgress(m_loadRequest, tr("Preparing the demo model…"), -1);
  emit workerLoadDemo(m_loadRequest, m_options.demoModelPath());
}

void MainWindow::cancelLoad() {
  if (!m_loadRequest) return;
  // The worker stops at its next step (reading the file is one engine call:
  // that finishes in the background) and drops the result.
  m_worker->cancelLoad(m_loadRequest);
  m_loadRequest = 0;
  m_loadBanner->hide();
  m_status->setText(
      tr("Load cancelled (the engine stops at its next step; the result is discarded)"));
}

void MainWindow::onLoadProgress(quint64 requestId, const QString& stage, int percent) {
  if (requestId != m_loadRequest) return;
  m_loadText->setText(stage);
  if (percent < 0) {
    m_loadBar->setRange(
        0, 0);  // busy indicator: reading the file is one engine call, with no progress
  } else {
    m_loadBar->setRange(0, 100);
    m_loadBar->setValue(percent);
  }
  m_loadBanner->show();
  emit loadProgressShown(stage, percent);
}

void MainWindow::onModelLoaded(quint64 requestId, const ModelSummary& model,
                               const PlacementPlan& placement, const PlannerPtr& planner,
                               const QString& note) {
  if (requestId != m_loadRequest) return;  // cancelled meanwhile: the worker dropped it too
  m_loadRequest = 0;
  m_loadBanner->hide();
  m_model = model;
  m_hasModel = true;
  m_planner = planner;
  m_placing = false;
  m_placeRequest = 0;
  m_engine->placementPanel()->setBusy(false);
  PlacementPlan plan = placement;
  // The budget starts at the whole device memory.
  if (planner && planner->hasGpu())
    plan.vramBudgetMiB =
        static_cast<int>(std::min<qint64>(planner->gpuMemoryBytes() >> 20, 1 << 30));
  m_placement->setApplied(plan);
  m_presets->setLayerCount(model.nLayer);
  m_engine->placementPanel()->setNote(note);
  m_sidebar->setModel(&m_model);
  showDevices();
  m_engine->chatSettings()->setModelContext(model.nCtxTrain);
  m_chat->setModelReady(true, modelDisplayName(model));
  m_engine->serverPanel()->setThreads(m_options.threads);
  m_engine->serverPanel()->setModel(model.path, modelDisplayName(model));
  refreshRecent();
  m_center->setCurrentWidget(m_chatArea);
  m_chat->openChat(m_chat->currentChat());  // re-signs the replies with the new model's name
  if (!model.warnings.isEmpty())
    showError(tr("Loaded, with notes"), model.warnings.join(QStringLiteral("\n")));
  updateHeader();
  m_composer->input()->setFocus();
  emit modelReady(m_model);
}

void MainWindow::onLoadFailed(quint64 requestId, const QString& message) {
  if (requestId != m_loadRequest) return;
  m_loadRequest = 0;
  m_loadBanner->hide();
  // The engine's own message (which tensor, which offset, what was expected), as it is.
  showError(tr("Could not open the model"), message);
  updateHeader();
  emit modelFailed(message);
}

void MainWindow::refreshRecent() {
  QList<QPair<QString, QString>> recent;
  auto rm = m_store->recent_models(8);
  if (rm.ok()) {
    for (const auto& r : *rm) {
      const QString path = QString::fromStdString(r.path);
      const bool demo = path == m_options.demoModelPath();
      recent << qMakePair(
          path, demo ? tr("Loom demo model (random weights)") : QString::fromStdString(r.name));
    }
  }
  m_start->setRecentModels(recent);
  m_sidebar->setRecentModels(recent);
}

// ---- view state -----------------------------------------------------------------

QString MainWindow::errorText() const {
  return m_errorBanner->isVisible() ? m_errorText->text() : QString();
}

void MainWindow::showError(const QString& title, const QString& message) {
  m_errorTitle->setText(title);
  m_errorText->setText(message);
  m_errorBanner->show();
}

void MainWindow::hideError() {
  m_errorBanner->hide();
}

void MainWindow::updateHeader() {
  const auto* c = m_chats->chat(m_chat->currentChat());
  m_chatTitle->setFullText(c ? QString::fromStdString(c->title) : tr("No chat open"));
  if (!m_hasModel) {
    // Past chats stay readable, searchable and exportable without a model:
    // a chat picked in the sidebar is shown; otherwise the start screen.
    m_center->setCurrentWidget(m_browsing && c ? m_chatArea : static_cast<QWidget*>(m_start));
    m_modelDot->setStyleSheet(QStringLiteral("color:%1;").arg(theme::css(theme::kBorder)));
    m_modelChip->setFullText(tr("No model loaded: open one to reply"));
    m_status->clear();
    return;
  }
  const QString name = m_model.isDemo ? tr("Loom demo") : m_model.name;
  const QStringList used = m_placement->applied().backendsUsed();
  const bool gpu = used.size() > 1 || (used.size() == 1 && used.first() != QLatin1String("cpu"));
  const QString units =
      gpu ? (used.contains(QStringLiteral("cpu")) ? tr("CPU + GPU") : tr("GPU")) : tr("CPU");
  m_modelDot->setStyleSheet(
      QStringLiteral("color:%1;").arg(theme::css(gpu ? theme::kVulkan : theme::kCpu)));
  m_modelChip->setFullText(
      tr("%1 · %2 · KV %3 · %4").arg(name, m_model.quant, m_model.kvDtype, units));
  m_modelChip->setToolTip(m_modelChip->fullText() + QStringLiteral("\n") + m_model.path);
  m_status->setText(m_chat->isBusy() ? tr("Generating…") : tr("Ready"));
}

void MainWindow::planStrategy(const QString& strategy, int gpuLayers, int budgetMiB) {
  if (!m_planner) {
    m_placement->setPendingStrategy(strategy, gpuLayers, budgetMiB);
    return;
  }
  // "First N layers on GPU", chosen anew: start at the largest N that fits
  // the budget (N = 0 would be the placement in force, and Apply would do nothing).
  if (strategy == QLatin1String("layers") && m_placement->pending().strategy != strategy)
    gpuLayers = largestGpuLayersThatFit(budgetMiB);
  PlacementPlan planned;
  QString error;
  if (!m_planner->plan(strategy, gpuLayers, budgetMiB, m_placement->pending(), &planned, &error)) {
    m_engine->placementPanel()->setNote(error, /*isError=*/true);
    return;
  }
  m_placement->setPendingStrategy(strategy, gpuLayers, budgetMiB, &planned);
}

int MainWindow::largestGpuLayersThatFit(int budgetMiB) const {
  if (!m_planner || !m_planner->hasGpu()) return 0;
  const qint64 budget = qint64{budgetMiB} << 20;
  for (int n = m_planner->layerCount(); n > 0; --n) {
    PlacementPlan p;
    QString error;
    if (!m_planner->plan(QStringLiteral("layers"), n, budgetMiB, m_placement->pending(), &p,
                         &error))
      continue;
    const PlanEstimate e = m_planner->estimate(p);
    if (budget <= 0 || e.gpuWeights + e.gpuKv + e.gpuOverhead <= budget) return n;
  }
  return 0;
}

void MainWindow::updateEstimate() {
  if (m_planner) m_placement->setEstimate(m_planner->estimate(m_placement->pending()));
}

void MainWindow::applyPlacement() {
  PlacementPanel* pp = m_engine->placementPanel();
  if (!m_hasModel || m_placing) return;
  const quint64 id = m_nextPlace++;
  QString error;
  bool waits = false;
  if (!m_worker->requestPlacement(id, m_placement->pending(), &error, &waits)) {
    pp->setNote(error, /*isError=*/true);
    emit placementDone(false, error);
    return;
  }
  m_placing = true;
  m_placeRequest = id;
  pp->setBusy(true);
  pp->setNote(
      waits ? tr("A new KV precision needs a new KV cache: it is applied when the reply ends…")
      : m_chat->isBusy() ? tr("Applying between two tokens of the reply…")
                         : tr("Applying…"));
}

void MainWindow::onPlacementApplied(quint64 requestId, const PlacementPlan& plan,
                                    const QString& note) {
  if (requestId != m_placeRequest) return;
  m_placing = false;
  m_placeRequest = 0;
  PlacementPlan p = plan;
  p.vramBudgetMiB = m_placement->pending().vramBudgetMiB;
  m_placement->setApplied(p);
  m_model.kvDtype = plan.kvPrecision();
  m_model.nCtx = plan.nCtx;
  m_sidebar->setModel(&m_model);
  m_engine->placementPanel()->setBusy(false);
  m_engine->placementPanel()->setNote(note);
  m_engine->placementPanel()->refreshMeasured();
  showDevices();
  updateHeader();
  emit placementDone(true, note);
}

void MainWindow::onPlacementAdapted(const PlacementPlan& plan, const QString& what, bool moved) {
  // A user's placement on its way, or edits pending: the grid stays as the user has it.
  if (m_placing || m_placement->isDirty()) return;
  m_placement->setApplied(plan);  // the cells that moved glow for a moment
  m_engine->placementPanel()->setNote(tr("Auto (adaptive): %1").arg(what), !moved);
  m_engine->placementPanel()->refreshMeasured();
  showDevices();
  updateHeader();
}

void MainWindow::onPlacementFailed(quint64 requestId, const QString& message) {
  if (requestId != m_placeRequest) return;
  m_placing = false;
  m_placeRequest = 0;
  // The grid keeps the pending edits (Revert goes back); the engine kept the old placement.
  m_engine->placementPanel()->setBusy(false);
  m_engine->placementPanel()->setNote(message, /*isError=*/true);
  emit placementDone(false, message);
}

void MainWindow::savePreset(const QString& name) {
  PlacementPanel* pp = m_engine->placementPanel();
  if (!m_planner) return pp->setNote(tr("Open a model first."), true);
  QString error;
  const QString spec = m_planner->toPresetJson(m_placement->pending());
  if (!m_presets->save(name, spec, m_model.nLayer, m_model.isDemo ? tr("Loom demo") : m_model.name,
                       &error)) {
    return pp->setNote(error, /*isError=*/true);
  }
  pp->setNote(tr("Saved the placement as “%1”.").arg(name.simplified()));
}

void MainWindow::applyPreset(qint64 presetId) {
  PlacementPanel* pp = m_engine->placementPanel();
  const loom::storage::PlacementPreset* preset = m_presets->preset(presetId);
  if (!preset || !m_planner) return;
  const QString name = QString::fromStdString(preset->name);
  PlacementPlan plan;
  QString error;
  if (!m_planner->fromPresetJson(QString::fromStdString(preset->spec), m_placement->pending(),
                                 &plan, &error)) {
    return pp->setNote(tr("Preset “%1”: %2").arg(name, error), /*isError=*/true);
  }
  plan.vramBudgetMiB = m_placement->pending().vramBudgetMiB;
  m_placement->setPending(plan);
  if (!m_placement->isDirty())
    return pp->setNote(tr("Preset “%1” is the placement in force.").arg(name));
  if (m_placing)
    return pp->setNote(
        tr("Preset “%1” is in the grid: Apply once the current placement is done.").arg(name));
  applyPlacement();
}

void MainWindow::deletePreset(qint64 presetId) {
  QString error;
  if (!m_presets->remove(presetId, &error))
    m_engine->placementPanel()->setNote(error, /*isError=*/true);
}

void MainWindow::confirmDeleteChat(qint64 chatId) {
  const auto* c = m_chats->chat(chatId);
  if (!c) return;
  const auto answer =
      QMessageBox::question(this, tr("Delete chat"),
                            tr("Delete “%1” and all its messages? This cannot be undone.")
                                .arg(QString::fromStdString(c->title)),
                            QMessageBox::Yes | QMessageBox::Cancel, QMessageBox::Cancel);
  if (answer == QMessageBox::Yes) m_chat->deleteChat(chatId);
}

// ---- window events --------------------------------------------------------------

void MainWindow::stopWorker() {
  if (m_stopped) return;
  m_stopped = true;
  // A reply in progress stops at its next token and the worker saves it
  // (state "stopped") before the thread ends; then nothing else runs there.
  m_worker->shutdown();
  m_thread.quit();
  m_thread.wait();
  delete m_worker;
  m_worker = nullptr;
}

void MainWindow::editKvTiers() {
  const QString defaultDir = QString::fromStdString(loom::default_kv_spill_dir());
  KvTiersDialog dialog(m_kvTiers, defaultDir, this);
  if (dialog.exec() != QDialog::Accepted) return;
  const KvTierSettings s = dialog.settings();
  if (s == m_kvTiers) return;
  m_kvTiers = s;  // saved once the engine has taken them
  m_engine->placementPanel()->setKvTiersSummary(KvTiersDialog::summary(s, defaultDir));
  m_kvRequest = m_nextPlace++;
  if (m_hasModel) m_engine->placementPanel()->setNote(tr("Making the session again…"));
  emit workerSetKvTiers(m_kvRequest, s);
}

QString MainWindow::layoutFile() const {
  return QFileInfo(m_options.dbPath()).absoluteDir().filePath(QStringLiteral("window.ini"));
}

void MainWindow::restoreLayout() {
  // Next to the store (per data directory): a test's or a screenshot's window
  // never changes the user's.
  QSettings ini(layoutFile(), QSettings::IniFormat);
  const QList<QVariant> saved = ini.value(QStringLiteral("main/panels")).toList();
  if (saved.size() == 3) {
    QList<int> sizes;
    for (const QVariant& v : saved) sizes << v.toInt();
    m_split->setSizes(sizes);
    m_userSizes = sizes;
  }
  if (!ini.value(QStringLiteral("main/enginePanel"), true).toBool()) setEnginePanelShown(false);
  QSize size = ini.value(QStringLiteral("main/size"), QSize(1440, 900)).toSize();
  if (m_options.windowSize.isValid()) size = m_options.windowSize;
  resize(size.expandedTo(minimumSize()));
}

void MainWindow::saveLayout() {
  QSettings ini(layoutFile(), QSettings::IniFormat);
  // (Folded away, the engine panel's width reads 0: the last one shown is kept.)
  if (!m_userSizes.isEmpty() && isEnginePanelShown()) {
    QList<QVariant> sizes;
    for (int v : m_split->sizes()) sizes << v;
    ini.setValue(QStringLiteral("main/panels"), sizes);
  }
  if (m_options.screenshotPath.isEmpty()) {
    ini.setValue(QStringLiteral("main/size"), size());
    ini.setValue(QStringLiteral("main/enginePanel"), isEnginePanelShown());
  }
}

void MainWindow::updateMinimumSize() {
  // The smallest window the shown columns fit (each at its minimum).
  int w = m_sidebar->minimumWidth() + kCenterMin + m_split->handleWidth();
  // (isVisibleTo: before the window is first shown, every child isHidden().)
  if (m_engine->isVisibleTo(this)) w += m_engine->minimumWidth() + m_split->handleWidth();
  setMinimumSize(w, kWindowMinHeight);
}

void MainWindow::setEnginePanelShown(bool shown) {
  if (m_panelAction->isChecked() != shown) m_panelAction->setChecked(shown);  // toggles back here
  if (m_engine->isVisibleTo(this) == shown) return;
  m_engine->setVisible(shown);
  updateMinimumSize();  // grows the window when it is too narrow for the panel
}

bool MainWindow::isEnginePanelShown() const {
  return m_engine->isVisibleTo(this);
}

QList<int> MainWindow::panelWidths() const {
  return m_split->sizes();
}

void MainWindow::closeEvent(QCloseEvent* event) {
  saveLayout();
  stopWorker();
  event->accept();
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event) {
  const auto urls = event->mimeData()->urls();
  if (urls.size() == 1 && isModelFile(urls.first())) event->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* event) {
  const auto urls = event->mimeData()->urls();
  if (urls.size() == 1 && isModelFile(urls.first())) loadModel(urls.first().toLocalFile());
}

// ---- start-up and --screenshot ---------------------------------------------------

void MainWindow::start() {
  if (!m_options.screenshotPath.isEmpty()) {
    connect(this, &MainWindow::modelReady, this,
            [this] { QTimer::singleShot(0, this, &MainWindow::screenshotStep); });
    connect(this, &MainWindow::modelFailed, this, &MainWindow::finishScreenshot);
    connect(m_chat, &ChatController::replyFinished, this,
            [this] { QTimer::singleShot(0, this, &MainWindow::screenshotStep); });
    // Never hang a script: whatever is on screen after two minutes is the picture.
    QTimer::singleShot(120000, this, &MainWindow::finishScreenshot);
  }
  if (m_options.demo)
    loadDemoModel();
  else if (!m_options.modelPath.isEmpty())
    loadModel(m_options.modelPath);
  else if (!m_options.screenshotPath.isEmpty())
    QTimer::singleShot(300, this, &MainWindow::finishScreenshot);
}

void MainWindow::screenshotStep() {
  // A short tour: a chat with two exchanges (one with a code block), so the
  // transcript, the grid and every chart have something to show.
  static const char* const kPrompts[] = {
      "What does this function do?\n\n```cpp\nint add(int a, int b) {\n  return a + b;  // "
      "sum\n}\n```",
      "Now tell me a **very short** story about a loom that learns to weave words.",
  };
  const int n = static_cast<int>(sizeof(kPrompts) / sizeof(kPrompts[0]));
  if (m_screenshotStage == 0) {
    m_chat->newChat();
    loom::storage::ChatSettings s;
    s.max_tokens = 120;
    s.seed = 7;  // the same picture every time
    m_engine->chatSettings()->setSettings(s, true);
    m_chat->saveSettings(s);
  }
  if (m_screenshotStage < n) {
    m_chat->send(QString::fromUtf8(kPrompts[m_screenshotStage++]));
    return;
  }
  finishScreenshot();
}

void MainWindow::finishScreenshot() {
  if (m_options.screenshotPath.isEmpty() || m_screenshotStage < 0) return;
  m_screenshotStage = -1;
  static const QStringList kTabs = {QStringLiteral("placement"), QStringLiteral("performance"),
                                    QStringLiteral("devices"), QStringLiteral("chat")};
  m_engine->setCurrentIndex(
      std::max<int>(0, static_cast<int>(kTabs.indexOf(m_options.screenshotTab))));
  m_engine->chartsPanel()->refresh();
  m_engine->placementPanel()->refreshMeasured();
  m_transcript->scrollToBottom();
  // One more turn of the event loop so layouts settle before the grab.
  QTimer::singleShot(250, this, [this] {
    const bool ok = grab().save(m_options.screenshotPath, "PNG");
    if (ok)
      std::printf("loom-chat: wrote %s\n",
                  qPrintable(QDir::toNativeSeparators(m_options.screenshotPath)));
    else
      std::fprintf(stderr, "loom-chat: could not write %s\n", qPrintable(m_options.screenshotPath));
    std::fflush(stdout);
    QCoreApplication::exit(ok ? 0 : 1);
  });
}
