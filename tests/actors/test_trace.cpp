// Trace: recorder across threads, binary round trip, format checks, Chrome JSON export.
#include "actors/trace/chrome_export.hpp"
#include "actors/trace/trace_analysis.hpp"
#include "actors/trace/trace_file.hpp"
#include "synthetic_run.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

using namespace dsa::actors;

namespace {

std::string temp_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / ("dsactor-test-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool same(const trace_record& a, const trace_record& b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

} // namespace

TEST_CASE("trace: records from several threads are all collected") {
  trace_recorder rec;
  rec.set_actor_name(0, "a");
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 3; ++t)
    threads.emplace_back([&rec, t] {
      for (std::uint32_t i = 0; i < 1000; ++i) trace_span span(&rec, trace_name::forward, t, 0, i, t);
    });
  for (auto& t : threads) t.join();
  auto data = rec.snapshot();
  CHECK(data.records.size() == 3000);
  for (std::size_t i = 1; i < data.records.size(); ++i) CHECK(data.records[i - 1].t0_ns <= data.records[i].t0_ns);
}

TEST_CASE("trace: a run's trace survives the binary round trip and exports to Chrome JSON") {
  pipeline_options options;
  options.stages = 2;
  options.micro_batches = 3;
  options.steps = 2;
  dsa::test::synthetic_pipeline pipe({4, 5, 3, 0.05}, options);
  const auto dir = temp_dir("roundtrip");
  auto result = dsa::test::run_synthetic(pipe, options, dir);
  REQUIRE(result.ok);
  CHECK(result.trace_error.empty());
  REQUIRE(std::filesystem::exists(result.trace_path));

  auto read = read_trace(result.trace_path);
  REQUIRE(read.has_value());
  CHECK(read->names == result.trace.names);
  CHECK(read->actors == result.trace.actors);
  CHECK(read->actors.at(3) == "stage 0");
  // The tracer actor wrote its snapshot before the system shut down: a prefix of the final trace.
  CHECK(stage_compute_spans(*read, 0).size() == 2 * 3 * 2);
  CHECK(stage_compute_spans(*read, 1).size() == 2 * 3 * 2);

  const auto path = dir + "/copy.dsat";
  REQUIRE(write_trace(path, result.trace).has_value());
  auto again = read_trace(path);
  REQUIRE(again.has_value());
  REQUIRE(again->records.size() == result.trace.records.size());
  for (std::size_t i = 0; i < again->records.size(); ++i) CHECK(same(again->records[i], result.trace.records[i]));

  auto json = nlohmann::json::parse(chrome_trace_json(result.trace));
  REQUIRE(json.contains("traceEvents"));
  int forwards = 0, backwards = 0, flows = 0;
  for (const auto& e : json["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "forward") {
      ++forwards;
      CHECK(e["args"].contains("stage"));
      CHECK(e["args"].contains("step"));
      CHECK(e["args"].contains("micro_batch"));
    }
    if (e["ph"] == "X" && e["name"] == "backward") ++backwards;
    if (e["ph"] == "s") ++flows;
  }
  CHECK(forwards == 2 * 3 * 2);
  CHECK(backwards == 2 * 3 * 2);
  CHECK(flows > 0);
  REQUIRE(write_chrome_trace(dir + "/trace.json", result.trace).has_value());
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace: the reader rejects a wrong magic, a newer version and a truncated file") {
  const auto dir = temp_dir("reject");
  trace_data data;
  data.names = {"forward"};
  data.actors = {"x"};
  data.records.resize(2);
  const auto path = dir + "/t.dsat";
  REQUIRE(write_trace(path, data).has_value());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto write_bytes = [&](const std::string& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  auto bad_magic = bytes;
  bad_magic[0] = 'X';
  write_bytes(bad_magic);
  CHECK(!read_trace(path).has_value());
  auto newer = bytes;
  newer[8] = 2;
  write_bytes(newer);
  auto r = read_trace(path);
  REQUIRE(!r.has_value());
  CHECK(r.err().message.find("version 2") != std::string::npos);
  write_bytes(bytes.substr(0, bytes.size() - 10));
  CHECK(!read_trace(path).has_value());
  write_bytes(bytes);
  CHECK(read_trace(path).has_value());
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace: idle fraction per stage lies in [0, 1]; bubble formula") {
  CHECK(theoretical_bubble(4, 8) == doctest::Approx(3.0 / 11.0));
  CHECK(theoretical_bubble(1, 8) == 0.0);
  pipeline_options options;
  options.stages = 4;
  options.micro_batches = 8;
  options.steps = 2;
  dsa::test::synthetic_pipeline pipe({4, 5, 3, 0.05}, options);
  auto result = dsa::test::run_synthetic(pipe, options);
  REQUIRE(result.ok);
  auto idle = stage_idle_fractions(result.trace, 4, 8);
  REQUIRE(idle.size() == 4);
  for (const auto& s : idle) {
    CHECK(s.idle_fraction >= 0.0);
    CHECK(s.idle_fraction <= 1.0);
  }
}
