// Leveled logging to stderr with a wall-clock timestamp. Thread-safe per line.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace dsa {

enum class log_level { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

void set_log_level(log_level level);
// Also appends every line to `path` (the run directory's log); "" stops. Returns false
// when the file cannot be opened.
bool set_log_file(const std::string& path);
log_level current_log_level();
void log_line(log_level level, std::string_view text);

template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (current_log_level() <= log_level::debug) log_line(log_level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (current_log_level() <= log_level::info) log_line(log_level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (current_log_level() <= log_level::warn) log_line(log_level::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (current_log_level() <= log_level::error) log_line(log_level::error, fmt::format(f, std::forward<Args>(args)...));
}

} // namespace dsa
