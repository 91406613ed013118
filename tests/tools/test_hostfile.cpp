// Host lists for `dsactor launch --hostfile` (tools/launch/hostfile.hpp), with DeepSpeed's rules:
// the file's syntax and its errors, --include/--exclude specs, --num_nodes/--num_gpus and
// the flags that exclude each other.
#include "tools/launch/hostfile.hpp"

#include <doctest/doctest.h>

#include <string>

namespace dsa::tools {
namespace {

std::vector<host_entry> three_hosts() {
  auto h = parse_hostfile("# the cluster\nworker-0 slots=2\n\nworker-1 slots=4  # four\nworker-2 slots=1\n", "hf");
  REQUIRE(h.has_value());
  return *h;
}

std::string error_of(const std::string& text) {
  auto h = parse_hostfile(text, "/tmp/hf");
  REQUIRE_FALSE(h.has_value());
  return h.err().message;
}

std::string selected(const host_filter& f) {
  auto s = select_hosts(three_hosts(), f);
  if (!s) return "error: " + s.err().message;
  std::string out;
  for (const auto& h : *s) {
    out += h.host + ":";
    for (int slot : h.slots) out += std::to_string(slot);
    out += " ";
  }
  return out;
}

} // namespace

TEST_CASE("hostfile: hosts and slots in file order; comments and blank lines skipped") {
  const auto h = three_hosts();
  REQUIRE(h.size() == 3);
  CHECK(h[0].host == "worker-0");
  CHECK(h[0].slots == 2);
  CHECK(h[1].slots == 4);
  CHECK(h[2].host == "worker-2");
}

TEST_CASE("hostfile: a malformed line, a duplicate host, slots=0 and an empty file are errors naming file and line") {
  CHECK(error_of("a slots=1\nb slot=2\n") == "hostfile /tmp/hf line 2: 'b slot=2' is not 'HOST slots=N'");
  CHECK(error_of("a slots=x\n").find("line 1: 'a slots=x' is not") != std::string::npos);
  CHECK(error_of("a slots=1 extra\n").find("is not 'HOST slots=N'") != std::string::npos);
  CHECK(error_of("a\n").find("line 1: 'a' is not") != std::string::npos);
  CHECK(error_of("a slots=1\n\na slots=2\n") == "hostfile /tmp/hf line 3: host a is listed twice");
  CHECK(error_of("a slots=0\n") == "hostfile /tmp/hf line 1: a has slots=0");
  CHECK(error_of("# nothing\n\n") == "hostfile /tmp/hf lists no hosts");
  CHECK(error_of("") == "hostfile /tmp/hf lists no hosts");
  auto missing = read_hostfile("/nonexistent/hostfile");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message == "hostfile /nonexistent/hostfile: cannot be read");
}

TEST_CASE("hostfile: --include and --exclude pick hosts and slots, in hostfile order") {
  CHECK(selected({}) == "worker-0:01 worker-1:0123 worker-2:0 ");
  CHECK(selected({"worker-2@worker-1:0,2", "", {}, {}}) == "worker-1:02 worker-2:0 ");
  CHECK(selected({"worker-0", "", {}, {}}) == "worker-0:01 ");
  CHECK(selected({"", "worker-1:0,3", {}, {}}) == "worker-0:01 worker-1:12 worker-2:0 ");
  CHECK(selected({"", "worker-2@worker-0:1", {}, {}}) == "worker-0:0 worker-1:0123 ");
  CHECK(selected({"", "worker-0@worker-1@worker-2", {}, {}}) == "error: the host filters leave no slot to run on");
}

TEST_CASE("hostfile: --num_nodes takes the first hosts, --num_gpus the first slots of each") {
  CHECK(selected({"", "", 2, {}}) == "worker-0:01 worker-1:0123 ");
  CHECK(selected({"", "", {}, 2}) == "worker-0:01 worker-1:01 worker-2:0 ");
  CHECK(selected({"", "", 1, 1}) == "worker-0:0 ");
  CHECK(selected({"", "", 0, {}}) == "error: --num_nodes 0: at least 1");
  CHECK(selected({"", "", {}, 0}) == "error: --num_gpus 0: at least 1");
}

TEST_CASE("hostfile: unknown hosts and slots, malformed specs and exclusive flags are errors naming them") {
  CHECK(selected({"worker-9", "", {}, {}}) == "error: --include: unknown host worker-9 (not in the hostfile)");
  CHECK(selected({"", "worker-1:4", {}, {}}) == "error: --exclude: host worker-1 has no slot 4 (slots=0..3)");
  CHECK(selected({"worker-1:a", "", {}, {}}) == "error: --include 'worker-1:a': slot 'a' of worker-1 is not a number");
  CHECK(selected({"worker-1:", "", {}, {}}) == "error: --include 'worker-1:': worker-1: no slots after ':'");
  CHECK(selected({":0", "", {}, {}}) == "error: --include ':0': a node without a host name");
  CHECK(selected({"worker-0", "worker-1", {}, {}}) == "error: --include and --exclude are mutually exclusive");
  CHECK(selected({"worker-0", "", 1, {}}) ==
        "error: --include/--exclude cannot be combined with --num_nodes or --num_gpus");
}

TEST_CASE("a restart takes the hosts that answer, up to --max_procs, and a lost host rejoins") {
  const std::vector<host_slots> original{{"a", {0, 1}}, {"b", {0, 1}}, {"c", {0, 1}}};
  auto names = [](const restart_choice& c) {
    std::string out;
    for (const auto& h : c.hosts) out += fmt::format("{}:{} ", h.host, h.slots.size());
    return out;
  };
  // b lost: a and c, 4 processes.
  auto first = choose_restart_hosts(original, {true, false, true}, original, 6);
  CHECK(names(first) == "a:2 c:2 ");
  CHECK(first.procs == 4);
  CHECK(first.dropped == "b");
  CHECK(first.rejoined.empty());
  // b answers again at the next restart: it rejoins, in list order.
  auto second = choose_restart_hosts(original, {true, true, true}, first.hosts, 6);
  CHECK(names(second) == "a:2 b:2 c:2 ");
  CHECK(second.rejoined == "b");
  CHECK(second.dropped.empty());
  // --max_procs 3: the hosts in list order, the last one's first slot only.
  auto capped = choose_restart_hosts(original, {true, true, true}, first.hosts, 3);
  CHECK(names(capped) == "a:2 b:1 ");
  CHECK(capped.procs == 3);
  CHECK(capped.hosts[1].slots == std::vector<int>{0});
  // Nothing answers: no hosts, every one dropped.
  auto none = choose_restart_hosts(original, {false, false, false}, original, 6);
  CHECK(none.hosts.empty());
  CHECK(none.procs == 0);
  CHECK(none.dropped == "a, b, c");
}

} // namespace dsa::tools
