// Tests for the order of io/aio/swap_store's sweeps: descending sweeps and their
// prefetch, and a sweep gated on each chunk being final (the streamed update) that reads
// later chunks while it waits.
#include "io/aio/swap_store.hpp"
#include "tests/aio/swap_test_util.hpp"

#include <doctest/doctest.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using namespace dsa;
using namespace dsa::test;
using namespace dsa::test::zero;

} // namespace

TEST_CASE("swap store: descending sweeps visit the last chunk first, and a prefetch reads the last chunks") {
  scratch_dir dir;
  auto engine = shared_engine();
  const std::int64_t numel = 5 * 2048; // 5 chunks of 2048, 3 buffer sets
  const auto arrays = patterned_arrays(numel);
  auto o = options_for(dir.path(), numel, 2048, true, true);
  o.descending = true;
  auto store = make_store(engine, o);
  REQUIRE(optim::write_arrays(*store, arrays).has_value());
  REQUIRE(store->flush().has_value());
  store->prefetch(optim::all_arrays);
  REQUIRE(store->flush().has_value());
  const std::uint64_t chunk_bytes = 3u * 2048u * 4u;
  CHECK(store->bytes_read() == 3 * chunk_bytes);
  std::vector<std::int64_t> order;
  std::vector<std::uint64_t> read_before; // bytes read when each chunk's turn came
  REQUIRE(store->sweep(optim::all_arrays, optim::all_arrays, [&](const optim::state_chunk& c) -> status {
    order.push_back(c.index);
    read_before.push_back(store->bytes_read());
    for (unsigned a = 0; a < 3; ++a)
      CHECK(std::memcmp(c.arrays[a], arrays[a].data<float>() + c.lo, static_cast<std::size_t>(c.hi - c.lo) * 4) == 0);
    for (std::int64_t i = 0; i < c.hi - c.lo; ++i) c.arrays[optim::master_array][i] = -c.arrays[optim::master_array][i];
    return {};
  }).has_value());
  CHECK(order == std::vector<std::int64_t>{4, 3, 2, 1, 0});
  // Chunks 4, 3 and 2 were prefetched: the sweep read nothing before its third chunk.
  CHECK(read_before[0] == 3 * chunk_bytes);
  CHECK(read_before[2] <= 4 * chunk_bytes);
  CHECK(store->bytes_read() == 5 * chunk_bytes);
  REQUIRE(store->flush().has_value());
  auto back = optim::read_arrays(*store);
  REQUIRE(back.has_value());
  for (std::int64_t i = 0; i < numel; ++i) REQUIRE(back->at(0).data<float>()[i] == -arrays[0].data<float>()[i]);
  CHECK(same_bits((*back)[1], arrays[1]));
}

TEST_CASE("swap store: a gated sweep updates a chunk only once it is final, reading later chunks while it waits") {
  scratch_dir dir;
  auto engine = shared_engine();
  const std::int64_t numel = 5 * 2048; // 5 chunks of 2048, 3 buffer sets
  const std::uint64_t chunk_bytes = 3u * 2048u * 4u;
  const auto arrays = patterned_arrays(numel);
  auto o = options_for(dir.path(), numel, 2048, true, true);
  o.descending = true;
  auto store = make_store(engine, o);
  REQUIRE(optim::write_arrays(*store, arrays).has_value());
  REQUIRE(store->flush().has_value()); // nothing held: the sweep reads every chunk itself
  // The test opens the gate: elements from `from` on are final. `asked` counts the
  // sweep's questions, so the test knows when the sweep has waited once.
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t from = numel;
  int asked = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> updated; // chunk lo, `from` when it ran
  optim::chunk_ready ready = [&](std::int64_t lo, std::int64_t) -> expected<bool> {
    std::lock_guard<std::mutex> lock(mu);
    ++asked;
    cv.notify_all();
    return lo >= from;
  };
  status result;
  std::thread sweeper([&] {
    result = store->sweep_when(optim::all_arrays, optim::all_arrays, ready, [&](const optim::state_chunk& c) -> status {
      std::lock_guard<std::mutex> lock(mu);
      updated.emplace_back(c.lo, from);
      return {};
    });
  });
  auto wait_asked = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return asked >= n; });
  };
  // The second question comes after the first answer's read-ahead and a completion: by
  // then every buffer set holds a chunk (4, 3, 2), none updated.
  wait_asked(2);
  store->wait_idle();
  CHECK(store->bytes_read() == 3 * chunk_bytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(updated.empty());
    from = 3 * 2048; // chunks 4 and 3 are final
  }
  store->wake();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return updated.size() == 2; });
    from = 0; // the rest
  }
  store->wake();
  sweeper.join();
  REQUIRE_MESSAGE(result.has_value(), result.err().to_string());
  REQUIRE(updated.size() == 5);
  for (std::size_t k = 0; k < updated.size(); ++k) {
    CAPTURE(k);
    CHECK(updated[k].first == static_cast<std::int64_t>(4 - k) * 2048); // last chunk first
    CHECK(updated[k].first >= updated[k].second);                        // never before it was final
  }
  CHECK(store->stats().gate_ns > 0);
  REQUIRE(store->flush().has_value());
  // A gate that fails (the run stopped) ends the sweep with its error, nothing left in flight.
  auto failed = store->sweep_when(
      optim::all_arrays, optim::all_arrays,
      [](std::int64_t, std::int64_t) -> expected<bool> { return make_error(errc::runtime, "the run stopped"); },
      [](const optim::state_chunk&) -> status { return {}; });
  REQUIRE_FALSE(failed.has_value());
  CHECK(failed.err().message == "the run stopped");
  CHECK(store->flush().has_value());
}
