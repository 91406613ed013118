// Log sink: one fprintf per line so concurrent lines do not interleave.
#include "core/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace dsa {
namespace {
std::atomic<int> g_level{static_cast<int>(log_level::info)};
std::mutex g_file_mutex;
std::FILE* g_file = nullptr;
const char* level_tag(log_level level) {
  switch (level) {
  case log_level::debug: return "debug";
  case log_level::info: return "info";
  case log_level::warn: return "warn";
  case log_level::error: return "error";
  case log_level::off: break;
  }
  return "";
}
} // namespace

void set_log_level(log_level level) { g_level = static_cast<int>(level); }

bool set_log_file(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_file_mutex);
  if (g_file) std::fclose(g_file);
  g_file = path.empty() ? nullptr : std::fopen(path.c_str(), "a");
  return path.empty() || g_file != nullptr;
}
log_level current_log_level() { return static_cast<log_level>(g_level.load()); }

void log_line(log_level level, std::string_view text) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t secs = system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::fprintf(stderr, "[%s %s] %.*s\n", stamp, level_tag(level), static_cast<int>(text.size()), text.data());
  std::lock_guard<std::mutex> lock(g_file_mutex);
  if (g_file) {
    std::fprintf(g_file, "[%s %s] %.*s\n", stamp, level_tag(level), static_cast<int>(text.size()), text.data());
    std::fflush(g_file);
  }
}

} // namespace dsa
