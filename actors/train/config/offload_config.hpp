// ZeRO-Offload / ZeRO-Infinity for the optimizer state: DeepSpeed's
// zero_optimization.offload_optimizer keys, the [aio] engine settings, and the
// swap area a rank's optimizer shards keep their swap files in.
//
// device = "nvme": each rank's shards keep their fp32 masters and Adam/LAMB
// moments in swap files under <nvme_path>/<job>/rank<r>/ and stream them through
// a few buffers one sub_group_size chunk at a time (io/aio/swap_store.hpp), so
// the 12 bytes per parameter of optimizer state leave memory. device = "cpu" is
// DeepSpeed's ZeRO-Offload: the state in host memory, stepped by the CPU
// kernels; on a CPU rank that is where it already is, so it changes nothing
// (the run says so). As in DeepSpeed, offloading needs ZeRO stage >= 1.
#pragma once

#include "core/config.hpp"
#include "core/config_problems.hpp"
#include "core/error.hpp"
#include "io/aio/aio_config.hpp"
#include "io/aio/aio_engine.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace dsa::train {

enum class offload_device { none, cpu, nvme };
const char* offload_device_name(offload_device d);

struct offload_settings {
  offload_device device = offload_device::none;
  std::string nvme_path;
  std::int64_t buffer_count = 4; // DeepSpeed's default
  bool pin_memory = true;        // no effect on CPU ranks (nothing is copied to a device)
  bool pipeline_read = false, pipeline_write = false;
  std::int64_t sub_group_size = 1'000'000'000; // zero_optimization.sub_group_size, elements
  aio::aio_config aio;                          // the top-level [aio] table

  bool swaps() const { return device == offload_device::nvme; }

  // zero_optimization.offload_param (ZeRO stage 3 only): where each rank's partition of the
  // working weights lives between gathers. DeepSpeed's keys and defaults; sizes in elements.
  struct params {
    offload_device device = offload_device::none;
    std::string nvme_path;
    std::int64_t buffer_count = 5, buffer_size = 100'000'000, max_in_cpu = 1'000'000'000;
    bool pin_memory = true;
    bool swaps() const { return device == offload_device::nvme; }
  } param;
};

// Reads zero_optimization.offload_optimizer, .offload_param (ZeRO stage 3 only),
// .sub_group_size, the legacy cpu_offload flags and [aio]; needs the ZeRO stage read.
void read_offload(const config& cfg, int zero_stage, offload_settings& out,
                  config_problems& problems);

// The job's swap folder name under nvme_path: the run directory's name and a hash of
// its absolute path, so a restarted job finds (and clears) what a crash left, and two
// jobs never share files.
std::string swap_job_name(const std::string& run_dir);

// One rank's swap folder and its NVMe engine. Opening takes the rank's lock
// (<job>/rank<r>.lock: a second run with the same run directory is refused instead of
// deleting this one's files), clears what an earlier run of the same job left there (a
// crash) and says so; rank 0 also removes the folders of ranks >= `world` an earlier run
// with more ranks left. Destroying it removes the folder and the lock. Under `dsactor
// launch` (DSA_LAUNCH_SWAP_REGISTRY, this host's ranks), opening also registers the folder
// with the launcher, which removes it once the job has ended if its rank died without
// doing so (tools/launch/swap_janitor.hpp).
class swap_area {
public:
  // The run failed (fail_run), or its job is lost (join_job's lost callback, which may
  // come while the run is blocked in a call to a peer that never answers): removes every
  // open swap area's files now, before a shutdown that may block until the launcher kills
  // the process, which would leave them. The locks stay held (no other run takes a
  // folder while this process lives) and the registry entries stay for the launcher;
  // transfers still in flight then fail, after the run's own error was reported.
  static void remove_all_now();

  static expected<std::unique_ptr<swap_area>> open(const offload_settings& settings, const std::string& run_dir,
                                                   int rank, int world);
  ~swap_area();
  swap_area(const swap_area&) = delete;
  swap_area& operator=(const swap_area&) = delete;

  const std::string& dir() const { return dir_; }
  const std::shared_ptr<aio::aio_engine>& engine() const { return engine_; }

private:
  swap_area() = default;
  std::string dir_, job_dir_, lock_path_;
  std::string registered_; // the launcher's registry entry for this folder ("" without one)
  int lock_fd_ = -1;
  std::shared_ptr<aio::aio_engine> engine_;
};

} // namespace dsa::train
