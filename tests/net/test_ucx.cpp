// ucx_transport between real processes (2 and 3 forked ranks, shared memory or TCP):
// every collective (the allreduce on its flat, ring and shared-memory paths) gives the
// in-process result bit for bit; wrong job tokens are refused; an abort or a killed rank
// fails the others' receives instead of hanging them.
#include "tests/net/net_support.hpp"
#include "tests/net/process_ranks.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>

namespace dsa::test {
namespace {

constexpr dtype all_types[] = {dtype::f32, dtype::f16, dtype::bf16};

void append(net::bytes& out, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  out.insert(out.end(), p, p + n);
}

std::vector<std::int64_t> awkward_sizes(int ranks) {
  // empty, one, a prime, not divisible by the rank count, over 1 MiB in every dtype, and
  // a ring chunk of more than one 2 MiB segment at 2 ranks (the last one short)
  return {0, 1, 97, ranks * 1000 + 1, 600011, 1100017};
}

// Every collective at every awkward size and dtype, plus a second communicator on its own
// thread and channel. Returns [u64 n_shared][shared results][this rank's own results]:
// the shared part must be the same on every rank.
expected<net::bytes> collective_script(net::transport& t) {
  const int n = t.size(), r = t.rank();
  net::bytes shared, own;
  status side = status{};
  typed_buffer side_buf = random_buffer(dtype::f32, 5003, 77u, r);
  std::thread other([&] {
    net::communicator comm(t, {}, 5);
    for (int k = 0; k < 3 && side; ++k)
      side = comm.allreduce_sum(side_buf.data(), side_buf.type, side_buf.size());
    if (side)
      side = comm.barrier();
  });
  auto run = [&]() -> status {
    net::communicator comm(t, {}, 1);
    net::collective_options ring_only;
    ring_only.flat_allreduce_below_bytes = 0;
    ring_only.shared_memory = false;
    net::collective_options flat_only;
    flat_only.flat_allreduce_below_bytes = SIZE_MAX;
    net::collective_options shared_only; // the processes are on one host: shared memory
    shared_only.flat_allreduce_below_bytes = 0;
    net::communicator ring(t, ring_only, 2), flat(t, flat_only, 3),
        through_memory(t, shared_only, 4);
    std::uint32_t seed = 1;
    for (dtype type : all_types)
      for (std::int64_t count : awkward_sizes(n)) {
        const std::size_t width = dtype_size(type);
        for (net::communicator* c : {&ring, &flat, &through_memory}) {
          typed_buffer b = random_buffer(type, count, seed++, r);
          DSA_TRY(c->allreduce_sum(b.data(), type, count));
          append(shared, b.data(), b.bytes.size());
        }
        const net::chunk part = net::partition(count, n, r);
        typed_buffer in = random_buffer(type, count, seed++, r);
        typed_buffer scattered(type, part.count);
        DSA_TRY(comm.reduce_scatter_sum(scattered.data(), in.data(), type, count));
        append(own, scattered.data(), scattered.bytes.size());
        typed_buffer gathered(type, count);
        typed_buffer mine = random_buffer(type, part.count, seed++, r);
        DSA_TRY(comm.allgather(gathered.data(), mine.data(), type, count));
        append(shared, gathered.data(), gathered.bytes.size());
        typed_buffer cast = random_buffer(type, count, seed++, r);
        DSA_TRY(comm.broadcast(cast.data(), type, count, n - 1));
        append(shared, cast.data(), cast.bytes.size());
        const std::int64_t block = count / 8 + 1;
        typed_buffer sent = random_buffer(type, n * block, seed++, r), got(type, n * block);
        DSA_TRY(comm.all_to_all(got.data(), sent.data(), type, block));
        append(own, got.data(), got.bytes.size());
        (void)width;
      }
    return comm.barrier();
  };
  status main_result = run();
  if (!main_result)
    t.abort(main_result.err()); // wakes the other thread too
  other.join();
  DSA_TRY(main_result);
  DSA_TRY(side);
  append(shared, side_buf.data(), side_buf.bytes.size());
  net::bytes out(8);
  const std::uint64_t n_shared = shared.size();
  std::memcpy(out.data(), &n_shared, 8);
  out.insert(out.end(), shared.begin(), shared.end());
  out.insert(out.end(), own.begin(), own.end());
  return out;
}

std::vector<net::bytes> in_process_script(int n) {
  std::vector<net::bytes> out(static_cast<std::size_t>(n));
  run_ranks(n, [&](net::transport& t, int r) {
    auto got = collective_script(t);
    REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().to_string()));
    out[static_cast<std::size_t>(r)] = std::move(*got);
  });
  return out;
}

void check_collectives(int n, const process_options& options) {
  const auto expected = in_process_script(n);
  auto outcomes = run_process_ranks(
      n, [](net::ucx_transport& t, int, const std::vector<net::bytes>&) {
        return collective_script(t);
      },
      options);
  std::uint64_t n_shared = 0;
  for (int r = 0; r < n; ++r) {
    const auto& o = outcomes[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << o.error);
    REQUIRE(o.finished);
    REQUIRE(o.ok);
    CHECK(o.output.size() == expected[static_cast<std::size_t>(r)].size());
    CHECK(o.output == expected[static_cast<std::size_t>(r)]); // bit for bit
    std::memcpy(&n_shared, o.output.data(), 8);
    const auto& first = outcomes[0].output;
    CHECK(std::equal(o.output.begin(), o.output.begin() + 8 + static_cast<std::ptrdiff_t>(n_shared),
                     first.begin()));
  }
}

TEST_CASE("ucx: every collective over 2 and 3 processes equals the in-process result bit for bit") {
  for (int n : {2, 3}) {
    INFO(n << " processes, UCX's own choice of transports (shared memory)");
    check_collectives(n, {});
  }
}

TEST_CASE("ucx: the same over TCP only (UCX_TLS=tcp)") {
  process_options tcp;
  tcp.env = {{"UCX_TLS", "tcp"}};
  for (int n : {2, 3}) {
    INFO(n << " processes over TCP");
    check_collectives(n, tcp);
  }
}

net::bytes text(const std::string& s) {
  return net::bytes(reinterpret_cast<const std::byte*>(s.data()),
                    reinterpret_cast<const std::byte*>(s.data()) + s.size());
}

TEST_CASE("ucx: a message with another job's token is refused and logged, never delivered") {
  // Rank 1 also opens a second transport with a wrong token and sends rank 0 a small and
  // a large (rendezvous) message on tag 5; only then does the real rank 1 send its own.
  const std::uint64_t token = 0x1234abcdULL;
  process_options options;
  options.job_token = token;
  auto outcomes = run_process_ranks(
      2,
      [token](net::ucx_transport& t, int r,
              const std::vector<net::bytes>& addresses) -> expected<net::bytes> {
        net::communicator comm(t);
        DSA_TRY(comm.barrier());
        if (r == 1) {
          DSA_ASSIGN_OR_RETURN(auto rogue, net::ucx_transport::create(1, 2, token + 1));
          DSA_TRY(rogue->connect(addresses));
          DSA_TRY(rogue->send(0, 5, text("forged small")));
          std::vector<std::byte> big(1 << 20, std::byte{0x66});
          DSA_ASSIGN_OR_RETURN(auto ticket, rogue->send_parts(0, 5, text("forged"), big.data(),
                                                              big.size()));
          status refused = ticket.wait(); // the receiver has judged it once this returns
          DSA_TRY(t.send(0, 5, text("genuine")));
          DSA_TRY(comm.barrier());
          return text(refused ? std::string("accepted") : refused.err().to_string());
        }
        DSA_ASSIGN_OR_RETURN(net::bytes got, t.recv(1, 5));
        DSA_TRY(comm.barrier());
        return text(std::string(reinterpret_cast<const char*>(got.data()), got.size()) + "|" +
                    std::to_string(t.refused_messages()));
      },
      options);
  REQUIRE(outcomes[0].finished);
  REQUIRE(outcomes[1].finished);
  INFO(outcomes[0].error << outcomes[1].error);
  REQUIRE(outcomes[0].ok);
  REQUIRE(outcomes[1].ok);
  const std::string at0(reinterpret_cast<const char*>(outcomes[0].output.data()),
                        outcomes[0].output.size());
  const std::string at1(reinterpret_cast<const char*>(outcomes[1].output.data()),
                        outcomes[1].output.size());
  CHECK(at1.find("refused") != std::string::npos);
  REQUIRE(at0.rfind("genuine|", 0) == 0);
  CHECK(std::stoi(at0.substr(8)) >= 1); // the forged rendezvous at least; the small one too unless it is still in flight
}

TEST_CASE("ucx: an abort on one rank fails the receives blocked on the others") {
  auto outcomes = run_process_ranks(
      3, [](net::ucx_transport& t, int r, const std::vector<net::bytes>&) -> expected<net::bytes> {
        net::communicator comm(t);
        DSA_TRY(comm.barrier());
        if (r == 0) {
          t.abort(make_error(errc::runtime, "test stops the job"));
          return net::bytes{};
        }
        auto got = t.recv(0, 99); // nothing is ever sent on tag 99
        return text(got ? std::string("received") : got.err().to_string());
      });
  for (int r = 1; r < 3; ++r) {
    const auto& o = outcomes[static_cast<std::size_t>(r)];
    REQUIRE(o.finished);
    const std::string s(reinterpret_cast<const char*>(o.output.data()), o.output.size());
    // Blocked in the barrier's last round or in the receive: an abort fails both.
    const std::string said = s + o.error;
    INFO("rank " << r << ": " << said);
    CHECK(said.find("rank 0 aborted the group: test stops the job") != std::string::npos);
  }
}

TEST_CASE("ucx: kill -9 of one rank fails the others' pending receives, naming it") {
  for (bool tcp : {false, true}) {
    process_options options;
    if (tcp)
      options.env = {{"UCX_TLS", "tcp"}};
    options.deadline = std::chrono::seconds(60);
    const std::string which = tcp ? "tcp" : "default transports";
    INFO(which);
    auto outcomes = run_process_ranks(
        3,
        [](net::ucx_transport& t, int r, const std::vector<net::bytes>&) -> expected<net::bytes> {
          net::communicator comm(t);
          DSA_TRY(comm.barrier()); // every endpoint to rank 2 is in use before it dies
          if (r == 2)
            ::kill(::getpid(), SIGKILL);
          // Rank 0 only waits (nothing to send: the death must be noticed on its own);
          // rank 1 is in a collective that also sends (large payloads) to rank 2.
          if (r == 0) {
            auto got = t.recv(2, 42);
            return text(got ? std::string("received") : got.err().to_string());
          }
          // 4 MiB: the ring, whose large sends to rank 2 are never pulled.
          std::vector<float> x(1 << 20, 1.0f);
          status s = comm.allreduce_sum(x.data(), dtype::f32, 1 << 20);
          return text(s ? std::string("completed") : s.err().to_string());
        },
        options);
    CHECK_FALSE(outcomes[2].finished);
    for (int r = 0; r < 2; ++r) {
      const auto& o = outcomes[static_cast<std::size_t>(r)];
      INFO("rank " << r << ": " << o.error);
      REQUIRE(o.finished);
      // In the allreduce, or still in the barrier when rank 2 died before its last
      // barrier message left: either way the error names rank 2.
      const std::string said =
          std::string(reinterpret_cast<const char*>(o.output.data()), o.output.size()) + o.error;
      INFO("rank " << r << ": " << said);
      CHECK(said.find("rank 2 lost") != std::string::npos);
    }
  }
}

} // namespace
} // namespace dsa::test
