// dsactor bench pipeline; see bench_pipeline.hpp.
#include "tools/bench/bench_pipeline.hpp"

#include "actors/trace/analysis/trace_pipeline.hpp"
#include "actors/trace/analysis/trace_summary.hpp"
#include "tools/bench/bench_process.hpp"
#include "tools/bench/bench_util.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace dsa::tools {
namespace {

namespace fs = std::filesystem;

struct pipeline_plan {
  std::string model = "mini";
  int layers = 4;
  int runs = 5, steps = 8, warmup = 2, micro_batch = 4, seq = 128;
  int max_stashed = 0;    // zb's held bound (0: the number of stages, 1F1B's memory: ZB-H1)
  int max_deferred_w = 0; // zb's deferred-W bound (0: what the stash leaves)
  std::vector<int> micro_batches{4, 8};
  std::string work;
  std::string config; // a base config instead of the built-in one (--config)
  int split = 0;      // layers on stage 0; 0: searched by measured time (--split)
};

// BERT on the quick start's data, the timing columns on, no checkpoints, no evaluation.
std::string config_text(const pipeline_plan& p) {
  return quickstart_bert_config(p.model, p.seq, "");
}

struct run_figures {
  double samples_per_s = 0;
  actors::pipeline_figures pipe;
};

// One 2-process run: `dsactor launch --num_procs 2` with one thread per process.
expected<run_figures> run_once(const pipeline_plan& p, const std::string& self, const std::string& config,
                               const std::string& name, const std::string& schedule, int M, int split) {
  const std::string run_dir = p.work + "/" + name, log = run_dir + ".log";
  fs::remove_all(run_dir);
  const std::vector<std::string> argv{self, "launch", "--num_procs", "2", config,
                                      "--set", fmt::format("run_dir=\"{}\"", run_dir),
                                      "--set", "pipeline.stages=2", "--set", "wall_clock_breakdown=true",
                                      "--set", fmt::format("train_steps={}", p.steps),
                                      "--set", fmt::format("train_micro_batch_size_per_gpu={}", p.micro_batch),
                                      "--set", "checkpoint.save_final=false", "--set", "checkpoint.save_interval=0",
                                      "--set", fmt::format("gradient_accumulation_steps={}", M),
                                      "--set", fmt::format("train_batch_size={}", M * p.micro_batch),
                                      "--set", fmt::format("pipeline.schedule=\"{}\"", schedule),
                                      "--set", fmt::format("pipeline.max_stashed={}", schedule == "zb" ? p.max_stashed : 0),
                                      "--set", fmt::format("pipeline.max_deferred_w={}", schedule == "zb" ? p.max_deferred_w : 0),
                                      "--set", fmt::format("pipeline.partition=\"layers:{},{}\"", split, p.layers - split)};
  DSA_ASSIGN_OR_RETURN(int code, run_logged(argv, log));
  if (code != 0) return make_error(errc::runtime, "the run {} failed (exit code {}); see {}", name, code, log);
  run_figures f;
  DSA_ASSIGN_OR_RETURN(double step_s, median_step_seconds(run_dir, p.warmup));
  f.samples_per_s = static_cast<double>(M * p.micro_batch) / step_s;
  DSA_ASSIGN_OR_RETURN(auto traces, actors::load_run_traces(run_dir));
  DSA_ASSIGN_OR_RETURN(f.pipe, actors::pipeline_bubble(traces, static_cast<std::uint32_t>(p.warmup)));
  return f;
}

struct series {
  std::vector<double> samples_per_s, bubble;
  std::vector<actors::pipeline_figures> figures;
};

std::string spread(const std::vector<double>& v, const char* format) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return fmt::format(fmt::runtime(format), median(v)) + " [" + fmt::format(fmt::runtime(format), *lo) + " .. " +
         fmt::format(fmt::runtime(format), *hi) + "]";
}

// The mean of a per-stage figure over the runs and stages.
double mean_of(const std::vector<actors::pipeline_figures>& runs, double actors::pipeline_stage_figures::*field) {
  double total = 0;
  std::size_t n = 0;
  for (const auto& r : runs)
    for (const auto& s : r.stages) {
      total += s.*field;
      ++n;
    }
  return n ? total / static_cast<double>(n) : 0.0;
}

} // namespace

int bench_pipeline_main(int argc, char** argv) {
  namespace po = boost::program_options;
  pipeline_plan p;
  po::options_description opts("dsactor bench pipeline [--runs 5 --steps 8 --micro-batch 4 --model mini] [--quick]");
  opts.add_options()("help,h", "this help")("runs", po::value(&p.runs)->default_value(p.runs),
                                            "runs per schedule and M, interleaved")(
      "steps", po::value(&p.steps)->default_value(p.steps), "steps per run")(
      "warmup", po::value(&p.warmup)->default_value(p.warmup), "first steps of a run not counted")(
      "micro-batch", po::value(&p.micro_batch)->default_value(p.micro_batch), "sequences per micro-batch")(
      "model", po::value(&p.model)->default_value(p.model), "model size (tiny, mini, small, medium: see --layers)")(
      "max-stashed", po::value(&p.max_stashed)->default_value(p.max_stashed),
      "zb's pipeline.max_stashed (0: the number of stages, 1F1B's memory; 3: ZB-H2's 2S - 1)")(
      "max-deferred-w", po::value(&p.max_deferred_w)->default_value(p.max_deferred_w),
      "zb's pipeline.max_deferred_w (0: max_stashed bounds it)")(
      "work", po::value(&p.work), "folder for the runs (default: a fresh one under /tmp, removed after)")(
      "config", po::value(&p.config), "a run config to measure instead of the built-in BERT on the quick start's data "
                                      "(its model and data; the bench sets the batch, steps and pipeline keys)")(
      "layers", po::value(&p.layers), "the model's encoder layers (for the split search; default: --model's)")(
      "split", po::value(&p.split), "encoder layers on stage 0 (default: the split by measured time, searched)")(
      "quick", "BERT-tiny, M = 4 only, 2 runs of 4 steps (a smoke run; the figures are noise)");
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench pipeline")) return *done;
  if (vm.count("quick")) {
    p.model = "tiny";
    p.runs = 2;
    p.steps = 4;
    p.warmup = 1;
    p.micro_batches = {4};
  }
  if (!vm.count("layers")) p.layers = p.model == "tiny" ? 2 : 4;
  if (p.runs < 1 || p.steps <= p.warmup || p.warmup < 0 || p.micro_batch < 1) {
    fmt::print(stderr, "dsactor bench pipeline: need runs >= 1, steps > warmup >= 0, micro-batch >= 1\n");
    return 2;
  }
  const bool own_work = p.work.empty();
  if (own_work) {
    std::string tmpl = (fs::temp_directory_path() / "dsactor-bench-pipeline-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      fmt::print(stderr, "dsactor bench pipeline: cannot make a folder under {}\n", fs::temp_directory_path().string());
      return 1;
    }
    p.work = tmpl;
  }
  fs::create_directories(p.work);
  auto self = dsactor_path();
  if (!self) {
    fmt::print(stderr, "dsactor bench pipeline: {}\n", self.err().message);
    return 1;
  }
  // One thread per process: the 2 processes share this machine's cores.
  ::setenv("OMP_NUM_THREADS", "1", 1);
  ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
  std::string config = p.config;
  if (config.empty()) {
    config = p.work + "/pipeline.toml";
    std::ofstream(config) << config_text(p);
  }
  auto fail = [&](const error& e) {
    fmt::print(stderr, "dsactor bench pipeline: {}\n", e.message);
    return 1;
  };
  fmt::print("pipeline: 2 stages in 2 processes of 1 thread each (dsactor launch), {} ({} layers), micro-batch "
             "{}, {} steps per run ({} warm-up), on {}\n",
             p.config.empty() ? fmt::format("BERT-{} at seq {}", p.model, p.seq) : p.config, p.layers, p.micro_batch,
             p.steps, p.warmup, cpu_model());
  std::fflush(stdout);
  // The split by measured time: the one whose busier stage is least busy (1F1B, M = 4).
  int split = p.split > 0 ? p.split : p.layers / 2;
  if (p.split >= p.layers) {
    fmt::print(stderr, "dsactor bench pipeline: --split {} leaves no layer for stage 1 of {} layers\n", p.split,
               p.layers);
    return 2;
  }
  if (p.layers > 2 && p.split <= 0) {
    double best = 1e30;
    for (int k = 1; k < p.layers; ++k) {
      auto f = run_once(p, *self, config, fmt::format("split{}", k), "1f1b", 4, k);
      if (!f) return fail(f.err());
      double busiest = 0;
      for (const auto& s : f->pipe.stages) busiest = std::max(busiest, s.busy_s);
      fmt::print("  split layers:{},{}: stage busy {:.3f} s / {:.3f} s\n", k, p.layers - k, f->pipe.stages[0].busy_s,
                 f->pipe.stages.back().busy_s);
      std::fflush(stdout);
      if (busiest < best) {
        best = busiest;
        split = k;
      }
    }
  }
  fmt::print("  partition: layers:{},{} (embeddings with stage 0, the MLM head with stage 1)\n", split,
             p.layers - split);
  std::map<int, std::map<std::string, series>> all;
  for (int M : p.micro_batches)
    for (int r = 0; r < p.runs; ++r)
      for (int i = 0; i < 2; ++i) {
        const std::string schedule = (r + i) % 2 == 0 ? "1f1b" : "zb"; // alternate which goes first
        auto f = run_once(p, *self, config, fmt::format("m{}_{}_{}", M, schedule, r), schedule, M, split);
        if (!f) return fail(f.err());
        auto& s = all[M][schedule];
        s.samples_per_s.push_back(f->samples_per_s);
        s.bubble.push_back(f->pipe.bubble);
        s.figures.push_back(f->pipe);
        fmt::print("  M {} run {} {:<4}: {:.1f} samples/s, bubble {:.1f}%\n", M, r + 1, schedule, f->samples_per_s,
                   100 * f->pipe.bubble);
        std::fflush(stdout); // progress, also into a file
      }
  nlohmann::json out;
  out["bench"] = "pipeline";
  out["stages"] = 2;
  out["cpu"] = cpu_model();
  out["model"] = p.model;
  out["partition"] = fmt::format("layers:{},{}", split, p.layers - split);
  out["runs"] = p.runs;
  const int stashed = p.max_stashed == 0 ? 2 : p.max_stashed;
  out["max_stashed"] = stashed;
  out["max_deferred_w"] = p.max_deferred_w;
  const auto zb_kind = stashed >= 3 ? actors::zb_memory::h2 : actors::zb_memory::h1;
  const char* zb_name = stashed >= 3 ? "ZB-H2" : "ZB-H1";
  for (int M : p.micro_batches) {
    const auto& a = all[M]["1f1b"];
    const auto& z = all[M]["zb"];
    const double f = mean_of(z.figures, &actors::pipeline_stage_figures::forward_ms);
    const double b = mean_of(z.figures, &actors::pipeline_stage_figures::backward_ms);
    const double w = mean_of(z.figures, &actors::pipeline_stage_figures::weight_ms);
    const double theory_a = actors::one_f_one_b_bubble(2, static_cast<std::uint32_t>(M));
    const double theory_z = actors::zb_bubble(zb_kind, 2, static_cast<std::uint32_t>(M), f, b, w);
    auto held = [](const std::vector<actors::pipeline_figures>& runs) {
      std::uint32_t peak = 0;
      for (const auto& r : runs)
        for (const auto& s : r.stages) peak = std::max(peak, s.peak_held);
      return peak;
    };
    fmt::print("M = {} (medians [min .. max] of {} runs each):\n", M, p.runs);
    fmt::print("  1f1b  samples/s {}  bubble {}  theory {:.1f}%  micro-batches held at most {}\n",
               spread(a.samples_per_s, "{:.1f}"), spread(a.bubble, "{:.3f}"), 100 * theory_a, held(a.figures));
    fmt::print("  zb    samples/s {}  bubble {}  theory {:.1f}% ({}, measured F {:.1f} B {:.1f} W {:.1f} ms)  "
               "micro-batches held at most {}\n",
               spread(z.samples_per_s, "{:.1f}"), spread(z.bubble, "{:.3f}"), 100 * theory_z, zb_name, f, b, w,
               held(z.figures));
    fmt::print("  zb / 1f1b: bubble {:.2f}x, samples/s {:.2f}x\n", median(z.bubble) / median(a.bubble),
               median(z.samples_per_s) / median(a.samples_per_s));
    const std::string suffix = M == 4 ? "" : fmt::format("_m{}", M);
    out["bubble_1f1b" + suffix] = median(a.bubble);
    out["bubble_zb" + suffix] = median(z.bubble);
    out["samples_per_s_1f1b" + suffix] = median(a.samples_per_s);
    out["samples_per_s_zb" + suffix] = median(z.samples_per_s);
    out["theory_bubble_1f1b" + suffix] = theory_a;
    out["theory_bubble_zb" + suffix] = theory_z;
    out["bubble_ratio" + suffix] = median(z.bubble) / median(a.bubble);
    out["speedup" + suffix] = median(z.samples_per_s) / median(a.samples_per_s);
  }
  if (own_work) fs::remove_all(p.work);
  fmt::print("{}\n", out.dump());
  return 0;
}

} // namespace dsa::tools
