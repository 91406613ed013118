// Async-signal-safe stop flag.
#include "actors/train/run/signals.hpp"

#include <atomic>
#include <csignal>
#include <unistd.h>

namespace dsa::train {
namespace {
std::atomic<int> g_signals{0};
std::atomic<bool> g_requested{false}; // request_stop(): not a signal, so a later one still counts as the first

void on_signal(int sig) {
  if (g_signals.fetch_add(1) > 0) _exit(128 + sig);
  const char msg[] = "\ndsactor: stopping after the current step (checkpoint follows); signal again to abort\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}
} // namespace

void install_stop_handlers() {
  g_signals = 0; // a new run in this process starts unstopped
  g_requested = false;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART; // interrupted reads and writes resume instead of failing with EINTR
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void request_stop() {
  if (!g_requested.exchange(true)) {
    const char msg[] = "\ndsactor: the launcher was interrupted: stopping after the current step (checkpoint follows)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
  }
}

bool stop_requested() { return g_signals.load() > 0 || g_requested.load(); }

} // namespace dsa::train
