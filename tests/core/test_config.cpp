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
