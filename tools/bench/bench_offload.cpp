// dsactor bench offload DIR: the same BERT pre-training run twice through
// train::run_training, ZeRO stage 1 on one rank — the optimizer state in memory,
// then offloaded to NVMe in DIR (pipelined reads and writes, 9 buffers, several
// sub-groups) — then the disk measured with the same engine settings. Step times
// come from the runs' metrics.jsonl (wall_clock_breakdown columns); the first
// steps are warm-up and left out. The offloaded step is I/O-bound when moving
// its swap bytes at the disk's measured rate takes longer than the in-memory step.
#include "tools/bench/bench_offload.hpp"

#include "actors/trace/analysis/trace_swap_io.hpp"
#include "actors/train/run/trainer.hpp"
#include "core/philox.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"
#include "models/bert/parameter_specs.hpp"
#include "tools/bench/bench_aio.hpp"
#include "tools/bench/bench_util.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dsa::tools {
namespace {

namespace fs = std::filesystem;

struct bench_setup {
  std::string model = "base";
  bool model_vocab = true; // BERT's 30522-token vocabulary (else the prepared one)
  int steps = 6;
  int warmup = 1;
  int micro_batch = 2;
  int seq = 128;
  int sub_groups = 8; // sub_group_size = the parameter count / this
  double clip = 0.0;  // gradient_clipping of both runs
  int rounds =
      2; // in-memory and offloaded runs alternate, ABBA, against drift in the machine's load
};

// One run's per-step figures from its metrics.jsonl, warm-up steps left out, and the
// process's block-device traffic while it ran.
struct run_figures {
  std::vector<double> step_s, update_s, forward_backward_s;
  std::uint64_t read_bytes = 0, write_bytes = 0;
  double wall_s = 0;
  int runs = 0;
  int streamed = 0; // updates streamed over the backward and kept (the runs' end-of-run swap lines)
  // From the runs' traces (the swap I/O summary): time reading swap chunks, and of it the
  // time while the shard updated another chunk.
  double read_s = 0, reads_during_update_s = 0;

  void add(const run_figures& o) {
    streamed += o.streamed;
    read_s += o.read_s;
    reads_during_update_s += o.reads_during_update_s;
    step_s.insert(step_s.end(), o.step_s.begin(), o.step_s.end());
    update_s.insert(update_s.end(), o.update_s.begin(), o.update_s.end());
    forward_backward_s.insert(forward_backward_s.end(), o.forward_backward_s.begin(),
                              o.forward_backward_s.end());
    read_bytes += o.read_bytes;
    write_bytes += o.write_bytes;
    wall_s += o.wall_s;
    runs += o.runs;
  }
};

// Bytes this process made the block layer read and write (/proc/self/io): O_DIRECT
// and libaio transfers included, page-cache hits not.
struct process_io {
  std::uint64_t read_bytes = 0, write_bytes = 0;
};

process_io read_process_io() {
  std::ifstream in("/proc/self/io");
  process_io io;
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "read_bytes:")
      io.read_bytes = value;
    if (key == "write_bytes:")
      io.write_bytes = value;
  }
  return io;
}

std::int64_t model_parameters(const bench_setup& b) {
  auto size = bert::parse_model_size(b.model);
  bert::bert_config cfg = bert::bert_config_for(*size);
  if (!b.model_vocab)
    cfg.vocab_size = 400; // the prepared vocabulary's size at most
  return bert::parameter_count(bert::parameter_specs(cfg, bert::bert_range::whole(cfg)));
}

std::string config_text(const bench_setup& b, const std::string& work, const std::string& corpus) {
  return fmt::format(R"(train_batch_size = {mb}
train_micro_batch_size_per_gpu = {mb}
train_steps = {steps}
steps_per_print = 1
wall_clock_breakdown = true
seed = 7
gradient_clipping = {clip}

[model]
size = "{model}"
{vocab}

[optimizer]
type = "AdamW"
params = {{ lr = 1e-4, weight_decay = 0.01 }}

[zero_optimization]
stage = 1

)",
                     fmt::arg("mb", b.micro_batch), fmt::arg("clip", b.clip), fmt::arg("steps", b.steps),
                     fmt::arg("model", b.model), fmt::arg("vocab", b.model_vocab ? "vocab_size = 30522" : "")) +
         prepared_data_sections(corpus, work, b.seq, work + "/checkpoints");
}

expected<run_figures> train_once(const bench_setup& b, const std::string& work,
                                 const std::string& name, const std::string& config,
                                 const std::vector<std::string>& overrides) {
  const std::string path = work + "/" + name + ".toml";
  std::ofstream(path) << config;
  train::run_request r;
  r.config_path = path;
  r.overrides = overrides;
  r.overrides.push_back(fmt::format("run_dir=\"{}/{}\"", work, name));
  const process_io before = read_process_io();
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = train::run_training(r);
  run_figures f;
  f.runs = 1;
  f.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const process_io after = read_process_io();
  f.read_bytes = after.read_bytes - before.read_bytes;
  f.write_bytes = after.write_bytes - before.write_bytes;
  if (rc != 0)
    return make_error(errc::runtime, "the {} run failed (exit code {}); its log is above", name,
                      rc);
  const std::string metrics = work + "/" + name + "/metrics.jsonl";
  std::ifstream in(metrics);
  std::string line;
  int step = 0;
  while (std::getline(in, line)) {
    if (++step <= b.warmup)
      continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.contains("Train/Samples/elapsed_time_ms_iteration"))
      return make_error(errc::io, "'{}' line {}: no Train/Samples/elapsed_time_ms_* columns",
                        metrics, step);
    auto ms = [&](const char* key) {
      return row[std::string("Train/Samples/elapsed_time_ms_") + key].get<double>() / 1e3;
    };
    f.step_s.push_back(ms("iteration"));
    f.update_s.push_back(ms("step"));
    f.forward_backward_s.push_back(ms("forward") + ms("backward"));
  }
  // "; N updates streamed over the backward" in the swap line of its log, less "R streamed
  // updates redone" (a clipped step's stream, redone after the backward).
  std::ifstream log(work + "/" + name + "/train.log");
  auto count_before = [&](const std::string& text, const std::string& key) {
    const auto at = text.find(key);
    if (at == std::string::npos) return 0;
    const auto from = text.rfind(' ', at - 1);
    return std::atoi(text.c_str() + (from == std::string::npos ? 0 : from + 1));
  };
  while (std::getline(log, line))
    f.streamed += count_before(line, " updates streamed over the backward") -
                  count_before(line, " streamed updates redone");
  if (f.step_s.empty())
    return make_error(errc::io,
                      "'{}' holds {} step(s); more than the {} warm-up step(s) are needed", metrics,
                      step, b.warmup);
  auto traces = actors::load_run_traces(work + "/" + name);
  if (!traces) return traces.err();
  for (const auto& s : actors::summarize_swap_io(*traces))
    if (s.updated && s.step >= static_cast<std::uint32_t>(b.warmup)) {
      f.read_s += s.read_s;
      f.reads_during_update_s += s.reads_during_update_s;
    }
  return f;
}

void print_run(const char* name, const run_figures& f) {
  fmt::print(
      "  {:<22} {:>9.3f} {:>9.3f} {:>9.3f}   ({} steps timed in {} run(s) of {:.1f} s in all)\n",
      name, median(f.step_s), median(f.forward_backward_s), median(f.update_s), f.step_s.size(),
      f.runs, f.wall_s);
}

// What the two variants' figures and the disk's rates say.
struct findings {
  double mem_step = 0, off_step = 0, ratio = 0;
  double mem_update = 0, off_update = 0, forward_backward_ratio = 0;
  double swap_bytes = 0;     // a step's, by the algorithm
  double measured_bytes = 0; // a step's, by the kernel's count
  double nvme_gbps = 0;      // swap bytes / offloaded update
  double io_s = 0;           // a step's swap bytes at the disk's measured rates
  double same_fb_ratio = 0;  // the in-memory step with the offloaded update in place of its own
  bool io_bound = false;     // the step: I/O takes longer than the in-memory step
};

findings assess(const bench_setup& b, std::int64_t params, const run_figures& mem,
                const run_figures& off, const transfer_rates& disk) {
  // A streamed update moves its bytes during forward and backward: its rate is over the step.
  findings f;
  f.mem_step = median(mem.step_s);
  f.off_step = median(off.step_s);
  f.ratio = f.off_step / f.mem_step;
  f.mem_update = median(mem.update_s);
  f.off_update = median(off.update_s);
  f.forward_backward_ratio = median(off.forward_backward_s) / median(mem.forward_backward_s);
  // AdamW over swapped state reads and writes the masters and both moments once a step.
  const double state_bytes = 12.0 * static_cast<double>(params);
  f.swap_bytes = 2 * state_bytes;
  const double runs = static_cast<double>(off.runs);
  const double extra = static_cast<double>(off.read_bytes + off.write_bytes) -
                       static_cast<double>(mem.read_bytes + mem.write_bytes);
  f.measured_bytes = (extra - runs * state_bytes) / (runs * b.steps); // less each first write
  f.nvme_gbps = f.swap_bytes / (off.streamed > 0 ? f.off_step : f.off_update) / 1e9;
  f.io_s = state_bytes / (disk.read_gbps * 1e9) + state_bytes / (disk.write_gbps * 1e9);
  f.io_bound = f.io_s > f.mem_step;
  // Forward and backward are the same work in both runs; only the update differs. This
  // cancels load that changed between the runs (the machine may be shared).
  f.same_fb_ratio = (f.mem_step - f.mem_update + f.off_update) / f.mem_step;
  return f;
}

const char* verdict(bool met) {
  return met ? "met" : "NOT met";
}

void print_findings(const findings& f, const std::string& dir, const transfer_rates& disk, const run_figures& off,
                    int updates) {
  fmt::print("  {:<22} {:>9.2f}x {:>8.2f}x {:>8.2f}x\n", "ratio offload/memory", f.ratio,
             f.forward_backward_ratio, f.off_update / f.mem_update);
  fmt::print("swap traffic: {:.3f} GB a step (12 B/param read + 12 B/param written); the kernel\n"
             "  counted {:.3f} GB a step more block I/O in the offloaded runs (/proc/self/io)\n",
             f.swap_bytes / 1e9, f.measured_bytes / 1e9);
  fmt::print("disk ({}): the engine moves {:.3f} GB/s read, {:.3f} GB/s write{}\n"
             "  -> {:.3f} s for a step's swap bytes\n",
             file_system_name(dir), disk.read_gbps, disk.write_gbps,
             disk.direct ? " (O_DIRECT)" : " (buffered)", f.io_s);
  const bool streamed = off.streamed > 0;
  if (streamed)
    fmt::print("offloaded update: {:.3f} s after the backward (streamed: a step's swap bytes moved at {:.3f} GB/s\n"
               "  over the whole offloaded step, {:.0f}% of the disk's rate); the rest of the step {:.3f} s\n",
               f.off_update, f.nvme_gbps, 100 * f.io_s / f.off_step, f.off_step - f.off_update);
  else
    fmt::print("offloaded update: {:.3f} s, {:.3f} GB/s achieved ({:.0f}% of the disk's rate); "
               "the rest of the step {:.3f} s\n",
               f.off_update, f.nvme_gbps, 100 * f.io_s / f.off_update, f.off_step - f.off_update);
  fmt::print("bound: the step is {} (swap I/O at the disk's rate {:.3f} s vs the in-memory step {:.3f} s)",
             f.io_bound ? "I/O-bound" : "compute-bound", f.io_s, f.mem_step);
  if (streamed)
    fmt::print("\n");
  else
    fmt::print(";\n  the offloaded update is {} (that I/O vs the in-memory update {:.3f} s)\n",
               f.io_s > f.mem_update ? "I/O-bound" : "compute-bound", f.mem_update);
  fmt::print("ratio with the same forward+backward (in-memory step - its update + the offloaded "
             "update): {:.2f}x\n",
             f.same_fb_ratio);
  if (streamed)
    fmt::print("  the offloaded update streamed over the backward in {} of {} updates: its I/O and arithmetic\n"
               "  ran inside the offloaded forward+backward, so only the measured ratio compares the steps\n",
               off.streamed, updates);
  else
    fmt::print("  the offloaded update ran after the backward (it streams only where no clipping fires and\n"
               "  there is no fp16 loss scaling)\n");
  if (off.read_s > 0)
    fmt::print("trace: {:.0f}% of the offloaded steps' swap reading ({:.3f} s a step) ran while the shard updated\n"
               "  another chunk (the read of chunk i+1 during the update of chunk i; `dsactor trace RUN summary`,\n"
               "  column read/upd); the rest was read ahead during forward and backward or waited for\n",
               100 * off.reads_during_update_s / off.read_s, off.read_s / static_cast<double>(off.step_s.size()));
  if (!streamed && std::abs(f.forward_backward_ratio - 1) > 0.1)
    fmt::print("  forward+backward took {:.2f}x as long in the offloaded runs: the machine's load "
               "changed, trust this ratio over the measured one\n",
               f.forward_backward_ratio);
  if (f.io_bound)
    fmt::print("goal: <= 1.3x applies when compute >= I/O; here I/O exceeds compute (ratio "
               "{:.2f}x; the floor is about {:.2f}x)\n",
               f.ratio, (f.mem_step - f.mem_update + f.io_s) / f.mem_step);
  else if (streamed)
    fmt::print("goal: <= 1.3x with compute >= I/O: {} by the measured ratio {:.2f}x\n", verdict(f.ratio <= 1.3),
               f.ratio);
  else
    fmt::print("goal: <= 1.3x with compute >= I/O: {} by the measured ratio {:.2f}x, {} with the "
               "same forward+backward {:.2f}x\n",
               verdict(f.ratio <= 1.3), f.ratio, verdict(f.same_fb_ratio <= 1.3), f.same_fb_ratio);
}

void print_json(const bench_setup& b, std::int64_t params, std::size_t steps_timed,
                const findings& f, const transfer_rates& disk, const run_figures& off) {
  fmt::print(
      "{{\"bench\":\"offload\",\"cpu\":{},\"model\":\"{}\",\"params\":{},\"micro_batch\":{},"
      "\"seq\":{},\"steps_timed\":{},\"in_memory_step_s\":{:.4g},\"offload_step_s\":{:.4g},"
      "\"ratio\":{:.4f},\"ratio_same_forward_backward\":{:.4f},\"forward_backward_ratio\":{:.4f},"
      "\"in_memory_update_s\":{:.4g},\"offload_update_s\":{:.4g},\"swap_bytes_per_step\":{:.0f},"
      "\"measured_io_bytes_per_step\":{:.0f},\"nvme_GBps\":{:.4g},\"disk_read_GBps\":{:.4g},"
      "\"disk_write_GBps\":{:.4g},\"io_s_per_step\":{:.4g},\"bound\":\"{}\",\"gradient_clipping\":{},"
      "\"streamed_updates\":{},\"reads_during_update_share\":{:.4f},\"goal_met\":{}}}\n",
      nlohmann::json(cpu_model()).dump(), b.model, params, b.micro_batch, b.seq, steps_timed,
      f.mem_step, f.off_step, f.ratio, f.same_fb_ratio, f.forward_backward_ratio, f.mem_update,
      f.off_update, f.swap_bytes, f.measured_bytes, f.nvme_gbps, disk.read_gbps, disk.write_gbps,
      f.io_s, f.io_bound ? "io" : "compute", b.clip, off.streamed,
      off.read_s > 0 ? off.reads_during_update_s / off.read_s : 0.0,
      f.io_bound ? "null" : (f.ratio <= 1.3 ? "true" : "false"));
}

} // namespace

int bench_offload_main(int argc, char** argv) {
  po::options_description opts(
      "dsactor bench offload DIR [--model base|mini|...] [--steps N] [--quick]");
  opts.add_options()("help,h", "this help")(
      "dir", po::value<std::string>()->required(),
      "directory on the NVMe device (swap files and a work folder go there)")(
      "model", po::value<std::string>()->default_value("base"),
      "model.size: tiny, mini, small, medium, base, large")(
      "steps", po::value<int>()->default_value(6),
      "optimizer steps per run (the first is warm-up)")(
      "micro-batch", po::value<int>()->default_value(2),
      "sequences per step")("seq", po::value<int>()->default_value(128), "sequence length")(
      "rounds", po::value<int>()->default_value(2),
      "pairs of runs, alternated in-memory/offloaded/offloaded/in-memory")(
      "clip", po::value<double>()->default_value(0.0),
      "gradient_clipping of both runs (0: none, where the offloaded update streams over the backward)")(
      "quick", "a smoke run: BERT-tiny with its own small vocabulary, 3 steps, sequences of 32");
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (auto done = parse_options(argc, argv, opts, vm, "bench offload", "", &pos))
    return *done;
  bench_setup b;
  b.model = vm["model"].as<std::string>();
  b.steps = vm["steps"].as<int>();
  b.micro_batch = vm["micro-batch"].as<int>();
  b.seq = vm["seq"].as<int>();
  b.rounds = vm["rounds"].as<int>();
  b.clip = vm["clip"].as<double>();
  if (vm.count("quick")) {
    const double clip = b.clip;
    b = bench_setup{};
    b.clip = clip;
    b.model = "tiny";
    b.model_vocab = false;
    b.steps = 3;
    b.seq = 32;
    b.rounds = 1;
  }
  if (!bert::parse_model_size(b.model) || b.model == "custom") {
    fmt::print(stderr,
               "dsactor bench offload: --model '{}' is not a model size (tiny, mini, small, "
               "medium, base, large)\n",
               b.model);
    return 2;
  }
  if (b.steps <= b.warmup || b.micro_batch < 1 || b.seq < 8 || b.rounds < 1 || !(b.clip >= 0)) {
    fmt::print(stderr,
               "dsactor bench offload: --steps must exceed {} (warm-up), --micro-batch >= 1, --seq "
               ">= 8, --rounds >= 1, --clip >= 0\n",
               b.warmup);
    return 2;
  }
  const std::string dir = fs::absolute(vm["dir"].as<std::string>()).string();
  std::error_code ec;
  const std::string work = dir + fmt::format("/dsactor-bench-offload-{}", ::getpid());
  if (!fs::create_directories(work, ec)) {
    fmt::print(stderr, "dsactor bench offload: cannot create '{}': {}\n", work,
               ec ? ec.message() : "it exists");
    return 1;
  }
  const std::int64_t params = model_parameters(b);
  const std::int64_t sub_group = (params + b.sub_groups - 1) / b.sub_groups;
  fmt::print("dsactor bench offload: BERT-{} ({} parameters), micro-batch {} x seq {}, {} steps "
             "({} warm-up), "
             "ZeRO stage 1, one rank, {} round(s)\n  cpu: {}\n  nvme: {} ({}), sub_group_size {} "
             "({} sub-groups), buffer_count 9, "
             "pipeline_read and pipeline_write on; gradient_clipping {}\n",
             b.model, params, b.micro_batch, b.seq, b.steps, b.warmup, b.rounds, cpu_model(), dir,
             file_system_name(dir), sub_group, b.sub_groups, b.clip);
  const std::string config = config_text(b, work, write_corpus(work, b.model_vocab ? 60 : 24));
  const std::vector<std::string> offload = {
      "zero_optimization.offload_optimizer.device=\"nvme\"",
      fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}/swap\"", work),
      "zero_optimization.offload_optimizer.buffer_count=9",
      "zero_optimization.offload_optimizer.pipeline_read=true",
      "zero_optimization.offload_optimizer.pipeline_write=true",
      fmt::format("zero_optimization.sub_group_size={}", sub_group)};
  const int phases = 2 * b.rounds + 1;
  int rc = 1;
  [&] {
    run_figures mem, off;
    for (int k = 0; k < 2 * b.rounds; ++k) {
      const bool offloaded = (k % 4 == 1 || k % 4 == 2); // A B B A ...
      const std::string name = fmt::format("{}_{}", offloaded ? "offload" : "in_memory", k / 2);
      fmt::print("[{}/{}] training {}\n", k + 1, phases,
                 offloaded ? "with the optimizer state on NVMe"
                           : "with the optimizer state in memory");
      std::fflush(stdout);
      auto f = train_once(b, work, name, config, offloaded ? offload : std::vector<std::string>{});
      if (!f)
        return fmt::print(stderr, "dsactor bench offload: {}\n", f.err().to_string());
      (offloaded ? off : mem).add(*f);
    }
    fmt::print("[{}/{}] the disk with the same engine settings ([aio] defaults)\n", phases, phases);
    std::fflush(stdout);
    const std::size_t disk_bytes =
        std::min<std::size_t>(512u << 20, static_cast<std::size_t>(params) * 12);
    auto disk = measure_engine(work, aio::aio_config{}, disk_bytes, 2);
    if (!disk)
      return fmt::print(stderr, "dsactor bench offload: {}\n", disk.err().to_string());
    fmt::print("median seconds ({})   {:>9} {:>9} {:>9}\n", cpu_model(), "step", "fwd+bwd",
               "update");
    print_run("in memory", mem);
    print_run("offloaded to NVMe", off);
    const findings f = assess(b, params, mem, off, *disk);
    print_findings(f, dir, *disk, off, off.runs * b.steps);
    print_json(b, params, off.step_s.size(), f, *disk, off);
    rc = 0;
  }();
  fs::remove_all(work, ec);
  return rc;
}

} // namespace dsa::tools
