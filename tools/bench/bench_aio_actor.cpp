// The swap pattern of `dsactor bench aio`; see bench_aio_actor.hpp.
#include "tools/bench/bench_aio_actor.hpp"

#include "actors/nvme_engine_actor.hpp"
#include "io/aio/aio_engine.hpp"
#include "io/aio/aligned_buffer_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

namespace dsa::tools {
namespace {

// Chunks [0, n) of one file through `to`: every buffer starts a chunk, and each completion
// starts the next chunk in the buffer it freed. A written chunk carries its index in its
// first 8 bytes; a read checks it.
class chunk_pipeline {
public:
  chunk_pipeline(aio::submitter& to, std::string path, std::vector<aio::pool_buffer>& buffers,
                 std::size_t chunk, std::size_t n)
      : to_(to), path_(std::move(path)), buffers_(buffers), chunk_(chunk), n_(n) {}

  expected<double> run(aio::aio_op op) {
    op_ = op;
    started_ = ended_ = 0;
    failed_.reset();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t b = 0; b < buffers_.size(); ++b)
      next(b);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ended_ == started_ && (started_ == n_ || failed_); });
    if (failed_)
      return *failed_;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

private:
  void next(std::size_t b) {
    std::uint64_t i = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_ == n_ || failed_)
        return;
      i = started_++;
    }
    void* data = buffers_[b].data();
    if (op_ == aio::aio_op::write)
      std::memcpy(data, &i, sizeof i);
    aio::aio_request r;
    r.op = op_;
    r.path = path_;
    r.buffer = data;
    r.buffer_bytes = buffers_[b].size();
    r.bytes = chunk_;
    r.file_offset = i * chunk_;
    if (op_ == aio::aio_op::write)
      r.file_length = n_ * chunk_;
    else
      r.expect_file_size = n_ * chunk_;
    auto id =
        to_.submit(std::move(r), aio::io_priority::update, [this, b, i](aio::aio_completion&& c) {
          std::optional<error> bad;
          if (!c.result)
            bad = c.result.err();
          else if (op_ == aio::aio_op::read && std::memcmp(buffers_[b].data(), &i, sizeof i) != 0)
            bad = make_error(errc::runtime, "bench aio: chunk {} of '{}' read back another chunk",
                             i, path_);
          if (bad)
            fail(*bad);
          else
            next(b);
          // Last: once counted, run() may return and this object go.
          std::lock_guard<std::mutex> lock(mu_);
          ++ended_;
          cv_.notify_all();
        });
    if (!id) {
      fail(id.err());
      std::lock_guard<std::mutex> lock(mu_);
      ++ended_;
      cv_.notify_all();
    }
  }
  void fail(const error& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_)
      failed_ = e;
  }

  aio::submitter& to_;
  std::string path_;
  std::vector<aio::pool_buffer>& buffers_;
  std::size_t chunk_, n_;
  aio::aio_op op_ = aio::aio_op::read;
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t started_ = 0, ended_ = 0;
  std::optional<error> failed_;
};

} // namespace

expected<swap_pattern_rates> measure_swap_pattern(const std::string& dir,
                                                  const aio::aio_config& config, std::size_t bytes,
                                                  int reps) {
  DSA_ASSIGN_OR_RETURN(std::size_t align, aio::direct_io_alignment(dir));
  aio::engine_options o;
  o.config = config;
  o.alignment = align;
  DSA_ASSIGN_OR_RETURN(auto created, aio::aio_engine::create(o));
  std::shared_ptr<aio::aio_engine> engine(std::move(created));
  actors::nvme_engine_options no;
  no.engines.push_back({engine, actors::io_credits_of(config), dir});
  DSA_ASSIGN_OR_RETURN(auto service, actors::nvme_engine_service::start(std::move(no)));
  auto port = service->port(0);
  swap_pattern_rates rates;
  rates.chunk_bytes = std::min<std::size_t>(std::size_t{4} << 20, aio::round_up(bytes, align));
  rates.in_flight = 9;
  const std::size_t n = std::max<std::size_t>(1, bytes / rates.chunk_bytes);
  aio::pool_options po;
  po.buffer_count = rates.in_flight;
  po.buffer_bytes = rates.chunk_bytes;
  po.alignment = align;
  DSA_ASSIGN_OR_RETURN(auto pool, aio::aligned_buffer_pool::create(po));
  std::vector<aio::pool_buffer> buffers;
  for (std::size_t b = 0; b < rates.in_flight; ++b)
    buffers.push_back(std::move(*pool->try_acquire()));
  const std::string path = dir + "/dsactor_bench_swap.tmp";
  chunk_pipeline on_engine(*engine, path, buffers, rates.chunk_bytes, n);
  chunk_pipeline on_actor(*port, path, buffers, rates.chunk_bytes, n);
  double best[4] = {1e30, 1e30, 1e30, 1e30}; // engine write, read; actor write, read
  status outcome;
  for (int rep = 0; rep < reps && outcome; ++rep) {
    int k = 0;
    for (chunk_pipeline* p : {&on_engine, &on_actor})
      for (aio::aio_op op : {aio::aio_op::write, aio::aio_op::read}) {
        auto s = outcome ? p->run(op) : expected<double>(outcome.err());
        if (!s)
          outcome = s.err();
        else
          best[k] = std::min(best[k], *s);
        ++k;
      }
  }
  ::unlink(path.c_str());
  if (!outcome)
    return outcome.err();
  const double moved = static_cast<double>(n * rates.chunk_bytes) * 1e-9;
  rates.engine_write_gbps = moved / best[0];
  rates.engine_read_gbps = moved / best[1];
  rates.actor_write_gbps = moved / best[2];
  rates.actor_read_gbps = moved / best[3];
  return rates;
}

} // namespace dsa::tools
