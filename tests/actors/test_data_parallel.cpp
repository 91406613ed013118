// Data parallelism in one process: R replicas of the synthetic pipeline, each a
// thread running run_pipeline over a shared local_group, end with the parameters
// one replica reaches with R times the micro-batches (the same global batch).
#include "parameter_check.hpp"
#include "synthetic_run.hpp"
#include "stage_faults.hpp"
#include "actors/stage_runner.hpp"
#include "actors/trace/trace_analysis.hpp"
#include "actors/trace/analysis/trace_check.hpp"
#include "io/net/local_transport.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <thread>

#include <unistd.h>

using namespace dsa::actors;
using dsa::test::synthetic_model;
using dsa::test::synthetic_pipeline;
using dsa::test::delegating_stage;
using dsa::test::throwing_stage;

namespace {

struct group_run {
  std::vector<std::unique_ptr<synthetic_pipeline>> pipes; // [rank]
  std::vector<run_result> results;                        // [rank]
};

// Runs `ranks` replicas of `model` with `options` (per-rank micro-batches) to the end.
// make_stage0 may wrap a rank's first stage compute (fault injection).
group_run run_group(synthetic_model model, const pipeline_options& options, int ranks,
                    std::int64_t bucket_elements = 500'000'000,
                    std::function<void(int, synthetic_pipeline&)> adjust = {}, bool overlap = false,
                    trace_mode trace = trace_mode::off,
                    std::function<void(int, const run_result&)> on_rank_done = {},
                    std::chrono::milliseconds watchdog = std::chrono::milliseconds(60000),
                    std::function<void(int, run_options&)> configure = {}) {
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
      o.trace = trace;
      o.dp = {r, ranks, &group.at(r), bucket_elements, overlap};
      o.watchdog = watchdog;
      if (configure) configure(r, o);
      g.results[static_cast<std::size_t>(r)] = run_pipeline(o, g.pipes[static_cast<std::size_t>(r)]->parts());
      if (on_rank_done) on_rank_done(r, g.results[static_cast<std::size_t>(r)]);
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


// A flag one thread sets and others wait for.
class latch {
public:
  void set() {
    std::lock_guard<std::mutex> lock(mutex_);
    set_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return set_; });
  }
  bool wait_for(std::chrono::seconds bound) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, bound, [&] { return set_; });
  }

private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};


// Blocks forward of `step` until released (a rank that stops answering).
class hanging_stage : public delegating_stage {
public:
  hanging_stage(std::unique_ptr<stage_compute> inner, std::uint32_t step)
      : delegating_stage(std::move(inner)), step_(step) {}
  void release() { released_.set(); }
  double forward(const work_key& key, const std::vector<dsa::tensor>& in, const dsa::tensor& labels,
                 std::vector<dsa::tensor>& out) override {
    if (key.step == step_) released_.wait();
    return delegating_stage::forward(key, in, labels, out);
  }

private:
  std::uint32_t step_;
  latch released_;
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

TEST_CASE("data parallel: overlap_comm sends buckets during backward; the result is the same bit for bit") {
  const synthetic_model model{4, 5, 3, 0.05};
  const std::uint32_t steps = 3;
  for (std::uint32_t S : {1u, 2u}) {
    CAPTURE(S);
    const pipeline_options options{S, 2, steps};
    auto plain = run_group(model, options, 2, 25); // each 5x5 layer its own bucket
    auto overlapped = run_group(model, options, 2, 25, {}, true, trace_mode::record);
    for (int r = 0; r < 2; ++r) {
      REQUIRE(plain.results[static_cast<std::size_t>(r)].ok);
      REQUIRE(overlapped.results[static_cast<std::size_t>(r)].ok);
      CHECK(same_bits(overlapped.pipes[static_cast<std::size_t>(r)]->parameters(), plain.pipes[0]->parameters()));
    }
    // Every stage's reducer summed one bucket per layer per step, bucket 0 (the last layer) first.
    const auto& trace = overlapped.results[0].trace;
    const std::uint32_t per_stage = model.layers / S;
    for (std::uint32_t s = 0; s < S; ++s) {
      std::vector<std::uint32_t> order;
      for (const auto& r : trace.records)
        if (r.kind == static_cast<std::uint8_t>(trace_kind::span) && trace.names[r.name] == "allreduce" &&
            r.stage == static_cast<std::int32_t>(s) && r.step == 1)
          order.push_back(r.micro_batch);
      std::vector<std::uint32_t> want(per_stage);
      for (std::uint32_t b = 0; b < per_stage; ++b) want[b] = b;
      CHECK(order == want);
    }
  }
}

namespace {
// A stage compute that reports each parameter final during backward and records
// which buckets the runner had handed on by then.
class reporting_compute : public stage_compute {
public:
  explicit reporting_compute(std::vector<std::uint32_t>& sent) : sent_(sent) {}
  void reserve_stash(std::uint32_t) override {}
  double forward(const work_key&, const std::vector<dsa::tensor>&, const dsa::tensor&, std::vector<dsa::tensor>&) override {
    return 0;
  }
  void backward(const work_key&, const dsa::tensor&, dsa::tensor&) override {
    for (std::size_t i = params_.size(); i-- > 0;) {
      if (final_) final_(i, i + 1);
      seen_during.push_back(sent_.size());
    }
  }
  std::vector<dsa::tensor> parameters() override { return params_; }
  std::vector<dsa::tensor> gradients() override { return params_; }
  void load_parameters(const std::vector<dsa::tensor>&) override {}
  void set_gradients_final(gradients_final_fn f) override { final_ = std::move(f); }
  std::vector<std::size_t> seen_during; // buckets sent after each parameter was reported

private:
  std::vector<std::uint32_t>& sent_;
  std::vector<dsa::tensor> params_{dsa::tensor::zeros({3}, dsa::dtype::f32), dsa::tensor::zeros({4}, dsa::dtype::f32),
                                   dsa::tensor::zeros({5}, dsa::dtype::f32)};
  gradients_final_fn final_;
};
} // namespace

TEST_CASE("stage runner: with overlap each bucket goes out as soon as its parameters are final, in order") {
  // Buckets of 5 elements from the last parameter: {2}, {1}, {0}.
  const auto buckets = make_grad_buckets({3, 4, 5}, 5);
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0].first == 2);
  CHECK(buckets[2].last == 1);
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    auto slots = std::make_shared<slot_table>();
    pipeline_options po;
    po.grad_buckets = {buckets};
    const auto plan = make_plan(po, *slots);
    std::vector<std::uint32_t> sent;
    reporting_compute compute(sent);
    stage_runner runner(slots, stage_edges_of(plan, 0), &compute, nullptr, plan.stage_id(0), 0, buckets, overlap);
    runner.set_sender([&](std::uint32_t, std::uint32_t b) { sent.push_back(b); });
    stage_work w;
    w.kind = work_kind::backward;
    w.last_of_step = true;
    w.stash_slot = 0;
    runner.run(w);
    CHECK(sent == std::vector<std::uint32_t>{0, 1, 2});
    // With overlap bucket b is out right after its parameter is reported; without, none before the end.
    CHECK(compute.seen_during == (overlap ? std::vector<std::size_t>{1, 2, 3} : std::vector<std::size_t>{0, 0, 0}));
    CHECK(slots->at({plan.grads_edges[0], 0}).size() == 1);
    CHECK(slots->at({plan.grads_edges[0], 2}).at(0).numel() == 3);
  }
}

TEST_CASE("data parallel: a rank that stops answering fails the others by their watchdog, not a hang") {
  // Rank 1's forward of step 2 blocks. Rank 0 waits in its collectives; its watchdog
  // (3 s here) fails its run and aborts the group. Rank 1 is released once rank 0 has
  // returned, so its run can end too (it fails: the group is gone).
  const synthetic_model model{4, 5, 3, 0.05};
  hanging_stage* hung = nullptr;
  auto g = run_group(
      model, {1, 2, 4}, 2, 500'000'000,
      [&](int r, synthetic_pipeline& p) {
        if (r != 1) return;
        auto h = std::make_unique<hanging_stage>(std::move(p.stages[0]), 2);
        hung = h.get();
        p.stages[0] = std::move(h);
      },
      false, trace_mode::off,
      [&](int r, const run_result&) {
        if (r == 0) hung->release();
      },
      std::chrono::milliseconds(3000));
  const auto& first = g.results[0];
  CAPTURE(first.error);
  CHECK_FALSE(first.ok);
  CHECK(first.error.find("watchdog") != std::string::npos);
  CHECK(first.steps_completed == 2);
  CHECK_FALSE(g.results[1].ok);
}

namespace {
// Signals once backward of `step`'s last micro-batch has run on the wrapped stage.
class signalling_stage : public delegating_stage {
public:
  signalling_stage(std::unique_ptr<stage_compute> inner, std::uint32_t step, std::uint32_t last_mb)
      : delegating_stage(std::move(inner)), step_(step), last_mb_(last_mb) {}
  bool wait(std::chrono::seconds bound) { return done_.wait_for(bound); }
  void backward(const work_key& key, const dsa::tensor& g, dsa::tensor& gi) override {
    delegating_stage::backward(key, g, gi);
    if (key.step == step_ && key.micro_batch == last_mb_) done_.set();
  }

private:
  std::uint32_t step_, last_mb_;
  latch done_;
};
} // namespace

TEST_CASE("data parallel: ranks stopping early start no collective of the step they will not finish") {
  // Rank 0 asks to stop after step 1. Its hook of step 1 returns only once rank 1 has run
  // step 2's backward, so rank 1 offers step 2's gradients to its reducer, while rank 0's
  // own forward of step 2 stays blocked until rank 1's run has returned: only rank 1 could
  // start step 2's sums. Had its reducer started them it would wait forever for rank 0 (the
  // test would hang); the sums of step k wait for the coordinators' go-ahead after step
  // k - 1's hooks, which a stop never gives.
  const synthetic_model model{4, 5, 3, 0.05};
  signalling_stage* rank1_stage = nullptr;
  hanging_stage* rank0_stage = nullptr;
  std::atomic<bool> waited{false};
  auto g = run_group(
      model, {1, 2, 6}, 2, 500'000'000,
      [&](int r, synthetic_pipeline& p) {
        if (r == 1) {
          auto s = std::make_unique<signalling_stage>(std::move(p.stages[0]), 2, 1);
          rank1_stage = s.get();
          p.stages[0] = std::move(s);
        } else {
          auto s = std::make_unique<hanging_stage>(std::move(p.stages[0]), 2);
          rank0_stage = s.get();
          p.stages[0] = std::move(s);
        }
      },
      false, trace_mode::off,
      [&](int r, const run_result&) {
        if (r == 1) rank0_stage->release();
      },
      std::chrono::milliseconds(60000), [&](int r, run_options& o) {
        if (r != 0) return;
        o.on_step = [&](const step_summary& s) {
          if (s.step == 1) waited = rank1_stage->wait(std::chrono::seconds(30));
        };
        o.stop_after = [](std::uint32_t k) { return k == 1; };
      });
  CHECK(waited.load());
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CAPTURE(g.results[static_cast<std::size_t>(r)].error);
    CHECK(g.results[static_cast<std::size_t>(r)].ok);
    CHECK(g.results[static_cast<std::size_t>(r)].steps_completed == 2);
  }
  CHECK(same_bits(g.pipes[1]->parameters(), g.pipes[0]->parameters()));
}

TEST_CASE("trace check: a 2-rank run with several buckets passes; one rank's allreduces swapped is caught") {
  const synthetic_model model{4, 5, 3, 0.05};
  const pipeline_options options{2, 2, 3};
  const auto dir = (std::filesystem::temp_directory_path() /
                    ("dsactor-test-" + std::to_string(::getpid()) + "-check-dp"))
                       .string();
  std::filesystem::remove_all(dir);
  // Each 5x5 layer its own bucket: two buckets per stage and step; both ranks write to one run directory.
  auto g = run_group(model, options, 2, 25, {}, true, trace_mode::record, {}, std::chrono::milliseconds(60000),
                     [&](int, run_options& o) { o.run_dir = dir; });
  for (const auto& r : g.results) REQUIRE(r.ok);
  auto traces = load_run_traces(dir);
  std::filesystem::remove_all(dir);
  REQUIRE(traces.has_value());
  REQUIRE(traces->size() == 2);
  CHECK((*traces)[1].rank == 1);
  // A real run on a shared machine may stall a thread for any time: the starvation rule's
  // tolerance is wide here (its detection is tested on injected traces).
  trace_check_options wide;
  wide.idle_tolerance_ms = 600'000;
  const auto result = check_traces(*traces, wide);
  INFO(format_trace_check(result));
  CHECK(!result.first);
  REQUIRE(!result.checked.empty());
  CHECK(result.checked.back().find("allreduce order of 2 ranks") != std::string::npos);
  CHECK(result.checked.back().find("(12 calls)") != std::string::npos); // 2 stages x 3 steps x 2 buckets

  // Rank 1 issues stage 0's two buckets of step 1 in the other order.
  auto& t = (*traces)[1].trace;
  std::vector<std::size_t> calls;
  for (std::size_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    if (r.kind == static_cast<std::uint8_t>(trace_kind::span) && t.names[r.name] == "allreduce" && r.stage == 0 &&
        r.step == 1)
      calls.push_back(i);
  }
  REQUIRE(calls.size() == 2);
  auto& a = t.records[calls[0]];
  auto& b = t.records[calls[1]];
  REQUIRE(a.micro_batch != b.micro_batch);
  std::swap(a.micro_batch, b.micro_batch);
  const auto swapped = check_traces(*traces, wide);
  INFO(format_trace_check(swapped));
  REQUIRE(swapped.first);
  CHECK(swapped.first->check == "collectives");
  CHECK(swapped.first->rank == 1);
  CHECK(swapped.first->what.find("stage 0's allreduce number 2 differs") != std::string::npos);
}
