// reduce_scatter, allgather, broadcast, all_to_all and barrier over the in-process
// transport: 1..5 ranks, every dtype, awkward sizes.
#include "tests/net/net_support.hpp"

#include <doctest/doctest.h>

#include <cstdint>

namespace dsa::test {
namespace {

constexpr dtype all_types[] = {dtype::f32, dtype::f16, dtype::bf16};

std::vector<std::int64_t> awkward_sizes(int ranks) {
  return {0, 1, 7, 97, ranks * 1000 + 3};
}

std::string where(int ranks, dtype type, std::int64_t count) {
  return fmt::format("ranks={} dtype={} count={}", ranks, dtype_name(type), count);
}

TEST_CASE("partition: contiguous, in rank order, sizes differ by at most one") {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (std::int64_t count : {0, 1, 2, 7, 97, 5003}) {
      std::int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        auto part = net::partition(count, ranks, r);
        CHECK(part.offset == next);
        CHECK(part.count == count / ranks + (r < count % ranks ? 1 : 0));
        next += part.count;
      }
      CHECK(next == count);
    }
}

TEST_CASE("reduce_scatter: each rank's part equals the ring allreduce's, bit for bit, and the "
          "reference") {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (dtype type : all_types)
      for (std::int64_t count : awkward_sizes(ranks)) {
        INFO(where(ranks, type, count));
        std::vector<typed_buffer> inputs, parts, full;
        for (int r = 0; r < ranks; ++r) {
          inputs.push_back(random_buffer(type, count, static_cast<std::uint32_t>(count + 3), r));
          parts.emplace_back(type, net::partition(count, ranks, r).count);
        }
        full = inputs;
        run_ranks(ranks, [&](net::transport& t, int r) {
          net::collective_options ring;
          ring.flat_allreduce_below_bytes = 0;
          net::communicator comm(t, ring);
          auto& in = inputs[static_cast<std::size_t>(r)];
          CHECK(comm.reduce_scatter_sum(parts[static_cast<std::size_t>(r)].data(), in.data(), type,
                                        count)
                    .has_value());
          auto& f = full[static_cast<std::size_t>(r)];
          CHECK(comm.allreduce_sum(f.data(), type, count).has_value());
        });
        auto expected = reference_sum(inputs);
        for (int r = 0; r < ranks; ++r) {
          const auto part = net::partition(count, ranks, r);
          const std::size_t width = dtype_size(type);
          const auto& got = parts[static_cast<std::size_t>(r)];
          CHECK(
              std::equal(got.bytes.begin(), got.bytes.end(),
                         full[0].bytes.begin() + static_cast<std::ptrdiff_t>(part.offset * width)));
          auto widened = got.widened();
          DSA_CHECK_CLOSE(widened.data(), expected.data() + part.offset, part.count,
                          sum_tolerance(type));
        }
      }
}

TEST_CASE("allgather: every rank gets every rank's part at its offset") {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (dtype type : all_types)
      for (std::int64_t count : awkward_sizes(ranks)) {
        INFO(where(ranks, type, count));
        const typed_buffer whole = random_buffer(type, count, 5u, 0);
        std::vector<typed_buffer> out(static_cast<std::size_t>(ranks), typed_buffer(type, count));
        run_ranks(ranks, [&](net::transport& t, int r) {
          net::communicator comm(t);
          const auto part = net::partition(count, ranks, r);
          const std::byte* mine =
              whole.bytes.data() + part.offset * static_cast<std::int64_t>(dtype_size(type));
          CHECK(comm.allgather(out[static_cast<std::size_t>(r)].data(), mine, type, count)
                    .has_value());
        });
        for (const auto& o : out)
          CHECK(o == whole);
      }
}

TEST_CASE("broadcast: from every root, every rank gets the root's bytes") {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (dtype type : all_types)
      for (std::int64_t count : awkward_sizes(ranks)) {
        INFO(where(ranks, type, count));
        std::vector<std::vector<typed_buffer>> data(static_cast<std::size_t>(ranks));
        for (int root = 0; root < ranks; ++root)
          for (int r = 0; r < ranks; ++r)
            data[static_cast<std::size_t>(root)].push_back(
                random_buffer(type, count, static_cast<std::uint32_t>(root * 10 + 1), r));
        const auto before = data;
        run_ranks(ranks, [&](net::transport& t, int r) {
          net::communicator comm(t);
          for (int root = 0; root < ranks; ++root) {
            auto& d = data[static_cast<std::size_t>(root)][static_cast<std::size_t>(r)];
            CHECK(comm.broadcast(d.data(), type, count, root).has_value());
          }
        });
        for (int root = 0; root < ranks; ++root)
          for (int r = 0; r < ranks; ++r)
            CHECK(data[static_cast<std::size_t>(root)][static_cast<std::size_t>(r)] ==
                  before[static_cast<std::size_t>(root)][static_cast<std::size_t>(root)]);
      }
}

TEST_CASE("all_to_all: block p of rank r's output is block r of rank p's input") {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (dtype type : all_types)
      for (std::int64_t block : {0, 1, 7, 97}) {
        INFO(where(ranks, type, block));
        std::vector<typed_buffer> in,
            out(static_cast<std::size_t>(ranks), typed_buffer(type, ranks * block));
        for (int r = 0; r < ranks; ++r)
          in.push_back(random_buffer(type, ranks * block, 9u, r));
        run_ranks(ranks, [&](net::transport& t, int r) {
          net::communicator comm(t);
          CHECK(comm.all_to_all(out[static_cast<std::size_t>(r)].data(),
                                in[static_cast<std::size_t>(r)].data(), type, block)
                    .has_value());
        });
        const std::size_t bytes = static_cast<std::size_t>(block) * dtype_size(type);
        for (int r = 0; r < ranks; ++r)
          for (int p = 0; p < ranks; ++p) {
            const auto& o = out[static_cast<std::size_t>(r)].bytes;
            const auto& i = in[static_cast<std::size_t>(p)].bytes;
            CHECK(std::equal(o.begin() + static_cast<std::ptrdiff_t>(p * bytes),
                             o.begin() + static_cast<std::ptrdiff_t>((p + 1) * bytes),
                             i.begin() + static_cast<std::ptrdiff_t>(r * bytes)));
          }
      }
}

TEST_CASE("barrier: completes when every rank enters, and fails rather than passing without one") {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    INFO("ranks=" << ranks);
    run_ranks(ranks, [&](net::transport& t, int) {
      net::communicator comm(t);
      for (int k = 0; k < 3; ++k)
        CHECK(comm.barrier().has_value());
    });
  }
  // Rank `missing` never enters: the others must not pass the barrier. They block until
  // the group is aborted (whenever that happens: before they enter or while they wait).
  for (int ranks = 2; ranks <= 5; ++ranks)
    for (int missing = 0; missing < ranks; ++missing) {
      INFO("ranks=" << ranks << " missing=" << missing);
      net::local_group group(ranks);
      std::vector<int> passed(static_cast<std::size_t>(ranks), 0);
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r)
        if (r != missing)
          threads.emplace_back([&, r] {
            net::communicator comm(group.at(r));
            passed[static_cast<std::size_t>(r)] = comm.barrier().has_value() ? 1 : 0;
          });
      group.abort(make_error(errc::runtime, "rank {} never entered the barrier", missing));
      for (auto& th : threads)
        th.join();
      for (int r = 0; r < ranks; ++r)
        CHECK(passed[static_cast<std::size_t>(r)] == 0);
    }
}

} // namespace
} // namespace dsa::test
