// Validation and printing of the `[aio]` settings.
#include "io/aio/aio_config.hpp"

namespace dsa::aio {
namespace {

// io_setup's nr_events is bounded by /proc/sys/fs/aio-max-nr (65536 by default); a queue
// deeper than a few thousand never helps one file, so the range stays well below it.
constexpr unsigned max_queue_depth = 4096;
constexpr unsigned max_threads = 256;

} // namespace

status aio_config::validate() const {
  if (block_size == 0 || block_size % 4096 != 0)
    return make_error(errc::config, "aio.block_size = {}: must be a positive multiple of 4096",
                      block_size);
  if (queue_depth == 0 || queue_depth > max_queue_depth)
    return make_error(errc::config, "aio.queue_depth = {}: must be in 1..{}", queue_depth,
                      max_queue_depth);
  if (intra_op_parallelism == 0 || intra_op_parallelism > max_threads)
    return make_error(errc::config, "aio.intra_op_parallelism = {}: must be in 1..{}",
                      intra_op_parallelism, max_threads);
  return {};
}

std::string aio_config::to_toml() const {
  return fmt::format("[aio]\nblock_size = {}\nqueue_depth = {}\nintra_op_parallelism = {}\n"
                     "single_submit = {}\noverlap_events = {}\n",
                     block_size, queue_depth, intra_op_parallelism, single_submit, overlap_events);
}

std::string aio_config::summary() const {
  return fmt::format("block_size={} queue_depth={} intra_op_parallelism={} single_submit={} "
                     "overlap_events={}",
                     block_size, queue_depth, intra_op_parallelism, single_submit, overlap_events);
}

} // namespace dsa::aio
