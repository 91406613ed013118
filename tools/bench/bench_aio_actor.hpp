// `dsactor bench aio`'s swap pattern: a file moved in chunks with a few buffers in flight,
// each completion starting the next chunk (as the optimizer swap does), once straight on the
// aio engine and once through the NVMe engine actor a run uses, so the bench shows what the
// messages and the actor's credits cost.
#pragma once

#include "core/error.hpp"
#include "io/aio/aio_config.hpp"

#include <cstddef>
#include <string>

namespace dsa::tools {

struct swap_pattern_rates {
  std::size_t chunk_bytes = 0, in_flight = 0;
  double engine_write_gbps = 0, engine_read_gbps = 0; // submitted to the aio engine
  double actor_write_gbps = 0, actor_read_gbps = 0;   // through the NVMe engine actor
};

// `bytes` in chunks of 4 MiB (or fewer bytes) with 9 buffers in flight (the swap's three
// arrays with both pipelines), written then read `reps` times each way; the best time of
// each. Every chunk read back carries its index where it was written.
expected<swap_pattern_rates> measure_swap_pattern(const std::string& dir,
                                                  const aio::aio_config& config, std::size_t bytes,
                                                  int reps);

} // namespace dsa::tools
