// Where a ZeRO-3 rank keeps its partition of a stage's working weights between the
// parameter fetcher's gathers (param_fetcher.hpp): in memory, or, with
// zero_optimization.offload_param.device = "nvme", the first `max_in_cpu` elements in
// memory and the rest in a swap file read and written through a submitter
// (io/aio/submitter.hpp: in a run, the rank's NVMe engine actor) in chunks of
// `buffer_size` elements, up to `buffer_count` of them in flight (DeepSpeed's
// offload_param keys and meaning). The fetcher reads a
// tensor's piece just before broadcasting it, on its own thread, so the reads of the
// next parts overlap the compute of the current one (the fetcher's prefetch).
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/aio/submitter.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dsa::train {

class param_store {
public:
  virtual ~param_store() = default;
  // The whole partition (numel() elements, any float dtype): begin_write, one append, end_write.
  status write(const tensor& partition);
  // A new partition in consecutive pieces: begin_write(), append() from element 0 on,
  // end_write() once numel() elements came (then they are stored; fewer is an error).
  // The optimizer shard writes each new version so, window by window, as it updates it.
  // No read may come in between.
  virtual status begin_write() = 0;
  virtual status append(const tensor& values) = 0; // 1-D, any float dtype
  virtual status end_write() = 0;
  // The partition itself when it is kept in memory whole (the shard may update it in
  // place between begin_write and end_write, appending nothing); undefined otherwise.
  virtual tensor in_memory() const { return {}; }
  // Elements [lo, lo + count) of the partition into `out` (count elements of the dtype).
  virtual status read(std::int64_t lo, std::int64_t count, void* out) = 0;
  virtual std::int64_t numel() const = 0;
  // Bytes held in memory: the in-memory elements and the transfer buffers.
  virtual std::int64_t resident_bytes() const = 0;
  // "memory" or "nvme: FILE (N of M elements on NVMe)".
  virtual std::string where() const = 0;
};

// The partition in memory (the default).
std::unique_ptr<param_store> memory_param_store(std::int64_t numel, dtype type);

struct nvme_param_options {
  std::shared_ptr<aio::submitter> engine; // reads go as io_priority::fetch, writes as update
  std::string path;                        // the swap file (created; removed by the destructor)
  std::int64_t max_in_cpu = 1'000'000'000; // elements kept in memory (the partition's first ones)
  std::int64_t buffer_size = 100'000'000;  // elements per transfer buffer
  std::int64_t buffer_count = 5;           // transfer buffers (chunks in flight)
};

expected<std::unique_ptr<param_store>> nvme_param_store(std::int64_t numel, dtype type, const nvme_param_options& options);

// The transfer buffers such a store allocates for a partition of `numel` elements: how
// many and the bytes of each (no larger than the file needs, no more than its chunks),
// for a file system alignment of `alignment` bytes.
struct param_buffers {
  std::int64_t count = 0, bytes = 0;
};
param_buffers nvme_param_buffers(std::int64_t numel, dtype type, std::int64_t max_in_cpu, std::int64_t buffer_size,
                                 std::int64_t buffer_count, std::size_t alignment);

} // namespace dsa::train
