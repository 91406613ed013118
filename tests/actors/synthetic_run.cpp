// Synthetic pipelines for the runtime tests; see synthetic_run.hpp.
#include "synthetic_run.hpp"

#include "actors/trace/trace_analysis.hpp"
#include "core/error.hpp"

#include <filesystem>
#include <map>

#include <unistd.h>

namespace dsa::test {

using namespace dsa::actors;

synthetic_pipeline::synthetic_pipeline(const synthetic_model& model, const pipeline_options& options) {
  const std::uint32_t S = options.stages;
  DSA_CHECK(model.layers % S == 0, "{} layers over {} stages", model.layers, S);
  DSA_CHECK(!model.tie_ends || S > 1, "a tied pair needs two stages (the runtime ties first and last stage)");
  const std::uint32_t per_stage = model.layers / S;
  const std::int64_t tied_layer = model.tie_ends ? static_cast<std::int64_t>(model.layers) - 1 : -1;
  for (std::uint32_t s = 0; s < S; ++s) {
    stages.push_back(std::make_unique<linear_stack>(s * per_stage, per_stage, model.width, tied_layer));
    optimizers.push_back(std::make_unique<sgd>(model.lr, options.micro_batches * static_cast<std::uint32_t>(model.dp_size),
                                               model.clip));
  }
  if (model.tie_ends) {
    tied.assign(S, -1);
    tied.front() = 0;
    tied.back() = static_cast<int>(per_stage) - 1;
  }
  source = std::make_unique<synthetic_source>(model.rows, model.width,
                                              static_cast<std::uint32_t>(model.dp_rank) * options.micro_batches);
}

run_parts synthetic_pipeline::parts() {
  run_parts p;
  for (auto& s : stages) p.stages.push_back(s.get());
  for (auto& o : optimizers) p.optimizers.push_back(o.get());
  p.source = source.get();
  p.tied = tied;
  return p;
}

std::vector<tensor> synthetic_pipeline::parameters() {
  std::vector<tensor> out;
  for (auto& s : stages)
    for (auto& t : s->parameters()) out.push_back(t);
  return out;
}

void synthetic_pipeline::load(const std::vector<tensor>& all) {
  std::size_t next = 0;
  for (auto& s : stages) {
    std::vector<tensor> mine;
    for (const auto& t : s->parameters()) {
      DSA_CHECK(next < all.size() && all[next].shape() == t.shape(), "load: parameter {} does not fit", next);
      mine.push_back(all[next++].clone());
    }
    s->load_parameters(mine);
  }
  DSA_CHECK(next == all.size(), "load: {} parameters given, the stages hold {}", all.size(), next);
}

std::vector<tensor> synthetic_pipeline::master() {
  std::vector<tensor> out;
  for (auto& o : optimizers)
    for (const auto& t : o->master()) out.push_back(t);
  return out;
}

std::vector<double> one_f_one_b_idle(const trace_data& trace, std::uint32_t stages) {
  std::map<std::uint32_t, std::uint64_t> first_forward, last_backward; // stage 0's, per step
  for (const auto& r : stage_spans(trace, "forward", 0))
    if (!first_forward.count(r.step)) first_forward[r.step] = r.t0_ns;
  for (const auto& r : stage_spans(trace, "backward", 0)) last_backward[r.step] = r.t1_ns;
  std::uint64_t windows = 0;
  for (const auto& [step, begin] : first_forward) windows += last_backward.at(step) - begin;
  std::vector<double> idle;
  for (std::uint32_t s = 0; s < stages; ++s) {
    std::uint64_t busy = 0;
    for (const auto& r : stage_compute_spans(trace, static_cast<std::int32_t>(s))) busy += r.t1_ns - r.t0_ns;
    idle.push_back(1.0 - static_cast<double>(busy) / static_cast<double>(windows));
  }
  return idle;
}

run_result run_synthetic(synthetic_pipeline& pipeline, const pipeline_options& options, const std::string& run_dir) {
  run_options opt;
  opt.pipeline = options;
  opt.run_dir = run_dir;
  return run_pipeline(opt, pipeline.parts());
}

reference_run run_reference(const synthetic_model& model, std::uint32_t micro_batches, std::uint32_t steps) {
  const std::size_t last = model.layers - 1;
  linear_stack stack(0, model.layers, model.width, model.tie_ends ? static_cast<std::int64_t>(last) : -1);
  synthetic_source source(model.rows, model.width);
  stack.reserve_stash(1);
  auto params = stack.parameters();
  std::vector<tensor> master;
  for (auto& p : params) master.push_back(p.clone());
  reference_run run;
  for (std::uint32_t step = 0; step < steps; ++step) {
    double loss = 0;
    for (std::uint32_t mb = 0; mb < micro_batches; ++mb) {
      tensor input, labels, grad_in;
      std::vector<tensor> out;
      source.fill(step, mb, input, labels);
      loss += stack.forward({step, mb, 0}, {input}, labels, out);
      stack.backward({step, mb, 0}, tensor(), grad_in);
    }
    run.losses.push_back(loss / micro_batches);
    auto grads = stack.gradients();
    if (model.tie_ends) { // both ends take the sum, first layer's term first; the norm counts it once
      tensor sum = grads[0].clone();
      float* s = sum.data<float>();
      const float* g = grads[last].data<float>();
      for (std::int64_t j = 0; j < sum.numel(); ++j) s[j] = s[j] + g[j];
      grads[0] = sum;
      grads[last] = sum;
    }
    double sum_of_squares = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (model.tie_ends && i == last) continue;
      const float* g = grads[i].data<float>();
      for (std::int64_t j = 0; j < grads[i].numel(); ++j) sum_of_squares += double(g[j]) * g[j];
    }
    const double c = sgd_clip_factor(model.clip, sum_of_squares);
    for (std::size_t i = 0; i < master.size(); ++i) sgd_apply(master[i], grads[i], model.lr, micro_batches, c);
    stack.load_parameters(master);
  }
  for (const auto& p : stack.parameters()) run.parameters.push_back(p.clone());
  return run;
}

std::vector<tensor> reference_parameters(const synthetic_model& model, std::uint32_t micro_batches,
                                         std::uint32_t steps) {
  return run_reference(model, micro_batches, steps).parameters;
}

expected<std::vector<actors::rank_trace>> two_stage_run_traces(const std::string& name) {
  actors::pipeline_options shape;
  shape.stages = 2;
  shape.micro_batches = 4;
  shape.steps = 3;
  synthetic_pipeline pipe({4, 5, 3, 0.05}, shape);
  const auto dir =
      std::filesystem::temp_directory_path() / ("dsactor-test-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto result = run_synthetic(pipe, shape, dir.string());
  if (!result.ok) {
    std::filesystem::remove_all(dir);
    return make_error(errc::runtime, "the 2-stage synthetic run failed");
  }
  auto traces = actors::load_run_traces(dir.string());
  std::filesystem::remove_all(dir);
  return traces;
}

} // namespace dsa::test
