// `dsactor bench allreduce`: fp32 allreduce between two processes of this machine:
// dsactor's communicator over ucx_transport against Gloo (ring and halving-doubling,
// TCP device) and OpenMPI's MPI_Allreduce, with memcpy bandwidth as the bound.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsa::tools {

int bench_allreduce_main(int argc, char** argv);

struct allreduce_plan {
  std::vector<std::int64_t> sizes_bytes; // each a multiple of 4 (fp32)
  int warmup = 2;
  int iterations = 7;
  bool shared_memory = true; // dsactor's shared-memory allreduce (false: the UCX ring)
};

// One rank's measurement: for every size, fill the buffer (rank r: element i is
// (i % 13) + r), run one allreduce and check every element against the exact sum
// (the values are small integers, so every summation order gives it), then time
// plan.warmup + plan.iterations allreduces, each after a barrier. Returns the median
// seconds per size. `progress` (may be empty) is told about each size.
using allreduce_call = std::function<status(float* data, std::int64_t count)>;
using barrier_call = std::function<status()>;
expected<std::vector<double>> time_allreduce(int rank, int ranks, const allreduce_plan& plan,
                                             const allreduce_call& allreduce,
                                             const barrier_call& barrier,
                                             const std::function<void(std::int64_t, double)>& progress);

// Gloo's ring and halving-doubling allreduce between `ranks` forked processes (rank
// 0's medians, per size). An error says why (including "not built with Gloo").
struct gloo_result {
  expected<std::vector<double>> ring = error{};
  expected<std::vector<double>> halving_doubling = error{};
};
gloo_result bench_gloo(int ranks, const allreduce_plan& plan);

} // namespace dsa::tools
