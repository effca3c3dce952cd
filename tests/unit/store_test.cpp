// The SQLite store: CRUD of every table, WAL mode, migration from a version-1
// file built here from a frozen copy of its SQL, refusal of newer and foreign
// files, one connection per thread, and streamed message updates surviving a
// killed process.
#include "storage/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace loom::storage {
namespace {

std::string db_path(const std::string& test) {
  return test::temp_dir("store_" + test) + "/loom.db";
}

std::unique_ptr<Store> open_ok(const std::string& path) {
  auto s = Store::open(path);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.message());
  return s.ok() ? std::move(s).value() : nullptr;
}

// Runs SQL on a raw connection (no Store: no migration).
void raw_exec(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

int raw_user_version(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr);
  int v = -1;
  if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

TEST(Store, OpensInWalModeAtTheCurrentSchema) {
  const std::string path = db_path("wal");
  auto s = open_ok(path);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s->journal_mode(), "wal");
  EXPECT_EQ(*s->schema_version(), kSchemaVersion);
  // Opening again is a no-op migration.
  s.reset();
  s = open_ok(path);
  EXPECT_EQ(*s->schema_version(), kSchemaVersion);
}

TEST(Store, ChatsCreateRenameListSearchDelete) {
  auto s = open_ok(db_path("chats"));
  ASSERT_TRUE(s);
  const int64_t a = *s->create_chat("Rust lifetimes");
  const int64_t b = *s->create_chat("Cooking 100% rye bread");
  ASSERT_NE(a, b);
  ASSERT_TRUE(s->add_message(a, "user", "what is a borrow checker?").ok());  // a becomes the newest

  auto all = *s->list_chats();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, a);
  EXPECT_EQ(all[1].title, "Cooking 100% rye bread");

  ASSERT_TRUE(s->rename_chat(b, "Rye bread").ok());
  EXPECT_EQ(s->get_chat(b)->title, "Rye bread");
  EXPECT_EQ(s->list_chats()->front().id, b);  // renaming counts as a change

  // Search: titles and contents, case-insensitive, LIKE wildcards taken literally.
  EXPECT_EQ(s->list_chats("RYE")->size(), 1u);
  EXPECT_EQ(s->list_chats("borrow")->front().id, a);
  EXPECT_EQ(s->list_chats("100%")->size(), 0u);  // the old title is gone
  EXPECT_EQ(s->list_chats("_")->size(), 0u);
  EXPECT_EQ(s->list_chats("nothing like this")->size(), 0u);

  ASSERT_TRUE(s->delete_chat(a).ok());
  EXPECT_EQ(s->list_chats()->size(), 1u);
  EXPECT_EQ(s->list_messages(a)->size(), 0u);  // cascaded
  // Errors name what is missing.
  Status st = s->rename_chat(a, "x");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no chat with id"), std::string::npos);
  EXPECT_FALSE(s->get_chat(12345).ok());
}

TEST(Store, ChatSettingsRoundTrip) {
  auto s = open_ok(db_path("settings"));
  ASSERT_TRUE(s);
  const int64_t id = *s->create_chat("c");
  EXPECT_EQ(s->get_chat(id)->settings, ChatSettings());
  ChatSettings cs;
  cs.system_prompt = "You are terse.\nAnswer in one line.";
  cs.temperature = 0.2;
  cs.top_k = 0;
  cs.top_p = 0.5;
  cs.min_p = 0.0;
  cs.repeat_penalty = 1.3;
  cs.seed = 1234567890123;
  cs.max_tokens = -1;
  cs.n_ctx = 8192;
  ASSERT_TRUE(s->set_chat_settings(id, cs).ok());
  EXPECT_EQ(s->get_chat(id)->settings, cs);
  EXPECT_EQ(s->list_chats()->front().settings, cs);
}

TEST(Store, MessagesAddUpdateListTruncate) {
  auto s = open_ok(db_path("messages"));
  ASSERT_TRUE(s);
  const int64_t chat = *s->create_chat("c");
  const int64_t u1 = *s->add_message(chat, "user", "hi");
  const int64_t a1 = *s->add_message(chat, "assistant", "", MessageState::kStreaming);
  ASSERT_TRUE(s->update_message(a1, "Hel", MessageState::kStreaming).ok());
  ASSERT_TRUE(
      s->update_message(a1, "Hello — ünïcode ✓", MessageState::kComplete, "12 tokens").ok());
  const int64_t u2 = *s->add_message(chat, "user", "again");
  ASSERT_TRUE(s->add_message(chat, "assistant", "sure").ok());

  auto msgs = *s->list_messages(chat);
  ASSERT_EQ(msgs.size(), 4u);
  EXPECT_EQ(msgs[0].id, u1);
  EXPECT_EQ(msgs[1].content, "Hello — ünïcode ✓");
  EXPECT_EQ(msgs[1].state, MessageState::kComplete);
  EXPECT_EQ(msgs[1].meta, "12 tokens");
  EXPECT_EQ(s->get_message(a1)->role, "assistant");
  EXPECT_EQ(msgs[1].model, "");  // not recorded yet
  ASSERT_TRUE(s->set_message_origin(a1, "Model A", R"({"kv":"F16"})").ok());
  EXPECT_EQ(s->get_message(a1)->model, "Model A");
  EXPECT_EQ(s->get_message(a1)->origin, R"({"kv":"F16"})");
  EXPECT_FALSE(s->set_message_origin(12345, "x", "").ok());  // no such message

  // Regenerate / edit-and-resend: drop a message and everything after it.
  ASSERT_TRUE(s->delete_messages_from(u2).ok());
  msgs = *s->list_messages(chat);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs.back().id, a1);
  EXPECT_FALSE(s->update_message(u2, "x", MessageState::kComplete).ok());
  EXPECT_FALSE(s->add_message(999, "user", "no such chat").ok());  // foreign key
}

TEST(Store, AppSettingsRecentModelsPresets) {
  auto s = open_ok(db_path("misc"));
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->get_setting("theme")->has_value());
  ASSERT_TRUE(s->set_setting("theme", "light").ok());
  ASSERT_TRUE(s->set_setting("theme", "dark").ok());
  EXPECT_EQ(**s->get_setting("theme"), "dark");

  ASSERT_TRUE(s->touch_recent_model({"/m/a.gguf", "a", "llama, 2 layers", 100, 1000}).ok());
  ASSERT_TRUE(s->touch_recent_model({"/m/b.gguf", "b", "qwen2", 200, 2000}).ok());
  ASSERT_TRUE(s->touch_recent_model({"/m/a.gguf", "a2", "llama, 2 layers", 100, 3000}).ok());
  auto rm = *s->recent_models();
  ASSERT_EQ(rm.size(), 2u);
  EXPECT_EQ(rm[0].path, "/m/a.gguf");
  EXPECT_EQ(rm[0].name, "a2");
  EXPECT_EQ(s->recent_models(1)->size(), 1u);
  ASSERT_TRUE(s->forget_recent_model("/m/a.gguf").ok());
  EXPECT_EQ(s->recent_models()->front().path, "/m/b.gguf");

  const int64_t p = *s->save_preset("attn on gpu", R"({"strategy":"attn-gpu"})");
  EXPECT_EQ(*s->save_preset("attn on gpu", R"({"strategy":"attn-gpu","budget":4})"),
            p);  // replaced
  ASSERT_TRUE(s->save_preset("all cpu", R"({"strategy":"cpu"})").ok());
  auto ps = *s->list_presets();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].name, "all cpu");
  EXPECT_EQ(ps[1].spec, R"({"strategy":"attn-gpu","budget":4})");
  ASSERT_TRUE(s->delete_preset(p).ok());
  EXPECT_EQ(s->list_presets()->size(), 1u);
  EXPECT_FALSE(s->delete_preset(p).ok());
}

// Version 1 exactly as it was released (frozen here: never update this copy).
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE chats(id INTEGER PRIMARY KEY, title TEXT NOT NULL, created_at INTEGER NOT NULL,
                   updated_at INTEGER NOT NULL);
CREATE TABLE messages(id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
                      role TEXT NOT NULL, content TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE TABLE settings(key TEXT PRIMARY KEY, value TEXT NOT NULL);
PRAGMA user_version = 1;
INSERT INTO chats VALUES(7, 'old chat', 1000, 2000);
INSERT INTO messages VALUES(1, 7, 'user', 'hello from v1', 1500);
INSERT INTO messages VALUES(2, 7, 'assistant', 'hi!', 1600);
INSERT INTO settings VALUES('last_model', '/m/x.gguf');
)sql";

TEST(Store, MigratesFromVersion1) {
  const std::string path = db_path("migrate_v1");
  raw_exec(path, kSchemaV1);
  ASSERT_EQ(raw_user_version(path), 1);

  auto s = open_ok(path);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s->schema_version(), kSchemaVersion);
  auto chat = *s->get_chat(7);
  EXPECT_EQ(chat.title, "old chat");
  EXPECT_EQ(chat.updated_ms, 2000);
  EXPECT_EQ(chat.settings, ChatSettings());  // new columns read as a new chat's defaults
  auto msgs = *s->list_messages(7);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[0].content, "hello from v1");
  EXPECT_EQ(msgs[1].state, MessageState::kComplete);
  EXPECT_EQ(msgs[1].meta, "");
  EXPECT_EQ(msgs[1].model, "");  // version 4: the model was not recorded
  EXPECT_EQ(msgs[1].origin, "");
  EXPECT_EQ(**s->get_setting("last_model"), "/m/x.gguf");
  // The tables of version 2 work.
  EXPECT_TRUE(s->touch_recent_model({"/m/x.gguf", "x", "d", 1, 0}).ok());
  EXPECT_TRUE(s->save_preset("p", "{}").ok());
}

TEST(Store, RefusesAFileFromANewerLoomWithoutTouchingIt) {
  const std::string path = db_path("newer");
  raw_exec(path, "CREATE TABLE future(x); PRAGMA user_version = 99;");
  auto s = Store::open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("schema version 99"), std::string::npos) << s.message();
  EXPECT_EQ(raw_user_version(path), 99);
}

TEST(Store, RefusesAFileThatIsNotADatabase) {
  const std::string path = db_path("garbage");
  std::ofstream(path, std::ios::binary) << std::string(4096, 'x');
  auto s = Store::open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kFormat);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
}

TEST(Store, OneConnectionPerThread) {
  const std::string path = db_path("threads");
  auto main_store = open_ok(path);
  ASSERT_TRUE(main_store);
  const int64_t chat = *main_store->create_chat("shared");

  // A Store used from a thread that did not open it refuses, with a reason.
  Status foreign;
  std::thread([&] { foreign = main_store->rename_chat(chat, "x"); }).join();
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.message().find("one Store per thread"), std::string::npos);

  // Threads with their own connections write at once; WAL + busy timeout serialise them.
  constexpr int kThreads = 4, kEach = 50;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto s = Store::open(path);
      if (!s.ok()) {
        failures[static_cast<size_t>(t)] = kEach;
        return;
      }
      for (int i = 0; i < kEach; ++i) {
        // (Built with append: GCC 12 gives a false -Wrestrict for "t" + std::to_string(t).)
        std::string text = std::to_string(t);
        text.append("-").append(std::to_string(i));
        auto id = (*s)->add_message(chat, "user", text);
        if (!id.ok() || !(*s)->update_message(*id, "done", MessageState::kComplete).ok()) {
          ++failures[static_cast<size_t>(t)];
        }
        (void)(*s)->list_chats();  // reads interleaved with the other writers
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
  EXPECT_EQ(main_store->list_messages(chat)->size(), static_cast<size_t>(kThreads * kEach));
}

// A message updated while it streams survives the process being killed: the
// child is killed by SIGKILL right after an update, without closing anything.
TEST(StoreDeathTest, StreamedUpdatesSurviveAKilledProcess) {
  const std::string path = db_path("killed");
  int64_t chat = 0;
  {
    auto s = open_ok(path);
    ASSERT_TRUE(s);
    chat = *s->create_chat("streaming");
  }
  EXPECT_EXIT(
      {
        auto s = Store::open(path);
        if (!s.ok()) std::_Exit(3);
        auto id = (*s)->add_message(chat, "assistant", "", MessageState::kStreaming);
        if (!id.ok()) std::_Exit(4);
        std::string text;
        for (int i = 0; i < 40; ++i) {
          text.append("tok").append(std::to_string(i)).append(" ");
          if (!(*s)->update_message(*id, text, MessageState::kStreaming).ok()) std::_Exit(5);
        }
        std::raise(SIGKILL);
      },
      testing::KilledBySignal(SIGKILL), "");

  auto s = open_ok(path);
  ASSERT_TRUE(s);
  auto msgs = *s->list_messages(chat);
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(msgs[0].state, MessageState::kStreaming);
  EXPECT_EQ(msgs[0].content.substr(msgs[0].content.size() - 6),
            "tok39 ");  // the last update is there
  // At start-up the app marks it interrupted.
  EXPECT_EQ(*s->recover_interrupted(), 1);
  msgs = *s->list_messages(chat);
  EXPECT_EQ(msgs[0].state, MessageState::kStopped);
  EXPECT_EQ(msgs[0].meta, "interrupted");
  EXPECT_EQ(*s->recover_interrupted(), 0);
}

}  // namespace
}  // namespace loom::storage
