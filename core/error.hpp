// Errors as values (expected<T>) and the always-on invariant check DSA_CHECK.
// Environmental failures return an error naming the file, key or peer;
// broken invariants abort with the expression, the place and a message.
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace dsa {

// Which module an error comes from and what kind of failure it is.
enum class errc {
  invalid_argument, // a caller passed something malformed
  config,           // a config key is missing, mistyped, unknown or inconsistent
  io,               // open/read/write/fsync/rename failed
  format,           // a file's contents do not match its format
  not_found,        // a named thing (tensor, file, key) does not exist
  unsupported,      // valid but not implemented on this build or device
  runtime,          // an actor or component failed while running
  protocol,         // a message (from another actor, process or peer) broke the protocol
};

const char* errc_name(errc code);

struct error {
  errc code = errc::runtime;
  std::string message;

  std::string to_string() const { return fmt::format("{}: {}", errc_name(code), message); }
};

template <class... Args>
error make_error(errc code, fmt::format_string<Args...> format, Args&&... args) {
  return error{code, fmt::format(format, std::forward<Args>(args)...)};
}

// Minimal expected<T>: holds a value or an error. C++17 has no std::expected.
template <class T>
class [[nodiscard]] expected {
public:
  expected(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  expected(error err) : state_(std::in_place_index<1>, std::move(err)) {}

  bool has_value() const { return state_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & { return checked_value(); }
  const T& value() const& { return const_cast<expected*>(this)->checked_value(); }
  T&& value() && { return std::move(checked_value()); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const error& err() const { return std::get<1>(state_); }

private:
  T& checked_value();
  std::variant<T, error> state_;
};

// expected<void>: success or an error.
template <>
class [[nodiscard]] expected<void> {
public:
  expected() = default;
  expected(error err) : err_(std::move(err)) {}
  bool has_value() const { return !err_.has_value(); }
  explicit operator bool() const { return has_value(); }
  const error& err() const { return *err_; }

private:
  std::optional<error> err_;
};

using status = expected<void>;

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

template <class T>
T& expected<T>::checked_value() {
  if (!has_value())
    check_failed("has_value()", __FILE__, __LINE__, std::get<1>(state_).to_string());
  return std::get<0>(state_);
}

} // namespace dsa

// Always compiled in: prints the expression, file:line and the message, then aborts.
#define DSA_CHECK(cond, ...)                                                                   \
  do {                                                                                         \
    if (!(cond)) ::dsa::check_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// Propagate an error from an expression yielding expected<T>/status.
#define DSA_TRY(expr)                                 \
  do {                                                \
    auto dsa_try_result_ = (expr);                    \
    if (!dsa_try_result_) return dsa_try_result_.err(); \
  } while (0)

// Bind the value of an expected<T> or return its error.
#define DSA_CONCAT_INNER(a, b) a##b
#define DSA_CONCAT(a, b) DSA_CONCAT_INNER(a, b)
#define DSA_ASSIGN_OR_RETURN(lhs, expr) DSA_ASSIGN_OR_RETURN_IMPL(DSA_CONCAT(dsa_tmp_, __LINE__), lhs, expr)
#define DSA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp) return tmp.err();                     \
  lhs = std::move(*tmp)
