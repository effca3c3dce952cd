// Errors as values: Status and Result<T>, used across every module boundary.
// Input problems (bad files, bad arguments) are reported through these, never
// by aborting; asserts are kept for programmer errors only.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace loom {

/// What kind of failure an Error is; callers branch on this, users read the message.
enum class ErrorCode {
  kInvalidArgument,  ///< bad option or argument from the caller
  kIo,               ///< open/read/write/mmap failed
  kFormat,           ///< a file's bytes do not follow its format (corrupt, truncated)
  kUnsupported,      ///< well-formed but not handled (unknown dtype, architecture...)
  kOutOfRange,       ///< a value outside what the format or engine allows
  kOutOfMemory,      ///< an allocation failed
  kNoSpace,          ///< a disk is full (a write returned ENOSPC)
  kCancelled,        ///< stopped by the user
  kInternal,         ///< a bug in Loom
};

/// Short lower-case name of an error code ("format", "io", ...).
const char* error_code_name(ErrorCode code);

/// An error: a code and a message naming the file, field and offset involved.
class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

/// Success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT: implicit on purpose
  static Status ok_status() { return Status(); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(failed_);
    return error_;
  }
  const std::string& message() const { return error_.message(); }

 private:
  Error error_{ErrorCode::kInternal, {}};
  bool failed_ = false;
};

/// A value of type T or an Error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit on purpose
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  Result(Status status) : v_(status.error()) { assert(!status.ok()); }  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  const std::string& message() const { return error().message(); }
  Status status() const { return ok() ? Status() : Status(error()); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> v_;
};

/// Builds an Error with a printf-style message.
Error make_error(ErrorCode code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace loom

/// Propagates a failed Status/Result from the current function.
#define LOOM_TRY(expr)                                           \
  do {                                                           \
    auto loom_try_status_ = (expr);                              \
    if (!loom_try_status_.ok()) return loom_try_status_.error(); \
  } while (0)

#define LOOM_CONCAT_INNER_(a, b) a##b
#define LOOM_CONCAT_(a, b) LOOM_CONCAT_INNER_(a, b)
/// `LOOM_ASSIGN_OR_RETURN(auto x, expr)`: unwraps a Result or returns its error.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL_(LOOM_CONCAT_(loom_result_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.error();                \
  lhs = std::move(tmp).value()
