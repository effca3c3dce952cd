// The app end to end, offscreen, with the real engine on its worker thread:
// open a synthetic model, send a message with the keyboard, watch the reply
// stream into the transcript, change one layer's placement and apply it, see
// the grid and the charts follow, stop a reply, close the window while one
// streams, then start again and find the chat. Also: a corrupt model's error
// is the engine's own and the app stays usable; cancelling a load; the demo
// model on first run. No timing assertions: only waits with generous limits.
#include <gtest/gtest.h>

#include <QApplication>
#include <QComboBox>
#include <QLabel>
#include <QListView>
#include <QMenu>
#include <QPushButton>
#include <QSignalSpy>
#include <QSlider>
#include <QTableView>
#include <QTest>
#include <QTimer>

#include "app/charts_panel.h"
#include "app/chat_controller.h"
#include "app/chat_settings_panel.h"
#include "app/composer.h"
#include "app/engine_panel.h"
#include "app/main_window.h"
#include "app/placement_panel.h"
#include "app/preset_list_model.h"
#include "app/sidebar.h"
#include "app/start_screen.h"
#include "app/transcript_view.h"
#include "storage/store.h"
#include "tests/gui/gui_test_util.h"

namespace {

constexpr int kWaitMs = 120000;

AppOptions optionsFor(const QString& name) {
  AppOptions o;
  o.dataDir = guitest::freshDir(name + QStringLiteral("-data"));
  o.cacheDir = guitest::freshDir(name + QStringLiteral("-cache"));
  o.threads = 2;
  return o;
}

bool loadAndWait(MainWindow& w, const QString& path) {
  QSignalSpy ready(&w, &MainWindow::modelReady);
  w.loadModel(path);
  return QTest::qWaitFor([&] { return ready.count() > 0; }, kWaitMs);
}

void setChatSettings(MainWindow& w, int maxTokens, qint64 seed, int nCtx = 0) {
  loom::storage::ChatSettings s;
  s.max_tokens = maxTokens;
  s.seed = seed;
  s.n_ctx = nCtx;
  w.enginePanel()->chatSettings()->setSettings(s, true);
  w.chat()->saveSettings(s);
}

// Types `text` and presses Enter, as a user would.
void typeAndSend(MainWindow& w, const QString& text) {
  ChatInput* input = w.composer()->input();
  input->setFocus();
  QTest::keyClicks(input, text);
  QTest::keyClick(input, Qt::Key_Return);
}

MessageWidget* lastMessage(MainWindow& w) {
  // Message ids grow: the largest is the newest.
  MessageWidget* best = nullptr;
  for (auto* m : w.transcript()->findChildren<MessageWidget*>()) {
    if (!best || m->messageId() > best->messageId()) best = m;
  }
  return best;
}

// Sends messages until a reply is streaming (random weights may end one at
// once with an end-of-generation token); `messages` counts what was added.
bool startLongReply(MainWindow& w, QSignalSpy& finished, int* messages) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const auto done = finished.count();
    QSignalSpy streamed(w.chat(), &ChatController::replyUpdated);
    typeAndSend(w, QStringLiteral("Go on, at length (attempt %1).").arg(attempt));
    *messages += 2;
    if (!QTest::qWaitFor([&] { return streamed.count() > 0 || finished.count() > done; }, kWaitMs))
      return false;
    if (w.chat()->isBusy()) return true;
    if (!QTest::qWaitFor([&] { return finished.count() > done; }, kWaitMs)) return false;
  }
  return false;
}

// Picks `text` in the popup menu that opens next.
void pickInNextMenu(const QString& text) {
  QTimer::singleShot(50, [text] {
    auto* menu = qobject_cast<QMenu*>(QApplication::activePopupWidget());
    if (!menu) return;
    for (QAction* a : menu->actions()) {
      if (a->text() == text && a->isEnabled()) a->trigger();
    }
    menu->close();
  });
}

TEST(EndToEnd, ChatStreamPlaceRestart) {
  const QString model = guitest::tinyModel();
  ASSERT_FALSE(model.isEmpty());
  const AppOptions opts = optionsFor(QStringLiteral("e2e"));
  qint64 chatId = 0;
  int expectedMessages = 0;
  QString firstReply;
  bool stoppedByClose = true;
  {
    MainWindow w(opts);
    w.show();
    w.activateWindow();
    ASSERT_TRUE(
        QTest::qWaitForWindowActive(&w));  // window shortcuts (Ctrl+N, Esc) need an active window
    w.start();
    // First run: the start screen offers a model or the demo.
    EXPECT_TRUE(w.startScreen()->isVisible());
    EXPECT_TRUE(w.startScreen()->demoButton()->isVisible());

    // A corrupt file: the engine's own message, and the app stays usable.
    QSignalSpy failed(&w, &MainWindow::modelFailed);
    w.loadModel(guitest::truncatedModel());
    ASSERT_TRUE(QTest::qWaitFor([&] { return failed.count() > 0; }, kWaitMs));
    const QString engineMessage = failed.first().first().toString();
    EXPECT_TRUE(engineMessage.contains(QStringLiteral("cut.gguf"))) << engineMessage.toStdString();
    EXPECT_EQ(w.errorText(), engineMessage);
    EXPECT_EQ(w.model(), nullptr);

    ASSERT_TRUE(loadAndWait(w, model));
    ASSERT_NE(w.model(), nullptr);
    EXPECT_EQ(w.model()->nLayer, 3);
    EXPECT_EQ(w.model()->arch, QStringLiteral("llama"));
    EXPECT_EQ(w.model()->quant, QStringLiteral("Q8_0"));
    EXPECT_FALSE(w.startScreen()->isVisible());
    EXPECT_TRUE(w.errorText().isEmpty());  // a successful load clears the old error
    // The grid: the model's layers and real dtypes, on the unit the first placement chose.
    PlacementModel* pm = w.placement();
    ASSERT_EQ(pm->rowCount(), 5);
    EXPECT_EQ(pm->data(pm->index(1, kColAttnWeights), PlacementModel::PrecisionRole).toString(),
              QStringLiteral("Q8_0"));
    EXPECT_EQ(pm->data(pm->index(2, kColAttnKv), PlacementModel::PrecisionRole).toString(),
              QStringLiteral("F16"));
    EXPECT_TRUE(pm->data(pm->index(2, kColAttnKv), Qt::DisplayRole)
                    .toString()
                    .endsWith(QStringLiteral(" F16")));
    EXPECT_TRUE(w.planner() != nullptr);
    EXPECT_EQ(w.planner() && w.planner()->hasGpu(), pm->gpuBackend() != nullptr);
    if (!pm->gpuBackend()) {
      EXPECT_EQ(pm->data(pm->index(2, kColAttnKv), PlacementModel::BackendIdRole).toString(),
                QStringLiteral("cpu"));
    }

    // Ctrl+N: a new chat; its settings make a reply long enough to stream in batches.
    QTest::keyClick(&w, Qt::Key_N, Qt::ControlModifier);
    chatId = w.chat()->currentChat();
    ASSERT_NE(chatId, 0);
    setChatSettings(w, 300, 11);

    QSignalSpy finished(w.chat(), &ChatController::replyFinished);
    int updates = 0, lastLength = -1, shownWhileBusy = 0;
    bool grew = true;
    auto conn =
        QObject::connect(w.chat(), &ChatController::replyUpdated, [&](qint64 id, int length) {
          ++updates;
          grew = grew && length >= lastLength;
          lastLength = length;
          MessageWidget* m = w.transcript()->message(id);
          if (w.chat()->isBusy() && m && !m->text().isEmpty()) ++shownWhileBusy;
        });
    // Shift+Enter is a new line; Enter sends.
    ChatInput* input = w.composer()->input();
    input->setFocus();
    QTest::keyClicks(input, QStringLiteral("Hello,"));
    QTest::keyClick(input, Qt::Key_Return, Qt::ShiftModifier);
    QTest::keyClicks(input, QStringLiteral("Loom!"));
    EXPECT_EQ(w.composer()->text(), QStringLiteral("Hello,\nLoom!"));
    QTest::keyClick(input, Qt::Key_Return);
    EXPECT_TRUE(w.chat()->isBusy());
    EXPECT_TRUE(w.composer()->text().isEmpty());
    ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > 0; }, kWaitMs));
    QObject::disconnect(conn);
    const auto r1 = finished.first().first().value<GenerationResult>();
    EXPECT_TRUE(r1.error.isEmpty()) << r1.error.toStdString();
    EXPECT_GT(r1.nGenerated, 0);
    EXPECT_GE(updates, 2) << "the reply should arrive in several batches";
    EXPECT_GE(shownWhileBusy, 1) << "text should be in the transcript before the reply ends";
    EXPECT_TRUE(grew);
    firstReply = r1.text;
    EXPECT_EQ(lastMessage(w)->text(), firstReply);
    EXPECT_TRUE(w.transcript()->plainText().contains(QStringLiteral("Hello,\nLoom!")));
    EXPECT_EQ(w.transcript()->messageCount(), 2);

    // Change one layer's placement: with a GPU, a click moves layer 1's FFN
    // to the other unit; without one, its precision changes on the CPU.
    w.enginePanel()->setCurrentIndex(EnginePanel::PlacementTab);
    PlacementPanel* pp = w.enginePanel()->placementPanel();
    EXPECT_FALSE(pp->applyButton()->isEnabled());
    const BackendInfo* gpu = pm->gpuBackend();
    const QString gpuId = gpu ? gpu->id : QString();
    // The panel says what the engine runs on.
    EXPECT_TRUE(
        pp->unitsText().contains(gpu ? QStringLiteral("and the GPU") : QStringLiteral("CPU only")))
        << pp->unitsText().toStdString();
    QString expectBackend = QStringLiteral("cpu"), expectText;
    if (gpu) {
      const bool wasCpu = pm->pending().rows[2][kColFfnWeights].backend == QLatin1String("cpu");
      expectBackend = wasCpu ? gpuId : QStringLiteral("cpu");
      expectText =
          (wasCpu ? QStringLiteral("GPU ") : QStringLiteral("CPU ")) + QStringLiteral("Q8_0");
      const QRect cell = pp->grid()->visualRect(pm->index(2, kColFfnWeights));
      ASSERT_TRUE(cell.isValid());
      QTest::mouseClick(pp->grid()->viewport(), Qt::LeftButton, {}, cell.center());
    } else {
      std::printf(
          "[   INFO   ] no Vulkan device: the placement change is a precision change on the CPU\n");
      expectText = QStringLiteral("CPU Q4_0");
      pickInNextMenu(QStringLiteral("Q4_0"));
      pp->openCellMenu(2, kColFfnWeights);
    }
    EXPECT_TRUE(pm->isDirty());
    EXPECT_TRUE(pm->data(pm->index(2, kColFfnWeights), PlacementModel::DirtyRole).toBool());
    EXPECT_EQ(pm->data(pm->index(2, kColFfnWeights), Qt::DisplayRole).toString(), expectText);
    EXPECT_EQ(pm->estimate().valid, true);  // the cost model follows the pending plan
    ASSERT_TRUE(pp->applyButton()->isEnabled());
    QSignalSpy placed(&w, &MainWindow::placementDone);
    QTest::mouseClick(pp->applyButton(), Qt::LeftButton);
    ASSERT_TRUE(QTest::qWaitFor([&] { return placed.count() > 0; }, kWaitMs));
    EXPECT_TRUE(placed.first().at(0).toBool()) << placed.first().at(1).toString().toStdString();
    EXPECT_FALSE(pm->isDirty());
    EXPECT_FALSE(pm->data(pm->index(2, kColFfnWeights), PlacementModel::DirtyRole).toBool());
    EXPECT_EQ(pm->applied().rows[2][kColFfnWeights].backend, expectBackend)
        << pp->noteText().toStdString();
    EXPECT_EQ(pm->data(pm->index(2, kColFfnWeights), Qt::DisplayRole).toString(), expectText);
    EXPECT_EQ(pm->applied().rows[1][kColFfnWeights].backend,
              pm->applied().rows[3][kColFfnWeights].backend);
    EXPECT_EQ(w.transcript()->messageCount(), 2);  // the chat survived the re-placement

    // The charts and the grid's timing column follow the next reply.
    ChartsPanel* charts = w.enginePanel()->chartsPanel();
    w.enginePanel()->setCurrentIndex(EnginePanel::PerformanceTab);
    setChatSettings(w, 64, 12);
    typeAndSend(w, QStringLiteral("Tell me more."));
    ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > 1; }, kWaitMs));
    // (Refreshed here: what the timer drew last may be from before the Apply.)
    ASSERT_TRUE(QTest::qWaitFor(
        [&] {
          charts->refresh();
          return charts->shown().layersWithData == 3;
        },
        kWaitMs));
    EXPECT_GT(charts->shown().itlSamples, 0u);
    EXPECT_GT(charts->shown().p99Ms, 0.0);
    EXPECT_GE(charts->shown().p99Ms, charts->shown().p50Ms);
    EXPECT_GT(charts->shown().tpsPoints, 0);
    EXPECT_GT(charts->shown().ramBytes, 0u);
    EXPECT_EQ(charts->shown().gpuPresent, gpu != nullptr);
    if (gpu && expectBackend == gpuId) {
      EXPECT_GT(charts->shown().gpuBytes, 0u);
    }
    pp->refreshMeasured();
    EXPECT_TRUE(pm->data(pm->index(2, kColTiming), PlacementModel::P50MsRole).isValid());
    EXPECT_GE(pm->data(pm->index(2, kColTiming), PlacementModel::P99MsRole).toDouble(),
              pm->data(pm->index(2, kColTiming), PlacementModel::P50MsRole).toDouble());
    EXPECT_TRUE(pm->data(pm->index(2, kColTiming), PlacementModel::PredictedMsRole).isValid());
    EXPECT_GT(pm->measured().steps, 0u);
    EXPECT_TRUE(pp->summaryText().contains(QStringLiteral("measured P50")))
        << pp->summaryText().toStdString();
    EXPECT_EQ(w.transcript()->messageCount(), 4);

    // The KV cache to Q8_0 (one precision for every layer: the column follows).
    // A new KV cache: the chat is kept and re-read by the next reply.
    w.enginePanel()->setCurrentIndex(EnginePanel::PlacementTab);
    pickInNextMenu(QStringLiteral("Q8_0"));
    pp->openCellMenu(2, kColAttnKv);
    EXPECT_EQ(pm->pending().kvPrecision(), QStringLiteral("Q8_0"));
    placed.clear();
    QTest::mouseClick(pp->applyButton(), Qt::LeftButton);
    ASSERT_TRUE(QTest::qWaitFor([&] { return placed.count() > 0; }, kWaitMs));
    EXPECT_TRUE(placed.first().at(0).toBool()) << placed.first().at(1).toString().toStdString();
    EXPECT_EQ(pm->applied().kvPrecision(), QStringLiteral("Q8_0"));
    EXPECT_EQ(w.model()->kvDtype, QStringLiteral("Q8_0"));
    EXPECT_EQ(pm->applied().rows[2][kColFfnWeights].backend, expectBackend);  // the rest stayed

    // Regenerate the last reply; edit-and-resend the last user message.
    MessageWidget* reply = lastMessage(w);
    ASSERT_EQ(reply->role(), QStringLiteral("assistant"));
    w.chat()->regenerate(reply->messageId());
    ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > 2; }, kWaitMs));
    EXPECT_EQ(w.transcript()->messageCount(), 4);
    qint64 lastUser = 0;
    for (auto* m : w.transcript()->findChildren<MessageWidget*>()) {
      if (m->role() == QLatin1String("user")) lastUser = std::max(lastUser, m->messageId());
    }
    w.chat()->editMessage(lastUser);
    EXPECT_TRUE(w.composer()->isEditing());
    EXPECT_EQ(w.composer()->text(), QStringLiteral("Tell me more."));
    w.composer()->clear();
    typeAndSend(w, QStringLiteral("Tell me less."));
    ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > 3; }, kWaitMs));
    EXPECT_EQ(w.transcript()->messageCount(), 4);
    EXPECT_TRUE(w.transcript()->plainText().contains(QStringLiteral("Tell me less.")));
    EXPECT_FALSE(w.transcript()->plainText().contains(QStringLiteral("Tell me more.")));

    // A placement applied while a reply streams: between two tokens, and the
    // reply goes on (8192 tokens of context: changing the length also rebuilds
    // the session). Random weights may end a reply at any token: when one ends
    // before the placement lands (it is then applied at once, idle), try again.
    setChatSettings(w, -1, 13, 8192);
    int messages = 4;
    PlacementPlan wanted;
    QSignalSpy streamed(w.chat(), &ChatController::replyUpdated);
    bool appliedLive = false;
    for (int attempt = 0; attempt < 6 && !appliedLive; ++attempt) {
      if (!w.chat()->isBusy()) {
        ASSERT_TRUE(startLongReply(w, finished, &messages));
      }
      if (gpu) {
        pp->clickCell(3,
                      kColAttnKv);  // layer 2's attention and its KV cache move to the other unit
      } else {
        const bool keep = pm->pending().rows[3][kColFfnWeights].dtype.isEmpty();
        ASSERT_TRUE(
            pm->setCellPrecision(3, kColFfnWeights, keep ? QStringLiteral("F16") : kKeepPrecision));
      }
      wanted = pm->pending();
      placed.clear();
      w.applyPlacement();
      ASSERT_TRUE(QTest::qWaitFor([&] { return placed.count() > 0; }, kWaitMs));
      ASSERT_TRUE(placed.first().at(0).toBool()) << placed.first().at(1).toString().toStdString();
      EXPECT_TRUE(pm->applied().sameCells(wanted));
      appliedLive = placed.first().at(1).toString().contains(QStringLiteral("between two tokens"));
    }
    EXPECT_TRUE(appliedLive)
        << "no reply streamed long enough to take a placement between two tokens";
    if (w.chat()->isBusy()) {  // and the reply goes on
      const auto batches = streamed.count(), done = finished.count();
      EXPECT_TRUE(QTest::qWaitFor(
          [&] { return streamed.count() > batches || finished.count() > done; }, kWaitMs));
    }

    // Esc stops a reply (one that random weights end by themselves at that very token does not
    // count: again).
    bool stopped = false;
    for (int attempt = 0; attempt < 4 && !stopped; ++attempt) {
      if (!w.chat()->isBusy()) {
        ASSERT_TRUE(startLongReply(w, finished, &messages));
      }
      const auto before = finished.count();
      QTest::keyClick(w.composer()->input(), Qt::Key_Escape);
      ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > before; }, kWaitMs))
          << "busy " << w.chat()->isBusy() << ", reply so far: " << lastMessage(w)->text().size()
          << " characters";
      stopped = finished.last().first().value<GenerationResult>().cancelled;
    }
    EXPECT_TRUE(stopped);
    for (const auto& f : finished) EXPECT_TRUE(f.first().value<GenerationResult>().error.isEmpty());
    EXPECT_EQ(lastMessage(w)->status(), MessageStatus::Stopped);

    // Presets: save this placement, go to "CPU only", then pick the preset: it is applied.
    w.savePreset(QStringLiteral("e2e preset"));
    ASSERT_EQ(w.presets()->rowCount(), 1);
    QComboBox* strategies = pp->strategyBox();
    strategies->setCurrentIndex(strategies->findData(QStringLiteral("cpu")));
    EXPECT_EQ(pm->pending().strategy, QStringLiteral("cpu"));
    ASSERT_TRUE(pm->isDirty());
    placed.clear();
    w.applyPlacement();
    ASSERT_TRUE(QTest::qWaitFor([&] { return placed.count() > 0; }, kWaitMs));
    EXPECT_TRUE(placed.first().at(0).toBool()) << placed.first().at(1).toString().toStdString();
    EXPECT_EQ(pm->applied().backendsUsed(), QStringList{QStringLiteral("cpu")});
    placed.clear();
    const qint64 presetId = w.presets()->index(0).data(PresetListModel::PresetIdRole).toLongLong();
    emit pp->presetChosen(presetId);
    ASSERT_TRUE(QTest::qWaitFor([&] { return placed.count() > 0; }, kWaitMs));
    EXPECT_TRUE(placed.first().at(0).toBool()) << placed.first().at(1).toString().toStdString();
    EXPECT_TRUE(pm->applied().sameCells(wanted));

    // Close the window while a reply streams: it stops and what came is saved.
    ASSERT_TRUE(startLongReply(w, finished, &messages));
    const auto beforeClose = finished.count();
    w.close();
    QCoreApplication::processEvents();  // the worker's last word, if it had one before it stopped
    // Random weights may have ended the reply by themselves just before: then it is complete, not
    // stopped.
    stoppedByClose = finished.count() == beforeClose ||
                     finished.last().first().value<GenerationResult>().cancelled;
    expectedMessages = messages;
  }

  // Start again: the chat is there, with the interrupted reply saved.
  MainWindow w2(opts);
  w2.show();
  w2.start();
  EXPECT_EQ(w2.sidebar()->chatView()->model()->rowCount(), 1);
  EXPECT_EQ(w2.chat()->currentChat(), chatId);
  EXPECT_EQ(w2.transcript()->messageCount(), expectedMessages);
  EXPECT_TRUE(w2.transcript()->plainText().contains(QStringLiteral("Hello,\nLoom!")));
  EXPECT_TRUE(w2.transcript()->plainText().contains(firstReply));
  MessageWidget* interrupted = lastMessage(w2);
  ASSERT_NE(interrupted, nullptr);
  EXPECT_EQ(interrupted->role(), QStringLiteral("assistant"));
  EXPECT_EQ(interrupted->status(),
            stoppedByClose ? MessageStatus::Stopped : MessageStatus::Complete);
  EXPECT_FALSE(interrupted->text().isEmpty());
  EXPECT_EQ(w2.presets()->rowCount(), 1);  // and the preset
  // The recent models list remembers the model.
  auto store = loom::storage::Store::open(opts.dbPath().toStdString());
  ASSERT_TRUE(store.ok());
  auto recent = (*store)->recent_models();
  ASSERT_TRUE(recent.ok());
  ASSERT_FALSE(recent->empty());
  EXPECT_EQ(QString::fromStdString(recent->front().path), model);
}

// Everything on the GPU through the strategy selector, when there is a GPU;
// the budget slider spans the device memory; replies run there.
TEST(EndToEnd, AllOnGpuStrategy) {
  MainWindow w(optionsFor(QStringLiteral("gpu")));
  w.show();
  w.start();
  ASSERT_TRUE(loadAndWait(w, guitest::tinyModel()));
  PlacementModel* pm = w.placement();
  const BackendInfo* gpu = pm->gpuBackend();
  if (!gpu)
    GTEST_SKIP()
        << "no usable Vulkan device: the GPU strategies are covered by PlacementPlanner tests";
  PlacementPanel* pp = w.enginePanel()->placementPanel();
  w.enginePanel()->setCurrentIndex(EnginePanel::PlacementTab);
  EXPECT_EQ(pp->budgetSlider()->maximum(),
            static_cast<int>(std::min<qint64>(gpu->memoryBytes >> 20, 1 << 30)));
  QComboBox* strategies = pp->strategyBox();
  const int at = strategies->findData(QStringLiteral("gpu"));
  ASSERT_GE(at, 0);
  strategies->setCurrentIndex(at);
  EXPECT_EQ(pm->pending().backendsUsed(), QStringList{gpu->id});
  EXPECT_GT(pm->estimate().gpuWeights, 0);
  QSignalSpy placed(&w, &MainWindow::placementDone);
  QTest::mouseClick(pp->applyButton(), Qt::LeftButton);
  ASSERT_TRUE(QTest::qWaitFor([&] { return placed.count() > 0; }, kWaitMs));
  ASSERT_TRUE(placed.first().at(0).toBool()) << placed.first().at(1).toString().toStdString();
  // Groups the GPU could not take would be back on the CPU, and the note would say why.
  const QString note = placed.first().at(1).toString();
  EXPECT_TRUE(pm->applied().backendsUsed().contains(gpu->id)) << note.toStdString();
  if (pm->applied().backendsUsed().contains(QStringLiteral("cpu"))) {
    EXPECT_TRUE(note.contains(QStringLiteral("Fell back"))) << note.toStdString();
  }
  ChartsPanel* charts = w.enginePanel()->chartsPanel();
  charts->refresh();
  EXPECT_TRUE(charts->shown().gpuPresent);
  EXPECT_GT(charts->shown().gpuBytes, 0u);

  QTest::keyClick(&w, Qt::Key_N, Qt::ControlModifier);
  setChatSettings(w, 24, 5);
  QSignalSpy finished(w.chat(), &ChatController::replyFinished);
  typeAndSend(w, QStringLiteral("Hello, GPU."));
  ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > 0; }, kWaitMs));
  const auto r = finished.first().first().value<GenerationResult>();
  EXPECT_TRUE(r.error.isEmpty()) << r.error.toStdString();
  EXPECT_GT(r.nGenerated, 0);
}

// Auto (adaptive): applied like any strategy, then it moves the placement on
// its own between tokens; each move shows on the tokens/s chart and in the
// grid, whose strategy stays "adaptive". Lavapipe stands in for the GPU.
TEST(EndToEnd, AdaptiveAutoMovesThePlacementWhileGenerating) {
  MainWindow w(optionsFor(QStringLiteral("adaptive")));
  w.show();
  w.start();
  ASSERT_TRUE(loadAndWait(w, guitest::tinyModel()));
  PlacementModel* pm = w.placement();
  if (!pm->gpuBackend())
    GTEST_SKIP() << "no usable Vulkan device: the controller is covered by the Adaptive tests";
  PlacementPanel* pp = w.enginePanel()->placementPanel();
  w.enginePanel()->setCurrentIndex(EnginePanel::PlacementTab);
  QComboBox* strategies = pp->strategyBox();
  const int at = strategies->findData(QStringLiteral("adaptive"));
  ASSERT_GE(at, 0);
  strategies->setCurrentIndex(at);
  QSignalSpy placed(&w, &MainWindow::placementDone);
  QTest::mouseClick(pp->applyButton(), Qt::LeftButton);
  ASSERT_TRUE(QTest::qWaitFor([&] { return placed.count() > 0; }, kWaitMs));
  ASSERT_TRUE(placed.first().at(0).toBool()) << placed.first().at(1).toString().toStdString();
  EXPECT_EQ(pm->applied().strategy, QStringLiteral("adaptive"));

  // Replies until the controller has measured and moved (random weights may end a reply early).
  QTest::keyClick(&w, Qt::Key_N, Qt::ControlModifier);
  setChatSettings(w, 40, 3);
  ChartsPanel* charts = w.enginePanel()->chartsPanel();
  QSignalSpy finished(w.chat(), &ChatController::replyFinished);
  for (int i = 0; i < 6; ++i) {
    const auto done = finished.count();
    typeAndSend(w, QStringLiteral("Tell me more (%1).").arg(i));
    ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > done; }, kWaitMs));
    const auto r = finished.last().first().value<GenerationResult>();
    EXPECT_TRUE(r.error.isEmpty()) << r.error.toStdString();
    charts->refresh();
    if (charts->shown().placementMarks >= 2) break;
  }
  // One mark for the apply, one or more for the controller's moves.
  EXPECT_GE(charts->shown().placementMarks, 2);
  EXPECT_EQ(pm->applied().strategy, QStringLiteral("adaptive"));
  EXPECT_EQ(strategies->currentData().toString(), QStringLiteral("adaptive"));
  EXPECT_TRUE(pp->noteText().contains(QStringLiteral("Auto (adaptive)")))
      << pp->noteText().toStdString();
}

// Loading shows its steps: reading the file (one engine call: a busy bar),
// measuring the units, then placing the weights layer by layer (a figure).
TEST(EndToEnd, LoadReportsProgressInSteps) {
  MainWindow w(optionsFor(QStringLiteral("progress")));
  w.show();
  w.start();
  QList<int> percents;
  QStringList stages;
  QObject::connect(&w, &MainWindow::loadProgressShown, [&](const QString& stage, int percent) {
    percents << percent;
    if (!stages.contains(stage)) stages << stage;
  });
  ASSERT_TRUE(loadAndWait(w, guitest::tinyModel()));
  ASSERT_GE(stages.size(), 3) << stages.join(QStringLiteral(" | ")).toStdString();
  EXPECT_TRUE(stages.last().contains(QStringLiteral("step 3 of 3"))) << stages.last().toStdString();
  EXPECT_TRUE(percents.contains(-1));  // reading the file
  int last = -1, determinate = 0;
  for (int p : percents) {
    if (p < 0) continue;
    EXPECT_GE(p, last);  // never backwards
    last = p;
    if (p > 66 && p < 100) ++determinate;
  }
  EXPECT_GE(determinate, 3) << "the weights' placement should report per layer";
  EXPECT_FALSE(w.isLoading());
}

TEST(EndToEnd, CancelledLoadIsDiscarded) {
  MainWindow w(optionsFor(QStringLiteral("cancel")));
  w.show();
  w.start();
  QSignalSpy ready(&w, &MainWindow::modelReady);
  w.loadModel(guitest::tinyModel());
  EXPECT_TRUE(w.isLoading());
  w.cancelLoad();
  EXPECT_FALSE(w.isLoading());
  QTest::qWait(1500);  // the worker finishes the read and drops the result
  EXPECT_EQ(ready.count(), 0);
  EXPECT_EQ(w.model(), nullptr);
  EXPECT_TRUE(w.startScreen()->isVisible());
  ASSERT_TRUE(loadAndWait(w, guitest::tinyModel()));  // and the next load works
}

TEST(EndToEnd, DemoModelOnFirstRun) {
  const AppOptions opts = optionsFor(QStringLiteral("demo"));
  MainWindow w(opts);
  w.show();
  w.start();
  QSignalSpy ready(&w, &MainWindow::modelReady);
  QTest::mouseClick(w.startScreen()->demoButton(), Qt::LeftButton);
  ASSERT_TRUE(QTest::qWaitFor([&] { return ready.count() > 0; }, kWaitMs));
  ASSERT_NE(w.model(), nullptr);
  EXPECT_TRUE(w.model()->isDemo);
  EXPECT_TRUE(QFile::exists(opts.demoModelPath()));
  EXPECT_FALSE(QFile::exists(opts.demoModelPath() + QStringLiteral(".part")));
  EXPECT_GT(w.model()->nLayer, 0);
  EXPECT_EQ(w.placement()->rowCount(), w.model()->nLayer + 2);
}

}  // namespace
