// The NVMe optimizer swap; see swap_store.hpp.
#include "io/aio/swap_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>

#include <unistd.h>

namespace dsa::aio {

namespace {
constexpr const char* array_names[optim::state_arrays] = {"master", "exp_avg", "exp_avg_sq"};

// The fault tests' hook (tests/integration/offload_faults.sh): with DSA_SWAP_HOLD_FIFO
// naming a FIFO, the process's first sweep that reads swapped state first reads that FIFO
// to its end. The script's open of the FIFO returns once the run waits there, with no
// transfer in flight, so it can cut a swap file at a known point instead of racing the run.
void hold_for_test() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* fifo = std::getenv("DSA_SWAP_HOLD_FIFO");
    if (fifo == nullptr || *fifo == '\0') return;
    std::ifstream in(fifo);
    std::string line;
    while (std::getline(in, line)) {
    }
  });
}
} // namespace

std::size_t swap_buffers_needed(bool pipeline_read, bool pipeline_write) {
  return optim::state_arrays * (1 + (pipeline_read ? 1 : 0) + (pipeline_write ? 1 : 0));
}

std::int64_t swap_chunk_numel(std::int64_t sub_group, std::int64_t granule, std::int64_t numel) {
  const std::int64_t rounded = (sub_group + granule - 1) / granule * granule;
  return std::max(granule, std::min(rounded, numel));
}

swap_store::swap_store(std::shared_ptr<aio_engine> engine, const swap_options& options, std::int64_t chunk)
    : engine_(std::move(engine)), options_(options), chunk_(chunk) {
  for (unsigned a = 0; a < optim::state_arrays; ++a)
    paths_[a] = fmt::format("{}/{}.{}.swp", options_.dir, options_.name, array_names[a]);
}

expected<std::unique_ptr<swap_store>> swap_store::create(std::shared_ptr<aio_engine> engine,
                                                         const swap_options& options) {
  DSA_CHECK(engine != nullptr, "swap_store: no engine");
  if (options.numel < 0 || options.granule < 1 || options.sub_group < 1 || options.numel % options.granule != 0)
    return make_error(errc::invalid_argument, "swap store '{}': {} elements, sub-groups of {}, granule {}",
                      options.name, options.numel, options.sub_group, options.granule);
  if ((options.granule * static_cast<std::int64_t>(sizeof(float))) % static_cast<std::int64_t>(engine->alignment()) != 0)
    return make_error(errc::invalid_argument, "swap store '{}': chunks of {} floats are not aligned to the file system's {} bytes",
                      options.name, options.granule, engine->alignment());
  const std::size_t needed = swap_buffers_needed(options.pipeline_read, options.pipeline_write);
  if (options.buffer_count < needed)
    return make_error(errc::config,
                      "zero_optimization.offload_optimizer.buffer_count = {} cannot hold the swap pipeline: {} buffers are "
                      "needed (3 per sub-group in flight: the one being updated{}{}); raise buffer_count to {} or turn "
                      "pipelining off", options.buffer_count, needed, options.pipeline_read ? ", the next being read" : "",
                      options.pipeline_write ? ", the last being written" : "", needed);
  if (::access(options.dir.c_str(), W_OK | X_OK) != 0)
    return make_error(errc::io, "nvme_path: cannot write swap files in '{}': {}", options.dir, std::strerror(errno));
  const std::int64_t chunk = swap_chunk_numel(options.sub_group, options.granule, options.numel);
  std::unique_ptr<swap_store> store(new swap_store(std::move(engine), options, chunk));
  pool_options po;
  po.buffer_count = needed; // buffer_count is an upper bound: more would sit idle
  po.buffer_bytes = static_cast<std::size_t>(chunk) * sizeof(float);
  po.alignment = std::max<std::size_t>(4096, store->engine_->alignment());
  po.pinning = options.pinning;
  DSA_ASSIGN_OR_RETURN(store->pool_, aligned_buffer_pool::create(po));
  for (std::size_t i = 0; i < needed; ++i) store->buffers_.push_back(*store->pool_->try_acquire());
  return store;
}

swap_store::~swap_store() {
  for (const auto& p : paths_) ::unlink(p.c_str()); // scratch: a missing file is fine
}

std::int64_t swap_store::resident_bytes() const {
  std::int64_t n = 0;
  for (const auto& b : buffers_) n += static_cast<std::int64_t>(b.size());
  return n;
}

// The chunks in flight of one sweep: each slot is one buffer per array.
struct swap_store::sweep_run {
  struct slot {
    std::int64_t chunk = -1;
    int pending = 0;       // transfers not yet completed
    bool computed = false; // fn has run on it (a read-ahead slot has not)
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<slot> slots;
  std::optional<error> failed;

  bool is_free(const slot& s) const { return s.chunk < 0 || (s.computed && s.pending == 0); }
  bool quiet() const {
    return std::all_of(slots.begin(), slots.end(), [](const slot& s) { return s.pending == 0; });
  }
  void fail(const error& e) {
    if (!failed) failed = e;
  }
};

status swap_store::sweep(unsigned read, unsigned write, const optim::chunk_fn& fn) {
  if ((read & ~written_) != 0)
    return make_error(errc::protocol, "swap store '{}/{}': read before the state was written", options_.dir,
                      options_.name);
  if (read != 0) hold_for_test();
  const std::int64_t n = chunks();
  const std::int64_t ahead = read != 0 && options_.pipeline_read ? 1 : 0;
  const bool write_behind = write != 0 && options_.pipeline_write;
  sweep_run run;
  run.slots.resize(buffers_.size() / optim::state_arrays);
  std::vector<std::size_t> slot_of(static_cast<std::size_t>(n), 0);
  const auto file_bytes = static_cast<std::uint64_t>(options_.numel) * sizeof(float);

  auto buffer = [&](std::size_t slot, unsigned a) -> const pool_buffer& {
    return buffers_[slot * optim::state_arrays + a];
  };
  auto range = [&](std::int64_t chunk) {
    return std::pair<std::int64_t, std::int64_t>{chunk * chunk_, std::min(options_.numel, (chunk + 1) * chunk_)};
  };
  // Starts the transfers of `mask`'s arrays of the chunk in `slot`.
  auto transfer = [&](std::size_t slot, aio_op op, unsigned mask) {
    const auto [lo, hi] = range(run.slots[slot].chunk);
    for (unsigned a = 0; a < optim::state_arrays; ++a) {
      if (!(mask & (1u << a))) continue;
      aio_request r;
      r.op = op;
      r.path = paths_[a];
      r.buffer = buffer(slot, a).data();
      r.buffer_bytes = buffer(slot, a).size();
      r.bytes = static_cast<std::size_t>(hi - lo) * sizeof(float);
      r.file_offset = static_cast<std::uint64_t>(lo) * sizeof(float);
      if (op == aio_op::read || (written_ & (1u << a))) r.expect_file_size = file_bytes;
      if (op == aio_op::write) r.file_length = file_bytes;
      const std::size_t bytes = r.bytes;
      {
        std::lock_guard<std::mutex> lock(run.mu);
        ++run.slots[slot].pending;
      }
      auto id = engine_->submit(std::move(r), [this, &run, slot, op, bytes](aio_completion&& c) {
        std::lock_guard<std::mutex> lock(run.mu);
        if (!c.result) run.fail(c.result.err());
        else (op == aio_op::read ? bytes_read_ : bytes_written_) += bytes;
        --run.slots[slot].pending;
        run.cv.notify_all();
      });
      if (!id) {
        std::lock_guard<std::mutex> lock(run.mu);
        --run.slots[slot].pending;
        run.fail(id.err());
      }
    }
  };
  // Gives chunk a free slot and starts its reads; with `wait`, waits for a slot to free.
  auto claim = [&](std::int64_t chunk, bool wait) {
    std::unique_lock<std::mutex> lock(run.mu);
    auto free_slot = [&] {
      return std::find_if(run.slots.begin(), run.slots.end(), [&](const auto& s) { return run.is_free(s); });
    };
    if (wait) run.cv.wait(lock, [&] { return run.failed || free_slot() != run.slots.end(); });
    auto it = free_slot();
    if (run.failed || it == run.slots.end()) return false;
    *it = sweep_run::slot{chunk, 0, false};
    const auto slot = static_cast<std::size_t>(it - run.slots.begin());
    slot_of[static_cast<std::size_t>(chunk)] = slot;
    lock.unlock();
    if (read != 0) transfer(slot, aio_op::read, read);
    return true;
  };

  std::int64_t next = 0; // the next chunk to be given a slot
  for (std::int64_t i = 0; i < n; ++i) {
    if (next == i) {
      if (!claim(i, true)) break;
      ++next;
    }
    while (next < n && next <= i + ahead && claim(next, false)) ++next;
    const std::size_t slot = slot_of[static_cast<std::size_t>(i)];
    {
      std::unique_lock<std::mutex> lock(run.mu);
      run.cv.wait(lock, [&] { return run.failed || run.slots[slot].pending == 0; });
      if (run.failed) break;
    }
    optim::state_chunk c;
    c.index = i;
    std::tie(c.lo, c.hi) = range(i);
    for (unsigned a = 0; a < optim::state_arrays; ++a)
      if ((read | write) & (1u << a)) c.arrays[a] = static_cast<float*>(buffer(slot, a).data());
    status done = fn(c);
    {
      std::lock_guard<std::mutex> lock(run.mu);
      run.slots[slot].computed = true;
      if (!done) run.fail(done.err());
      if (run.failed) break;
    }
    if (write != 0) {
      transfer(slot, aio_op::write, write);
      if (!write_behind) {
        std::unique_lock<std::mutex> lock(run.mu);
        run.cv.wait(lock, [&] { return run.failed || run.slots[slot].pending == 0; });
      }
    }
  }
  std::unique_lock<std::mutex> lock(run.mu);
  run.cv.wait(lock, [&] { return run.quiet(); }); // the buffers are ours again
  if (run.failed) return *run.failed;
  written_ |= write;
  return {};
}

} // namespace dsa::aio
