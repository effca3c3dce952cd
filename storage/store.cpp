#include "storage/store.h"

#include <chrono>
#include <sstream>

#include "storage/sqlite_util.h"

namespace loom::storage {

using detail::Stmt;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// Columns of a chat, in the order read_chat expects.
constexpr const char* kChatColumns =
    "id, title, created_at, updated_at, system_prompt, temperature, top_k, top_p, min_p, "
    "repeat_penalty, seed, "
    "max_tokens, n_ctx";

ChatRow read_chat(const Stmt& st) {
  ChatRow c;
  c.id = st.i64(0);
  c.title = st.text(1);
  c.created_ms = st.i64(2);
  c.updated_ms = st.i64(3);
  ChatSettings& s = c.settings;
  s.system_prompt = st.text(4);
  s.temperature = st.f64(5);
  s.top_k = st.i64(6);
  s.top_p = st.f64(7);
  s.min_p = st.f64(8);
  s.repeat_penalty = st.f64(9);
  s.seed = st.i64(10);
  s.max_tokens = st.i64(11);
  s.n_ctx = st.i64(12);
  return c;
}

// A chat's new updated_at: now, but strictly after every other chat's, so that
// "last changed" orders chats even when changes share a millisecond (or the
// clock steps back).
#define LOOM_NEXT_UPDATED_AT(now) \
  "MAX(" now ", COALESCE((SELECT MAX(updated_at) FROM chats), 0) + 1)"

constexpr const char* kMessageColumns =
    "id, chat_id, role, content, state, meta, created_at, model, origin";

MessageRow read_message(const Stmt& st) {
  MessageRow m;
  m.id = st.i64(0);
  m.chat_id = st.i64(1);
  m.role = st.text(2);
  m.content = st.text(3);
  const int64_t state = st.i64(4);
  // A state this build does not know (a newer Loom wrote it) reads as finished.
  m.state = state >= 0 && state <= 3 ? static_cast<MessageState>(state) : MessageState::kComplete;
  m.meta = st.text(5);
  m.created_ms = st.i64(6);
  m.model = st.text(7);
  m.origin = st.text(8);
  return m;
}

// `text` as a LIKE pattern that matches it anywhere, with % _ and \ taken literally.
std::string like_pattern(const std::string& text) {
  std::string p = "%";
  for (char c : text) {
    if (c == '%' || c == '_' || c == '\\') p += '\\';
    p += c;
  }
  return p + "%";
}

Error not_found(const char* what, int64_t id) {
  return make_error(ErrorCode::kInvalidArgument, "store: no %s with id %lld", what,
                    static_cast<long long>(id));
}

// Binds a chat's nine settings to parameters first .. first + 8, in the
// column order of the chats table (system_prompt .. n_ctx).
void bind_settings(Stmt& st, int first, const ChatSettings& s) {
  st.bind(first, s.system_prompt)
      .bind(first + 1, s.temperature)
      .bind(first + 2, s.top_k)
      .bind(first + 3, s.top_p)
      .bind(first + 4, s.min_p)
      .bind(first + 5, s.repeat_penalty)
      .bind(first + 6, s.seed)
      .bind(first + 7, s.max_tokens)
      .bind(first + 8, s.n_ctx);
}
}  // namespace

Result<std::unique_ptr<Store>> Store::open(const std::string& path) {
  sqlite3* db = nullptr;
  // NOMUTEX: one connection per thread (checked by check_thread), so SQLite's
  // own per-connection locking is not needed.
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    Error e = make_error(ErrorCode::kIo, "store '%s': cannot open: %s", path.c_str(),
                         db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close(db);
    return e;
  }
  std::unique_ptr<Store> s(new Store(db, path));
  // Other threads and processes hold their own connections: wait for their
  // write transactions (short ones) rather than failing at once.
  sqlite3_busy_timeout(db, 5000);
  // The first statement reads the header: a file that is not a database fails here.
  {
    Stmt st(db, "PRAGMA journal_mode = WAL");
    if (!st.ok() || st.step() != SQLITE_ROW) return st.error("switching to WAL mode");
    if (st.text(0) != "wal") {
      return make_error(ErrorCode::kIo,
                        "store '%s': the file system refused WAL mode (journal mode is '%s')",
                        path.c_str(), st.text(0).c_str());
    }
  }
  // NORMAL in WAL mode: a commit survives a crash of the process (not always a
  // power loss), without an fsync per streamed update.
  LOOM_TRY(detail::exec(db, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
                        "setting pragmas"));
  LOOM_TRY(detail::migrate(db));
  return s;
}

Store::~Store() {
  sqlite3_close(db_);
}

Status Store::check_thread() const {
  if (std::this_thread::get_id() == owner_) return {};
  std::ostringstream os;
  os << "store '" << path_ << "' was opened on another thread: open one Store per thread";
  return Error(ErrorCode::kInternal, os.str());
}

Status Store::exec(const std::string& sql) {
  LOOM_TRY(check_thread());
  return detail::exec(db_, sql.c_str(), "running SQL");
}

Result<int> Store::schema_version() {
  LOOM_TRY(check_thread());
  Stmt st(db_, "PRAGMA user_version");
  if (!st.ok() || st.step() != SQLITE_ROW) return st.error("reading the schema version");
  return static_cast<int>(st.i64(0));
}

Result<std::string> Store::journal_mode() {
  LOOM_TRY(check_thread());
  Stmt st(db_, "PRAGMA journal_mode");
  if (!st.ok() || st.step() != SQLITE_ROW) return st.error("reading the journal mode");
  return st.text(0);
}

// ---- chats ------------------------------------------------------------------

Result<int64_t> Store::create_chat(const std::string& title, const ChatSettings& s) {
  LOOM_TRY(check_thread());
  const int64_t now = now_ms();
  Stmt st(db_,
          "INSERT INTO chats(title, created_at, updated_at, system_prompt, temperature, top_k, "
          "top_p, min_p, "
          "repeat_penalty, seed, max_tokens, n_ctx) VALUES(?1, ?2, " LOOM_NEXT_UPDATED_AT(
              "?2") ", ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
  if (!st.ok()) return st.error("creating a chat");
  st.bind(1, title).bind(2, now);
  bind_settings(st, 3, s);
  LOOM_TRY(st.run("creating a chat"));
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

Status Store::rename_chat(int64_t chat_id, const std::string& title) {
  LOOM_TRY(check_thread());
  Stmt st(db_,
          "UPDATE chats SET title = ?2, updated_at = " LOOM_NEXT_UPDATED_AT("?3") " WHERE id = ?1");
  st.bind(1, chat_id).bind(2, title).bind(3, now_ms());
  LOOM_TRY(st.run("renaming a chat"));
  if (sqlite3_changes(db_) == 0) return not_found("chat", chat_id);
  return {};
}

Status Store::delete_chat(int64_t chat_id) {
  LOOM_TRY(check_thread());
  Stmt st(db_, "DELETE FROM chats WHERE id = ?1");  // messages go by ON DELETE CASCADE
  st.bind(1, chat_id);
  LOOM_TRY(st.run("deleting a chat"));
  if (sqlite3_changes(db_) == 0) return not_found("chat", chat_id);
  return {};
}

Result<std::vector<ChatRow>> Store::list_chats(const std::string& search) {
  LOOM_TRY(check_thread());
  std::string sql = std::string("SELECT ") + kChatColumns + " FROM chats";
  if (!search.empty()) {
    sql +=
        " WHERE title LIKE ?1 ESCAPE '\\' OR id IN (SELECT chat_id FROM messages WHERE content "
        "LIKE ?1 ESCAPE '\\')";
  }
  sql += " ORDER BY updated_at DESC, id DESC";
  Stmt st(db_, sql.c_str());
  if (!st.ok()) return st.error("listing chats");
  if (!search.empty()) st.bind(1, like_pattern(search));
  std::vector<ChatRow> out;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) out.push_back(read_chat(st));
  if (rc != SQLITE_DONE) return st.error("listing chats");
  return out;
}

Result<ChatRow> Store::get_chat(int64_t chat_id) {
  LOOM_TRY(check_thread());
  Stmt st(db_, (std::string("SELECT ") + kChatColumns + " FROM chats WHERE id = ?1").c_str());
  if (!st.ok()) return st.error("reading a chat");
  st.bind(1, chat_id);
  const int rc = st.step();
  if (rc == SQLITE_DONE) return not_found("chat", chat_id);
  if (rc != SQLITE_ROW) return st.error("reading a chat");
  return read_chat(st);
}

Status Store::set_chat_settings(int64_t chat_id, const ChatSettings& s) {
  LOOM_TRY(check_thread());
  Stmt st(
      db_,
      "UPDATE chats SET system_prompt = ?2, temperature = ?3, top_k = ?4, top_p = ?5, min_p = ?6, "
      "repeat_penalty = ?7, seed = ?8, max_tokens = ?9, n_ctx = ?10 WHERE id = ?1");
  st.bind(1, chat_id);
  bind_settings(st, 2, s);
  LOOM_TRY(st.run("saving chat settings"));
  if (sqlite3_changes(db_) == 0) return not_found("chat", chat_id);
  return {};
}

Status Store::touch_chat(int64_t chat_id) {
  Stmt st(db_, "UPDATE chats SET updated_at = " LOOM_NEXT_UPDATED_AT("?2") " WHERE id = ?1");
  st.bind(1, chat_id).bind(2, now_ms());
  return st.run("updating a chat");
}

// ---- messages ---------------------------------------------------------------

Result<int64_t> Store::add_message(int64_t chat_id, const std::string& role,
                                   const std::string& content, MessageState state,
                                   const std::string& meta) {
  LOOM_TRY(check_thread());
  // The message and the chat's new time together, or neither.
  LOOM_TRY(detail::exec(db_, "BEGIN IMMEDIATE", "adding a message"));
  Stmt st(db_,
          "INSERT INTO messages(chat_id, role, content, state, meta, created_at) VALUES(?1, ?2, "
          "?3, ?4, ?5, ?6)");
  st.bind(1, chat_id)
      .bind(2, role)
      .bind(3, content)
      .bind(4, static_cast<int64_t>(state))
      .bind(5, meta);
  st.bind(6, now_ms());
  Status s = st.run("adding a message");
  const auto id = static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
  if (s.ok()) s = touch_chat(chat_id);
  if (!s.ok()) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return s.error();
  }
  LOOM_TRY(detail::exec(db_, "COMMIT", "adding a message"));
  return id;
}

Status Store::update_message(int64_t message_id, const std::string& content, MessageState state,
                             const std::string& meta) {
  LOOM_TRY(check_thread());
  Stmt st(db_, "UPDATE messages SET content = ?2, state = ?3, meta = ?4 WHERE id = ?1");
  st.bind(1, message_id).bind(2, content).bind(3, static_cast<int64_t>(state)).bind(4, meta);
  LOOM_TRY(st.run("updating a message"));
  if (sqlite3_changes(db_) == 0) return not_found("message", message_id);
  return {};
}

Status Store::set_message_origin(int64_t message_id, const std::string& model,
                                 const std::string& origin) {
  LOOM_TRY(check_thread());
  Stmt st(db_, "UPDATE messages SET model = ?2, origin = ?3 WHERE id = ?1");
  st.bind(1, message_id).bind(2, model).bind(3, origin);
  LOOM_TRY(st.run("recording what wrote a message"));
  if (sqlite3_changes(db_) == 0) return not_found("message", message_id);
  return {};
}

Result<std::vector<MessageRow>> Store::list_messages(int64_t chat_id) {
  LOOM_TRY(check_thread());
  Stmt st(db_, (std::string("SELECT ") + kMessageColumns +
                " FROM messages WHERE chat_id = ?1 ORDER BY id")
                   .c_str());
  if (!st.ok()) return st.error("listing messages");
  st.bind(1, chat_id);
  std::vector<MessageRow> out;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) out.push_back(read_message(st));
  if (rc != SQLITE_DONE) return st.error("listing messages");
  return out;
}

Result<MessageRow> Store::get_message(int64_t message_id) {
  LOOM_TRY(check_thread());
  Stmt st(db_, (std::string("SELECT ") + kMessageColumns + " FROM messages WHERE id = ?1").c_str());
  if (!st.ok()) return st.error("reading a message");
  st.bind(1, message_id);
  const int rc = st.step();
  if (rc == SQLITE_DONE) return not_found("message", message_id);
  if (rc != SQLITE_ROW) return st.error("reading a message");
  return read_message(st);
}

Status Store::delete_messages_from(int64_t message_id) {
  LOOM_TRY(check_thread());
  Stmt st(db_,
          "DELETE FROM messages WHERE chat_id = (SELECT chat_id FROM messages WHERE id = ?1) AND "
          "id >= ?1");
  st.bind(1, message_id);
  LOOM_TRY(st.run("deleting messages"));
  if (sqlite3_changes(db_) == 0) return not_found("message", message_id);
  return {};
}

Result<int> Store::recover_interrupted() {
  LOOM_TRY(check_thread());
  Stmt st(db_,
          "UPDATE messages SET state = ?1, meta = CASE WHEN meta = '' THEN 'interrupted' ELSE meta "
          "|| ' · interrupted' "
          "END WHERE state = ?2");
  st.bind(1, static_cast<int64_t>(MessageState::kStopped))
      .bind(2, static_cast<int64_t>(MessageState::kStreaming));
  LOOM_TRY(st.run("recovering interrupted messages"));
  return sqlite3_changes(db_);
}

// ---- settings -----------------------------------------------------------------

Result<std::optional<std::string>> Store::get_setting(const std::string& key) {
  LOOM_TRY(check_thread());
  Stmt st(db_, "SELECT value FROM settings WHERE key = ?1");
  if (!st.ok()) return st.error("reading a setting");
  st.bind(1, key);
  const int rc = st.step();
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  if (rc != SQLITE_ROW) return st.error("reading a setting");
  return std::optional<std::string>(st.text(0));
}

Status Store::set_setting(const std::string& key, const std::string& value) {
  LOOM_TRY(check_thread());
  Stmt st(db_,
          "INSERT INTO settings(key, value) VALUES(?1, ?2) ON CONFLICT(key) DO UPDATE SET value = "
          "excluded.value");
  st.bind(1, key).bind(2, value);
  return st.run("saving a setting");
}

// ---- recent models ------------------------------------------------------------

Status Store::touch_recent_model(const RecentModel& m) {
  LOOM_TRY(check_thread());
  Stmt st(
      db_,
      "INSERT INTO recent_models(path, name, description, size_bytes, last_used) VALUES(?1, ?2, "
      "?3, ?4, ?5) "
      "ON CONFLICT(path) DO UPDATE SET name = excluded.name, description = excluded.description, "
      "size_bytes = excluded.size_bytes, last_used = excluded.last_used");
  st.bind(1, m.path).bind(2, m.name).bind(3, m.description).bind(4, m.size_bytes);
  st.bind(5, m.last_used_ms > 0 ? m.last_used_ms : now_ms());
  return st.run("remembering a model");
}

Result<std::vector<RecentModel>> Store::recent_models(int limit) {
  LOOM_TRY(check_thread());
  Stmt st(db_,
          "SELECT path, name, description, size_bytes, last_used FROM recent_models "
          "ORDER BY last_used DESC, rowid DESC LIMIT ?1");
  if (!st.ok()) return st.error("listing recent models");
  st.bind(1, static_cast<int64_t>(limit));
  std::vector<RecentModel> out;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    out.push_back(RecentModel{st.text(0), st.text(1), st.text(2), st.i64(3), st.i64(4)});
  }
  if (rc != SQLITE_DONE) return st.error("listing recent models");
  return out;
}

Status Store::forget_recent_model(const std::string& path) {
  LOOM_TRY(check_thread());
  Stmt st(db_, "DELETE FROM recent_models WHERE path = ?1");
  st.bind(1, path);
  return st.run("forgetting a model");
}

// ---- placement presets ----------------------------------------------------------

Result<int64_t> Store::save_preset(const std::string& name, const std::string& spec,
                                   int64_t n_layer, const std::string& model) {
  LOOM_TRY(check_thread());
  Stmt st(db_,
          "INSERT INTO placement_presets(name, spec, created_at, n_layer, model) VALUES(?1, ?2, "
          "?3, ?4, ?5) "
          "ON CONFLICT(name) DO UPDATE SET spec = excluded.spec, n_layer = excluded.n_layer, model "
          "= excluded.model "
          "RETURNING id");
  if (!st.ok()) return st.error("saving a placement preset");
  st.bind(1, name).bind(2, spec).bind(3, now_ms()).bind(4, n_layer).bind(5, model);
  if (st.step() != SQLITE_ROW) return st.error("saving a placement preset");
  return st.i64(0);
}

Result<std::vector<PlacementPreset>> Store::list_presets() {
  LOOM_TRY(check_thread());
  Stmt st(db_,
          "SELECT id, name, spec, created_at, n_layer, model FROM placement_presets ORDER BY name");
  if (!st.ok()) return st.error("listing placement presets");
  std::vector<PlacementPreset> out;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    out.push_back(
        PlacementPreset{st.i64(0), st.text(1), st.text(2), st.i64(3), st.i64(4), st.text(5)});
  }
  if (rc != SQLITE_DONE) return st.error("listing placement presets");
  return out;
}

Status Store::delete_preset(int64_t preset_id) {
  LOOM_TRY(check_thread());
  Stmt st(db_, "DELETE FROM placement_presets WHERE id = ?1");
  st.bind(1, preset_id);
  LOOM_TRY(st.run("deleting a placement preset"));
  if (sqlite3_changes(db_) == 0) return not_found("placement preset", preset_id);
  return {};
}

}  // namespace loom::storage
