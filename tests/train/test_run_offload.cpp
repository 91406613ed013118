// ZeRO-Infinity's optimizer offload in `dsactor run`: the fp32 masters and moments
// swapped to NVMe give the same bits as in memory (the same kernels, chunk by chunk),
// on one and two ranks, with AdamW, LAMB and fp16; the swap files live where the docs
// say and go at the end (and after a crash, at the next start); checkpoints of an
// offloaded run resume with and without offload; config errors name the key.
#include "tests/train/train_fixture.hpp"

#include "actors/train/config/offload_config.hpp"
#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/run_config.hpp"

#include <doctest/doctest.h>
#include <unistd.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

using namespace dsa;
using dsa::test::with;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> nvme(const std::string& path, const std::vector<std::string>& more = {}) {
  return with({"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=\"nvme\"",
               fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}\"", path)},
              more);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct finished {
  ckpt::loaded_checkpoint checkpoint;
  std::string log;
  std::vector<double> losses;
};

finished train_run(const std::vector<std::string>& overrides) {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "off", test::tiny_config(dir.path()), overrides) == 0);
  return {test::load_run_checkpoint(dir.path() + "/ckpt", "latest"), read_text(dir.path() + "/run/train.log"),
          test::run_losses(dir.path() + "/run")};
}

// The requests the rank's NVMe engine actor handled, from its end-of-run line; 0 without one.
std::uint64_t engine_actor_requests(const std::string& log) {
  const std::string key = "NVMe engine actor: ";
  const auto at = log.find(key);
  if (at == std::string::npos) return 0;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  CHECK_MESSAGE(line.find(", 0 failed)") != std::string::npos, line);
  return std::stoull(line.substr(key.size()));
}
} // namespace

TEST_CASE("offload_optimizer none, cpu and nvme give the same parameters and optimizer state, bit for bit, ZeRO 1, 2 and 3") {
  test::temp_dir swap;
  struct variant {
    std::vector<std::string> keys;
    const char* name;
  };
  // Sub-groups of 2048 elements: the tiny model's stages stream through tens of chunks.
  const std::vector<variant> variants{
      {{}, "AdamW"},
      {{"optimizer.type=\"Lamb\"", "pipeline.stages=2", "zero_optimization.offload_optimizer.pipeline_read=true",
        "zero_optimization.offload_optimizer.buffer_count=6"},
       "LAMB, 2 stages, pipelined reads"},
      {{"fp16.enabled=true", "fp16.initial_scale_power=8", "zero_optimization.offload_optimizer.pipeline_read=true",
        "zero_optimization.offload_optimizer.pipeline_write=true", "zero_optimization.offload_optimizer.buffer_count=9"},
       "fp16, both pipelines"}};
  for (const auto& v : variants) {
    for (auto [ranks, stage] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}, std::pair{2, 3}}) {
      if (stage == 3 && std::string(v.name).find("2 stages") != std::string::npos) continue; // stage 3 has one
      CAPTURE(v.name);
      CAPTURE(ranks);
      CAPTURE(stage);
      const std::string zero = fmt::format("zero_optimization.stage={}", stage);
      auto base = with(v.keys, {fmt::format("devices.ranks={}", ranks), "zero_optimization.sub_group_size=2048"});
      if (stage == 3) base.push_back("zero_optimization.stage3_param_persistence_threshold=1000");
      auto none = train_run(with(base, {zero}));
      auto cpu = train_run(with(base, {zero, "zero_optimization.offload_optimizer.device=\"cpu\""}));
      auto on_nvme = train_run(with(base, nvme(swap.path(), {zero}))); // the later stage key wins
      test::check_same_state(cpu.checkpoint, none.checkpoint);
      test::check_same_state(on_nvme.checkpoint, none.checkpoint);
      CHECK(cpu.log.find("nothing changes") != std::string::npos);
      CHECK(on_nvme.log.find("ZeRO-Infinity: optimizer state (fp32 masters and moments) swapped to " + swap.path()) !=
            std::string::npos);
      // What stays in memory is the swap buffers, measured as the accounting expects.
      CHECK(on_nvme.log.find("masters and moments on NVMe") != std::string::npos);
      CHECK(on_nvme.log.find(fmt::format("(ZeRO stage {}: ", stage)) != std::string::npos);
      CHECK(on_nvme.log.find("(as expected)") != std::string::npos);
      CHECK(on_nvme.log.find("the accounting expected") == std::string::npos);
      // Every swap read and write went through the rank's NVMe engine actor.
      CHECK(engine_actor_requests(on_nvme.log) > 0);
      CHECK(engine_actor_requests(none.log) == 0);
      // The checkpoint streamed the swapped state: one optimizer file per swap chunk of each
      // rank (2048-element chunks: dozens), each holding only that chunk's pieces.
      std::size_t parts = 0;
      for (const auto& f : on_nvme.checkpoint.manifest.files)
        if (f.group.find("_rank") != std::string::npos) {
          CHECK(f.group.find("_part") != std::string::npos);
          ++parts;
          for (const auto& [key, t] : on_nvme.checkpoint.groups.at(f.group))
            if (t.type() == dtype::f32) CHECK(t.numel() <= 2048);
        }
      CHECK(parts > static_cast<std::size_t>(10 * ranks));
      // The swap files are scratch: gone when the run ends.
      CHECK(fs::is_empty(swap.path()));
    }
  }
}

TEST_CASE("offload: the NVMe update streams over the backward, bit for bit the in-memory run, with and without clipping") {
  test::temp_dir swap;
  // fp32 AdamW: each chunk is updated as soon as the backward has finished its gradients
  // (last chunk first); 2048-element sub-groups: the stage's gradients come in dozens of
  // parts. Without clipping the decision is known ahead; with it the stream assumes no
  // clipping, writing the swap's second files, and a step that clips is redone from the
  // state's own files (1e6: never clips; 0.05: clips).
  for (const int ranks : {1, 2})
    for (const char* clip : {"0.0", "1e6", "0.05"}) {
      CAPTURE(ranks);
      CAPTURE(clip);
      const std::vector<std::string> base{fmt::format("gradient_clipping={}", clip),
                                          fmt::format("devices.ranks={}", ranks), "zero_optimization.stage=1",
                                          "zero_optimization.sub_group_size=2048"};
      auto none = train_run(base);
      auto streamed = train_run(with(base, nvme(swap.path(), {"zero_optimization.offload_optimizer.pipeline_read=true",
                                                               "zero_optimization.offload_optimizer.pipeline_write=true",
                                                               "zero_optimization.offload_optimizer.buffer_count=9"})));
      test::check_same_state(streamed.checkpoint, none.checkpoint);
      const std::string& log = streamed.log;
      const std::string line = log.substr(log.find("NVMe swap: "), log.find('\n', log.find("NVMe swap: ")) - log.find("NVMe swap: "));
      CAPTURE(line);
      if (std::string(clip) != "0.05") { // never clips: all 5 steps streamed and kept
        CHECK(line.find("; 5 updates streamed over the backward: ") != std::string::npos);
        if (std::string(clip) == "1e6")
          CHECK(line.find("clipping: 0 streamed updates redone after the norm, 0 steps not streamed") != std::string::npos);
      } else { // the first step streams and is redone; the next ones wait after a clipped step
        CHECK(line.find("; 1 updates streamed over the backward: ") != std::string::npos);
        CHECK(line.find("clipping: 1 streamed updates redone after the norm, 4 steps not streamed") != std::string::npos);
      }
      CHECK(fs::is_empty(swap.path()));
    }
  // Three pipeline stages: the middle one holds no tied parameter and streams; the first
  // and the last exchange the word embedding's gradient and update after the backward.
  const std::vector<std::string> three{"gradient_clipping=0.0", "pipeline.stages=3", "zero_optimization.stage=1",
                                       "zero_optimization.sub_group_size=2048"};
  auto none = train_run(three);
  auto streamed = train_run(with(three, nvme(swap.path())));
  test::check_same_state(streamed.checkpoint, none.checkpoint);
  for (int stage = 0; stage < 3; ++stage) {
    CAPTURE(stage);
    const std::string key = fmt::format("stage {} NVMe swap: ", stage);
    const auto at = streamed.log.find(key);
    REQUIRE(at != std::string::npos);
    const std::string line = streamed.log.substr(at, streamed.log.find('\n', at) - at);
    CAPTURE(line);
    CHECK((line.find("; 5 updates streamed over the backward") != std::string::npos) == (stage == 1));
  }
}

TEST_CASE("offload: a run that fails while an update streams stops with the error instead of hanging") {
  test::temp_dir dir, swap;
  // Stage 0's optimizer throws in step 1 while stage 1 (the middle one, streaming) may be
  // waiting for parts of a step that will not come: the run ends, naming the fault.
  const int rc = test::run_config(dir.path(), "fail", test::tiny_config(dir.path()),
                                  with({"gradient_clipping=0.0", "pipeline.stages=3", "zero_optimization.stage=1",
                                        "zero_optimization.sub_group_size=2048", "debug.fail_stage=0",
                                        "debug.fail_optimizer_step=1"},
                                       nvme(swap.path())));
  CHECK(rc == 1);
  CHECK(read_text(dir.path() + "/run/train.log").find("injected fault") != std::string::npos);
}

TEST_CASE("offload: swap files live under nvme_path/<job>/rank<r>; a crashed run's leftovers are cleared at start") {
  test::temp_dir dir, swap;
  const std::string config = test::tiny_config(dir.path());
  const std::string run_dir = dir.path() + "/run";
  const std::string rank_dir = swap.path() + "/" + train::swap_job_name(run_dir) + "/rank0";
  // What a run killed with -9 leaves behind.
  fs::create_directories(rank_dir);
  std::ofstream(rank_dir + "/stage0.master.swp") << "stale";
  REQUIRE(test::run_config(dir.path(), "swap", config, nvme(swap.path(), {"train_steps=2"})) == 0);
  const std::string log = read_text(run_dir + "/train.log");
  CHECK(log.find("removing the swap files an earlier run of this job left in " + rank_dir) != std::string::npos);
  CHECK_FALSE(fs::exists(swap.path() + "/" + train::swap_job_name(run_dir)));
  // Another run directory is another job: it never touches this one's files.
  CHECK(train::swap_job_name(run_dir) != train::swap_job_name(dir.path() + "/other/run"));
  CHECK(train::swap_job_name(run_dir).rfind("run-", 0) == 0);
}

TEST_CASE("offload: a rank's swap folder is locked against a second run, and rank 0 clears extra ranks' folders") {
  test::temp_dir swap;
  train::offload_settings settings;
  settings.device = train::offload_device::nvme;
  settings.nvme_path = swap.path();
  const std::string run_dir = swap.path() + "/some/run";
  const std::string job = swap.path() + "/" + train::swap_job_name(run_dir);
  // An earlier run with 3 ranks left rank 2's folder; this job has 2.
  fs::create_directories(job + "/rank2");
  std::ofstream(job + "/rank2/stage0.master.swp") << "stale";
  auto rank0 = train::swap_area::open(settings, run_dir, 0, 2);
  REQUIRE_MESSAGE(rank0.has_value(), (rank0.has_value() ? "" : rank0.err().message));
  CHECK_FALSE(fs::exists(job + "/rank2"));
  CHECK(fs::is_directory((*rank0)->dir()));
  // A second run of the same job while this one holds rank 0's folder is refused, naming it.
  auto again = train::swap_area::open(settings, run_dir, 0, 2);
  REQUIRE_FALSE(again.has_value());
  CHECK(again.err().message.find("another run of this job") != std::string::npos);
  CHECK(again.err().message.find((*rank0)->dir()) != std::string::npos);
  // ... and leaves the live run's folder and lock as they were.
  CHECK(fs::is_directory((*rank0)->dir()));
  CHECK(fs::exists(job + "/rank0.lock"));
  // Rank 1's folder is its own; closing both leaves nothing behind.
  auto rank1 = train::swap_area::open(settings, run_dir, 1, 2);
  REQUIRE(rank1.has_value());
  rank1->reset();
  rank0->reset();
  CHECK_FALSE(fs::exists(job));
}

TEST_CASE("offload: a checkpoint of an offloaded run holds the real state and resumes with or without offload") {
  test::temp_dir full, swap;
  const std::vector<std::string> lamb{"optimizer.type=\"Lamb\"", "zero_optimization.sub_group_size=4096"};
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()),
                           with(lamb, {"train_steps=6", "zero_optimization.stage=1"})) == 0);
  auto want = test::load_run_checkpoint(full.path() + "/ckpt", "6");
  for (bool offload_first : {true, false}) {
    CAPTURE(offload_first);
    test::temp_dir part;
    const auto first = offload_first ? nvme(swap.path()) : std::vector<std::string>{"zero_optimization.stage=1"};
    const auto second = offload_first ? std::vector<std::string>{"zero_optimization.stage=1"} : nvme(swap.path());
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(lamb, with(first, {"train_steps=3"}))) == 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(lamb, with(second, {"train_steps=6"})),
                             /*resume=*/true) == 0);
    auto got = test::load_run_checkpoint(part.path() + "/ckpt", "6");
    test::check_same_state(got, want);
  }
}

// DeepSpeed's single-device config with offload_param on "cpu": accepted, and the log says
// that nothing moves on a CPU rank (as offload_optimizer's "cpu" does).
TEST_CASE("offload_param.device = \"cpu\" on one rank: accepted, the log says nothing changes") {
  const finished f = train_run({"zero_optimization.stage=3", "zero_optimization.offload_param.device=\"cpu\""});
  CHECK(f.log.find("offload_param.device = \"cpu\": on a CPU rank the working weights") != std::string::npos);
  CHECK(f.log.find("nothing changes") != std::string::npos);
}

// Swap files on tmpfs live in host memory: the run says so (it still runs).
TEST_CASE("offload: an nvme_path on tmpfs is warned about") {
  struct statfs info{};
  if (::statfs("/dev/shm", &info) != 0 || info.f_type != TMPFS_MAGIC) {
    MESSAGE("skipped: /dev/shm is not a tmpfs here");
    return;
  }
  const std::string path = fmt::format("/dev/shm/dsactor-test-{}", ::getpid());
  const finished f = train_run(nvme(path));
  std::filesystem::remove_all(path);
  CHECK(f.log.find("is on a RAM-backed file system (tmpfs or ramfs)") != std::string::npos);
}

TEST_CASE("offload: bad settings are refused at start-up naming the key and what is expected") {
  test::temp_dir dir, swap;
  auto parse = [&](const std::string& tables) {
    const std::string path = dir.path() + "/bad.toml";
    std::ofstream(path) << test::tiny_config(dir.path(), tables);
    auto cfg = train::load_run_config(path);
    REQUIRE(cfg.has_value());
    return train::parse_run_config(*cfg, "runs/x");
  };
  const std::string nvme_at = fmt::format("[zero_optimization.offload_optimizer]\ndevice = \"nvme\"\nnvme_path = \"{}\"\n",
                                          swap.path());
  struct bad {
    std::string tables, says;
  };
  const std::vector<bad> cases{
      {nvme_at, "key 'zero_optimization.offload_optimizer.device': offloading the optimizer needs zero_optimization.stage >= 1"},
      {"[zero_optimization]\nstage = 1\n[zero_optimization.offload_optimizer]\ndevice = \"nvme\"\n",
       "zero_optimization.offload_optimizer.nvme_path"},
      {"[zero_optimization]\nstage = 1\n[zero_optimization.offload_optimizer]\ndevice = \"disk\"\n",
       "expected \"none\", \"cpu\" or \"nvme\", got \"disk\""},
      {"[zero_optimization]\nstage = 1\n" + nvme_at + "pipeline_read = true\npipeline_write = true\n",
       "key 'zero_optimization.offload_optimizer.buffer_count': 4 buffers cannot hold the swap pipeline: 9 are needed"},
      {"[zero_optimization]\nstage = 1\n" + nvme_at + "buffer_cont = 9\n",
       "key 'zero_optimization.offload_optimizer.buffer_cont': unknown key (did you mean 'buffer_count'?)"},
      {"[zero_optimization]\nstage = 1\n[zero_optimization.offload_param]\ndevice = \"cpu\"\n",
       "key 'zero_optimization.offload_param.device': offloading the parameters needs zero_optimization.stage = 3 (as in "
       "DeepSpeed), got stage 1"},
      {"[devices]\nranks = 2\n[zero_optimization]\nstage = 3\n[zero_optimization.offload_param]\ndevice = \"nvme\"\n",
       "zero_optimization.offload_param.nvme_path"},
      {"[devices]\nranks = 2\n[zero_optimization]\nstage = 3\n[zero_optimization.offload_param]\ndevice = \"nvme\"\n"
       "nvme_path = \"x\"\nmax_in_cpus = 0\n",
       "key 'zero_optimization.offload_param.max_in_cpus': unknown key (did you mean 'max_in_cpu'?)"},
      {"[zero_optimization]\nstage = 1\n" + nvme_at + "[aio]\nqueue_depth = 0\n", "aio.queue_depth"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.says);
    auto rc = parse(c.tables);
    REQUIRE_FALSE(rc.has_value());
    INFO(rc.err().message);
    CHECK(rc.err().message.find(c.says) != std::string::npos);
  }
  auto good = parse("[zero_optimization]\nstage = 1\nsub_group_size = 1e6\n" + nvme_at + "[aio]\nblock_size = 262144\n");
  REQUIRE_MESSAGE(good.has_value(), (good.has_value() ? "" : good.err().message));
  CHECK(good->offload.swaps());
  CHECK(good->offload.sub_group_size == 1000000);
  CHECK(good->offload.aio.block_size == 262144);
  auto params = parse(fmt::format("[devices]\nranks = 2\n[zero_optimization]\nstage = 3\n[zero_optimization.offload_param]\n"
                                  "device = \"nvme\"\nnvme_path = \"{}\"\nbuffer_count = 2\nbuffer_size = 1e4\nmax_in_cpu = 0\n",
                                  swap.path()));
  REQUIRE_MESSAGE(params.has_value(), (params.has_value() ? "" : params.err().message));
  CHECK(params->offload.param.swaps());
  CHECK(params->offload.param.buffer_count == 2);
  CHECK(params->offload.param.buffer_size == 10000);
  CHECK(params->offload.param.max_in_cpu == 0);
  // A place where no folder can be made fails the run at start, naming it.
  std::ofstream(dir.path() + "/a_file") << "not a folder";
  CHECK(test::run_config(dir.path(), "bad", test::tiny_config(dir.path()), nvme(dir.path() + "/a_file")) != 0);
  train::offload_settings settings;
  settings.device = train::offload_device::nvme;
  settings.nvme_path = dir.path() + "/a_file";
  auto area = train::swap_area::open(settings, dir.path() + "/run", 0, 1);
  REQUIRE_FALSE(area.has_value());
  CHECK(area.err().message.find("nvme_path: cannot create '" + dir.path() + "/a_file/") != std::string::npos);
}

// The GPU-resident optimizer's path (device_shard) taken end to end on the CPU over the
// host device (debug.host_optimizer_device): the same losses and checkpoint as the plain
// run, bit for bit (resuming it is tested with the shard, test_shard_modes.cpp), through pipelines, data parallelism, fp16 with an overflow skip,
// clipping and speculative updates; and its limits refused by key.
TEST_CASE("debug.host_optimizer_device: the GPU optimizer's mode on the CPU equals the plain run, bit for bit") {
  const std::vector<std::vector<std::string>> variants{
      {},
      {"optimizer.type=\"Adam\"", "bf16.enabled=true", "pipeline.stages=2", "pipeline.speculative_update=true"},
      {"fp16.enabled=true", "fp16.initial_scale_power=8", "debug.overflow_step=2", "devices.ranks=2"}};
  for (const auto& v : variants) {
    CAPTURE(fmt::format("{}", fmt::join(v, " ")));
    auto plain = train_run(v);
    auto device = train_run(with(v, {"debug.host_optimizer_device=true"}));
    CHECK(device.log.find("optimizer: fp32 masters and Adam") != std::string::npos); // Adam or AdamW
    CHECK(device.log.find("moments of every stage on host") != std::string::npos);
    CHECK(plain.log.find("moments of every stage on") == std::string::npos);
    // The host device's masters and moments are host memory, measured as the accounting expects.
    CHECK(device.log.find("the accounting expected") == std::string::npos);
    CHECK(device.log.find("(as expected)") != std::string::npos);
    REQUIRE(plain.losses.size() == 5);
    CHECK(device.losses == plain.losses);
    test::check_same_state(device.checkpoint, plain.checkpoint);
  }
  test::temp_dir dir;
  const std::string cfg = test::tiny_config(dir.path());
  CHECK(test::run_config(dir.path(), "lamb", cfg, {"debug.host_optimizer_device=true", "optimizer.type=\"Lamb\""}) ==
        2);
  CHECK(test::run_config(dir.path(), "zero", cfg,
                         {"debug.host_optimizer_device=true", "devices.ranks=2", "zero_optimization.stage=1"}) == 2);
  CHECK(test::run_config(dir.path(), "cpu", cfg,
                         {"debug.host_optimizer_device=true", "zero_optimization.stage=1",
                          "zero_optimization.offload_optimizer.device=\"cpu\""}) == 2);
}

// A whole stage's update in host memory streamed over the backward (whole_shard's
// host_stream; a CUDA rank with offload_optimizer.device = "cpu" does this, and
// debug.stream_host_update asks for it here): each parameter updated as soon as its
// gradient is final, last first, gives the update after the backward bit for bit, on one
// stage, with bf16 working weights, over two data-parallel ranks (the parts are then the
// reduce buckets) and in a pipeline whose middle stage streams while the ends (the tied word
// embedding's exchange) update after the backward. With clipping nothing streams.
TEST_CASE("debug.stream_host_update: the update streamed over the backward equals the plain run, bit for bit") {
  const std::vector<std::string> base{"gradient_clipping=0.0", "zero_optimization.reduce_bucket_size=2048"};
  struct variant {
    std::vector<std::string> keys;
    std::vector<int> streaming; // the stages whose line says they streamed every step
    int stages = 1;
  };
  const std::vector<variant> variants{{{}, {0}},
                                      {{"bf16.enabled=true", "optimizer.type=\"Adam\""}, {0}},
                                      {{"devices.ranks=2"}, {0}},
                                      {{"pipeline.stages=3"}, {1}, 3},
                                      {{"gradient_clipping=1.0"}, {}}};
  for (const auto& v : variants) {
    const auto keys = with(base, v.keys);
    CAPTURE(fmt::format("{}", fmt::join(keys, " ")));
    auto plain = train_run(keys);
    auto streamed = train_run(with(keys, {"debug.stream_host_update=true"}));
    REQUIRE(plain.losses.size() == 5);
    CHECK(streamed.losses == plain.losses);
    test::check_same_state(streamed.checkpoint, plain.checkpoint);
    for (int stage = 0; stage < v.stages; ++stage) {
      CAPTURE(stage);
      const bool streams = std::find(v.streaming.begin(), v.streaming.end(), stage) != v.streaming.end();
      const std::string key = fmt::format("stage {} optimizer in host memory: ", stage);
      const auto at = streamed.log.find(key);
      CHECK((at != std::string::npos) == streams);
      if (at == std::string::npos) continue;
      const std::string line = streamed.log.substr(at, streamed.log.find('\n', at) - at);
      CAPTURE(line);
      CHECK(line.find(": 5 updates streamed over the backward, ") != std::string::npos);
    }
    CHECK(plain.log.find("optimizer in host memory: ") == std::string::npos);
  }
}

// With clipping or fp16 loss scaling the stream speculates when pipeline.speculative_update
// asks: each parameter's state copied as it steps, taken back when the norm clips or the
// gradients overflow, the step redone after the backward; a step right after one that
// differed waits for the totals. Bit for bit the plain run whichever happens.
TEST_CASE("pipeline.speculative_update: a streamed host update with clipping or fp16 equals the plain run") {
  const std::vector<std::string> base{"zero_optimization.reduce_bucket_size=2048"};
  struct variant {
    std::vector<std::string> keys;
    std::string streamed, taken_back; // what the end-of-run line says (taken_back: none said)
  };
  const std::vector<variant> variants{
      {{"gradient_clipping=1e6"}, ": 5 updates streamed over the backward, ", ""}, // never clips: every step kept
      // Clips every step: the first is taken back, the rest wait for the totals.
      {{"gradient_clipping=0.01"}, ": 1 updates streamed over the backward, ", "; 1 streamed updates taken back", },
      // From 2^20 the first three steps overflow: the first taken back, the next three wait
      // (the third after an overflow, the fourth after the third's), the fifth streams and stands.
      {{"gradient_clipping=0.0", "fp16.enabled=true", "fp16.initial_scale_power=20", "fp16.hysteresis=1"},
       ": 2 updates streamed over the backward, ", "; 1 streamed updates taken back"},
      // fp16 without overflows, clipping every step: the first step's gradients, unscaled in
      // place as it streamed, are restored and the step redone with the clip.
      {{"gradient_clipping=0.01", "fp16.enabled=true", "fp16.initial_scale_power=8"},
       ": 1 updates streamed over the backward, ", "; 1 streamed updates taken back"},
      // A pipeline: the middle stage (no tied embedding) streams, clipping every step.
      {{"gradient_clipping=0.01", "pipeline.stages=3"}, ": 1 updates streamed over the backward, ",
       "; 1 streamed updates taken back"}};
  for (const auto& v : variants) {
    const auto keys = with(base, v.keys);
    CAPTURE(fmt::format("{}", fmt::join(keys, " ")));
    auto plain = train_run(keys);
    auto streamed = train_run(with(keys, {"debug.stream_host_update=true", "pipeline.speculative_update=true"}));
    REQUIRE(plain.losses.size() == 5);
    CHECK(streamed.losses == plain.losses);
    test::check_same_state(streamed.checkpoint, plain.checkpoint);
    const bool piped = std::find(keys.begin(), keys.end(), "pipeline.stages=3") != keys.end();
    const auto at = streamed.log.find(fmt::format("stage {} optimizer in host memory: ", piped ? 1 : 0));
    REQUIRE(at != std::string::npos);
    const std::string line = streamed.log.substr(at, streamed.log.find('\n', at) - at);
    CAPTURE(line);
    CHECK(line.find(v.streamed) != std::string::npos);
    CHECK((line.find("streamed updates taken back") != std::string::npos) == !v.taken_back.empty());
    if (!v.taken_back.empty()) CHECK(line.find(v.taken_back) != std::string::npos);
    CHECK((streamed.log.find("speculative update: the stage's update in host memory streams over the backward") !=
           std::string::npos) == !piped);
    if (piped) { // the ends exchange the tied embedding: they wait for the totals
      for (int stage : {0, 2}) CHECK(streamed.log.find(fmt::format("stage {} optimizer in host memory: ", stage)) ==
                                     std::string::npos);
      // The run's speculation line counts every stage: the ends' 2 x 5 speculated and
      // clipped updates and the middle stage's one streamed and taken back.
      CHECK(streamed.log.find("speculative update: 11 shard update(s) started before the global norm, 11 rolled "
                              "back") != std::string::npos);
    }
  }
  // Without speculative_update nothing streams under clipping (the first test's last variant).
}

TEST_CASE("debug.stream_host_update: a run that fails while an update streams stops with the error") {
  test::temp_dir dir;
  // Stage 0's optimizer throws in step 1 while stage 1 (the middle one, streaming) may be
  // waiting for parts of a step that will not come: the run ends, naming the fault.
  const int rc = test::run_config(dir.path(), "fail", test::tiny_config(dir.path()),
                                  {"gradient_clipping=0.0", "pipeline.stages=3", "debug.stream_host_update=true",
                                   "zero_optimization.reduce_bucket_size=2048", "debug.fail_stage=0",
                                   "debug.fail_optimizer_step=1"});
  CHECK(rc == 1);
  CHECK(read_text(dir.path() + "/run/train.log").find("injected fault") != std::string::npos);
}
