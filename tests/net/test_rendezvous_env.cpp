// The launcher's environment variables (read_rendezvous_env) and the frame decoders on
// malformed input.
#include "io/net/rendezvous_env.hpp"
#include "io/net/rendezvous_frame.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace dsa::test {
namespace {

const char* const names[] = {
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",    "LOCAL_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "DSA_JOB_TOKEN", "DSA_HEARTBEAT_TIMEOUT_MS",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_LOCALID"};

// Sets the variables of a good 4-rank environment for rank 2; restores them on destruction.
struct scoped_env {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  scoped_env() {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
    }
    set("RANK", "2");
    set("WORLD_SIZE", "4");
    set("LOCAL_RANK", "2");
    set("LOCAL_SIZE", "4");
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", "29500");
    set("DSA_JOB_TOKEN", "abc");
    for (const char* n : {"DSA_HEARTBEAT_TIMEOUT_MS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_LOCALID"})
      ::unsetenv(n);
  }
  ~scoped_env() {
    for (auto& [n, v] : saved)
      v ? ::setenv(n.c_str(), v->c_str(), 1) : ::unsetenv(n.c_str());
  }
  static void set(const char* n, const char* v) { ::setenv(n, v, 1); }
};

TEST_CASE("rendezvous env: unset WORLD_SIZE is a single-process run") {
  scoped_env env;
  ::unsetenv("WORLD_SIZE");
  auto r = net::read_rendezvous_env();
  REQUIRE(r.has_value());
  CHECK_FALSE(r->has_value());
}

TEST_CASE("rendezvous env: under mpirun or srun the rank comes from OpenMPI's or Slurm's variables") {
  scoped_env env;
  ::unsetenv("RANK");
  ::unsetenv("LOCAL_RANK");
  ::unsetenv("LOCAL_SIZE");
  scoped_env::set("OMPI_COMM_WORLD_RANK", "3");
  scoped_env::set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  scoped_env::set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  auto r = net::read_rendezvous_env();
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  CHECK((**r).rank == 3);
  CHECK((**r).local_rank == 1);
  CHECK((**r).local_size == 2);
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    ::unsetenv(n);
  scoped_env::set("SLURM_PROCID", "1");
  scoped_env::set("SLURM_LOCALID", "0");
  r = net::read_rendezvous_env();
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  CHECK((**r).rank == 1);
  CHECK((**r).local_rank == 0);
  CHECK_FALSE((**r).local_size.has_value());
  // RANK wins over the others; none set names RANK.
  scoped_env::set("RANK", "2");
  r = net::read_rendezvous_env();
  REQUIRE(r.has_value());
  CHECK((**r).rank == 2);
  ::unsetenv("RANK");
  ::unsetenv("SLURM_PROCID");
  r = net::read_rendezvous_env();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().message.find("RANK is not set") != std::string::npos);
}

TEST_CASE("rendezvous env: a complete environment is read") {
  scoped_env env;
  auto r = net::read_rendezvous_env();
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  const auto& e = **r;
  CHECK(e.rank == 2);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 2);
  CHECK(e.local_size == 4);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == 29500);
  CHECK(e.job_token == "abc");
  CHECK_FALSE(e.heartbeat_timeout.has_value());
  CHECK(net::make_rendezvous_options(e).heartbeat_timeout == std::chrono::seconds(10));
  auto req = net::make_join_request(e, {{"k", "v"}}, {});
  CHECK(req.port == 29500);
  CHECK(req.rank == 2);
}

TEST_CASE("rendezvous env: the launcher's heartbeat timeout sets the ranks' options") {
  scoped_env env;
  scoped_env::set("DSA_HEARTBEAT_TIMEOUT_MS", "2000");
  auto r = net::read_rendezvous_env();
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  auto options = net::make_rendezvous_options(**r);
  CHECK(options.heartbeat_timeout == std::chrono::milliseconds(2000));
  CHECK(options.heartbeat_interval == std::chrono::milliseconds(500));
  scoped_env::set("DSA_HEARTBEAT_TIMEOUT_MS", "soon");
  auto bad = net::read_rendezvous_env();
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message == "DSA_HEARTBEAT_TIMEOUT_MS='soon' is not an integer in 1..86400000");
}

TEST_CASE("rendezvous env: a missing or malformed variable is an error naming it") {
  for (const char* n : {"RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DSA_JOB_TOKEN"}) {
    CAPTURE(n);
    scoped_env env;
    ::unsetenv(n);
    auto r = net::read_rendezvous_env();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().message == std::string(n) + " is not set (it is set by 'dsactor launch')");
  }
  struct bad {
    const char* name;
    const char* value;
    const char* message;
  };
  for (auto b : {bad{"RANK", "4", "RANK='4' is not an integer in 0..3"},
                 bad{"RANK", "x", "RANK='x' is not an integer in 0..3"},
                 bad{"WORLD_SIZE", "0", "WORLD_SIZE='0' is not an integer in 1..1048576"},
                 bad{"MASTER_PORT", "70000", "MASTER_PORT='70000' is not an integer in 1..65535"},
                 bad{"MASTER_PORT", "12ab", "MASTER_PORT='12ab' is not an integer in 1..65535"},
                 bad{"LOCAL_SIZE", "2", "LOCAL_RANK=2 is not below LOCAL_SIZE=2"},
                 bad{"DSA_JOB_TOKEN", "", "DSA_JOB_TOKEN is set but empty"}}) {
    CAPTURE(b.name);
    scoped_env env;
    scoped_env::set(b.name, b.value);
    auto r = net::read_rendezvous_env();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().message == b.message);
  }
}

TEST_CASE("rendezvous frames: decoders reject truncated and forged payloads") {
  net::hello_msg h{"tok", 1, 2, {{"a", "1"}}, {std::byte{7}}};
  net::bytes good = net::encode_hello(h);
  auto back = net::decode_hello(good);
  REQUIRE(back.has_value());
  CHECK(back->job_token == "tok");
  CHECK(back->config.at("a") == "1");
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    net::bytes shorter(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
    CHECK_FALSE(net::decode_hello(shorter).has_value());
  }
  net::bytes longer = good;
  longer.push_back(std::byte{0});
  CHECK_FALSE(net::decode_hello(longer).has_value());
  // A blob count far beyond the payload is refused before anything is reserved.
  net::bytes forged = {std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0x7f}};
  CHECK_FALSE(net::decode_blobs(forged).has_value());
  // A clock message is two u64s, exactly.
  net::bytes clock = net::encode_clock({0x0102030405060708ull, 0xfffffffffffffff0ull});
  REQUIRE(clock.size() == 16);
  auto tick = net::decode_clock(clock);
  REQUIRE(tick.has_value());
  CHECK(tick->sequence == 0x0102030405060708ull);
  CHECK(tick->steady_ns == 0xfffffffffffffff0ull);
  for (std::size_t cut = 0; cut < clock.size(); ++cut)
    CHECK_FALSE(net::decode_clock(net::bytes(clock.begin(), clock.begin() + static_cast<std::ptrdiff_t>(cut))).has_value());
  clock.push_back(std::byte{0});
  CHECK_FALSE(net::decode_clock(clock).has_value());
  // Frames: an oversized length and an unknown type are errors, not waits.
  net::frame_buffer fb;
  net::bytes big = {std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0xff}};
  fb.append(big.data(), big.size());
  CHECK_FALSE(fb.next(net::max_frame_bytes, "peer").has_value());
  net::frame_buffer unknown;
  net::bytes odd = {std::byte{1}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{99}};
  unknown.append(odd.data(), odd.size());
  CHECK_FALSE(unknown.next(net::max_frame_bytes, "peer").has_value());
}

TEST_CASE("rendezvous: summarize_config flattens a table to key paths and TOML texts") {
  auto t = toml::parse(R"(
train_steps = 4
run_dir = "runs/x"
[optimizer]
type = "Adam"
params = { lr = 0.001, betas = [0.9, 0.999] }
groups = [{ name = "a", decay = true }]
)");
  auto s = net::summarize_config(t);
  CHECK(s.size() == 6);
  CHECK(s.at("optimizer.groups") == "[{decay = true, name = \"a\"}]"); // keys sorted
  CHECK(s.at("train_steps") == "4");
  CHECK(s.at("run_dir") == "\"runs/x\"");
  CHECK(s.at("optimizer.type") == "\"Adam\"");
  CHECK(s.at("optimizer.params.lr") == "0.001");
  CHECK(s.at("optimizer.params.betas") == "[0.9, 0.999]");
}

} // namespace
} // namespace dsa::test
