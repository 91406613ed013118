// The first phases of `dsactor run`: open the run, its data, its memory plan and the
// ranks of this process; see run_phases.hpp.
#include "actors/train/run/run_phases.hpp"
#include "actors/train/run/trainer.hpp"

#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/offload_config.hpp"
#include "actors/train/stage/device_choice.hpp"
#include "core/log.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "io/ckpt/checkpoint_dir.hpp"
#include "io/net/rendezvous_env.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/cpu/isa.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>

namespace dsa::train {

namespace {
namespace fs = std::filesystem;

std::string default_run_dir(const std::string& config_path) {
  // `dsactor launch --max_restarts` pins it for every attempt of the job.
  if (const char* pinned = std::getenv("DSA_LAUNCH_RUN_DIR"); pinned && *pinned) return pinned;
  return timestamped_run_dir(config_path);
}

// --resume without a run_dir in the config: the newest runs/<config name>-<time> that
// holds a checkpoint (names sort by time).
expected<std::string> run_dir_to_resume(const std::string& config_path) {
  const std::string prefix = fs::path(config_path).stem().string() + "-";
  std::string best;
  std::error_code ec;
  for (fs::directory_iterator it("runs", ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) == 0 && fs::exists(it->path() / "checkpoints" / "latest") && name > best) best = name;
  }
  if (best.empty())
    return make_error(errc::not_found, "--resume: no earlier run of {} with a checkpoint under runs/{}* (set run_dir "
                      "or checkpoint.load)", config_path, prefix);
  return "runs/" + best;
}

// The config, the --set flags and --resume: every problem of them reported in one run.
int read_config(const run_request& req, opened_run& run, int processes) {
  run_context& ctx = run.ctx;
  config_problems problems;
  for (const auto& o : req.overrides)
    if (auto s = ctx.cfg.set_override(o); !s)
      problems.add(s.err());
  if (req.resume)
    if (auto s = ctx.cfg.set_override("checkpoint.load=\"latest\""); !s)
      problems.add(s.err());
  std::string run_dir = default_run_dir(req.config_path);
  if (req.resume_if_any && !req.resume) {
    // A restarted attempt: resume when this run's checkpoint.dir holds a committed
    // checkpoint, start afresh otherwise (a fault before the first commit).
    config_problems probe;
    const run_config rc = read_run_config(ctx.cfg, run_dir, probe, processes);
    if (probe.to_status() && ckpt::resolve_checkpoint(rc.checkpoint.dir, "latest"))
      if (auto s = ctx.cfg.set_override("checkpoint.load=\"latest\""); !s) problems.add(s.err());
  }
  if (req.resume && !ctx.cfg.table().at_path("run_dir").node()) {
    // Not finding the run to resume is reported with the config's problems.
    if (auto earlier = run_dir_to_resume(req.config_path)) run_dir = *earlier;
    else problems.add(earlier.err());
  }
  ctx.rc = read_run_config(ctx.cfg, run_dir, problems, processes);
  if (auto s = problems.to_status(); !s) return fail_run(s.err(), 2);
  return 0;
}

// Under dsactor launch: join the job, take rank 0's run directory, and estimate where the
// rendezvous server's steady clock stands against this process's (the trace inspector puts
// the ranks of several hosts on that one clock: trace_clock.hpp).
int join(const net::rendezvous_env& env, opened_run& run) {
  run_context& ctx = run.ctx;
  auto joined = join_job(env, ctx.cfg);
  if (!joined) return fail_run(joined.err());
  run.job = std::move(*joined);
  ctx.process = run.job->env.rank;
  ctx.rank = ctx.process;
  if (ctx.rc.stages_across_processes()) {
    // DeepSpeed's pipe-data topology: rank = pipe position x dp + data rank.
    const auto& rc = ctx.rc;
    const int dp = run.job->env.world_size / rc.pipe_processes;
    ctx.rank = ctx.process % dp;
    ctx.placement.here = ctx.process;
    for (std::uint32_t s = 0; s < rc.stages; ++s)
      ctx.placement.process.push_back(static_cast<int>(s / rc.stages_per_process) * dp + ctx.rank);
  }
  // Every process writes into rank 0's run directory (a default name carries the time).
  auto dirs = run.job->client->allgather("run_dir", to_bytes(ctx.rc.run_dir));
  if (!dirs) return fail_run(dirs.err(), 1);
  const auto& first = dirs->front();
  ctx.rc.run_dir.assign(reinterpret_cast<const char*>(first.data()), first.size());
  if (!ctx.cfg.has("checkpoint.dir")) ctx.rc.checkpoint.dir = ctx.rc.run_dir + "/checkpoints";
  auto clock = run.job->client->estimate_server_clock();
  if (!clock) return fail_run(clock.err(), 1);
  ctx.trace_facts = {{"clock_reference", fmt::format("rendezvous server at {}:{}", run.job->env.master_addr,
                                                     run.job->env.master_port)},
                     {"clock_reference_offset_ns", std::to_string(clock->offset_ns)},
                     {"clock_reference_error_ns", std::to_string(clock->error_ns)}};
  return 0;
}

// The run directory, its log file (one per rank) and the effective config, logged.
int open_run_dir(opened_run& run) {
  const run_config& rc = run.ctx.rc;
  std::error_code ec;
  fs::create_directories(rc.run_dir, ec);
  if (ec) return fail_run(make_error(errc::io, "run_dir '{}': cannot create: {}", rc.run_dir, ec.message()), 1);
  const std::string log_name = run.lead ? "train.log" : fmt::format("train.rank{}.log", run.ctx.process);
  if (!set_log_file(rc.run_dir + "/" + log_name))
    return fail_run(make_error(errc::io, "{}/{}: cannot open for writing", rc.run_dir, log_name), 1);
  run.log.open = true;
  const std::string effective = run.ctx.cfg.to_toml();
  if (run.lead)
    if (auto w = ckpt::write_file_atomic(rc.run_dir + "/config.toml", effective + "\n"); !w) return fail_run(w.err(), 1);
  log_info("dsactor run {} -> {}{}\neffective config:\n{}", rc.config_path, rc.run_dir,
           run.job ? fmt::format(" as rank {} of {} processes on host {}", run.ctx.process, run.job->env.world_size,
                                 host_name())
                   : std::string(),
           effective);
  if (rc.stages_across_processes() && run.job) log_info("{}", describe_pipe_layout(run.ctx, run.job->env.world_size));
  log_info("{}{}", cpu::isa_report(),
           rc.bf16_cpu_gemm ? fmt::format("; GEMMs on bf16 operands through oneDNN {} (bf16.cpu_gemm)",
                                          cpu::bf16_gemm_implementation())
                            : std::string());
  return 0;
}

} // namespace

std::string describe_pipe_layout(const run_inputs& in, int processes) {
  const auto& rc = in.rc;
  const int dp = processes / rc.pipe_processes;
  std::string out = fmt::format("pipe-data layout: {} processes = {} pipeline position(s) x data-parallel {}; "
                                "{} stage(s) per process (pipeline.stages_per_process)",
                                processes, rc.pipe_processes, dp, rc.stages_per_process);
  for (int p = 0; p < rc.pipe_processes; ++p) {
    const auto first = static_cast<std::uint32_t>(p) * rc.stages_per_process;
    const auto last = first + rc.stages_per_process - 1;
    std::string ranks;
    for (int d = 0; d < dp; ++d) ranks += fmt::format("{}{}", d ? ", " : "", p * dp + d);
    out += fmt::format("\n  stage{} {}: rank{} {}", first == last ? "" : "s",
                       first == last ? std::to_string(first) : fmt::format("{}-{}", first, last), dp > 1 ? "s" : "",
                       ranks);
  }
  out += fmt::format("\n  this process: rank {}, stage(s) ", in.process);
  bool any = false;
  for (std::uint32_t s = 0; s < rc.stages; ++s)
    if (in.local(s)) {
      out += fmt::format("{}{}", any ? ", " : "", s);
      any = true;
    }
  out += fmt::format(" of replica {}", in.rank);
  return out;
}

std::string describe_rank_stages(const run_config& rc, int processes, int rank) {
  const int dp = std::max(1, processes / std::max(1, rc.pipe_processes));
  const auto first = static_cast<std::uint32_t>(rank / dp) * rc.stages_per_process;
  const auto last = first + rc.stages_per_process - 1;
  return fmt::format("rank {} ran {} of replica {}", rank,
                     first == last ? fmt::format("stage {}", first) : fmt::format("stages {}-{}", first, last),
                     rank % dp);
}

int fail_run(const error& e, int code) {
  fmt::print(stderr, "dsactor run: {}\n", e.message);
  swap_area::remove_all_now(); // before a shutdown that may block (a peer behind a cut link)
  return code;
}

int fail_run(const error& e) { return fail_run(e, e.code == errc::config ? 2 : 1); }

log_file_guard::~log_file_guard() {
  if (open) set_log_file("");
}

int open_run(const run_request& req, opened_run& run) {
  auto loaded = load_run_config(req.config_path, req.deepspeed_config);
  if (!loaded) return fail_run(loaded.err(), 2);
  run.ctx.cfg = std::move(*loaded);
  // Under dsactor launch this process is one rank of a job of WORLD_SIZE processes.
  auto launched = net::read_rendezvous_env();
  if (!launched) return fail_run(launched.err(), 2);
  if (int code = read_config(req, run, *launched ? (*launched)->world_size : 1)) return code;
  if (*launched)
    if (int code = join(**launched, run)) return code;
  // devices.backend: refused here, before anything is allocated, when it cannot be used
  // (the CUDA runtime is probed only when asked for).
  const run_config& rc = run.ctx.rc;
  auto device = choose_device(rc, *launched ? (*launched)->local_rank : 0,
                              rc.backend == "cpu" ? gpu_facts{} : probe_gpu());
  if (!device) return fail_run(device.err());
  if (rc.host_optimizer_device) {
    if (rc.offload.device != offload_device::none)
      return fail_run(make_error(errc::config, "debug.host_optimizer_device: the GPU-resident optimizer's mode needs "
                                               "zero_optimization.offload_optimizer.device = \"none\""));
    if (auto s = device_optimizer_supports(rc, "debug.host_optimizer_device"); !s) return fail_run(s.err());
  }
  if (device->device == stage_device::cuda) device->free_bytes = device_free_bytes(device->index);
  run.ctx.device = *device;
  if (device->device != stage_device::cpu) log_info("devices: the stages compute on {}", device->description);
  run.lead = run.ctx.process == 0;
  if (int code = open_run_dir(run)) return code;
  if (run.ctx.cfg.has("activation_checkpointing") && !rc.model.checkpoint_activations && run.lead)
    log_warn("activation_checkpointing configures how checkpointing runs, and model.checkpoint_activations = true "
             "turns it on: it is off in this run");
  return 0;
}

int open_data(opened_run& run) {
  run_context& ctx = run.ctx;
  const run_config& rc = ctx.rc;
  // Rank 0 prepares the data (data.prepare) before the others look at it.
  if (run.job && !run.lead)
    if (auto s = run.job->client->barrier("data"); !s) return fail_run(s.err(), 1);
  auto v = load_vocab(ctx);
  if (!v) return fail_run(v.err());
  if (run.job && run.lead)
    if (auto s = run.job->client->barrier("data"); !s) return fail_run(s.err(), 1);
  tok::tokenizer_options to;
  if (!rc.data.lower_case) to.case_mode = tok::casing::keep;
  if (*v) ctx.tokenizer = std::make_unique<tok::bert_tokenizer>(std::move(**v), to);
  run.rss_before_data = proc_status_bytes("VmRSS");
  if (auto s = make_provider(ctx, ctx); !s) return fail_run(s.err());
  log_info("model: {}; precision {}; batch {} = micro {} x accumulation {} x {} rank(s)", bert::describe(rc.model),
           precision_name(rc.working), rc.batch.train_batch_size, rc.batch.micro_batch_size,
           rc.batch.gradient_accumulation, rc.batch.data_parallel_size);
  std::int64_t total_steps = rc.train_steps;
  if (total_steps == 0)
    total_steps = static_cast<std::int64_t>(std::ceil(rc.epochs * static_cast<double>(ctx.provider->rows_per_epoch()) /
                                                      static_cast<double>(rc.batch.train_batch_size)));
  ctx.last_step = static_cast<std::uint32_t>(std::max<std::int64_t>(total_steps, 1) - 1);
  return 0;
}

int plan_run(opened_run& run, run_plan& plan) {
  run_config& rc = run.ctx.rc;
  const bool could_move_weights = rc.host_memory > 0 && may_move_weights(rc); // the same in every process
  // Stages across processes: this process's stages; rank 0 also gathers the others' masters.
  std::vector<bool> here;
  if (run.ctx.placement.split())
    for (std::uint32_t s = 0; s < rc.stages; ++s) here.push_back(run.ctx.local(s));
  plan_inputs inputs;
  auto memory = plan_run_memory(run.ctx.rc, *run.ctx.provider, run.rss_before_data, here,
                                run.ctx.placement.split() && run.lead, &inputs);
  if (!memory) return fail_run(memory.err());
  plan.memory = std::move(*memory);
  auto device = plan_run_device_memory(rc, run.ctx.device, inputs);
  if (!device) return fail_run(device.err());
  plan.device = *device;
  // What every process of a job must do alike, from what each planned for itself.
  plan.evaluates = plan.memory->evaluation_fits(rc);
  if (run.job)
    if (auto agreed = agree_on_memory(*run.job->client, rc, could_move_weights, plan.evaluates); !agreed)
      return fail_run(agreed.err(), 1);
  return 0;
}

int build_ranks(opened_run& run, process_ranks& ranks) {
  run_context& ctx = run.ctx;
  auto start0 = prepare_rank(ctx, ctx);
  if (!start0) return fail_run(start0.err());
  ranks.starts.push_back(std::move(*start0));
  // Data-parallel ranks 1..R-1 of this process: the same config, each with its own
  // data provider (a copy at rank 0's position), stages, deciders and restored state.
  for (int r = 1; r < static_cast<int>(ctx.rc.ranks); ++r) {
    auto c = std::make_unique<run_context>();
    static_cast<run_inputs&>(*c) = ctx; // the same inputs, but its rank
    c->rank = ctx.rank + r;
    c->provider = ctx.provider->clone();
    c->seq_length = ctx.seq_length;
    auto st = prepare_rank(*c, *c);
    if (!st) return fail_run(st.err());
    ranks.starts.push_back(std::move(*st));
    ranks.replicas.push_back(std::move(c));
  }
  return 0;
}

std::string timestamped_run_dir(const std::string& config_path) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return fmt::format("runs/{}-{}", fs::path(config_path).stem().string(), stamp);
}

} // namespace dsa::train
