// ZeRO-3 on ranks as threads of one process: the parameter fetcher (what each use binds,
// what each release frees, the live bound, a use out of sequence) and the gradient partition.
#include "actors/train/stage/param_fetcher.hpp"
#include "actors/train/stage/partition_grads.hpp"
#include "io/net/local_transport.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <set>
#include <stdexcept>
#include <thread>

using namespace dsa;

namespace {

// Four tensors of awkward sizes, so partition boundaries fall inside tensors.
optim::flat_layout test_layout(std::uint32_t ranks) {
  std::vector<optim::flat_tensor_spec> specs{
      {"a", {50, 100}, true}, {"b", {300}, true}, {"c", {7, 1000}, true}, {"d", {100}, false}};
  auto l = optim::flat_layout::create(std::move(specs), ranks);
  REQUIRE(l.has_value());
  return *l;
}

// Tensor t's values in version v: distinct per tensor, element and version.
std::vector<tensor> whole_values(const optim::flat_layout& layout, int version) {
  std::vector<tensor> out;
  for (std::size_t t = 0; t < layout.tensors().size(); ++t) {
    tensor x = tensor::empty(layout.tensors()[t].shape, dtype::f32);
    for (std::int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(1000 * t + i) * 0.25f + static_cast<float>(version);
    out.push_back(x);
  }
  return out;
}

// Rank r's partition of `whole`, as the optimizer shard writes it.
tensor partition_of(const optim::flat_layout& layout, std::uint32_t r, const std::vector<tensor>& whole) {
  const auto mine = layout.partition(r);
  tensor p = tensor::zeros({layout.partition_numel()}, dtype::f32);
  for (const auto& piece : layout.pieces(mine))
    std::memcpy(p.data<float>() + (piece.flat_offset - mine.lo),
                whole[piece.tensor].data<float>() + piece.tensor_offset, sizeof(float) * static_cast<std::size_t>(piece.count));
  return p;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Parts: 0 = {a, b}, 1 = {c}, 2 = {a, d}; one micro-batch uses 0 1 2 then 2 1 0.
std::vector<train::fetch_part> test_parts() { return {{0, {0, 1}}, {1, {2}}, {2, {0, 3}}}; }
const std::vector<std::int64_t> test_sequence{0, 1, 2, 2, 1, 0};

// Runs `body(rank, transport)` on `ranks` threads; rethrows nothing, records failures.
void on_ranks(int ranks, const std::function<void(int, net::transport&)>& body) {
  net::local_group group(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { body(r, group.at(r)); });
  for (auto& t : threads) t.join();
}

} // namespace

TEST_CASE("param fetcher: each use binds its part whole, bit for bit, and the releases leave nothing behind") {
  for (std::uint32_t ranks : {1u, 2u, 3u}) {
    for (std::int64_t threshold : {0, 200}) {
      CAPTURE(ranks);
      CAPTURE(threshold);
      const auto layout = test_layout(ranks);
      std::vector<std::string> failures(ranks);
      std::vector<train::fetch_stats> stats(ranks);
      on_ranks(static_cast<int>(ranks), [&](int r, net::transport& t) {
        try {
          train::fetch_settings s;
          s.persistence_threshold = threshold;
          train::param_fetcher f(layout, static_cast<std::uint32_t>(r), dtype::f32,
                                 std::make_shared<net::communicator>(t), test_parts(), test_sequence, 2, s);
          f.take_whole(whole_values(layout, 0));
          const auto parts = test_parts();
          for (int step = 0; step < 3; ++step) {
            f.allow(static_cast<std::uint32_t>(step));
            if (step > 0) f.load(partition_of(layout, static_cast<std::uint32_t>(r), whole_values(layout, step)));
            const auto want = whole_values(layout, step);
            std::map<std::size_t, tensor> bound;
            for (int m = 0; m < 2; ++m)
              for (std::int64_t id : test_sequence) {
                for (auto& [i, v] : f.acquire(id, static_cast<std::uint32_t>(step))) {
                  if (!same_bits(v, want[i])) throw std::runtime_error("a gathered tensor differs");
                  bound[i] = v;
                }
                for (std::size_t i : parts[static_cast<std::size_t>(id)].tensors)
                  if (!bound.count(i)) throw std::runtime_error("a tensor of the part is not bound");
                for (std::size_t i : f.release(id)) {
                  if (f.persistent(i)) throw std::runtime_error("a persistent tensor was released");
                  bound.erase(i);
                }
              }
            // After the step only the persistent tensors stay bound.
            for (const auto& [i, v] : bound)
              if (!f.persistent(i)) throw std::runtime_error("a gathered tensor outlived the step");
          }
          stats[static_cast<std::size_t>(r)] = f.stats();
          const auto all = f.gather_all();
          const auto last = whole_values(layout, 2);
          for (std::size_t i = 0; i < all.size(); ++i)
            if (!same_bits(all[i], last[i])) throw std::runtime_error("gather_all differs");
        } catch (const std::exception& e) {
          failures[static_cast<std::size_t>(r)] = e.what();
        }
      });
      for (const auto& e : failures) CHECK_MESSAGE(e.empty(), e);
      // The same gathers on every rank (they are collectives).
      for (const auto& s : stats) CHECK(s.gathers == stats.front().gathers);
      CHECK(stats.front().gathers > 0);
    }
  }
}

TEST_CASE("param fetcher: with stage3_max_live_parameters 1 nothing is gathered ahead of the one use needed") {
  const std::uint32_t ranks = 2;
  const auto layout = test_layout(ranks);
  std::vector<train::fetch_stats> stats(ranks);
  on_ranks(2, [&](int r, net::transport& t) {
    train::fetch_settings s;
    s.persistence_threshold = 0;
    s.max_live_elements = 1;
    train::param_fetcher f(layout, static_cast<std::uint32_t>(r), dtype::f32, std::make_shared<net::communicator>(t),
                           test_parts(), test_sequence, 1, s);
    f.take_whole(whole_values(layout, 0));
    f.allow(0);
    for (std::int64_t id : test_sequence) {
      (void)f.acquire(id, 0);
      (void)f.release(id);
    }
    stats[static_cast<std::size_t>(r)] = f.stats();
  });
  // A use is gathered only once the compute holds the one before it: at most that use's
  // tensors and the next's are live, here c (7000) with a and b (5300); a use ahead of
  // that would add at least 5100 more.
  for (const auto& s : stats) CHECK(s.peak_live_elements <= 7000 + 5300);
  // a+b, c, a+d, nothing (the same part again), c, a+b.
  for (const auto& s : stats) CHECK(s.gathers == 8);
}

TEST_CASE("param fetcher: a use out of the sequence is an error naming both parts") {
  const auto layout = test_layout(1);
  net::local_group group(1);
  train::param_fetcher f(layout, 0, dtype::f32, std::make_shared<net::communicator>(group.at(0)), test_parts(),
                         test_sequence, 1, {});
  f.take_whole(whole_values(layout, 0));
  try {
    (void)f.acquire(1, 0);
    FAIL("acquire out of order did not throw");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.find("out of order") != std::string::npos);
    CHECK(what.find("part 0") != std::string::npos);
    CHECK(what.find("part 1") != std::string::npos);
  }
  f.allow(0);
  (void)f.acquire(0, 0);
  try {
    (void)f.acquire(1, 0);
    FAIL("a second acquire without release did not throw");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("still in use") != std::string::npos);
  }
}

// A run that stops after step k never allows step k + 1: a stage already in step k + 1's
// forward waits in acquire, gathering nothing, until the runtime cancels it at the end.
TEST_CASE("param fetcher: a step's gathers wait for it to be allowed, and cancel ends the wait") {
  const auto layout = test_layout(2);
  net::local_group group(2);
  train::param_fetcher f(layout, 0, dtype::f32, std::make_shared<net::communicator>(group.at(0)), test_parts(),
                         test_sequence, 1, {});
  f.take_whole(whole_values(layout, 0));
  f.allow(4);
  std::string what;
  std::thread waiting([&] {
    try {
      (void)f.acquire(0, 5);
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
  });
  f.cancel();
  waiting.join();
  CHECK(what.find("the run is ending") != std::string::npos);
  CHECK(f.stats().gathers == 0); // rank 1 never took part: no collective was started
}

// Each micro-batch's gradients summed over the ranks, this rank's elements added in: with
// small whole numbers every order of the sums is exact, so the partition must equal the
// sum over ranks and micro-batches element for element; the pending bound (one tensor)
// only makes the backward wait.
TEST_CASE("partition_grads: each rank's partition is the sum over ranks and micro-batches of its elements") {
  for (std::uint32_t ranks : {1u, 2u, 3u}) {
    CAPTURE(ranks);
    const auto layout = test_layout(ranks);
    const int micro_batches = 3;
    auto value = [](std::uint32_t rank, int m, std::size_t t, std::int64_t i) {
      return static_cast<float>((rank + 1) * 3 + m * 5 + static_cast<int>(t) * 7 + static_cast<int>(i % 11));
    };
    std::vector<std::string> failures(ranks);
    on_ranks(static_cast<int>(ranks), [&](int r, net::transport& t) {
      try {
        train::partition_grads g(layout, static_cast<std::uint32_t>(r), dtype::f32, std::make_shared<net::communicator>(t),
                                 /*pending_elements=*/1);
        for (int step = 0; step < 2; ++step) {
          g.allow(static_cast<std::uint32_t>(step));
          for (int m = 0; m < micro_batches; ++m)
            for (std::size_t k = layout.tensors().size(); k-- > 0;) { // as a backward: last tensor first
              tensor grad = tensor::empty(layout.tensors()[k].shape, dtype::f32);
              for (std::int64_t i = 0; i < grad.numel(); ++i) grad.data<float>()[i] = value(static_cast<std::uint32_t>(r), m, k, i);
              g.submit(k, std::move(grad), static_cast<std::uint32_t>(step));
            }
          g.wait();
          for (std::size_t k = 0; k < layout.tensors().size(); ++k) {
            const tensor piece = g.piece_of(k);
            for (std::int64_t j = 0; j < piece.numel(); ++j) {
              const std::int64_t i = g.piece_offset(k) + j;
              double want = 0;
              for (std::uint32_t q = 0; q < ranks; ++q)
                for (int m = 0; m < micro_batches; ++m) want += value(q, m, k, i);
              if (piece.data<float>()[j] != static_cast<float>(want))
                throw std::runtime_error("a partition element differs from the sum");
            }
          }
          g.reset();
        }
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
    for (const auto& e : failures) CHECK_MESSAGE(e.empty(), e);
  }
}

TEST_CASE("partition_grads: a failed sum fails the next call, naming the tensor") {
  const auto layout = test_layout(2);
  net::local_group group(2);
  train::partition_grads g(layout, 0, dtype::f32, std::make_shared<net::communicator>(group.at(0)), 1'000'000);
  group.abort(make_error(errc::runtime, "rank 1 is gone"));
  g.allow(0);
  g.submit(0, tensor::zeros(layout.tensors()[0].shape, dtype::f32), 0);
  try {
    g.wait();
    FAIL("wait after a failed sum did not throw");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("summing the gradient of a") != std::string::npos);
  }
}

// While the model holds the step's first use, the fetcher gathers the next uses ahead of
// it, as far as stage3_prefetch_bucket_size allows (and no further).
TEST_CASE("param fetcher: uses are gathered ahead of the compute within the prefetch window") {
  const auto layout = test_layout(2);
  struct outcome {
    bool all_ahead = false, next_ahead = false, beyond_window = true;
    train::fetch_stats stats;
  };
  for (const bool wide : {true, false}) {
    CAPTURE(wide);
    std::vector<outcome> got(2);
    on_ranks(2, [&](int r, net::transport& t) {
      train::fetch_settings s;
      s.persistence_threshold = 0;
      // Narrow: room for use 1's gather (c, 7000 elements) but not use 2's (a and d) on top.
      s.prefetch_elements = wide ? 1'000'000 : 7000;
      train::param_fetcher f(layout, static_cast<std::uint32_t>(r), dtype::f32, std::make_shared<net::communicator>(t),
                             test_parts(), test_sequence, 1, s);
      f.take_whole(whole_values(layout, 0));
      f.allow(0);
      (void)f.acquire(test_sequence[0], 0);
      outcome& o = got[static_cast<std::size_t>(r)];
      if (wide) {
        o.all_ahead = f.wait_gathered(test_sequence.size(), std::chrono::seconds(30));
      } else {
        o.next_ahead = f.wait_gathered(2, std::chrono::seconds(30));
        o.beyond_window = f.wait_gathered(3, std::chrono::milliseconds(300)); // must not happen
      }
      (void)f.release(test_sequence[0]);
      for (std::size_t i = 1; i < test_sequence.size(); ++i) {
        (void)f.acquire(test_sequence[i], 0);
        (void)f.release(test_sequence[i]);
      }
      o.stats = f.stats();
    });
    for (const auto& o : got) {
      if (wide) {
        CHECK(o.all_ahead);
        CHECK(o.stats.ahead == static_cast<std::int64_t>(test_sequence.size()) - 1);
      } else {
        CHECK(o.next_ahead);
        CHECK_FALSE(o.beyond_window);
      }
    }
  }
}
