// The Server tab: it starts the real `loom serve` (the CLI built beside the
// tests) on the open model, shows the address and key once /health answers,
// counts the requests other programs send (from /metrics), stops it; a busy
// port and a missing CLI end in a message, not a hang.
#include "app/server_panel.h"

#include <gtest/gtest.h>

#include <QCoreApplication>
#include <QEventLoop>
#include <QNetworkAccessManager>
#include <QNetworkReply>
#include <QNetworkRequest>
#include <QTest>

#include "tests/gui/gui_test_util.h"

namespace {

using State = ServerController::State;

int freePort() {
  // Distinct per process (ctest runs several at once): 20000 + pid mod 20000.
  return 20000 + static_cast<int>(QCoreApplication::applicationPid() % 20000);
}

/// POSTs a chat completion; returns the HTTP status (0: no answer).
int postChat(int port, const QString& key) {
  QNetworkAccessManager net;
  QNetworkRequest req(QUrl(QStringLiteral("http://127.0.0.1:%1/v1/chat/completions").arg(port)));
  req.setHeader(QNetworkRequest::ContentTypeHeader, QStringLiteral("application/json"));
  if (!key.isEmpty()) req.setRawHeader("Authorization", "Bearer " + key.toUtf8());
  req.setTransferTimeout(30000);
  QNetworkReply* r = net.post(
      req, QByteArray(R"({"messages":[{"role":"user","content":"hello"}],"max_tokens":4})"));
  QEventLoop loop;
  QObject::connect(r, &QNetworkReply::finished, &loop, &QEventLoop::quit);
  loop.exec();
  const int status = r->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
  r->deleteLater();
  return status;
}

class ServerPanelTest : public ::testing::Test {
 protected:
  void SetUp() override { qputenv("LOOM_CLI", LOOM_CLI_PATH); }
  void TearDown() override { qunsetenv("LOOM_CLI"); }
};

TEST_F(ServerPanelTest, StartsServesCountsAndStops) {
  const QString model = guitest::tinyModel();
  ASSERT_FALSE(model.isEmpty());
  ServerPanel panel;
  EXPECT_TRUE(panel.statusText().contains(QStringLiteral("Open a model")));
  panel.setModel(model, QStringLiteral("tiny"));
  ServerController::Settings s;
  s.port = freePort();
  s.apiKey = QStringLiteral("k123");
  s.parallel = 2;
  s.threads = 1;
  panel.setSettings(s);
  panel.toggle();
  ServerController* c = panel.controller();
  ASSERT_TRUE(QTest::qWaitFor([&] { return c->state() != State::Starting; }, 60000));
  ASSERT_EQ(c->state(), State::Running) << c->lastError().toStdString();
  const QString shown = panel.statusText();
  EXPECT_TRUE(shown.contains(QStringLiteral("http://127.0.0.1:%1/v1").arg(s.port)))
      << shown.toStdString();
  EXPECT_TRUE(shown.contains(QStringLiteral("k123"))) << shown.toStdString();
  EXPECT_TRUE(c->commandLine().contains(QStringLiteral("--parallel 2")));
  EXPECT_FALSE(c->commandLine().contains(QStringLiteral("k123")));  // the key is not echoed

  EXPECT_EQ(postChat(s.port, QString()), 401);
  EXPECT_EQ(postChat(s.port, s.apiKey), 200);
  EXPECT_EQ(postChat(s.port, s.apiKey), 200);
  EXPECT_TRUE(QTest::qWaitFor([&] { return c->servedRequests() >= 2; }, 10000))
      << c->servedRequests();
  EXPECT_GT(c->generatedTokens(), 0);

  // A second server on the same port cannot listen: it says so and stops.
  ServerController other;
  other.start(model, s);
  ASSERT_TRUE(QTest::qWaitFor([&] { return other.state() == State::Failed; }, 60000))
      << static_cast<int>(other.state());
  EXPECT_FALSE(other.lastError().isEmpty());

  panel.toggle();
  EXPECT_EQ(c->state(), State::Stopped);
  EXPECT_EQ(postChat(s.port, s.apiKey), 0);  // nothing listens any more
}

TEST_F(ServerPanelTest, MissingCliIsAClearFailure) {
  qputenv("LOOM_CLI", "/nonexistent/loom");
  ServerController c;
  c.start(guitest::tinyModel(), ServerController::Settings{});
  EXPECT_EQ(c.state(), State::Failed);
  EXPECT_TRUE(c.lastError().contains(QStringLiteral("not found"))) << c.lastError().toStdString();
}

}  // namespace
