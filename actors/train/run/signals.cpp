// Async-signal-safe stop flag, and SIGUSR1 for a flight record.
#include "actors/train/run/signals.hpp"

#include "io/net/flight_recorder.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <unistd.h>

namespace dsa::train {
namespace {
std::atomic<int> g_signals{0};
std::atomic<bool> g_requested{false}; // request_stop(): not a signal, so a later one still counts as the first

void on_signal(int sig) {
  if (g_signals.fetch_add(1) > 0) _exit(128 + sig);
  const int saved = errno;
  net::request_flight_dump(sig == SIGINT ? "SIGINT" : "SIGTERM"); // the trace writer's thread writes it
  const char msg[] = "\ndsactor: stopping after the current step (checkpoint follows); signal again to abort\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  errno = saved;
}
// SIGUSR1: a flight record into the trace now, and the run goes on (dsactor trace hang).
void on_flight_signal(int) {
  const int saved = errno;
  net::request_flight_dump("SIGUSR1");
  const char msg[] = "\ndsactor: SIGUSR1: writing a flight record into the trace (dsactor trace hang RUN)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  errno = saved;
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
  struct sigaction flight{};
  flight.sa_handler = on_flight_signal;
  flight.sa_flags = SA_RESTART;
  sigemptyset(&flight.sa_mask);
  sigaction(SIGUSR1, &flight, nullptr);
}

void request_stop() {
  if (!g_requested.exchange(true)) {
    net::request_flight_dump("stop requested by the launcher");
    const char msg[] = "\ndsactor: the launcher was interrupted: stopping after the current step (checkpoint follows)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
  }
}

bool stop_requested() { return g_signals.load() > 0 || g_requested.load(); }

} // namespace dsa::train
