// The SQLite store: chats and their messages, per-chat settings, app settings,
// recently opened models and placement presets. No Qt, no engine types: the
// app converts at its edge.
//
// One Store is one SQLite connection and belongs to the thread that opened it
// (SQLite is opened without its own mutexes); a call from another thread is
// refused with an error instead of racing. Threads that need the database open
// their own Store on the same file: WAL mode lets readers and one writer work
// at once, and a busy timeout serialises writers.
//
// Crash safety: every call is its own transaction (or a batch of them in one),
// committed before the call returns. With WAL and synchronous=NORMAL a commit
// survives the process being killed; only a power loss can drop the last few.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace loom::storage {

/// The schema this build writes. Older files are migrated on open.
inline constexpr int kSchemaVersion = 4;

/// Where a message stands. Stored as an integer: never renumber.
enum class MessageState : int {
  kComplete = 0,   ///< finished normally (or typed by the user)
  kStreaming = 1,  ///< generation in progress (or the app died while it was)
  kStopped = 2,    ///< stopped by the user, or found interrupted after a crash
  kError = 3,      ///< generation failed; `meta` says why
};

/// Per-chat system prompt and sampling settings. The defaults are those of a
/// new chat; values follow the engine's conventions (seed < 0: a new random
/// seed each turn, n_ctx 0: the model's own context capped by the engine).
struct ChatSettings {
  std::string system_prompt;
  double temperature = 0.8;
  int64_t top_k = 40;
  double top_p = 0.95;
  double min_p = 0.05;
  double repeat_penalty = 1.1;
  int64_t seed = -1;
  int64_t max_tokens = 512;
  int64_t n_ctx = 0;
  bool operator==(const ChatSettings&) const = default;
};

struct ChatRow {
  int64_t id = 0;
  std::string title;
  int64_t created_ms = 0;  ///< Unix time, milliseconds
  int64_t updated_ms = 0;  ///< last change to the chat or any of its messages
  ChatSettings settings;
};

struct MessageRow {
  int64_t id = 0;
  int64_t chat_id = 0;
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;  ///< UTF-8 Markdown
  MessageState state = MessageState::kComplete;
  std::string meta;  ///< free text for the UI: generation stats, the error message
  int64_t created_ms = 0;
  std::string model;   ///< the model that wrote it (assistant messages; empty: not recorded)
  std::string origin;  ///< what else produced it, as the app wrote it (JSON; may be empty)
};

struct RecentModel {
  std::string path;
  std::string name;
  std::string description;  ///< e.g. "llama, 22 layers, dim 2048, Q4_0"
  int64_t size_bytes = 0;
  int64_t last_used_ms = 0;
};

struct PlacementPreset {
  int64_t id = 0;
  std::string name;
  std::string spec;  ///< the placement as text (JSON written by the app)
  int64_t created_ms = 0;
  int64_t n_layer = 0;  ///< layers of the model it was saved for (0: not recorded)
  std::string model;    ///< that model's name, for the list
};

class Store {
 public:
  /// Opens (creating when absent) the database at `path`, in WAL mode, and
  /// migrates it to kSchemaVersion. A file from a newer Loom is refused, not
  /// touched. The Store belongs to the calling thread.
  static Result<std::unique_ptr<Store>> open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& path() const { return path_; }
  /// PRAGMA user_version of the open file.
  Result<int> schema_version();
  /// PRAGMA journal_mode ("wal" once open succeeded).
  Result<std::string> journal_mode();

  /// @name Chats. list_chats orders by last change, newest first; `search`
  /// (case-insensitive, plain text) matches titles and message contents.
  /// @{
  Result<int64_t> create_chat(const std::string& title, const ChatSettings& settings = {});
  Status rename_chat(int64_t chat_id, const std::string& title);
  /// Deletes the chat and every message in it.
  Status delete_chat(int64_t chat_id);
  Result<std::vector<ChatRow>> list_chats(const std::string& search = {});
  Result<ChatRow> get_chat(int64_t chat_id);
  Status set_chat_settings(int64_t chat_id, const ChatSettings& settings);
  /// @}

  /// @name Messages, in the order they were added.
  /// @{
  Result<int64_t> add_message(int64_t chat_id, const std::string& role, const std::string& content,
                              MessageState state = MessageState::kComplete,
                              const std::string& meta = {});
  /// Rewrites a message (called repeatedly while it streams).
  Status update_message(int64_t message_id, const std::string& content, MessageState state,
                        const std::string& meta = {});
  /// Records the model (and the app's description of placement, KV cache and
  /// sampling) that writes `message_id`.
  Status set_message_origin(int64_t message_id, const std::string& model,
                            const std::string& origin);
  Result<std::vector<MessageRow>> list_messages(int64_t chat_id);
  Result<MessageRow> get_message(int64_t message_id);
  /// Deletes `message_id` and every later message of its chat (regenerate, edit-and-resend).
  Status delete_messages_from(int64_t message_id);
  /// Marks messages left kStreaming by a process that died as kStopped
  /// ("interrupted"); returns how many. Call once at start-up, before any
  /// generation of this process begins.
  Result<int> recover_interrupted();
  /// @}

  /// @name App settings: plain key/value text.
  /// @{
  Result<std::optional<std::string>> get_setting(const std::string& key);
  Status set_setting(const std::string& key, const std::string& value);
  /// @}

  /// @name Recently opened models, most recent first.
  /// @{
  Status touch_recent_model(const RecentModel& m);
  Result<std::vector<RecentModel>> recent_models(int limit = 10);
  Status forget_recent_model(const std::string& path);
  /// @}

  /// @name Placement presets (the name is unique: saving again replaces).
  /// @{
  Result<int64_t> save_preset(const std::string& name, const std::string& spec, int64_t n_layer = 0,
                              const std::string& model = {});
  Result<std::vector<PlacementPreset>> list_presets();
  Status delete_preset(int64_t preset_id);
  /// @}

  /// Runs SQL text with no results (tests build old schemas with it).
  Status exec(const std::string& sql);

 private:
  Store(sqlite3* db, std::string path)
      : db_(db), path_(std::move(path)), owner_(std::this_thread::get_id()) {}
  Status check_thread() const;
  Status migrate();
  Status touch_chat(int64_t chat_id);

  sqlite3* db_;
  std::string path_;
  std::thread::id owner_;
};

/// Unix time now, in milliseconds.
int64_t now_ms();

}  // namespace loom::storage
