// Internal to storage/: a prepared statement that finalizes itself, and
// SQLite results turned into Status values that carry SQLite's own message.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace loom::storage::detail {

/// An Error for a failed SQLite call on `db`: what we were doing, then SQLite's words.
inline Error sqlite_error(sqlite3* db, const char* what) {
  const int code = sqlite3_extended_errcode(db);
  // A locked or busy database, or a full disk, is an I/O problem for the user;
  // anything else means the file is not what we expect.
  ErrorCode ec = ErrorCode::kIo;
  if ((code & 0xff) == SQLITE_CORRUPT || (code & 0xff) == SQLITE_NOTADB) ec = ErrorCode::kFormat;
  if ((code & 0xff) == SQLITE_NOMEM) ec = ErrorCode::kOutOfMemory;
  return make_error(ec, "store '%s': %s: %s",
                    sqlite3_db_filename(db, "main") ? sqlite3_db_filename(db, "main") : "?", what,
                    sqlite3_errmsg(db));
}

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &st_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(st_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  /// Whether preparing worked; error() says why not.
  bool ok() const { return rc_ == SQLITE_OK; }
  Error error(const char* what) const { return sqlite_error(db_, what); }

  // Parameters are 1-based, as in SQL (?1, ?2...).
  Stmt& bind(int i, int64_t v) {
    sqlite3_bind_int64(st_, i, v);
    return *this;
  }
  Stmt& bind(int i, double v) {
    sqlite3_bind_double(st_, i, v);
    return *this;
  }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }

  /// SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(st_); }
  /// Runs a statement that returns no rows.
  Status run(const char* what) {
    if (!ok()) return error(what);
    const int rc = step();
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return error(what);
    return {};
  }

  int64_t i64(int col) const { return sqlite3_column_int64(st_, col); }
  double f64(int col) const { return sqlite3_column_double(st_, col); }
  std::string text(int col) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st_, col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(st_, col))) : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* st_ = nullptr;
  int rc_;
};

/// Runs SQL text (several statements allowed) with no results.
inline Status exec(sqlite3* db, const char* sql, const char* what) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return sqlite_error(db, what);
  return {};
}

/// Schema migrations (schema.cpp): brings the file from its user_version to
/// kSchemaVersion, one step per transaction.
Status migrate(sqlite3* db);

}  // namespace loom::storage::detail
