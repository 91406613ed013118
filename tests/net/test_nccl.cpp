// NCCL loaded at run time (io/net/nccl.hpp) against a fake NCCL library loaded the same way
// (tests/net/fake_nccl.cpp, its path in DSA_FAKE_NCCL), ranks as threads: a missing library
// or symbol refused by name, the unique id from rank 0 to every rank over the job's
// rendezvous, an allreduce's sums, rank 0's failure to make an id reaching every rank, an
// asynchronous error and a rank that never comes each ending in an abort with a named error
// (fake clocks: no outcome depends on time), a rank failing after the exchange ending the
// others' join at its deadline, a communicator dropped with a collective pending aborted,
// nothing after an abort. The asynchronous collectives over it (io/net/nccl_collectives.hpp):
// several operations in flight, one wait, tickets, a failure breaking the group for good.
// And the machine's real NCCL, where one is installed: its version.
#include "io/net/nccl.hpp"
#include "io/net/nccl_collectives.hpp"
#include "tests/net/rendezvous_support.hpp"

#include <doctest/doctest.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <thread>

namespace dsa::test {
namespace {

using namespace std::chrono_literals;
using net::nccl::communicator;

std::string fake_path() {
  const char* p = std::getenv("DSA_FAKE_NCCL");
  REQUIRE_MESSAGE(p != nullptr, "DSA_FAKE_NCCL names the fake NCCL library (set by meson)");
  return p;
}

// The fake's controls, from the library the loader opened (dlopen of the same path shares it).
struct fake_controls {
  void* handle = nullptr;
  void (*set)(int, int, int, int) = nullptr; // fail the id, async-error rank and code, rank failing init
  int (*done)(void*) = nullptr;
  int (*aborts)() = nullptr;
  int (*destroys)() = nullptr;
  fake_controls() {
    handle = dlopen(fake_path().c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle != nullptr);
    set = reinterpret_cast<void (*)(int, int, int, int)>(dlsym(handle, "fake_nccl_set"));
    done = reinterpret_cast<int (*)(void*)>(dlsym(handle, "fake_nccl_done"));
    aborts = reinterpret_cast<int (*)()>(dlsym(handle, "fake_nccl_aborts"));
    destroys = reinterpret_cast<int (*)()>(dlsym(handle, "fake_nccl_destroys"));
    REQUIRE((set && done && aborts && destroys));
    set(0, -1, 0, -1);
  }
  ~fake_controls() {
    set(0, -1, 0, -1);
    dlclose(handle);
  }
};

// An id exchange among threads: every rank's blob once all gave theirs (the rendezvous
// allgather's contract), in memory.
class memory_exchange {
public:
  explicit memory_exchange(int ranks) : ranks_(ranks) {}
  net::nccl::id_exchange for_rank(int rank) {
    return [this, rank](const std::string& key, std::vector<std::byte> blob)
               -> expected<std::vector<std::vector<std::byte>>> {
      std::unique_lock<std::mutex> lock(mutex_);
      auto& slot = blobs_[key];
      slot.resize(static_cast<std::size_t>(ranks_));
      slot[static_cast<std::size_t>(rank)] = std::move(blob);
      ++given_[key];
      changed_.notify_all();
      changed_.wait(lock, [&] { return given_[key] >= ranks_; });
      return slot;
    };
  }

private:
  int ranks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<std::vector<std::byte>>> blobs_;
  std::map<std::string, int> given_;
};

// Every rank of `ranks` joins from its own thread and runs `body` on its communicator.
// size_of(r): the group size rank r claims (all the same but in a test of a wrong one).
template <class Body>
void run_ranks(int ranks, const std::function<net::nccl::id_exchange(int)>& exchange_for, Body body,
               const std::function<int(int)>& size_of = {}, std::chrono::milliseconds init_deadline = 5min) {
  auto lib = net::nccl::load_library(fake_path());
  REQUIRE_MESSAGE(lib.has_value(), (lib ? "" : lib.err().to_string()));
  std::vector<std::future<void>> threads;
  for (int r = 0; r < ranks; ++r)
    threads.push_back(std::async(std::launch::async, [&, r] {
      body(r, communicator::join(*lib, exchange_for(r), "dp", r, size_of ? size_of(r) : ranks, init_deadline));
    }));
  for (auto& t : threads) t.get();
}

// A clock that never moves: a wait that must end by its collective ending (a broken one
// hangs until the test's own time limit rather than fail on a slow machine).
net::nccl::clock_fn frozen_clock() {
  return [] { return std::chrono::steady_clock::time_point{}; };
}

// run_ranks with the id exchanged in memory.
template <class Body>
void run_in_memory(int ranks, Body body, const std::function<int(int)>& size_of = {},
                   std::chrono::milliseconds init_deadline = 5min) {
  memory_exchange exchange(ranks);
  run_ranks(ranks, [&](int r) { return exchange.for_rank(r); }, body, size_of, init_deadline);
}

// A clock that moves 1 ms each time it is read.
net::nccl::clock_fn stepping_clock() {
  auto t = std::make_shared<std::chrono::steady_clock::time_point>();
  return [t] { return *t += 1ms; };
}

// Enqueues one allreduce of `data` on rank r's communicator, then waits for it on `clock`
// with the fake's completion query (counting its calls in `polls` when given).
status reduce_and_wait(communicator& c, const fake_controls& fake, std::vector<float>& data, const std::string& what,
                       std::chrono::milliseconds deadline, const net::nccl::clock_fn& clock = {},
                       int* polls = nullptr) {
  REQUIRE(c.all_reduce_sum(data.data(), data.size(), net::nccl::element::f32, nullptr).has_value());
  void* handle = c.handle();
  return c.wait(
      [&fake, handle, polls] {
        if (polls) ++*polls;
        return fake.done(handle) == 1;
      },
      what, deadline, polls ? std::chrono::microseconds(0) : std::chrono::microseconds(200), clock);
}

} // namespace

TEST_CASE("nccl: a missing library or symbol is refused by name") {
  auto missing = net::nccl::load_library("/nonexistent/libnccl.so.2");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == errc::unsupported);
  CHECK(missing.err().message.find("cannot load '/nonexistent/libnccl.so.2': ") != std::string::npos);
  CHECK(missing.err().message.find("(the path given)") != std::string::npos);
  // A real library that is not NCCL: the first symbol it lacks is named.
  auto wrong = net::nccl::load_library("libm.so.6");
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.err().message.find("has no symbol ncclGetVersion") != std::string::npos);
  // DSA_NCCL_LIBRARY chooses the library when no path is given.
  ::setenv("DSA_NCCL_LIBRARY", fake_path().c_str(), 1);
  auto chosen = net::nccl::load_library();
  ::unsetenv("DSA_NCCL_LIBRARY");
  REQUIRE_MESSAGE(chosen.has_value(), (chosen ? "" : chosen.err().to_string()));
  CHECK((*chosen)->path == fake_path());
  CHECK((*chosen)->version == 22800);
}

TEST_CASE("nccl: the id goes from rank 0 over the rendezvous; an allreduce sums every rank's buffer") {
  fake_controls fake;
  constexpr int ranks = 3;
  auto server = net::rendezvous_server::start("127.0.0.1", 0, test_token, ranks, {}, nullptr);
  REQUIRE(server.has_value());
  auto clients = join_all((*server)->port(), ranks);
  for (auto& c : clients) REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.err().to_string()));
  std::atomic<int> destroyed_before{fake.destroys()};
  run_ranks(
      ranks,
      [&](int r) -> net::nccl::id_exchange {
        auto* client = clients[static_cast<std::size_t>(r)]->get();
        return [client](const std::string& key, std::vector<std::byte> blob) { return client->allgather(key, blob); };
      },
      [&](int r, expected<std::unique_ptr<communicator>> c) {
        REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.err().to_string()));
        CHECK((*c)->rank() == r);
        CHECK((*c)->size() == ranks);
        std::vector<float> data{1.0f + static_cast<float>(r), 10.0f * static_cast<float>(r), -2.0f};
        // The others may come later: no deadline that time could pass.
        auto status = reduce_and_wait(**c, fake, data, "the allreduce", 1ms, frozen_clock());
        REQUIRE_MESSAGE(status.has_value(), (status ? "" : status.err().to_string()));
        CHECK(data == std::vector<float>{6.0f, 30.0f, -6.0f}); // (1 + 2 + 3), 10 x (0 + 1 + 2), 3 x -2
      });
  CHECK(fake.destroys() - destroyed_before == ranks); // each communicator destroyed, none aborted
  for (auto& c : clients) CHECK((*c)->leave().has_value());
}

TEST_CASE("nccl: rank 0 failing to make the id fails every rank, naming NCCL's error; nobody waits") {
  fake_controls fake;
  fake.set(1, -1, 0, -1);
  std::mutex m;
  std::vector<std::string> errors;
  run_in_memory(3, [&](int r, expected<std::unique_ptr<communicator>> c) {
        REQUIRE_FALSE(c.has_value());
        std::lock_guard<std::mutex> lock(m);
        errors.push_back(c.err().message);
        CHECK(c.err().message.find(fmt::format("NCCL group \"dp\", rank {}: rank 0 could not make the unique id: "
                                               "NCCL result 2 (unhandled system error (fake))",
                                               r)) != std::string::npos);
      });
  CHECK(errors.size() == 3);
}

TEST_CASE("nccl: an asynchronous error aborts the communicator and names the rank, the collective and NCCL's reason") {
  fake_controls fake;
  fake.set(0, 1, 6, -1); // rank 1 reports ncclRemoteError once its first allreduce completed
  const int aborts_before = fake.aborts();
  run_in_memory(2, [&](int r, expected<std::unique_ptr<communicator>> c) {
        REQUIRE(c.has_value());
        std::vector<float> data{1.0f};
        auto status = reduce_and_wait(**c, fake, data, "bucket 0's allreduce", 1ms, frozen_clock());
        if (r == 0) {
          CHECK(status.has_value());
          return;
        }
        REQUIRE_FALSE(status.has_value());
        CHECK(status.err().message ==
              "rank 1 of NCCL group \"dp\" (2 ranks): bucket 0's allreduce failed: NCCL result 6 (remote process "
              "exited or there was a network error (fake)); the communicator was aborted");
        CHECK((*c)->aborted());
        // Nothing runs on an aborted communicator.
        auto after = (*c)->all_reduce_sum(data.data(), 1, net::nccl::element::f32, nullptr);
        REQUIRE_FALSE(after.has_value());
        CHECK(after.err().message.find("after the communicator was aborted") != std::string::npos);
      });
  CHECK(fake.aborts() - aborts_before == 1);
}

TEST_CASE("nccl: a rank that never comes leaves the others to their deadline: aborted, not hung") {
  fake_controls fake;
  const int aborts_before = fake.aborts();
  run_in_memory(2, [&](int r, expected<std::unique_ptr<communicator>> c) {
        REQUIRE(c.has_value());
        if (r == 1) return; // joined, then never reduces (its communicator is destroyed on return)
        std::vector<float> data{1.0f};
        int polls = 0;
        auto status = reduce_and_wait(**c, fake, data, "the allreduce", 50ms, stepping_clock(), &polls);
        REQUIRE_FALSE(status.has_value());
        CHECK(status.err().message.find("rank 0 of NCCL group \"dp\" (2 ranks): the allreduce did not finish within "
                                        "50 ms; the communicator was aborted") != std::string::npos);
        CHECK(polls >= 10); // the stepping clock: about one poll per 2 ms of it
        CHECK((*c)->aborted());
      });
  CHECK(fake.aborts() - aborts_before == 1);
}

TEST_CASE("nccl: a rank that fails after the id exchange fails the others' join at its deadline, not a hang") {
  fake_controls fake;
  fake.set(0, -1, 0, 1); // rank 1's ncclCommInitRank fails before it joins the group
  run_in_memory(2, [&](int r, expected<std::unique_ptr<communicator>> c) {
    REQUIRE_FALSE(c.has_value());
    CAPTURE(c.err().message);
    if (r == 1) {
      CHECK(c.err().message.find("rank 1 of 2: ncclCommInitRank failed: NCCL result 2") != std::string::npos);
      return;
    }
    CHECK(c.err().message.find("rank 0 of 2: ncclCommInitRank did not return within 100 ms") != std::string::npos);
  }, {}, 100ms);
}

TEST_CASE("nccl: a communicator dropped with a collective never waited for is aborted, not destroyed") {
  fake_controls fake;
  const int aborts_before = fake.aborts(), destroys_before = fake.destroys();
  run_in_memory(2, [&](int, expected<std::unique_ptr<communicator>> c) {
    REQUIRE(c.has_value());
    std::vector<float> data{1.0f};
    REQUIRE((*c)->all_reduce_sum(data.data(), 1, net::nccl::element::f32, nullptr).has_value());
  }); // each communicator goes out of scope here, its allreduce not waited for
  CHECK(fake.aborts() - aborts_before == 2);
  CHECK(fake.destroys() - destroys_before == 0);
}

TEST_CASE("nccl: a group of one rank sums to itself; an element type NCCL refuses is named") {
  fake_controls fake;
  run_in_memory(1, [&](int, expected<std::unique_ptr<communicator>> c) {
    REQUIRE(c.has_value());
    std::vector<float> data{2.5f, -1.0f};
    REQUIRE(reduce_and_wait(**c, fake, data, "the allreduce", 1ms, frozen_clock()).has_value());
    CHECK(data == std::vector<float>{2.5f, -1.0f});
    // The fake sums f32 only: its refusal of bf16 comes back with NCCL's words.
    auto refused = (*c)->all_reduce_sum(data.data(), 1, net::nccl::element::bf16, nullptr);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.err().message == "rank 0 of NCCL group \"dp\" (1 ranks): ncclAllReduce of 1 elements failed: NCCL "
                                   "result 4 (invalid argument (fake))");
  });
}

// Asynchronous collectives over rank r's communicator `c`, completed by the fake's query
// (the stream's, on a GPU); by default waits on a frozen clock end only by completion.
std::unique_ptr<net::nccl_collectives> over_fake(const fake_controls& fake, std::unique_ptr<communicator> c,
                                                 std::chrono::milliseconds deadline = 1ms,
                                                 const net::nccl::clock_fn& clock = frozen_clock()) {
  void* handle = c->handle();
  return std::make_unique<net::nccl_collectives>(
      std::move(c), nullptr, [&fake, handle] { return fake.done(handle) == 1; }, deadline,
      std::chrono::microseconds(200), clock);
}

TEST_CASE("nccl_collectives: allreduces and allgathers in flight together, one wait, every result") {
  fake_controls fake;
  constexpr int ranks = 3;
  run_in_memory(ranks, [&](int r, expected<std::unique_ptr<communicator>> c) {
    REQUIRE(c.has_value());
    auto owned = over_fake(fake, std::move(*c));
    net::nccl_collectives& group = *owned;
    CHECK(group.rank() == r);
    CHECK(group.size() == ranks);
    CHECK(group.memory() == net::buffer_memory::device);
    std::vector<float> a{1.0f + static_cast<float>(r), -1.0f}, b{static_cast<float>(r)};
    const std::vector<std::int64_t> mine{r * 10 + 1, r * 10 + 2};
    std::vector<std::int64_t> gathered(2 * ranks);
    const std::uint8_t flag = r == 1 ? 1 : 0;
    std::vector<std::uint8_t> flags(ranks, 9);
    auto t1 = group.all_reduce_sum(a.data(), dtype::f32, 2);
    auto t2 = group.all_reduce_sum(b.data(), dtype::f32, 1);
    auto t3 = group.all_gather(gathered.data(), mine.data(), dtype::i64, 2);
    auto t4 = group.all_gather(flags.data(), &flag, dtype::u8, 1);
    REQUIRE((t1 && t2 && t3 && t4));
    CHECK(*t4 == *t1 + 3);
    // Waiting with a frozen clock: only the group's completion ends it.
    REQUIRE(group.wait(*t4));
    CHECK(group.wait(*t1)); // completed with it
    CHECK(a == std::vector<float>{6.0f, -3.0f});
    CHECK(b == std::vector<float>{3.0f});
    CHECK(gathered == std::vector<std::int64_t>{1, 2, 11, 12, 21, 22});
    CHECK(flags == std::vector<std::uint8_t>{0, 1, 0});
    const status bad = group.wait(*t4 + 1);
    REQUIRE_FALSE(bad);
    CHECK(bad.err().code == errc::invalid_argument);
  });
}

TEST_CASE("nccl_collectives: an asynchronous error or a refused operation breaks the group for good") {
  fake_controls fake;
  fake.set(0, 1, 6, -1); // rank 1 reports ncclRemoteError once its collective completed
  run_in_memory(2, [&](int r, expected<std::unique_ptr<communicator>> c) {
    REQUIRE(c.has_value());
    auto owned = over_fake(fake, std::move(*c));
    net::nccl_collectives& group = *owned;
    std::vector<float> data{1.0f};
    auto t = group.all_reduce_sum(data.data(), dtype::f32, 1);
    REQUIRE(t);
    const status s = group.wait(*t);
    if (r == 0) {
      CHECK(s);
      return;
    }
    REQUIRE_FALSE(s);
    CHECK(s.err().message.find("the collectives up to ticket 1 failed: NCCL result 6") != std::string::npos);
    auto after = group.all_reduce_sum(data.data(), dtype::f32, 1);
    REQUIRE_FALSE(after);
    CHECK(after.err().message == s.err().message); // the same error from then on
    CHECK(group.wait(*t).err().message == s.err().message);
  });
  fake.set(0, -1, 0, -1);
  // One rank: an operation refused on enqueue, here (an element type NCCL does not sum) or by
  // NCCL (the fake sums f32 only), breaks the group as a failed one does.
  struct refusal {
    dtype type;
    const char* named;
  };
  for (const refusal& r : {refusal{dtype::i64, "f32, f16 or bf16 only"},
                           refusal{dtype::bf16, "ncclAllReduce of 1 elements failed"}}) {
    CAPTURE(dtype_name(r.type));
    run_in_memory(1, [&](int, expected<std::unique_ptr<communicator>> c) {
      REQUIRE(c.has_value());
      auto group = over_fake(fake, std::move(*c));
      std::int64_t raw = 1; // room for one element of either type
      auto refused = group->all_reduce_sum(&raw, r.type, 1);
      REQUIRE_FALSE(refused);
      CHECK(refused.err().message.find(r.named) != std::string::npos);
      float data = 1.0f;
      auto later = group->all_reduce_sum(&data, dtype::f32, 1); // the group is broken
      REQUIRE_FALSE(later);
      CHECK(later.err().message == refused.err().message);
    });
  }
}

TEST_CASE("nccl_collectives: a rank that never comes ends the others' wait at the deadline, aborted") {
  fake_controls fake;
  const int aborts_before = fake.aborts();
  run_in_memory(2, [&](int r, expected<std::unique_ptr<communicator>> c) {
    REQUIRE(c.has_value());
    if (r == 1) return; // joined, then never enqueues
    auto owned = over_fake(fake, std::move(*c), 50ms, stepping_clock());
    net::nccl_collectives& group = *owned;
    std::vector<float> data{1.0f};
    auto t = group.all_reduce_sum(data.data(), dtype::f32, 1);
    REQUIRE(t);
    const status s = group.wait(*t);
    REQUIRE_FALSE(s);
    CHECK(s.err().message.find("did not finish within 50 ms; the communicator was aborted") != std::string::npos);
  });
  CHECK(fake.aborts() - aborts_before == 1);
}

TEST_CASE("nccl: the machine's own library, where one is installed, loads and reports its version") {
  std::string real;
  for (const char* p : {"/usr/local/cuda/lib64/libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2"})
    if (std::filesystem::exists(p)) real = p;
  if (real.empty()) {
    MESSAGE("no libnccl.so.2 on this machine: only the fake is tested");
    return;
  }
  auto lib = net::nccl::load_library(real);
  REQUIRE_MESSAGE(lib.has_value(), (lib ? "" : lib.err().to_string()));
  CHECK((*lib)->version >= 20900);
  MESSAGE("NCCL " << (*lib)->version << " from " << real);
}

} // namespace dsa::test
