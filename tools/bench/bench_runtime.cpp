// `dsactor bench runtime`: (a) a plain loop of M BERT-mini forward/backward
// calls plus a parameter copy per step, against (b) run_pipeline with one
// stage and M micro-batches running the very same calls, and (c) run_pipeline
// with trace recording on against off. The optimizer only copies parameters,
// so every step sees the same model and batch: the losses of all three must
// agree (checked before the times are reported). Rounds interleave the three
// variants (the first step of a round, with allocation and actor start-up, is
// left out). Reported: each variant's fastest step over all rounds, and the
// ratios as the median over rounds of each round's paired ratio of median step
// times — the machine's speed drifts between rounds (other load, frequency), and
// a ratio taken within one round cancels most of that drift.
#include "tools/bench/bench_runtime.hpp"
#include "tools/bench/bench_util.hpp"
#include "tools/options.hpp"

#include "actors/run.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"
#include "kernels/cpu/convert.hpp"
#include "models/bert/bert_part.hpp"
#include "optim/grad_clip.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace dsa::tools {
namespace {

using actors::work_key;

tensor random_ids(std::int64_t rows, std::int64_t cols, std::int32_t lo, std::int32_t hi, std::uint32_t site) {
  tensor t = tensor::empty({rows, cols}, dtype::i32);
  philox_stream s{11, 0, 0, 0, site};
  for (std::int64_t i = 0; i < rows * cols; ++i)
    t.data<std::int32_t>()[i] =
        lo + static_cast<std::int32_t>(s.uniform(static_cast<std::uint64_t>(i)) * static_cast<float>(hi - lo));
  return t;
}

bert::bert_batch synthetic_batch(const bert::bert_config& cfg, std::int64_t b, std::int64_t t) {
  const std::int64_t p = std::max<std::int64_t>(1, t * 15 / 100);
  bert::bert_batch batch;
  batch.input_ids = random_ids(b, t, 0, static_cast<std::int32_t>(cfg.vocab_size), 1);
  batch.token_type_ids = tensor::zeros({b, t}, dtype::i32);
  batch.attention_mask = tensor::empty({b, t}, dtype::f32);
  for (std::int64_t i = 0; i < b * t; ++i) batch.attention_mask.data<float>()[i] = 1.0f;
  batch.masked_lm_positions = random_ids(b, p, 1, static_cast<std::int32_t>(t), 2);
  batch.masked_lm_ids = random_ids(b, p, 0, static_cast<std::int32_t>(cfg.vocab_size), 3);
  batch.next_sentence_labels = random_ids(b, 1, 0, 2, 4).reshape({b});
  return batch;
}

// The whole BERT-mini with its pretraining head on one fixed batch; the
// runtime's input and label tensors are ignored.
class bert_mini_stage : public actors::stage_compute {
public:
  bert_mini_stage(const bert::bert_config& cfg, bert::bert_batch batch, std::uint32_t micro_batches)
      : part_(cfg, bert::bert_range::whole(cfg)), batch_(std::move(batch)), micro_batches_(micro_batches) {
    part_.parameters().init(1234);
  }

  void reserve_stash(std::uint32_t slots) override { stash_.assign(slots, bert::part_stash{}); }

  double forward(const work_key& key, const std::vector<tensor>&, const tensor&, std::vector<tensor>&) override {
    bert::forward_context ctx;
    ctx.seed = 1;
    ctx.step = key.step;
    ctx.micro_batch = key.micro_batch;
    auto out = part_.forward(tensor(), batch_, ctx, stash_.at(key.stash));
    DSA_CHECK(out.has_value(), "bench forward failed: {}", out.has_value() ? "" : out.err().to_string());
    return out->losses.total;
  }

  void backward(const work_key& key, const tensor&, tensor&) override {
    bert::backward_options opt;
    opt.loss_scale = 1.0f / static_cast<float>(micro_batches_);
    part_.backward(tensor(), stash_.at(key.stash), opt);
  }

  std::vector<tensor> parameters() override {
    std::vector<tensor> out;
    for (const auto& e : part_.parameters().entries()) out.push_back(e.value);
    return out;
  }
  std::vector<tensor> gradients() override {
    std::vector<tensor> out;
    for (const auto& e : part_.parameters().entries()) out.push_back(e.grad);
    return out;
  }
  void load_parameters(const std::vector<tensor>& updated) override {
    const auto& entries = part_.parameters().entries();
    DSA_CHECK(updated.size() == entries.size(), "load: {} tensors for {}", updated.size(), entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      tensor value = entries[i].value; // a view of the parameter's storage
      value.copy_from(updated[i]);
    }
    part_.parameters().zero_grad();
  }

private:
  bert::bert_part part_;
  bert::bert_batch batch_;
  std::uint32_t micro_batches_;
  std::vector<bert::part_stash> stash_;
};

// No update: copies the master parameters into the new version (the data
// movement of an optimizer step without its arithmetic).
class copy_optimizer : public actors::optimizer_compute {
public:
  void init(const std::vector<tensor>& initial) override {
    master_.clear();
    grads_.clear();
    for (const auto& t : initial) {
      master_.push_back(t.clone());
      grads_.push_back(tensor::zeros(t.shape(), dtype::f32));
    }
  }
  std::vector<tensor> gradient_buffers() override { return grads_; }
  bool update(std::uint32_t, const actors::grad_totals&, std::vector<tensor>& out) override {
    out.resize(master_.size());
    for (std::size_t i = 0; i < master_.size(); ++i) {
      if (!out[i].defined()) out[i] = tensor::empty(master_[i].shape(), master_[i].type());
      out[i].copy_from(master_[i]);
    }
    return true;
  }

private:
  std::vector<tensor> master_;
  std::vector<tensor> grads_;
};

// What a reducer does for one stage and one replica: the gradients into the
// optimizer's f32 buffers, and their sum of squares.
actors::grad_totals reduce_locally(const std::vector<tensor>& grads, std::vector<tensor> buffers) {
  actors::grad_totals t;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    cpu::cast(buffers[i].raw_data(), dtype::f32, grads[i].raw_data(), grads[i].type(), grads[i].numel());
    t.sum_of_squares += optim::sum_of_squares(buffers[i]);
  }
  t.own_sum_of_squares = t.sum_of_squares;
  return t;
}

// The runtime wants defined input and label tensors; the stage reads its own batch.
class token_source : public actors::batch_source {
public:
  void fill(std::uint32_t, std::uint32_t, tensor& input, tensor& labels) override {
    if (!input.defined()) input = tensor::zeros({1}, dtype::i32);
    if (!labels.defined()) labels = tensor::zeros({1}, dtype::i32);
  }
};

struct timing {
  std::vector<double> step_s; // per step
  std::vector<double> losses; // per step: mean micro-batch loss
  double best_s() const {     // fastest step without the first
    return *std::min_element(step_s.begin() + (step_s.size() > 1 ? 1 : 0), step_s.end());
  }
  double median_s() const { // median step without the first
    std::vector<double> v(step_s.begin() + (step_s.size() > 1 ? 1 : 0), step_s.end());
    return median(v);
  }
};

timing run_loop(bert_mini_stage& stage, copy_optimizer& optimizer, std::uint32_t M, std::uint32_t steps) {
  token_source source;
  stage.reserve_stash(1);
  optimizer.init(stage.parameters());
  timing t;
  std::vector<tensor> version;
  tensor input, labels, grad_in;
  std::vector<tensor> out;
  for (std::uint32_t step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (std::uint32_t mb = 0; mb < M; ++mb) {
      source.fill(step, mb, input, labels);
      loss += stage.forward({step, mb, 0}, {input}, labels, out);
      stage.backward({step, mb, 0}, tensor(), grad_in);
    }
    optimizer.update(step, reduce_locally(stage.gradients(), optimizer.gradient_buffers()), version);
    stage.load_parameters(version);
    t.step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    t.losses.push_back(loss / M);
  }
  return t;
}

timing run_actors(bert_mini_stage& stage, copy_optimizer& optimizer, std::uint32_t M, std::uint32_t steps,
                  actors::trace_mode trace) {
  token_source source;
  actors::run_options options;
  options.pipeline.stages = 1;
  options.pipeline.micro_batches = M;
  options.pipeline.steps = steps;
  options.trace = trace;
  timing t;
  options.on_step = [&](const actors::step_summary& s) {
    t.step_s.push_back(s.wall_s);
    t.losses.push_back(s.loss);
  };
  // As the driver runs: with a stop check, so the shards wait for the coordinator each step.
  options.stop_after = [](std::uint32_t) { return false; };
  auto result = actors::run_pipeline(options, {{&stage}, {&optimizer}, &source, {}});
  DSA_CHECK(result.ok, "bench run failed: {}", result.error);
  return t;
}

void check_losses(const char* what, const timing& got, const timing& want) {
  DSA_CHECK(got.losses.size() == want.losses.size(), "{}: {} steps, the loop ran {}", what, got.losses.size(),
            want.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    const double diff = std::abs(got.losses[i] - want.losses[i]);
    // The same calls on the same data: only the thread differs, so the values must match closely.
    DSA_CHECK(diff <= 1e-6 * std::abs(want.losses[i]) + 1e-9, "{}: step {} loss {} vs the loop's {}", what, i,
              got.losses[i], want.losses[i]);
  }
}

} // namespace

int bench_runtime_main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::uint32_t M = 4, steps = 6, rounds = 5;
  std::int64_t batch = 8, seq = 128;
  po::options_description opts("dsactor bench runtime [options]");
  opts.add_options()("help,h", "this help")("quick", "batch 2, seq 32, 3 steps, 2 rounds (a smoke run)")(
      "micro-batches", po::value(&M)->default_value(M), "micro-batches per step (M)")(
      "steps", po::value(&steps)->default_value(steps), "steps per run (the first is not timed)")(
      "rounds", po::value(&rounds)->default_value(rounds), "interleaved rounds (ratios: median of per-round ratios)")(
      "batch", po::value(&batch)->default_value(batch), "sequences per micro-batch")(
      "seq", po::value(&seq)->default_value(seq), "tokens per sequence");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench runtime")) return *done;
  if (vm.count("quick")) {
    batch = 2;
    seq = 32;
    steps = 3;
    rounds = 2;
  }
  if (M == 0 || steps < 2 || rounds == 0 || batch <= 0 || seq <= 1) {
    fmt::print(stderr, "dsactor bench runtime: need micro-batches >= 1, steps >= 2, rounds >= 1, batch >= 1, "
                       "seq >= 2\n");
    return 2;
  }
  const bert::bert_config cfg = bert::bert_config_for(bert::model_size::mini);
  fmt::print("runtime overhead: BERT-mini (L {}, H {}), micro-batch {} x {}, M {}, {} steps x {} rounds\n",
             cfg.num_layers, cfg.hidden_size, batch, seq, M, steps, rounds);
  bert_mini_stage stage(cfg, synthetic_batch(cfg, batch, seq), M);
  copy_optimizer optimizer;

  double loop_s = 1e30, traced_s = 1e30, untraced_s = 1e30;
  std::vector<double> overheads, untraced_overheads, trace_overheads; // per round, paired
  for (std::uint32_t r = 0; r < rounds; ++r) {
    const timing loop = run_loop(stage, optimizer, M, steps);
    const timing traced = run_actors(stage, optimizer, M, steps, actors::trace_mode::record);
    const timing untraced = run_actors(stage, optimizer, M, steps, actors::trace_mode::off);
    check_losses("run_pipeline, trace on", traced, loop);
    check_losses("run_pipeline, trace off", untraced, loop);
    fmt::print("  round {}: median step: loop {:.4f}  actors+trace {:.4f}  actors {:.4f} s\n", r, loop.median_s(),
               traced.median_s(), untraced.median_s());
    overheads.push_back(traced.median_s() / loop.median_s());
    untraced_overheads.push_back(untraced.median_s() / loop.median_s());
    trace_overheads.push_back(traced.median_s() / untraced.median_s());
    loop_s = std::min(loop_s, loop.best_s());
    traced_s = std::min(traced_s, traced.best_s());
    untraced_s = std::min(untraced_s, untraced.best_s());
  }
  const double overhead = median(overheads), trace_overhead = median(trace_overheads);
  const double untraced_overhead = median(untraced_overheads);
  fmt::print("  {:<44} {:>9} {:>8} {:>8}\n", "variant (fastest step; paired median ratio)", "s/step", "ratio", "goal");
  fmt::print("  {:<44} {:>9.4f} {:>8} {:>8}\n", "(a) plain loop: M x fwd+bwd, parameter copy", loop_s, "1", "");
  fmt::print("  {:<44} {:>9.4f} {:>8.4f} {:>8}\n", "(b) run_pipeline, 1 stage, trace on", traced_s, overhead,
             "<=1.05");
  fmt::print("  {:<44} {:>9.4f} {:>8.4f} {:>8}\n", "    run_pipeline, 1 stage, trace off", untraced_s,
             untraced_overhead, "");
  fmt::print("  {:<44} {:>9} {:>8.4f} {:>8}\n", "(c) trace overhead (on / off)", "", trace_overhead, "<=1.03");
  fmt::print("{{\"bench\":\"runtime\",\"model\":\"bert-mini\",\"batch\":{},\"seq\":{},\"micro_batches\":{},"
             "\"steps\":{},\"rounds\":{},\"loop_step_s\":{:.6g},\"actor_step_s\":{:.6g},"
             "\"actor_untraced_step_s\":{:.6g},\"overhead_ratio\":{:.4f},\"untraced_overhead_ratio\":{:.4f},"
             "\"trace_overhead_ratio\":{:.4f}}}\n",
             batch, seq, M, steps, rounds, loop_s, traced_s, untraced_s, overhead, untraced_overhead,
             trace_overhead);
  return 0;
}

} // namespace dsa::tools
