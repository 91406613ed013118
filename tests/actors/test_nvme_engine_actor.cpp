// The NVMe engine actor over a fake engine that completes requests when the test says so
// (no sleeps, no timing): requests start by priority within the credits, completions run
// the right client's continuation, shutdown finishes what was accepted; and over the real
// aio engine, a failed request reaches its own client naming the file.
#include "actors/nvme_engine_actor.hpp"

#include "io/aio/aio_engine.hpp"
#include "tests/aio/aio_test_util.hpp"

#include <doctest/doctest.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace dsa;
using namespace dsa::actors;
using aio::io_priority;

namespace {

// Holds every request it is given until complete(i) ends the i-th one (on the caller's thread).
class fake_engine final : public aio::submitter {
public:
  expected<std::uint64_t> submit(aio::aio_request request, io_priority priority,
                                 aio::aio_callback on_done) override {
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back({std::move(request), priority, std::move(on_done)});
    ++outstanding_;
    peak_ = std::max(peak_, outstanding_);
    cv_.notify_all();
    return held_.size();
  }
  std::size_t alignment() const override { return 4096; }

  // Waits until `n` requests have been submitted; the path of the n-th.
  std::string wait_for(std::size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_.size() >= n; });
    return held_[n - 1].request.path;
  }
  void complete(std::size_t i, status result = {}) {
    aio::aio_callback done;
    aio::aio_completion c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& h = held_.at(i);
      c = aio::aio_completion{0,    h.request.op,     h.request.path, h.request.bytes,
                              true, std::move(result)};
      done = std::move(h.on_done);
      --outstanding_;
    }
    done(std::move(c));
  }
  std::size_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

private:
  struct held {
    aio::aio_request request;
    io_priority priority;
    aio::aio_callback on_done;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<held> held_;
  std::size_t outstanding_ = 0, peak_ = 0;
};

// What the clients' continuations saw (they run on the actor).
struct client_log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<aio::aio_completion> done;
  aio::aio_callback callback() {
    return [this](aio::aio_completion&& c) {
      std::lock_guard<std::mutex> lock(mu);
      done.push_back(std::move(c));
      cv.notify_all();
    };
  }
  void wait_for(std::size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done.size() >= n; });
  }
};

aio::aio_request request(test::aligned_bytes& buffer, const std::string& path,
                         aio::aio_op op = aio::aio_op::read) {
  aio::aio_request r;
  r.op = op;
  r.path = path;
  r.buffer = buffer.data.get();
  r.buffer_bytes = buffer.size;
  r.bytes = buffer.size;
  return r;
}

std::shared_ptr<nvme_engine_service> start_on(std::shared_ptr<aio::submitter> engine,
                                              io_credits credits,
                                              std::function<void()> on_drain = nullptr) {
  nvme_engine_options o;
  o.engines.push_back({std::move(engine), credits, "fake"});
  o.on_drain = std::move(on_drain);
  auto service = nvme_engine_service::start(std::move(o));
  REQUIRE_MESSAGE(service.has_value(), service.err().to_string());
  return *service;
}

io_credits requests(std::size_t n) {
  io_credits c;
  c.requests = n;
  c.always = n;
  return c;
}

} // namespace

TEST_CASE("nvme engine actor: requests waiting for a credit start fetch first, then update, "
          "prefetch, write behind") {
  auto fake = std::make_shared<fake_engine>();
  auto service = start_on(fake, requests(1));
  auto port = service->port(0);
  test::aligned_bytes buffer(4096);
  client_log log;
  // One thread submits all, then completes the first: its nvme_ended follows the five
  // requests in the actor's mailbox, so all wait when the credit comes back.
  const std::vector<std::pair<std::string, io_priority>> sent = {
      {"w1", io_priority::write_behind}, {"p", io_priority::prefetch},
      {"u", io_priority::update},        {"f", io_priority::fetch},
      {"w2", io_priority::write_behind}, {"u2", io_priority::update}};
  std::vector<std::uint64_t> ids;
  for (const auto& [path, priority] : sent) {
    auto id = port->submit(request(buffer, path), priority, log.callback());
    REQUIRE(id.has_value());
    ids.push_back(*id);
  }
  CHECK(fake->wait_for(1) == "w1");
  std::vector<std::string> started = {"w1"};
  for (std::size_t i = 0; i + 1 < sent.size(); ++i) {
    fake->complete(i);
    started.push_back(fake->wait_for(i + 2));
  }
  fake->complete(sent.size() - 1);
  CHECK(started == std::vector<std::string>{"w1", "f", "u", "u2", "p", "w2"});
  log.wait_for(sent.size());
  std::vector<std::string> finished;
  for (const auto& c : log.done)
    finished.push_back(c.path);
  CHECK(finished == started);      // each continuation as its request ended
  CHECK(log.done[1].id == ids[3]); // the client's id, not the engine's
  CHECK(fake->peak() == 1);
  service->shutdown();
  const auto stats = service->stats();
  CHECK(stats.requests == sent.size());
  CHECK(stats.waited == sent.size() - 1);
  CHECK(stats.peak_in_flight == std::vector<std::size_t>{1});
}

TEST_CASE("nvme engine actor: never more requests in flight than the credits") {
  auto fake = std::make_shared<fake_engine>();
  auto service = start_on(fake, requests(3));
  auto port = service->port(0);
  test::aligned_bytes buffer(4096);
  client_log log;
  const std::size_t n = 10;
  for (std::size_t i = 0; i < n; ++i)
    REQUIRE(port->submit(request(buffer, "r" + std::to_string(i)), io_priority::prefetch,
                         log.callback())
                .has_value());
  for (std::size_t i = 0; i < n; ++i) {
    fake->wait_for(std::min(n, i + 3)); // three start; each end lets one more start
    fake->complete(i);
  }
  log.wait_for(n);
  CHECK(fake->peak() == 3);
  CHECK(service->stats().peak_in_flight == std::vector<std::size_t>{3});
  for (std::size_t i = 0; i < n; ++i)
    CHECK(log.done[i].path == "r" + std::to_string(i)); // FIFO within a class
}

TEST_CASE(
    "nvme engine actor: shutdown with requests waiting finishes every accepted request first") {
  auto fake = std::make_shared<fake_engine>();
  std::promise<void> draining;
  auto service = start_on(fake, requests(1), [&] { draining.set_value(); });
  auto port = service->port(0);
  test::aligned_bytes buffer(4096);
  client_log log;
  for (const char* path : {"a", "b", "c"})
    REQUIRE(port->submit(request(buffer, path), io_priority::update, log.callback()).has_value());
  std::thread stopper([&] { service->shutdown(); });
  draining.get_future().wait(); // the actor has the drain request; b and c still wait
  for (std::size_t i = 0; i < 3; ++i) {
    fake->wait_for(i + 1);
    fake->complete(i, i == 1 ? status(make_error(errc::io, "aio read 'b': EIO")) : status());
  }
  stopper.join();
  REQUIRE(log.done.size() == 3);
  CHECK(log.done[0].result.has_value());
  CHECK(!log.done[1].result.has_value());
  CHECK(log.done[2].result.has_value());
  // After shutdown a submit is refused, naming the engine and the file; no continuation runs.
  auto late = port->submit(request(buffer, "late"), io_priority::fetch, log.callback());
  REQUIRE(!late.has_value());
  CHECK(late.err().message.find("'late'") != std::string::npos);
  CHECK(late.err().message.find("fake") != std::string::npos);
  CHECK(service->stats().failed == 1);
}

TEST_CASE("nvme engine actor: a malformed request is refused at submit and gets no completion") {
  auto fake = std::make_shared<fake_engine>();
  auto service = start_on(fake, requests(2));
  auto port = service->port(0);
  test::aligned_bytes buffer(8192);
  client_log log;
  aio::aio_request r = request(buffer, "odd");
  r.file_offset = 100;
  auto id = port->submit(std::move(r), io_priority::update, log.callback());
  REQUIRE(!id.has_value());
  CHECK(id.err().code == errc::invalid_argument);
  CHECK(id.err().message.find("'odd'") != std::string::npos);
  service->shutdown();
  CHECK(log.done.empty());
  CHECK(service->stats().requests == 0);
}

TEST_CASE("nvme engine actor over the aio engine: a failed read reaches its own client, naming the "
          "file") {
  test::scratch_dir dir;
  aio::engine_options eo;
  eo.config.intra_op_parallelism = 2;
  auto alignment = aio::direct_io_alignment(dir.path());
  REQUIRE(alignment.has_value());
  eo.alignment = *alignment;
  auto engine = aio::aio_engine::create(eo);
  REQUIRE(engine.has_value());
  auto service =
      start_on(std::shared_ptr<aio::aio_engine>(std::move(*engine)), io_credits_of(eo.config));
  auto port = service->port(0);
  const std::size_t bytes = 3 * eo.alignment + 17; // not a multiple of the alignment
  test::aligned_bytes out(port->padded_size(bytes), eo.alignment),
      in(port->padded_size(bytes), eo.alignment);
  test::fill_pattern(out.data.get(), bytes, 7);
  aio::aio_request w = request(out, dir.file("good.bin"), aio::aio_op::write);
  w.bytes = bytes;
  auto written = aio::submit_future(*port, std::move(w), io_priority::write_behind).get();
  REQUIRE_MESSAGE(written.result.has_value(), written.result.err().to_string());
  client_log good, bad;
  aio::aio_request missing = request(in, dir.file("missing.bin"));
  missing.bytes = bytes;
  test::aligned_bytes back(port->padded_size(bytes), eo.alignment);
  aio::aio_request read = request(back, dir.file("good.bin"));
  read.bytes = bytes;
  REQUIRE(port->submit(std::move(missing), io_priority::prefetch, bad.callback()).has_value());
  REQUIRE(port->submit(std::move(read), io_priority::fetch, good.callback()).has_value());
  bad.wait_for(1);
  good.wait_for(1);
  REQUIRE(bad.done.size() == 1);
  REQUIRE(!bad.done[0].result.has_value());
  CHECK(bad.done[0].result.err().message.find(dir.file("missing.bin")) != std::string::npos);
  REQUIRE_MESSAGE(good.done[0].result.has_value(), good.done[0].result.err().to_string());
  CHECK(test::first_mismatch(back.data.get(), bytes, 7) == bytes);
  service->shutdown();
  CHECK(service->stats().failed == 1);
  CHECK(service->stats().bytes_read == bytes);
  CHECK(service->stats().bytes_written == bytes);
}

TEST_CASE("nvme engine actor: a port keeps the actor running after its owner lets go; the last one "
          "going drains it") {
  auto fake = std::make_shared<fake_engine>();
  std::promise<void> draining;
  auto draining_seen = draining.get_future();
  auto service = start_on(fake, requests(1), [&] { draining.set_value(); });
  auto port = service->port(0);
  std::weak_ptr<nvme_engine_service> alive = service;
  service.reset(); // as rank_run goes while a store still holds its port
  REQUIRE(!alive.expired());
  test::aligned_bytes buffer(4096);
  client_log log;
  REQUIRE(port->submit(request(buffer, "a"), io_priority::fetch, log.callback()).has_value());
  REQUIRE(port->submit(request(buffer, "b"), io_priority::fetch, log.callback()).has_value());
  CHECK(fake->wait_for(1) == "a");
  std::thread last([&] { port.reset(); }); // the store goes: shutdown waits for a and b
  draining_seen.wait();
  fake->complete(0);
  CHECK(fake->wait_for(2) == "b");
  fake->complete(1);
  last.join();
  CHECK(alive.expired());
  REQUIRE(log.done.size() == 2);
  CHECK(log.done[1].path == "b");
}
