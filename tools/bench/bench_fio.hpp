// fio as the peer of `dsactor bench aio`: sequential write then read of one file with
// libaio and O_DIRECT at 1 MiB blocks and queue depth 32 (the reference setting),
// run as a child process with JSON output. fio is optional: without it the bench says so.
#pragma once

#include "core/error.hpp"
#include "tools/bench/bench_aio.hpp"

#include <cstddef>
#include <string>

namespace dsa::tools {

// The best write and read rates of `reps` runs of fio on a file of `bytes` in `dir` (the
// file is removed afterwards); errc::not_found when no fio is on PATH.
expected<transfer_rates> measure_fio(const std::string& dir, std::size_t bytes, int reps);

} // namespace dsa::tools
