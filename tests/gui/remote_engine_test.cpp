// The remote engine as a model source: the worker connects to a real
// OpenAI-compatible server (`loom serve`'s, in process, with an API key),
// refuses a wrong key, an unknown model and an unreachable address with the
// cause, and streams a reply equal to the server's greedy text; opening a
// local model afterwards makes the chats local again.
#include <gtest/gtest.h>

#include <QSignalSpy>

#include "app/engine_worker.h"
#include "app/live_stats.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/runtime/session.h"
#include "tests/gui/gui_test_util.h"
#include "tests/test_util.h"
#include "tools/serve/server.h"

namespace {

TEST(RemoteEngine, ConnectsChatsAndSaysWhatFails) {
  auto model = loom::load_model(guitest::tinyModel().toStdString());
  ASSERT_TRUE(model.ok()) << model.message();
  loom::CpuBackend be(1);
  std::vector<std::unique_ptr<loom::Session>> sessions;
  auto s0 = loom::Session::create(**model, be, loom::SessionConfig{});
  ASSERT_TRUE(s0.ok());
  sessions.push_back(std::move(s0).value());
  loom::serve::Metrics metrics;
  loom::serve::Scheduler sched(std::move(sessions), loom::serve::SchedulerOptions{}, &metrics);
  loom::serve::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.api_key = "k";
  so.model_id = "tiny-remote";
  loom::serve::Server server(sched, metrics, so);
  ASSERT_TRUE(server.start().ok());
  const QString url = QStringLiteral("http://127.0.0.1:%1/v1").arg(server.port());

  const QString dir = guitest::freshDir(QStringLiteral("remote-engine"));
  EngineWorker worker(dir + QStringLiteral("/chats.db"), 2, std::make_shared<LiveStats>());
  QSignalSpy connected(&worker, &EngineWorker::remoteConnected);
  QSignalSpy failed(&worker, &EngineWorker::modelLoadFailed);
  worker.connectRemote(1, url, QStringLiteral("wrong"), {});
  ASSERT_EQ(failed.count(), 1);
  EXPECT_TRUE(failed.at(0).at(1).toString().contains(QStringLiteral("401")))
      << failed.at(0).at(1).toString().toStdString();
  worker.connectRemote(2, url, QStringLiteral("k"), QStringLiteral("nope"));
  ASSERT_EQ(failed.count(), 2);
  EXPECT_TRUE(failed.at(1).at(1).toString().contains(QStringLiteral("tiny-remote")));
  worker.connectRemote(3, QStringLiteral("http://127.0.0.1:1/v1"), {}, {});
  ASSERT_EQ(failed.count(), 3);
  EXPECT_TRUE(failed.at(2).at(1).toString().contains(QStringLiteral("cannot reach")))
      << failed.at(2).at(1).toString().toStdString();
  worker.connectRemote(4, QStringLiteral("ftp://x"), {}, {});
  ASSERT_EQ(failed.count(), 4);

  worker.connectRemote(5, url, QStringLiteral("k"), {});
  ASSERT_EQ(connected.count(), 1);
  const auto summary = connected.at(0).at(1).value<ModelSummary>();
  EXPECT_EQ(summary.name, QStringLiteral("tiny-remote"));
  EXPECT_EQ(summary.path, url);

  QSignalSpy finished(&worker, &EngineWorker::generationFinished);
  GenerationRequest req;
  req.requestId = 6;
  req.turns << ChatTurn{QStringLiteral("user"), QStringLiteral("hello there")};
  req.sampling.temperature = 0;
  req.sampling.repeatPenalty = 1.0;
  req.sampling.maxTokens = 12;
  worker.generate(req);
  ASSERT_EQ(finished.count(), 1);
  auto r = finished.at(0).at(0).value<GenerationResult>();
  ASSERT_TRUE(r.error.isEmpty()) << r.error.toStdString();
  EXPECT_EQ(r.text.toStdString(), loom::test::greedy_chat(**model, {{"user", "hello there"}}, 12));
  EXPECT_GT(r.nPrompt, 0);
  EXPECT_GT(r.nGenerated, 0);
  EXPECT_TRUE(r.meta.contains(QStringLiteral("tiny-remote at 127.0.0.1"))) << r.meta.toStdString();

  // The server goes away: the next reply is an error that says so.
  server.stop();
  req.requestId = 7;
  worker.generate(req);
  ASSERT_EQ(finished.count(), 2);
  r = finished.at(1).at(0).value<GenerationResult>();
  EXPECT_TRUE(r.error.contains(QStringLiteral("cannot reach"))) << r.error.toStdString();

  // A local model makes the chats local again.
  QSignalSpy loaded(&worker, &EngineWorker::modelLoaded);
  worker.loadModel(8, guitest::tinyModel(), false);
  ASSERT_EQ(loaded.count(), 1);
  req.requestId = 9;
  worker.generate(req);
  ASSERT_EQ(finished.count(), 3);
  r = finished.at(2).at(0).value<GenerationResult>();
  ASSERT_TRUE(r.error.isEmpty()) << r.error.toStdString();
  EXPECT_FALSE(r.meta.contains(QStringLiteral("tiny-remote")));
}

}  // namespace
