// Config access: typed reads by key path, errors naming file/key/line, unknown keys.
#include "core/config.hpp"

#include <doctest/doctest.h>

using namespace dsa;

namespace {
const char* sample = R"(train_batch_size = 32
steps_per_print = 10

[optimizer]
type = "Adam"
[optimizer.params]
lr = 1e-4
betas = [0.9, 0.999]
weight_decay = 0
)";
}

TEST_CASE("typed reads by key path") {
  config c = *config::parse(sample, "run.toml");
  CHECK(*c.get<std::int64_t>("train_batch_size") == 32);
  CHECK(*c.get<std::string>("optimizer.type") == "Adam");
  CHECK(*c.get<double>("optimizer.params.lr") == doctest::Approx(1e-4));
  CHECK(*c.get<double>("optimizer.params.weight_decay") == 0.0); // integer accepted as number
  CHECK(c.get<std::vector<double>>("optimizer.params.betas")->size() == 2);
  CHECK(*c.get_or<bool>("fp16.enabled", false) == false);
}

TEST_CASE("type errors and missing keys name the file, the line and the key") {
  config c = *config::parse(sample, "run.toml");
  auto bad = c.get<std::int64_t>("optimizer.type");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message == "run.toml:5: key 'optimizer.type': expected an integer, found a string");
  auto missing = c.get<double>("optimizer.params.eps");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message.find("missing required key 'optimizer.params.eps'") != std::string::npos);
}

TEST_CASE("unknown keys are rejected with the nearest known key") {
  config c = *config::parse("train_batch_size = 8\ntrain_micro_batch_size_per_gpuu = 2\n", "x.toml");
  (void)c.get_or<std::int64_t>("train_batch_size", 1);
  (void)c.get_or<std::int64_t>("train_micro_batch_size_per_gpu", 1);
  auto s = c.reject_unknown();
  REQUIRE_FALSE(s.has_value());
  CHECK(s.err().message ==
        "x.toml:2: key 'train_micro_batch_size_per_gpuu': unknown key (did you mean 'train_micro_batch_size_per_gpu'?)");
}

TEST_CASE("accepted subtrees and read keys pass the unknown-key check") {
  config c = *config::parse(sample, "run.toml");
  (void)c.get<std::int64_t>("train_batch_size");
  (void)c.get<std::int64_t>("steps_per_print");
  c.accept("optimizer");
  CHECK(c.reject_unknown().has_value());
}

TEST_CASE("command-line overrides set typed values and create tables") {
  config c = *config::parse(sample, "run.toml");
  CHECK(c.set_override("optimizer.params.lr=3e-5").has_value());
  CHECK(*c.get<double>("optimizer.params.lr") == doctest::Approx(3e-5));
  CHECK(c.set_override("fp16.enabled=true").has_value());
  CHECK(*c.get<bool>("fp16.enabled"));
  CHECK(c.set_override("run_dir=runs/x").has_value()); // not TOML: taken as a string
  CHECK(*c.get<std::string>("run_dir") == "runs/x");
  CHECK_FALSE(c.set_override("novalue").has_value());
  // An error about an overridden key names the flag, not the file.
  REQUIRE(c.set_override("train_batch_size=\"many\"").has_value());
  auto bad = c.get<std::int64_t>("train_batch_size");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.find("--set train_batch_size=\"many\"") != std::string::npos);
  CHECK_FALSE(c.set_override("train_batch_size.x=1").has_value());
}

TEST_CASE("parse errors name the file and position") {
  auto bad = config::parse("a = [1, 2\n", "broken.toml");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.rfind("broken.toml:", 0) == 0);
}

TEST_CASE("reads record every problem and go on, each with file, line and key") {
  config c = *config::parse(R"(lr = "fast"
steps = 3
stepz = 4
[opt]
kind = "x"
betas = [0.9, "b"]
)",
                            "run.toml");
  config_problems problems;
  double lr = 1.0;
  c.read("lr", lr, problems);
  CHECK(lr == 1.0); // a bad value keeps the default
  std::int64_t steps = 0, missing = 7;
  c.read("steps", steps, problems);
  CHECK(steps == 3);
  c.require("opt.weight", missing, problems);
  CHECK(missing == 7);
  std::vector<double> betas;
  c.read("opt.betas", betas, problems);
  c.check_unknown(problems); // stepz and opt.kind
  auto all = problems.sorted();
  REQUIRE(all.size() == 5);
  CHECK(all[0].to_string() == "run.toml:3: key 'stepz': unknown key (did you mean 'steps'?)");
  CHECK(all[1].to_string() == "run.toml:5: key 'opt.kind': unknown key");
  CHECK(all[1].kind == problem_kind::unknown_key);
  // An absent key is placed at the line of its table.
  CHECK(all[2].to_string() ==
        "run.toml:4: key 'opt.weight': required key is missing (expected an integer)");
  CHECK(all[2].kind == problem_kind::missing_key);
  CHECK(all[3].to_string() == "run.toml:1: key 'lr': expected a number, found a string");
  CHECK(all[4].to_string() ==
        "run.toml:6: key 'opt.betas': element 1 should be a number, found a string");
  CHECK(all[4].kind == problem_kind::invalid_value);
  CHECK(all[4].line == 6);
  CHECK(all[4].origin == "run.toml");
}

TEST_CASE("config_problems: unknown, then missing, then invalid; by line within a kind") {
  config c = *config::parse("a = 1\nb = 2\nc = 3\n[t]\nd = 4\n", "x.toml");
  config_problems problems;
  CHECK(problems.to_status().has_value());
  problems.add(c.problem(problem_kind::invalid_value, "c", "too big"));
  problems.add(c.problem(problem_kind::invalid_value, "a", "too small"));
  problems.add(c.problem(problem_kind::missing_key, "t.e", "required"));
  problems.add(c.problem(problem_kind::unknown_key, "t.d", "unknown key"));
  problems.add(c.problem(problem_kind::unknown_key, "b", "unknown key"));
  problems.add(
      c.problem(problem_kind::unknown_key, "b", "unknown key (again)")); // one per key and kind
  problems.add(make_error(errc::config, "override 'x': expected key=value"));
  auto s = problems.to_status();
  REQUIRE_FALSE(s.has_value());
  CHECK(s.err().code == errc::config);
  CHECK(s.err().message == "6 problems in the configuration:\n"
                           "  x.toml:2: key 'b': unknown key\n"
                           "  x.toml:5: key 't.d': unknown key\n"
                           "  x.toml:4: key 't.e': required\n"
                           "  x.toml:1: key 'a': too small\n"
                           "  x.toml:3: key 'c': too big\n"
                           "  override 'x': expected key=value");
}

TEST_CASE("every unknown key is reported, not only the first") {
  config c = *config::parse("train_stepz = 1\nseed = 2\ntrain_batch_sise = 3\n", "x.toml");
  (void)c.get_or<std::int64_t>("train_steps", 0);
  (void)c.get_or<std::int64_t>("train_batch_size", 0);
  (void)c.get_or<std::int64_t>("seed", 0);
  auto s = c.reject_unknown();
  REQUIRE_FALSE(s.has_value());
  CHECK(s.err().message ==
        "2 problems in the configuration:\n"
        "  x.toml:1: key 'train_stepz': unknown key (did you mean 'train_steps'?)\n"
        "  x.toml:3: key 'train_batch_sise': unknown key (did you mean 'train_batch_size'?)");
}

TEST_CASE("a problem about a key set by --set names the flag and has no line") {
  config c = *config::parse("a = 1\n", "x.toml");
  REQUIRE(c.set_override("b.c=\"text\"").has_value());
  config_problems problems;
  std::int64_t v = 0;
  c.read("b.c", v, problems);
  c.read("a", v, problems);
  problems.add(c.problem(problem_kind::invalid_value, "a", "must be even"));
  auto all = problems.sorted();
  REQUIRE(all.size() == 2);
  CHECK(all[0].to_string() ==
        "x.toml:1: key 'a': must be even"); // lines first, then keys without one
  CHECK(all[1].to_string() == "--set b.c=\"text\": key 'b.c': expected an integer, found a string");
  CHECK(all[1].line == 0);
}
