// Schema migrations. The file's version is PRAGMA user_version; step N turns
// version N-1 into version N inside one transaction, so a crash mid-migration
// leaves the old version intact. Steps are history: once released, a step is
// never edited, only followed by a new one (tests/unit/store_test.cpp builds
// version 1 from its own frozen copy of the SQL and migrates it).
#include "storage/sqlite_util.h"
#include "storage/store.h"

namespace loom::storage::detail {

namespace {

// Version 1: chats, messages, app settings.
constexpr const char* kStep1 = R"sql(
CREATE TABLE chats(
  id         INTEGER PRIMARY KEY,
  title      TEXT    NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE TABLE messages(
  id         INTEGER PRIMARY KEY,
  chat_id    INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
  role       TEXT    NOT NULL,
  content    TEXT    NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE TABLE settings(
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
)sql";

// Version 2: per-chat system prompt and sampling; message state (streaming,
// stopped...) and metadata; recent models; placement presets.
// Defaults equal ChatSettings' so chats of version 1 read as new ones.
constexpr const char* kStep2 = R"sql(
ALTER TABLE chats ADD COLUMN system_prompt  TEXT    NOT NULL DEFAULT '';
ALTER TABLE chats ADD COLUMN temperature    REAL    NOT NULL DEFAULT 0.8;
ALTER TABLE chats ADD COLUMN top_k          INTEGER NOT NULL DEFAULT 40;
ALTER TABLE chats ADD COLUMN top_p          REAL    NOT NULL DEFAULT 0.95;
ALTER TABLE chats ADD COLUMN min_p          REAL    NOT NULL DEFAULT 0.05;
ALTER TABLE chats ADD COLUMN repeat_penalty REAL    NOT NULL DEFAULT 1.1;
ALTER TABLE chats ADD COLUMN seed           INTEGER NOT NULL DEFAULT -1;
ALTER TABLE chats ADD COLUMN max_tokens     INTEGER NOT NULL DEFAULT 512;
ALTER TABLE chats ADD COLUMN n_ctx          INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN state INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN meta  TEXT    NOT NULL DEFAULT '';
CREATE TABLE recent_models(
  path        TEXT    PRIMARY KEY,
  name        TEXT    NOT NULL,
  description TEXT    NOT NULL,
  size_bytes  INTEGER NOT NULL,
  last_used   INTEGER NOT NULL
);
CREATE TABLE placement_presets(
  id         INTEGER PRIMARY KEY,
  name       TEXT    NOT NULL UNIQUE,
  spec       TEXT    NOT NULL,
  created_at INTEGER NOT NULL
);
)sql";

// Version 3: a placement preset remembers the model it was saved for (its
// layer count, which a placement must match, and its name for the list).
// Presets of version 2 read as "any model" (0 layers).
constexpr const char* kStep3 = R"sql(
ALTER TABLE placement_presets ADD COLUMN n_layer INTEGER NOT NULL DEFAULT 0;
ALTER TABLE placement_presets ADD COLUMN model   TEXT    NOT NULL DEFAULT '';
)sql";

// Version 4: an assistant message remembers what produced it: the model's
// name, and its origin (JSON written by the app: file, placement, KV cache,
// sampling), so a later model does not relabel it. Messages of version 3
// read as "model not recorded".
constexpr const char* kStep4 = R"sql(
ALTER TABLE messages ADD COLUMN model  TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN origin TEXT NOT NULL DEFAULT '';
)sql";
constexpr const char* kSteps[] = {kStep1, kStep2, kStep3, kStep4};
static_assert(sizeof(kSteps) / sizeof(kSteps[0]) == kSchemaVersion, "one step per schema version");

Result<int> user_version(sqlite3* db) {
  Stmt st(db, "PRAGMA user_version");
  if (!st.ok() || st.step() != SQLITE_ROW) return st.error("reading the schema version");
  return static_cast<int>(st.i64(0));
}

}  // namespace

Status migrate(sqlite3* db) {
  LOOM_ASSIGN_OR_RETURN(int version, user_version(db));
  if (version > kSchemaVersion) {
    return make_error(
        ErrorCode::kUnsupported,
        "store '%s' has schema version %d but this Loom knows up to %d: it was written by a newer "
        "Loom; open it with that version (the file was not changed)",
        sqlite3_db_filename(db, "main"), version, kSchemaVersion);
  }
  for (int v = version + 1; v <= kSchemaVersion; ++v) {
    // IMMEDIATE: take the write lock first, so two processes opening an old
    // file at once do not both run the step (the second sees the new version).
    LOOM_TRY(exec(db, "BEGIN IMMEDIATE", "starting a migration"));
    auto rollback = [&](Error e) -> Status {
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      return e;
    };
    auto again = user_version(db);
    if (!again.ok()) return rollback(again.error());
    if (*again >= v) {  // someone else migrated meanwhile
      LOOM_TRY(exec(db, "COMMIT", "ending a migration"));
      continue;
    }
    const std::string what = "migrating to schema version " + std::to_string(v);
    if (Status st = exec(db, kSteps[v - 1], what.c_str()); !st.ok()) return rollback(st.error());
    const std::string set_version = "PRAGMA user_version = " + std::to_string(v);
    if (Status st = exec(db, set_version.c_str(), what.c_str()); !st.ok())
      return rollback(st.error());
    if (Status st = exec(db, "COMMIT", what.c_str()); !st.ok()) return rollback(st.error());
  }
  return {};
}

}  // namespace loom::storage::detail
