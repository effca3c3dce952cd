// A reply keeps the model, placement, KV cache and sampling that wrote it:
// after another model is loaded, the old reply still names the first model
// (in the transcript, after a reload, and in the exports), the new reply the
// second; a reply from before the store recorded models says so.
#include <gtest/gtest.h>

#include <QSignalSpy>
#include <QTest>

#include "app/chat_controller.h"
#include "app/chat_export.h"
#include "app/elided_label.h"
#include "app/main_window.h"
#include "app/transcript_view.h"
#include "storage/store.h"
#include "tests/gui/gui_test_util.h"

namespace {

constexpr int kWaitMs = 120000;

QString secondModel() {
  const QString dir =
      guitest::freshDir(QStringLiteral("origin-model-%1").arg(QCoreApplication::applicationPid()));
  const QString p = dir + QStringLiteral("/second.gguf");
  return guitest::writeSmallModel(p, "second model", "f16") ? p : QString();
}

bool load(MainWindow& w, const QString& path) {
  QSignalSpy ready(&w, &MainWindow::modelReady);
  w.loadModel(path);
  return QTest::qWaitFor([&] { return ready.count() > 0; }, kWaitMs);
}

bool sendAndWait(MainWindow& w, const QString& text) {
  QSignalSpy finished(w.chat(), &ChatController::replyFinished);
  w.chat()->send(text);
  return QTest::qWaitFor([&] { return finished.count() > 0; }, kWaitMs);
}

// The assistant messages' names, oldest first.
QStringList assistantNames(MainWindow& w, QStringList* tips = nullptr) {
  QList<MessageWidget*> list = w.transcript()->findChildren<MessageWidget*>();
  std::sort(list.begin(), list.end(),
            [](MessageWidget* a, MessageWidget* b) { return a->messageId() < b->messageId(); });
  QStringList names;
  for (MessageWidget* m : list) {
    if (m->role() != QLatin1String("assistant")) continue;
    auto* name = m->findChild<ElidedLabel*>(QStringLiteral("RoleLabel"));
    names << (name ? name->fullText() : QString());
    if (tips) *tips << (name ? name->toolTip() : QString());
  }
  return names;
}

TEST(MessageOrigin, AReplyKeepsTheModelThatWroteItAcrossAModelChange) {
  const AppOptions o = guitest::appOptions(QStringLiteral("origin"));
  const QString second = secondModel();
  ASSERT_FALSE(second.isEmpty());
  {
    MainWindow w(o);
    w.show();
    ASSERT_TRUE(load(w, guitest::tinyModel()));
    ASSERT_TRUE(sendAndWait(w, QStringLiteral("First question")));
    ASSERT_TRUE(load(w, second));
    // The first reply is not relabelled by the model loaded now.
    QStringList tips;
    EXPECT_EQ(assistantNames(w, &tips), QStringList{QStringLiteral("gui test model")});
    ASSERT_EQ(tips.size(), 1);
    EXPECT_TRUE(tips[0].contains(QStringLiteral("Placement:"))) << tips[0].toStdString();
    EXPECT_TRUE(tips[0].contains(QStringLiteral("KV cache: F16"))) << tips[0].toStdString();
    EXPECT_TRUE(tips[0].contains(QStringLiteral("temperature"))) << tips[0].toStdString();
    ASSERT_TRUE(sendAndWait(w, QStringLiteral("Second question")));
    EXPECT_EQ(assistantNames(w),
              (QStringList{QStringLiteral("gui test model"), QStringLiteral("second model")}));
  }
  // After a restart without a model: the names come from the store.
  {
    AppOptions again = o;
    MainWindow w(again);
    w.show();
    QTest::qWait(50);
    EXPECT_EQ(assistantNames(w),
              (QStringList{QStringLiteral("gui test model"), QStringLiteral("second model")}));
  }
  // The exports carry them too; a row the store has no model for says so.
  auto store = loom::storage::Store::open(AppOptions(o).dbPath().toStdString());
  ASSERT_TRUE(store.ok()) << store.message();
  auto chats = (*store)->list_chats();
  ASSERT_TRUE(chats.ok());
  ASSERT_FALSE(chats->empty());
  auto msgs = (*store)->list_messages(chats->front().id);
  ASSERT_TRUE(msgs.ok());
  const QString md = chatToMarkdown(chats->front(), *msgs);
  EXPECT_TRUE(md.contains(QStringLiteral("Assistant (gui test model)"))) << md.toStdString();
  EXPECT_TRUE(md.contains(QStringLiteral("Assistant (second model)"))) << md.toStdString();
  const QByteArray json = chatToJson(chats->front(), *msgs);
  EXPECT_TRUE(json.contains("\"model\":\"second model\"") ||
              json.contains("\"model\": \"second model\""))
      << json.toStdString();
  EXPECT_TRUE(json.contains("\"origin\"")) << json.toStdString();
  EXPECT_TRUE(describeOrigin(QString(), QString()).contains(QStringLiteral("not recorded")));
}

}  // namespace
