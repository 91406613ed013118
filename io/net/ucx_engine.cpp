// The progress thread: command queue, ucp_worker_progress, spin-then-sleep.
#include "io/net/ucx_engine.hpp"

#include <chrono>
#include <cstdlib>
#include <string>
#include <future>
#include <poll.h>

namespace dsa::net {

namespace {

// After the last sign of traffic the thread keeps polling this long before it sleeps:
// long enough to catch a reply to what it just sent, short enough not to take a core
// from the threads summing the data on a small machine.
constexpr auto spin_for = std::chrono::microseconds(30);
// A sleeping worker still wakes this often, so UCX's keepalive (how a dead peer is
// noticed on shared memory) runs while nothing else happens.
constexpr int sleep_ms = 100;

// Whether UCX_TLS (unset: all) lets UCX use posix/sysv; setting MM_ERROR_HANDLING
// without them makes UCX warn about an unused option.
bool shared_memory_allowed() {
  const char* tls = std::getenv("UCX_TLS");
  if (!tls)
    return true;
  const std::string list = tls;
  for (const char* name : {"all", "sm", "shm", "mm", "sysv", "posix"}) {
    const std::string n = name;
    for (std::size_t at = list.find(n); at != std::string::npos; at = list.find(n, at + 1)) {
      const bool starts = at == 0 || list[at - 1] == ',' || list[at - 1] == '^';
      const bool ends = at + n.size() == list.size() || list[at + n.size()] == ',';
      if (starts && ends)
        return list[0] != '^'; // "^x" excludes x
    }
  }
  return list[0] == '^';
}

} // namespace

error ucx_error(ucs_status_t status, const std::string& what) {
  return make_error(errc::runtime, "UCX {}: {}", what, ucs_status_string(status));
}

expected<std::unique_ptr<ucx_engine>> ucx_engine::start() {
  std::unique_ptr<ucx_engine> engine(new ucx_engine());
  std::promise<status> started;
  auto ready = started.get_future();
  engine->thread_ = std::thread([e = engine.get(), &started] {
    e->main([&started](status s) { started.set_value(std::move(s)); });
  });
  status s = ready.get();
  if (!s) {
    engine->thread_.join();
    engine->thread_ = std::thread();
    return s.err();
  }
  return engine;
}

ucx_engine::~ucx_engine() {
  if (!thread_.joinable())
    return;
  stop_.store(true);
  post([] {}); // wakes the thread, which then sees stop_
  thread_.join();
}

void ucx_engine::main(std::function<void(status)> started) {
  status s = init();
  const bool ok = s.has_value();
  started(std::move(s));
  if (ok)
    loop();
  if (worker_)
    ucp_worker_destroy(worker_);
  if (context_)
    ucp_cleanup(context_);
}

status ucx_engine::init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK)
    return ucx_error(st, "ucp_config_read");
  // UCX checks that a peer is alive every 20 s by default; a dead rank must fail the
  // others' receives sooner. UCX_KEEPALIVE_INTERVAL still wins when set.
  if (!std::getenv("UCX_KEEPALIVE_INTERVAL"))
    (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  // UCX's registration cache hooks mmap/munmap process-wide (libucm) and, when set up
  // in a process forked from a threaded one, now and then waited forever for a lock in
  // ucm_event_handler_add (seen 1 run in ~30 of the fork tests). Shared memory (cma)
  // and TCP need no registration cache. UCX_RCACHE_ENABLE still wins when set.
  if (!std::getenv("UCX_RCACHE_ENABLE"))
    (void)ucp_config_modify(config, "RCACHE_ENABLE", "n");
  // UCX 1.13's cma transport (process_vm_readv between processes of one host) treats a
  // peer that died during a zero-copy read as fatal and aborts this process (cma_ep.c:81,
  // "returned -1: No such process"): a rank killed mid-transfer took the survivors with it
  // (seen 1 run in ~8 of the chaos drill's kill -9 seed). Without cma, messages between
  // ranks of one host go through posix/sysv shared memory, whose errors reach the
  // endpoint's handler. UCX_TLS still wins when set.
  if (!std::getenv("UCX_TLS")) {
    st = ucp_config_modify(config, "TLS", "^cma");
    if (st != UCS_OK) {
      ucp_config_release(config);
      return ucx_error(st, "ucp_config_modify TLS ^cma");
    }
  }
  // Endpoints are created with peer error handling (a dead rank must fail the others'
  // receives), which UCX 1.13's shared-memory transports (posix, sysv) claim only with
  // MM_ERROR_HANDLING on: without it every byte between ranks of one host went over
  // TCP loopback. UCX_MM_ERROR_HANDLING still wins when set.
  if (!std::getenv("UCX_MM_ERROR_HANDLING") && shared_memory_allowed()) {
    st = ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
    if (st != UCS_OK) {
      ucp_config_release(config);
      return ucx_error(st, "ucp_config_modify MM_ERROR_HANDLING");
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "dsactor";
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK)
    return ucx_error(st, "ucp_init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK)
    return ucx_error(st, "ucp_worker_create");
  st = ucp_worker_get_efd(worker_, &wakeup_fd_);
  if (st != UCS_OK)
    return ucx_error(st, "ucp_worker_get_efd");
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  st = ucp_worker_get_address(worker_, &address, &length);
  if (st != UCS_OK)
    return ucx_error(st, "ucp_worker_get_address");
  const auto* begin = reinterpret_cast<const std::byte*>(address);
  address_.assign(begin, begin + length);
  ucp_worker_release_address(worker_, address);
  return {};
}

void ucx_engine::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    posted_.push_back(std::move(fn));
  }
  // The thread sets sleeping_ before it arms and then looks at the queue once more, so
  // a command queued after that look always finds sleeping_ set and signals.
  if (sleeping_.load())
    ucp_worker_signal(worker_);
}

void ucx_engine::run_sync(const std::function<void()>& fn) {
  std::promise<void> done;
  auto finished = done.get_future();
  post([&] {
    fn();
    done.set_value();
  });
  finished.wait();
}

bool ucx_engine::run_posted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    batch.swap(posted_);
  }
  for (auto& fn : batch)
    fn();
  return !batch.empty();
}

bool ucx_engine::run_deferred() {
  bool any = false;
  while (!deferred_.empty()) { // deferred work may defer more
    std::vector<std::function<void()>> batch;
    batch.swap(deferred_);
    for (auto& fn : batch)
      fn();
    any = true;
  }
  return any;
}

void ucx_engine::loop() {
  auto last_busy = std::chrono::steady_clock::now();
  auto last_tick = last_busy;
  while (!stop_.load()) {
    bool busy = run_posted();
    if (tick_ && std::chrono::steady_clock::now() - last_tick >= std::chrono::milliseconds(sleep_ms)) {
      tick_();
      last_tick = std::chrono::steady_clock::now();
    }
    busy |= ucp_worker_progress(worker_) != 0;
    busy |= run_deferred();
    auto now = std::chrono::steady_clock::now();
    if (busy) {
      last_busy = now;
      continue;
    }
    if (now - last_busy < spin_for)
      continue;
    sleep();
    last_busy = std::chrono::steady_clock::now();
  }
  run_posted(); // whatever was queued with the stop (teardown work)
}

void ucx_engine::sleep() {
  sleeping_.store(true);
  ucs_status_t st = ucp_worker_arm(worker_);
  bool queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued = !posted_.empty();
  }
  if (st == UCS_OK && !queued && !stop_.load()) {
    pollfd fd{wakeup_fd_, POLLIN, 0};
    (void)::poll(&fd, 1, sleep_ms); // EINTR or timeout: just progress again
  }
  sleeping_.store(false);
}

} // namespace dsa::net
