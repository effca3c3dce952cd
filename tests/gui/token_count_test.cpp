// Tokens/s and the inter-token intervals count every generated token, also
// those whose text is not out yet (a UTF-8 character spread over tokens,
// which random weights produce often): n tokens give n - 1 intervals. Bytes
// that never make a character are shown escaped.
#include <gtest/gtest.h>

#include <QSignalSpy>

#include "app/engine_worker.h"
#include "app/live_stats.h"
#include "tests/gui/gui_test_util.h"

namespace {

TEST(TokenCount, EveryTokenIsAnIntervalWithOrWithoutText) {
  const QString dir = guitest::freshDir(QStringLiteral("token-count"));
  auto stats = std::make_shared<LiveStats>();
  EngineWorker worker(dir + QStringLiteral("/chats.db"), 2, stats);
  QSignalSpy loaded(&worker, &EngineWorker::modelLoaded);
  worker.loadModel(1, guitest::tinyModel(), false);
  ASSERT_EQ(loaded.count(), 1);

  QSignalSpy finished(&worker, &EngineWorker::generationFinished);
  GenerationRequest req;
  req.requestId = 2;
  req.turns << ChatTurn{QStringLiteral("user"), QStringLiteral("Count every token, please.")};
  req.sampling.maxTokens = 48;
  req.sampling.seed = 5;
  req.sampling.temperature = 1.0;
  worker.generate(req);
  ASSERT_EQ(finished.count(), 1);
  const auto r = finished.at(0).at(0).value<GenerationResult>();
  ASSERT_TRUE(r.error.isEmpty()) << r.error.toStdString();
  ASSERT_GT(r.nGenerated, 2);
  EXPECT_EQ(static_cast<int64_t>(stats->snapshot().itl.count), r.nGenerated - 1);
  // Random weights make bytes that are not UTF-8: they read as \xNN, not U+FFFD.
  EXPECT_FALSE(r.text.contains(QChar(0xFFFD))) << r.text.toStdString();
}

}  // namespace
