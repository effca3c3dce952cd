// The start screen's "On this machine": the worker finds a model in
// llama.cpp's cache folder (LLAMA_CACHE), the start screen lists the first
// few (not those already under Recent), counts the rest, and a click opens one.
#include <gtest/gtest.h>

#include <QFile>
#include <QLabel>
#include <QPushButton>
#include <QSignalSpy>
#include <QTest>
#include <QtGlobal>

#include "app/chat_controller.h"
#include "app/engine_worker.h"
#include "app/live_stats.h"
#include "app/main_window.h"
#include "app/start_screen.h"
#include "engine/model/hf_export.h"
#include "tests/gui/gui_test_util.h"

namespace {

TEST(FoundModels, TheWorkerFindsModelsInTheOtherToolsFolders) {
  const QString cache = guitest::freshDir(QStringLiteral("found-llama-cache"));
  ASSERT_TRUE(QFile::copy(guitest::tinyModel(), cache + QStringLiteral("/tiny-q8.gguf")));
  const QByteArray old = qgetenv("LLAMA_CACHE");
  qputenv("LLAMA_CACHE", cache.toUtf8());
  EngineWorker worker(cache + QStringLiteral("/chats.db"), 2, std::make_shared<LiveStats>());
  QSignalSpy found(&worker, &EngineWorker::modelsFound);
  worker.discoverModels();
  if (old.isEmpty())
    qunsetenv("LLAMA_CACHE");
  else
    qputenv("LLAMA_CACHE", old);
  ASSERT_EQ(found.count(), 1);
  const auto list = found.at(0).at(0).value<QVector<FoundModelInfo>>();
  bool seen = false;
  for (const FoundModelInfo& f : list) {
    if (!f.path.endsWith(QStringLiteral("tiny-q8.gguf"))) continue;
    seen = true;
    EXPECT_EQ(f.name, QStringLiteral("gui test model"));
    EXPECT_EQ(f.arch, QStringLiteral("llama"));
    EXPECT_EQ(f.quant, QStringLiteral("Q8_0"));
    EXPECT_EQ(f.source, QStringLiteral("llama.cpp cache"));
    EXPECT_GT(f.sizeBytes, 0);
  }
  EXPECT_TRUE(seen);
}

TEST(FoundModels, TheStartScreenListsTheFirstFewAndCountsTheRest) {
  StartScreen s;
  QVector<FoundModelInfo> found;
  for (int i = 0; i < StartScreen::kFoundShown + 3; ++i) {
    FoundModelInfo f;
    f.path = QStringLiteral("/models/m%1.gguf").arg(i);
    f.name = QStringLiteral("model %1").arg(i);
    f.arch = QStringLiteral("llama");
    f.quant = QStringLiteral("Q4_K_M");
    f.sizeBytes = qint64{1} << 30;
    f.source = QStringLiteral("LM Studio");
    found << f;
  }
  found[1].error = QStringLiteral("truncated download?");
  // m0 is already under Recent: not listed twice.
  s.setRecentModels({{QStringLiteral("/models/m0.gguf"), QStringLiteral("model 0")}});
  s.setFoundModels(found);
  const auto buttons = s.findChildren<QPushButton*>(QStringLiteral("FoundModel"));
  ASSERT_EQ(buttons.size(), StartScreen::kFoundShown);
  EXPECT_TRUE(buttons[0]->text().startsWith(QStringLiteral("model 1")));
  EXPECT_FALSE(buttons[0]->isEnabled());  // unreadable: shown, with the reason
  EXPECT_TRUE(buttons[0]->toolTip().contains(QStringLiteral("truncated")));
  EXPECT_TRUE(buttons[1]->text().contains(QStringLiteral("Q4_K_M")));
  EXPECT_TRUE(buttons[1]->text().contains(QStringLiteral("LM Studio")));
  QSignalSpy open(&s, &StartScreen::recentModelRequested);
  buttons[1]->click();
  ASSERT_EQ(open.count(), 1);
  EXPECT_EQ(open.at(0).at(0).toString(), QStringLiteral("/models/m2.gguf"));
  // 8 models, one recent, five shown: two more.
  bool more = false;
  for (QLabel* l : s.findChildren<QLabel*>()) {
    if (l->text().contains(QStringLiteral("and 2 more"))) more = true;
  }
  EXPECT_TRUE(more);
}

}  // namespace

// A Hugging Face folder (config.json, safetensors, tokenizer.json) opens like
// a GGUF file, and chats.
TEST(FoundModels, AHuggingFaceFolderOpensAndChats) {
  const QString base = guitest::freshDir(QStringLiteral("found-hf"));
  const QString dir = base + QStringLiteral("/tiny-hf");
  // A folder holds F32, F16 or BF16 weights.
  const QString gguf = base + QStringLiteral("/src.gguf");
  ASSERT_TRUE(guitest::writeSmallModel(gguf, "hf folder model", "f16"));
  const loom::Status written = loom::write_hf_folder(gguf.toStdString(), dir.toStdString(), {});
  ASSERT_TRUE(written.ok()) << written.message();
  const AppOptions o = guitest::appOptions(QStringLiteral("found-hf"));
  MainWindow w(o);
  w.show();
  QSignalSpy ready(&w, &MainWindow::modelReady);
  QSignalSpy failed(&w, &MainWindow::modelFailed);
  w.loadModel(dir);
  ASSERT_TRUE(QTest::qWaitFor([&] { return ready.count() + failed.count() > 0; }, 120000));
  ASSERT_EQ(ready.count(), 1) << failed.at(0).at(0).toString().toStdString();
  QSignalSpy finished(w.chat(), &ChatController::replyFinished);
  w.chat()->send(QStringLiteral("Hello, folder"));
  ASSERT_TRUE(QTest::qWaitFor([&] { return finished.count() > 0; }, 120000));
  const auto r = finished.at(0).at(0).value<GenerationResult>();
  EXPECT_TRUE(r.error.isEmpty()) << r.error.toStdString();
  EXPECT_GT(r.nGenerated, 0);
}
