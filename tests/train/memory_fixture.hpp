// Helpers of the host-memory tests (test_run_memory_plan.cpp: the plan's arithmetic;
// test_run_memory_runs.cpp: real runs of the dsactor binary in a child process whose peak
// resident memory, the kernel's from wait4, stays within the budget the plan accepts).
#pragma once

#include "tests/train/train_fixture.hpp"

#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/layer_partition.hpp"
#include "actors/train/config/run_config.hpp"
#include "actors/train/memory/memory_plan.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <regex>
#include <spawn.h>
#include <sstream>
#include <sys/resource.h>
#include <sys/wait.h>

extern char** environ;

namespace dsa::test::memory {

using dsa::test::with; // for the files that use this namespace

using namespace dsa;

inline constexpr std::int64_t mib = std::int64_t{1} << 20;

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline train::run_config parsed(const std::string& dir, const std::string& tables) {
  const std::string path = dir + "/plan.toml";
  std::ofstream(path) << test::tiny_config(dir, tables);
  auto cfg = train::load_run_config(path);
  REQUIRE(cfg.has_value());
  auto rc = train::parse_run_config(*cfg, dir + "/run");
  REQUIRE_MESSAGE(rc.has_value(), (rc.has_value() ? "" : rc.err().message));
  return *rc;
}

inline std::vector<bert::bert_range> ranges_of(const train::run_config& rc) {
  auto r = train::partition_layers(rc.model, rc.stages, rc.partition);
  REQUIRE(r.has_value());
  return *r;
}

inline train::plan_inputs inputs() {
  train::plan_inputs in;
  in.baseline = 10 * mib;
  in.seq_length = 32;
  in.predictions = 5;
  return in;
}

// The message's "the smallest budget that works is <n>MiB".
inline std::int64_t smallest_mib(const std::string& message) {
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(message, m, std::regex("the smallest budget that works is ([0-9]+)MiB")), message);
  return std::stoll(m[1].str());
}

struct child_run {
  int exit_code = -1;
  std::int64_t max_rss = 0; // bytes, the kernel's high-water mark of the child
  std::string err, log;
};

// `dsactor run` as a child process, so its peak resident memory is its own.
inline child_run run_binary(const std::string& dir, const std::string& config_text, const std::vector<std::string>& sets,
                     const std::vector<std::string>& flags = {}) {
  const char* binary = std::getenv("DSACTOR");
  REQUIRE_MESSAGE(binary != nullptr, "DSACTOR names the dsactor binary (set by meson)");
  const std::string config = dir + "/mem.toml", err = dir + "/stderr.txt", out = dir + "/stdout.txt";
  std::ofstream(config) << config_text;
  std::vector<std::string> args{binary, "run", config};
  for (const auto& f : flags) args.push_back(f);
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&files, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, binary, &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  REQUIRE(spawned == 0);
  int status = 0;
  rusage usage{};
  REQUIRE(wait4(pid, &status, 0, &usage) == pid);
  child_run r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.max_rss = static_cast<std::int64_t>(usage.ru_maxrss) * 1024; // KiB on Linux
  r.err = read_text(err);
  r.log = read_text(dir + "/run/train.log");
  return r;
}

// A model whose states and activations dwarf the process's own baseline: hidden 256,
// 4 layers (3.2 M parameters, 88 MiB of model states in fp32 without ZeRO).
inline const std::vector<std::string> larger{"model.hidden_size=256", "model.num_heads=4", "model.intermediate_size=1024",
                                      "train_steps=2"};

// Two in-process ranks of ZeRO-3 with the optimizer state on NVMe under `swap` (ZeRO-3
// partitions the weights with or without offload_param; on one rank, offload_param is what
// turns stage 3 from stage 0 into real partitions), and a model whose weights outweigh
// offload_param's buffers (about 9M parameters; the tiny one's are smaller than the buffers
// that would stream them).
inline train::run_config zero3_on_nvme(const std::string& dir, const std::string& swap) {
  auto rc = parsed(dir, fmt::format("[devices]\nranks = 2\n[zero_optimization]\nstage = 3\n"
                                    "[zero_optimization.offload_optimizer]\n"
                                    "device = \"nvme\"\nnvme_path = \"{}\"\n",
                                    swap));
  rc.model.hidden_size = 384;
  rc.model.num_heads = 6;
  rc.model.intermediate_size = 1536;
  rc.model.vocab_size = 8000;
  return rc;
}

} // namespace dsa::test::memory
