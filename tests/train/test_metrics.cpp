// metrics.csv / metrics.jsonl: rows per step; a resumed run drops rows past its checkpoint.
#include "actors/train/run/metrics.hpp"
#include "actors/train/stage/step_stats.hpp"
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

TEST_CASE("step totals: per-micro-batch losses summed as forward metrics read back exactly") {
  dsa::bert::bert_losses a, b;
  a.total = 2.5;
  a.mlm_loss = 2.0;
  a.nsp_loss = 0.5;
  a.mlm_count = 20;
  a.mlm_correct = 3;
  a.nsp_count = 8;
  a.nsp_correct = 5;
  b.total = 1.5;
  b.start_count = 4;
  b.start_correct = 1;
  b.end_count = 4;
  b.end_correct = 2;
  auto sum = dsa::train::forward_metrics_of(a);
  const auto second = dsa::train::forward_metrics_of(b);
  REQUIRE(sum.size() == second.size());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += second[i];
  const auto t = dsa::train::step_totals_of(sum);
  CHECK(t.micro_batches == 2);
  CHECK(t.mean_loss() == 2.0);
  CHECK(t.mlm_loss_sum == 2.0);
  CHECK(t.nsp_loss_sum == 0.5);
  CHECK(t.mlm_count == 20);
  CHECK(t.mlm_correct == 3);
  CHECK(t.nsp_count == 8);
  CHECK(t.nsp_correct == 5);
  CHECK(t.span_count == 8);
  CHECK(t.span_correct == 3);
  CHECK(dsa::train::step_totals_of({}).micro_batches == 0);
}
