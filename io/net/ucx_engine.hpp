// One UCX context and worker per process, owned by a progress thread. Every ucp_* call
// on the worker happens on that thread (UCS_THREAD_MODE_SINGLE): other threads hand it
// work with post(), which wakes it through ucp_worker_signal. The thread polls while
// there is traffic, then arms the worker's wakeup fd and sleeps, so an idle process does
// not burn a core.
#pragma once

#include "core/error.hpp"

#include <ucp/api/ucp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dsa::net {

// Wraps a ucs_status_t in an error naming `what` (and whatever the caller adds).
error ucx_error(ucs_status_t status, const std::string& what);

class ucx_engine {
public:
  // Starts the thread, which creates the context (features AM + WAKEUP) and the worker;
  // returns once both exist or with the error that stopped them.
  static expected<std::unique_ptr<ucx_engine>> start();
  // Stops the thread, which destroys the worker and the context. Whoever created
  // endpoints must have closed them (run_sync) first.
  ~ucx_engine();
  ucx_engine(const ucx_engine&) = delete;
  ucx_engine& operator=(const ucx_engine&) = delete;

  // The worker's address blob, for another process's ucp_ep_create.
  const std::vector<std::byte>& address() const { return address_; }

  // Runs fn on the progress thread, in posting order. Any thread.
  void post(std::function<void()> fn);
  // post(fn) and wait until it has run. Not from the progress thread.
  void run_sync(const std::function<void()>& fn);
  // Runs fn on the progress thread after the current ucp_worker_progress returns (for
  // work a UCX callback must not do itself). Progress thread only.
  void defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }
  // Runs fn on the progress thread about every 100 ms, busy or idle. Progress thread
  // only.
  void set_tick(std::function<void()> fn) { tick_ = std::move(fn); }
  // Progress thread only.
  ucp_worker_h worker() const { return worker_; }
  bool on_progress_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

private:
  ucx_engine() = default;
  void main(std::function<void(status)> started);
  status init();
  void loop();
  bool run_posted();
  bool run_deferred();
  void sleep();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int wakeup_fd_ = -1;
  std::vector<std::byte> address_;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::function<void()>> posted_;
  std::vector<std::function<void()>> deferred_;
  std::function<void()> tick_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
};

} // namespace dsa::net
