// zero_optimization.offload_optimizer, [aio], and a rank's swap folder.
#include "actors/train/config/offload_config.hpp"

#include "core/file_lock.hpp"
#include "core/log.hpp"
#include "io/aio/swap_store.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "optim/param_reader.hpp"

#include <fmt/format.h>

#include <linux/magic.h>
#include <sys/vfs.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <system_error>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace dsa::train {

const char* offload_device_name(offload_device d) {
  switch (d) {
  case offload_device::none: return "none";
  case offload_device::cpu: return "cpu";
  case offload_device::nvme: return "nvme";
  }
  return "?";
}

namespace {

// DeepSpeed writes element counts as 1e9 (a float in JSON and TOML).
void read_count(optim::param_reader& r, const char* key, std::int64_t& out, std::int64_t min) {
  double v = static_cast<double>(out);
  r.read(key, v);
  if (!(v >= static_cast<double>(min) && v <= 9e15 && v == std::floor(v)))
    r.invalid(key, fmt::format("must be a whole number >= {}, got {}", min, v));
  else
    out = static_cast<std::int64_t>(v);
}

void read_aio(const config& cfg, aio::aio_config& a, config_problems& problems) {
  optim::param_reader r(cfg, "aio", problems);
  std::int64_t block = static_cast<std::int64_t>(a.block_size), depth = a.queue_depth,
               threads = a.intra_op_parallelism;
  read_count(r, "block_size", block, 4096);
  read_count(r, "queue_depth", depth, 1);
  read_count(r, "intra_op_parallelism", threads, 1);
  r.read("single_submit", a.single_submit);
  r.read("overlap_events", a.overlap_events);
  bool gds = false;
  r.read("use_gds", gds);
  if (gds) r.invalid("use_gds", "GPUDirect Storage needs a CUDA rank; set false");
  std::int64_t thread_count = 0; // DeepSpeed's documented, unread alias
  read_count(r, "thread_count", thread_count, 0);
  r.check_unknown();
  a.block_size = static_cast<std::size_t>(block);
  a.queue_depth = static_cast<unsigned>(std::min<std::int64_t>(depth, 1 << 20));
  a.intra_op_parallelism = static_cast<unsigned>(std::min<std::int64_t>(threads, 1024));
  if (auto ok = a.validate(); !ok) problems.add(cfg.problem(problem_kind::invalid_value, "aio", ok.err().message));
}

} // namespace

namespace {

// The table's device, with DeepSpeed's legacy flag (cpu_offload / cpu_offload_param = true
// means "cpu" when no device is named); "nvme" needs the table's nvme_path.
offload_device device_of(const config& cfg, optim::param_reader& r, const std::string& table, const std::string& device,
                         const std::string& nvme_path, const char* legacy_key, config_problems& problems) {
  bool legacy = false;
  cfg.read(legacy_key, legacy, problems);
  if (device == "none") return legacy ? offload_device::cpu : offload_device::none;
  if (device == "cpu") return offload_device::cpu;
  if (device != "nvme") {
    r.invalid("device", fmt::format("expected \"none\", \"cpu\" or \"nvme\", got \"{}\"", device));
    return offload_device::none;
  }
  if (nvme_path.empty())
    problems.add(cfg.problem(problem_kind::missing_key, table + ".nvme_path",
                             "device = \"nvme\" needs the folder for the swap files"));
  return offload_device::nvme;
}

void read_offload_param(const config& cfg, int zero_stage, offload_settings::params& out,
                        config_problems& problems) {
  const std::string table = "zero_optimization.offload_param";
  optim::param_reader r(cfg, table, problems);
  std::string device = "none";
  r.read("device", device);
  r.read("nvme_path", out.nvme_path);
  read_count(r, "buffer_count", out.buffer_count, 1);
  read_count(r, "buffer_size", out.buffer_size, 1);
  read_count(r, "max_in_cpu", out.max_in_cpu, 0);
  r.read("pin_memory", out.pin_memory);
  r.check_unknown();
  out.device = device_of(cfg, r, table, device, out.nvme_path, "zero_optimization.cpu_offload_param", problems);
  if (out.device == offload_device::none) return;
  if (zero_stage != 3)
    r.invalid("device", fmt::format("offloading the parameters needs zero_optimization.stage = 3 (as in DeepSpeed), "
                                    "got stage {}", zero_stage));
}

} // namespace

void read_offload(const config& cfg, int zero_stage, offload_settings& out,
                  config_problems& problems) {
  const std::string table = "zero_optimization.offload_optimizer";
  optim::param_reader r(cfg, table, problems);
  std::string device = "none";
  r.read("device", device);
  r.read("nvme_path", out.nvme_path);
  read_count(r, "buffer_count", out.buffer_count, 1);
  r.read("pin_memory", out.pin_memory);
  r.read("pipeline_read", out.pipeline_read);
  r.read("pipeline_write", out.pipeline_write);
  bool fast_init = false;
  r.read("fast_init", fast_init); // DeepSpeed's start-up shortcut; the swap files are written at start either way
  double ratio = 1.0;
  r.read("ratio", ratio);
  if (ratio != 1.0) r.invalid("ratio", fmt::format("partial offload is not supported; set 1.0, got {}", ratio));
  r.check_unknown();
  out.device = device_of(cfg, r, table, device, out.nvme_path, "zero_optimization.cpu_offload", problems);
  if (out.device != offload_device::none && zero_stage < 1)
    r.invalid("device", fmt::format("offloading the optimizer needs zero_optimization.stage >= 1 (as in DeepSpeed), "
                                    "got stage {}", zero_stage));
  const auto needed = static_cast<std::int64_t>(aio::swap_buffers_needed(out.pipeline_read, out.pipeline_write));
  if (out.swaps() && out.buffer_count < needed)
    r.invalid("buffer_count",
              fmt::format("{} buffers cannot hold the swap pipeline: {} are needed (3 per sub-group in flight{}{}); "
                          "set buffer_count = {} or turn pipelining off",
                          out.buffer_count, needed, out.pipeline_read ? ", one being read ahead" : "",
                          out.pipeline_write ? ", one being written behind" : "", needed));
  optim::param_reader zero(cfg, "zero_optimization", problems);
  read_count(zero, "sub_group_size", out.sub_group_size, 1);
  read_offload_param(cfg, zero_stage, out.param, problems);
  read_aio(cfg, out.aio, problems);
}

std::string swap_job_name(const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(run_dir, ec);
  if (ec) abs = run_dir;
  abs = abs.lexically_normal();
  std::string name = abs.filename().string();
  if (name.empty()) name = abs.parent_path().filename().string();
  std::uint64_t h = 1469598103934665603ull; // FNV-1a of the absolute path
  for (unsigned char c : abs.string()) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{}-{:08x}", name.empty() ? "run" : name, static_cast<std::uint32_t>(h ^ (h >> 32)));
}

namespace {

// Rank 0: folders of ranks >= world that an earlier run with more ranks left, unless
// their owner is alive (holds the lock).
void remove_extra_ranks(const std::string& job_dir, int world) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(job_dir, ec)) {
    const std::string name = e.path().filename().string();
    int r = -1;
    if (!e.is_directory(ec) || std::sscanf(name.c_str(), "rank%d", &r) != 1 || name != fmt::format("rank{}", r) ||
        r < world)
      continue;
    if (remove_unowned_folder(fmt::format("{}/rank{}.lock", job_dir, r), e.path().string()))
      log_warn("offload: removed the swap files of rank {} that an earlier run of this job with more ranks left in {}",
               r, e.path().string());
  }
}

// The open swap areas' folders (remove_all_now).
struct open_area {
  const swap_area* area;
  std::string dir;
};
std::mutex g_open_mu;
std::vector<open_area> g_open; // under g_open_mu

void remove_area_files(const std::string& dir, const std::string& lock, const std::string& job,
                       const std::string& registered) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!lock.empty()) ::unlink(lock.c_str());
  std::filesystem::remove(job, ec); // only when empty: other ranks may still be there
  if (!registered.empty()) ::unlink(registered.c_str()); // nothing left for the launcher
}

} // namespace

void swap_area::remove_all_now() {
  std::lock_guard lock(g_open_mu);
  for (const auto& a : g_open) {
    log_warn("offload: the run failed: removing this rank's swap files in {}", a.dir);
    std::error_code ec;
    std::filesystem::remove_all(a.dir, ec); // the lock and the registry entry stay (see the header)
  }
}

expected<std::unique_ptr<swap_area>> swap_area::open(const offload_settings& settings, const std::string& run_dir,
                                                     int rank, int world) {
  namespace fs = std::filesystem;
  std::unique_ptr<swap_area> area(new swap_area());
  area->job_dir_ = fmt::format("{}/{}", settings.nvme_path, swap_job_name(run_dir));
  area->dir_ = fmt::format("{}/rank{}", area->job_dir_, rank);
  area->lock_path_ = fmt::format("{}/rank{}.lock", area->job_dir_, rank);
  std::error_code ec;
  fs::create_directories(area->job_dir_, ec);
  if (ec)
    return make_error(errc::io, "zero_optimization.offload_optimizer.nvme_path: cannot create '{}': {}",
                      area->job_dir_, ec.message());
  auto fd = try_lock_file(area->lock_path_);
  if (!fd) return make_error(fd.err().code, "zero_optimization.offload_optimizer.nvme_path: {}", fd.err().message);
  if (*fd < 0)
    return make_error(errc::runtime,
                      "zero_optimization.offload_optimizer.nvme_path: another run of this job (run_dir '{}') is using "
                      "the swap folder '{}'; two runs at once need different run directories",
                      run_dir, area->dir_);
  area->lock_fd_ = *fd;
  if (rank == 0) remove_extra_ranks(area->job_dir_, world);
  // Swap files on a RAM-backed file system take the host memory offloading was to spare,
  // outside what limits.host_memory measures (the process's resident memory).
  if (struct statfs fs_info{}; rank == 0 && ::statfs(area->job_dir_.c_str(), &fs_info) == 0 &&
                               (fs_info.f_type == TMPFS_MAGIC || fs_info.f_type == RAMFS_MAGIC))
    log_warn("offload: nvme_path '{}' is on a RAM-backed file system (tmpfs or ramfs): its swap files take host "
             "memory, which limits.host_memory does not count; point it at a disk",
             settings.nvme_path);
  if (fs::exists(area->dir_, ec)) {
    log_warn("offload: removing the swap files an earlier run of this job left in {} (it did not end cleanly)",
             area->dir_);
    fs::remove_all(area->dir_, ec);
    if (ec)
      return make_error(errc::io, "zero_optimization.offload_optimizer.nvme_path: cannot clear '{}': {}", area->dir_,
                        ec.message());
  }
  fs::create_directories(area->dir_, ec);
  if (ec)
    return make_error(errc::io, "zero_optimization.offload_optimizer.nvme_path: cannot create '{}': {}", area->dir_,
                      ec.message());
  if (const char* registry = std::getenv("DSA_LAUNCH_SWAP_REGISTRY"); registry && *registry) {
    // For the launcher: where this rank's files are, should it die before removing them.
    // rank<r>-<n>: a rank may open several (ZeRO-3's weights and optimizer state on
    // different nvme_paths).
    static std::atomic<int> opened{0};
    const std::string entry = fmt::format("{}/rank{}-{}", registry, rank, opened++);
    auto written = ckpt::write_file_atomic(entry, fmt::format("{}\n{}\n{}\n", area->lock_path_, area->dir_, area->job_dir_));
    if (written) area->registered_ = entry;
    else log_warn("offload: could not register the swap folder with the launcher: {}", written.err().message);
  }
  {
    std::lock_guard lock(g_open_mu);
    g_open.push_back({area.get(), area->dir_});
  }
  aio::engine_options o;
  o.config = settings.aio;
  auto alignment = aio::direct_io_alignment(area->dir_);
  if (!alignment) return alignment.err();
  o.alignment = *alignment;
  auto engine = aio::aio_engine::create(o);
  if (!engine) return engine.err();
  area->engine_ = std::move(*engine);
  return area;
}

swap_area::~swap_area() {
  engine_.reset(); // every transfer ended before the files go
  {
    std::lock_guard lock(g_open_mu);
    g_open.erase(std::remove_if(g_open.begin(), g_open.end(), [this](const open_area& a) { return a.area == this; }),
                 g_open.end());
  }
  // Only a folder this area owns (holds the lock of): an open refused because another run
  // holds it must not touch that run's files.
  if (lock_fd_ < 0) return;
  remove_area_files(dir_, lock_path_, job_dir_, registered_);
  ::close(lock_fd_);
}

} // namespace dsa::train
