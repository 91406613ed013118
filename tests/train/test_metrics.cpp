// metrics.csv / metrics.jsonl: rows per step; a resumed run drops rows past its checkpoint.
#include "actors/train/metrics.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace dsa;

namespace {
train::metrics_row row(std::int64_t step) {
  return {step, step * 8, {{"Train/Samples/train_loss", 1.0 / static_cast<double>(step)}, {"Train/Samples/lr", 0.5}}};
}
} // namespace

TEST_CASE("a resumed run keeps the rows up to its checkpoint and appends after them") {
  test::temp_dir dir;
  {
    auto w = train::metrics_writer::open(dir.path());
    REQUIRE(w.has_value());
    for (int s = 1; s <= 5; ++s) REQUIRE(w->write(row(s)).has_value()); // a run that crashed after step 5
  }
  {
    auto w = train::metrics_writer::open_resumed(dir.path(), 3); // its checkpoint holds 3 steps
    REQUIRE(w.has_value());
    REQUIRE(w->write(row(4)).has_value());
  }
  auto csv = ckpt::read_file(dir.path() + "/metrics.csv");
  REQUIRE(csv.has_value());
  CHECK(*csv == "step,global_samples,Train/Samples/train_loss,Train/Samples/lr\n"
                "1,8,1,0.5\n2,16,0.5,0.5\n3,24,0.3333333333333333,0.5\n4,32,0.25,0.5\n");
  auto jsonl = ckpt::read_file(dir.path() + "/metrics.jsonl");
  REQUIRE(jsonl.has_value());
  CHECK(jsonl->find("\"step\":5") == std::string::npos);
  CHECK(jsonl->find("\"step\":4,\"global_samples\":32") != std::string::npos);
  CHECK(std::count(jsonl->begin(), jsonl->end(), '\n') == 4);
}
