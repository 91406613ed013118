// Data parallelism in one process: R replicas of the synthetic pipeline, each a
// thread running run_pipeline over a shared local_group, end with the parameters
// one replica reaches with R times the micro-batches (the same global batch).
#include "parameter_check.hpp"
#include "synthetic_run.hpp"
#include "io/net/local_transport.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

using namespace dsa::actors;
using dsa::test::synthetic_model;
using dsa::test::synthetic_pipeline;

namespace {

struct group_run {
  std::vector<std::unique_ptr<synthetic_pipeline>> pipes; // [rank]
  std::vector<run_result> results;                        // [rank]
};

// Runs `ranks` replicas of `model` with `options` (per-rank micro-batches) to the end.
// make_stage0 may wrap a rank's first stage compute (fault injection).
group_run run_group(synthetic_model model, const pipeline_options& options, int ranks,
                    std::int64_t bucket_elements = 500'000'000,
                    std::function<void(int, synthetic_pipeline&)> adjust = {}) {
  dsa::net::local_group group(ranks);
  group_run g;
  for (int r = 0; r < ranks; ++r) {
    model.dp_rank = r;
    model.dp_size = ranks;
    g.pipes.push_back(std::make_unique<synthetic_pipeline>(model, options));
    if (adjust) adjust(r, *g.pipes.back());
  }
  g.results.resize(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      run_options o;
      o.pipeline = options;
      o.trace = trace_mode::off;
      o.dp = {r, ranks, &group.at(r), bucket_elements};
      g.results[static_cast<std::size_t>(r)] = run_pipeline(o, g.pipes[static_cast<std::size_t>(r)]->parts());
    });
  for (auto& t : threads) t.join();
  return g;
}

bool same_bits(const std::vector<dsa::tensor>& a, const std::vector<dsa::tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() ||
        std::memcmp(a[i].raw_data(), b[i].raw_data(), static_cast<std::size_t>(a[i].numel()) * 4) != 0)
      return false;
  return true;
}

// Fails forward of `step` on the rank it wraps.
class throwing_stage : public stage_compute {
public:
  throwing_stage(std::unique_ptr<stage_compute> inner, std::uint32_t step) : inner_(std::move(inner)), step_(step) {}
  void reserve_stash(std::uint32_t slots) override { inner_->reserve_stash(slots); }
  double forward(const work_key& key, const std::vector<dsa::tensor>& in, const dsa::tensor& labels,
                 std::vector<dsa::tensor>& out) override {
    if (key.step == step_) throw std::runtime_error("injected fault");
    return inner_->forward(key, in, labels, out);
  }
  void backward(const work_key& key, const dsa::tensor& g, dsa::tensor& gi) override { inner_->backward(key, g, gi); }
  std::vector<dsa::tensor> parameters() override { return inner_->parameters(); }
  std::vector<dsa::tensor> gradients() override { return inner_->gradients(); }
  void load_parameters(const std::vector<dsa::tensor>& u) override { inner_->load_parameters(u); }

private:
  std::unique_ptr<stage_compute> inner_;
  std::uint32_t step_;
};

} // namespace

TEST_CASE("data parallel: 1, 2 and 4 ranks x 1 and 2 stages match one rank with the same global batch") {
  // One rank sums a step's R*M micro-batch gradients one after another; R ranks
  // sum M each and then add the R sums in rank order. The float sums differ only
  // in order, hence the layout_equivalence tolerance (relative 1e-5); the ranks
  // themselves end bit for bit alike, since every rank applies the same sums.
  const std::uint32_t M = 2, steps = 5;
  for (std::uint32_t S : {1u, 2u}) {
    for (int R : {1, 2, 4}) {
      CAPTURE(S);
      CAPTURE(R);
      const synthetic_model model{4, 5, 3, 0.05};
      const auto reference = dsa::test::run_reference(model, M * static_cast<std::uint32_t>(R), steps);
      auto g = run_group(model, {S, M, steps}, R);
      for (int r = 0; r < R; ++r) {
        CAPTURE(r);
        const auto& res = g.results[static_cast<std::size_t>(r)];
        CAPTURE(res.error);
        REQUIRE(res.ok);
        CHECK(res.steps_completed == steps);
        dsa::test::check_parameters_close(g.pipes[static_cast<std::size_t>(r)]->parameters(), reference.parameters);
        CHECK(same_bits(g.pipes[static_cast<std::size_t>(r)]->parameters(), g.pipes[0]->parameters()));
        // The reported loss is the group's mean micro-batch loss, as one rank reports it (the
        // parameters it is computed with differ in the last bits, hence the tolerance).
        REQUIRE(res.losses.size() == steps);
        for (std::uint32_t k = 0; k < steps; ++k) CHECK(res.losses[k] == doctest::Approx(reference.losses[k]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("data parallel: with clipping and a tied pair across 2 stages, 2 ranks match one rank") {
  synthetic_model model{4, 5, 3, 0.05};
  model.tie_ends = true;
  model.clip = 0.05; // small enough that every step clips
  const std::uint32_t M = 3, steps = 4;
  const auto reference = dsa::test::run_reference(model, 2 * M, steps);
  auto g = run_group(model, {2, M, steps}, 2);
  for (int r = 0; r < 2; ++r) {
    const auto& res = g.results[static_cast<std::size_t>(r)];
    CAPTURE(res.error);
    REQUIRE(res.ok);
    dsa::test::check_parameters_close(g.pipes[static_cast<std::size_t>(r)]->parameters(), reference.parameters);
  }
  CHECK(same_bits(g.pipes[1]->parameters(), g.pipes[0]->parameters()));
}

TEST_CASE("data parallel: the bucket size changes how gradients are packed, not the result") {
  const synthetic_model model{4, 5, 3, 0.05};
  auto whole = run_group(model, {2, 2, 3}, 2);
  auto tiny = run_group(model, {2, 2, 3}, 2, 7); // 7 elements: every 5x5 weight alone, split from its neighbours
  auto mid = run_group(model, {2, 2, 3}, 2, 50); // two weights per bucket
  for (auto* g : {&whole, &tiny, &mid})
    for (const auto& res : g->results) REQUIRE(res.ok);
  CHECK(same_bits(tiny.pipes[0]->parameters(), whole.pipes[0]->parameters()));
  CHECK(same_bits(mid.pipes[1]->parameters(), whole.pipes[0]->parameters()));
}

TEST_CASE("data parallel: a failure on one rank fails every rank's run instead of leaving it waiting") {
  const synthetic_model model{4, 5, 3, 0.05};
  auto g = run_group(model, {2, 2, 4}, 3, 500'000'000, [](int r, synthetic_pipeline& p) {
    if (r == 1) p.stages[0] = std::make_unique<throwing_stage>(std::move(p.stages[0]), 2);
  });
  const auto& bad = g.results[1];
  CHECK_FALSE(bad.ok);
  CHECK(bad.error.find("stage 0 of rank 1 failed in step 2") != std::string::npos);
  CHECK(bad.error.find("injected fault") != std::string::npos);
  for (int r : {0, 2}) {
    const auto& res = g.results[static_cast<std::size_t>(r)];
    CAPTURE(res.error);
    CHECK_FALSE(res.ok);
    // The others learn it from the aborted group: the reason names rank 1.
    CHECK(res.error.find("rank 1 failed") != std::string::npos);
    CHECK(res.steps_completed <= 2);
  }
}
