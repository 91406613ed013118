// The NVMe optimizer swap; see swap_store.hpp.
#include "io/aio/swap_store.hpp"
#include "io/aio/swap_flight.hpp"
#include "core/test_fault.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
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
// naming a FIFO, the process's first sweep that reads swapped state first waits for every
// transfer in flight (`settle`), then reads that FIFO to its end. The script's open of the
// FIFO returns once the run waits there, with no transfer in flight, so it can cut a swap
// file at a known point instead of racing the run.
template <class Settle>
void hold_for_test(Settle&& settle) {
  static std::once_flag once;
  std::call_once(once, [&] {
    const char* fifo = std::getenv("DSA_SWAP_HOLD_FIFO");
    if (fifo == nullptr || *fifo == '\0') return;
    settle();
    std::ifstream in(fifo);
    std::string line;
    while (std::getline(in, line)) {
    }
  });
}

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}
} // namespace

struct swap_store::report {
  swap_transfer t;
  std::size_t remaining = 0; // requests not yet ended
};

std::size_t swap_buffers_needed(bool pipeline_read, bool pipeline_write) {
  return optim::state_arrays * (1 + (pipeline_read ? 1 : 0) + (pipeline_write ? 1 : 0));
}

std::size_t swap_buffers_allocated(std::size_t buffer_count) {
  return buffer_count / optim::state_arrays * optim::state_arrays;
}

std::int64_t swap_chunk_numel(std::int64_t sub_group, std::int64_t granule, std::int64_t numel) {
  const std::int64_t rounded = (sub_group + granule - 1) / granule * granule;
  return std::max(granule, std::min(rounded, numel));
}

swap_store::swap_store(std::shared_ptr<submitter> engine, const swap_options& options, std::int64_t chunk)
    : engine_(std::move(engine)), options_(options), chunk_(chunk), flight_(std::make_unique<flight>()) {
  for (unsigned a = 0; a < optim::state_arrays; ++a) {
    paths_[a] = fmt::format("{}/{}.{}.swp", options_.dir, options_.name, array_names[a]);
    shadow_paths_[a] = fmt::format("{}/{}.{}.next.swp", options_.dir, options_.name, array_names[a]);
  }
}

// During a speculation writes go to the second files and reads to the state's own, which
// the speculation leaves as it was (a checkpoint reads the state before the speculation).
const std::string& swap_store::file_of(unsigned a, aio_op op) const {
  return shadow_open_ && op == aio_op::write ? shadow_paths_[a] : paths_[a];
}

expected<std::unique_ptr<swap_store>> swap_store::create(std::shared_ptr<submitter> engine,
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
  // Every buffer_count buffer, in whole sets of 3: sets beyond the pipeline's hold chunks of
  // the next step read ahead (prefetch).
  po.buffer_count = swap_buffers_allocated(options.buffer_count);
  po.buffer_bytes = static_cast<std::size_t>(chunk) * sizeof(float);
  po.alignment = std::max<std::size_t>(4096, store->engine_->alignment());
  po.pinning = options.pinning;
  DSA_ASSIGN_OR_RETURN(store->pool_, aligned_buffer_pool::create(po));
  for (std::size_t i = 0; i < po.buffer_count; ++i) store->buffers_.push_back(*store->pool_->try_acquire());
  store->flight_->slots.resize(po.buffer_count / optim::state_arrays);
  return store;
}

swap_store::~swap_store() {
  (void)flush(); // no transfer may outlive the buffers; an error here has no one to tell
  for (const auto& p : paths_) ::unlink(p.c_str()); // scratch: a missing file is fine
  for (const auto& p : shadow_paths_) ::unlink(p.c_str());
}

std::int64_t swap_store::resident_bytes() const {
  std::int64_t n = 0;
  for (const auto& b : buffers_) n += static_cast<std::int64_t>(b.size());
  return n;
}

std::pair<std::int64_t, std::int64_t> swap_store::range(std::int64_t chunk) const {
  return {chunk * chunk_, std::min(options_.numel, (chunk + 1) * chunk_)};
}

// Starts the transfers of `mask`'s arrays of the slot's chunk; called with `lock` held,
// released around each submit (a completion may run at once, where completions run).
void swap_store::transfer(std::unique_lock<std::mutex>& lock, std::size_t slot, aio_op op, unsigned mask,
                          reading_for serves) {
  auto& f = *flight_;
  const auto [lo, hi] = range(f.slots[slot].chunk);
  const auto file_bytes = static_cast<std::uint64_t>(options_.numel) * sizeof(float);
  // Every transfer is counted before the first is submitted: one that ends at once must
  // not make the set look ready (or free) while the others are still to come.
  std::vector<aio_request> requests;
  for (unsigned a = 0; a < optim::state_arrays; ++a) {
    if (!(mask & (1u << a))) continue;
    const pool_buffer& buffer = buffers_[slot * optim::state_arrays + a];
    aio_request r;
    r.op = op;
    r.path = file_of(a, op);
    r.buffer = buffer.data();
    r.buffer_bytes = buffer.size();
    r.bytes = static_cast<std::size_t>(hi - lo) * sizeof(float);
    r.file_offset = static_cast<std::uint64_t>(lo) * sizeof(float);
    r.file_length = file_bytes;
    // A file that exists must have its whole length: one cut or removed under the run is
    // an error naming it, never refilled with zeros by a write.
    const bool shadow = r.path == shadow_paths_[a];
    if (op == aio_op::read || ((shadow ? shadow_full_ : written_.load()) & (1u << a))) r.expect_file_size = file_bytes;
    if (op == aio_op::write && shadow) shadow_round_ |= 1u << a;
    requests.push_back(std::move(r));
  }
  f.slots[slot].pending += static_cast<int>(requests.size());
  if (requests.empty()) return;
  test_fault::at(test_fault::phase::swap);
  // The statistics and the observer see the set's requests as one transfer.
  auto rep = std::make_shared<report>();
  rep->t.op = op;
  rep->t.chunk = f.slots[slot].chunk;
  rep->t.bytes = static_cast<std::uint64_t>(requests.size() * requests.front().bytes);
  rep->t.t0_ns = steady_ns();
  rep->t.prefetch = serves == reading_for::next_sweep;
  const std::uint64_t sweeps = sweeps_.load();
  rep->t.sweep = rep->t.prefetch ? sweeps + 1 : sweeps;
  rep->remaining = requests.size();
  if (f.active++ == 0) f.busy_since = rep->t.t0_ns;
  // A sweep waits for its reads, and for its writes unless they go behind it.
  const io_priority priority = serves == reading_for::next_sweep ? io_priority::prefetch
                               : op == aio_op::write && options_.pipeline_write ? io_priority::write_behind
                                                                                : io_priority::update;
  lock.unlock();
  std::optional<error> refused;
  std::size_t submitted = 0;
  for (auto& r : requests) {
    const std::size_t bytes = r.bytes;
    auto id = engine_->submit(std::move(r), priority, [this, slot, op, bytes, rep](aio_completion&& c) {
      auto& fl = *flight_;
      std::unique_lock<std::mutex> g(fl.mu);
      if (!c.result) {
        if (!fl.failed) fl.failed = c.result.err();
        rep->t.ok = false;
      } else {
        (op == aio_op::read ? bytes_read_ : bytes_written_) += bytes;
      }
      ++fl.events;
      ended(*rep); // before the slot's: a waiter for quiet slots finds the observer called
      fl.ended(fl.slots[slot]);
      // A set this completion freed takes the next chunk of a prefetch under way.
      if (fl.prefetch_mask != 0 && fl.slots[slot].state == flight::use::free) pump(g);
      fl.cv.notify_all();
    });
    if (!id) {
      refused = id.err();
      break;
    }
    ++submitted;
  }
  lock.lock();
  if (refused) {
    if (!f.failed) f.failed = *refused;
    rep->t.ok = false;
    for (std::size_t k = submitted; k < requests.size(); ++k) { // never submitted
      ended(*rep);
      f.ended(f.slots[slot]);
    }
    f.cv.notify_all();
  }
}

void swap_store::ended(report& r) {
  if (--r.remaining > 0) return;
  auto& f = *flight_;
  r.t.t1_ns = steady_ns();
  if (--f.active == 0) f.stats.busy_ns += r.t.t1_ns - f.busy_since;
  if (r.t.ok) ++(r.t.op == aio_op::read ? f.stats.chunk_reads : f.stats.chunk_writes);
  if (options_.observer) options_.observer(r.t);
}

// After an error: waits for every transfer, empties the sets, reports the error once.
error swap_store::settle(std::unique_lock<std::mutex>& lock) {
  auto& f = *flight_;
  f.cv.wait(lock, [&] { return f.quiet(); });
  for (auto& s : f.slots) s = flight::slot{};
  f.prefetch_mask = 0;
  error e = *f.failed;
  f.failed.reset();
  return e;
}

void swap_store::wake() {
  auto& f = *flight_;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    ++f.events; // a sweep that asked before this waits no more
  }
  f.cv.notify_all();
}

status swap_store::sweep_when(unsigned read, unsigned write, const optim::chunk_ready& ready, const optim::chunk_fn& fn) {
  if ((read & ~written_.load()) != 0)
    return make_error(errc::protocol, "swap store '{}/{}': read before the state was written", options_.dir,
                      options_.name);
  auto& f = *flight_;
  using use = flight::use;
  {
    std::lock_guard<std::mutex> check(f.mu);
    // An update that reads back what it wrote earlier in the same speculation would read
    // the state from before it (Adam's one sweep and LAMB's two never do).
    if (shadow_open_ && write != 0 && (read & shadow_round_) != 0)
      return make_error(errc::protocol, "swap store '{}/{}': a speculative sweep reads arrays it wrote", options_.dir,
                        options_.name);
  }
  if (read != 0)
    hold_for_test([&] {
      std::unique_lock<std::mutex> quiet(f.mu);
      f.cv.wait(quiet, [&] { return f.quiet(); });
    });
  {
    // A prefetch still under way stops first (what it read is used below), so none of its
    // reads is counted for the sweep after this one.
    std::lock_guard<std::mutex> stop(f.mu);
    f.prefetch_mask = 0;
    ++sweeps_;
  }
  const std::uint64_t began = steady_ns();
  std::uint64_t computing = 0, gated = 0;
  const std::int64_t n = chunks();
  const std::int64_t ahead = read != 0 && options_.pipeline_read ? 1 : 0;
  const bool write_behind = write != 0 && options_.pipeline_write;
  std::unique_lock<std::mutex> lock(f.mu);
  // Chunks read ahead that this sweep cannot use (it reads other arrays, or none) go.
  f.cv.wait(lock, [&] {
    return std::none_of(f.slots.begin(), f.slots.end(), [&](const flight::slot& s) {
      return s.state == use::reading && (read == 0 || (s.mask & read) != read);
    });
  });
  for (auto& s : f.slots)
    if (s.state == use::ready && (read == 0 || (s.mask & read) != read)) s = flight::slot{};
  if (read != 0) // what is still held was read ahead by a prefetch, for this sweep
    f.stats.chunks_prefetched += static_cast<std::uint64_t>(std::count_if(
        f.slots.begin(), f.slots.end(), [](const flight::slot& s) { return s.state == use::reading || s.state == use::ready; }));
  // Gives chunk c a set and starts its reads, unless a set holds it already; false when no
  // set is free (or, with `wait`, only after an error).
  auto claim = [&](std::int64_t c, bool wait) {
    if (f.holding(c)) return true;
    auto can = [&] { return f.failed || (!f.writing(c) && f.free_slot()); };
    if (wait) f.cv.wait(lock, can);
    if (f.failed || !can()) return false;
    flight::slot* s = f.free_slot();
    *s = flight::slot{read != 0 ? use::reading : use::ready, c, read, 0};
    if (read != 0) transfer(lock, static_cast<std::size_t>(s - f.slots.data()), aio_op::read, read);
    return true;
  };
  for (std::int64_t k = 0; k < n; ++k) {
    const std::int64_t i = chunk_at(k);
    if (!claim(i, true)) break;
    for (std::int64_t j = k + 1; j <= std::min(n - 1, k + ahead); ++j)
      if (!claim(chunk_at(j), false)) break;
    flight::slot* s = f.holding(i);
    if (ready) { // a streamed update: the chunk's inputs may not be final yet
      const std::uint64_t gate_start = steady_ns();
      while (!f.failed) {
        const std::uint64_t seen = f.events; // before the question: a wake() after it ends the wait
        const auto [lo, hi] = range(i);
        auto final = ready(lo, hi);
        if (!final) f.failed = final.err();
        else if (*final) break;
        else {
          // Meanwhile every free buffer set reads a later chunk (each submit releases the
          // lock for a moment; an event then is counted, not lost).
          for (std::int64_t j = k + 1; j < n; ++j)
            if (!claim(chunk_at(j), false)) break;
          f.cv.wait(lock, [&] { return f.failed || f.events != seen; }); // a completion or wake()
        }
      }
      gated += steady_ns() - gate_start;
      if (f.failed) break;
    }
    f.cv.wait(lock, [&] { return f.failed || s->state == use::ready; });
    if (f.failed) break;
    s->state = use::computing;
    const auto slot = static_cast<std::size_t>(s - f.slots.data());
    optim::state_chunk c;
    c.index = i;
    std::tie(c.lo, c.hi) = range(i);
    for (unsigned a = 0; a < optim::state_arrays; ++a)
      if ((read | write) & (1u << a)) c.arrays[a] = static_cast<float*>(buffers_[slot * optim::state_arrays + a].data());
    lock.unlock();
    swap_transfer work;
    work.compute = true;
    work.chunk = i;
    work.t0_ns = steady_ns();
    status done = fn(c);
    work.t1_ns = steady_ns();
    computing += work.t1_ns - work.t0_ns;
    lock.lock();
    work.sweep = sweeps_.load();
    work.ok = static_cast<bool>(done);
    if (options_.observer) options_.observer(work);
    if (!done) {
      if (!f.failed) f.failed = done.err();
      s->state = use::free; // its transfers have all ended: it was ready
      break;
    }
    if (write == 0) {
      *s = flight::slot{};
      continue;
    }
    s->state = use::writing;
    transfer(lock, slot, aio_op::write, write);
    if (!write_behind) f.cv.wait(lock, [&] { return f.failed || s->state != use::writing; });
  }
  f.stats.compute_ns += computing;
  f.stats.gate_ns += gated;
  f.stats.wait_ns += steady_ns() - began - computing - gated;
  if (f.failed) return settle(lock);
  if (!shadow_open_) written_ |= write;
  return {};
}

void swap_store::prefetch(unsigned read) {
  if (read == 0 || (read & ~written_.load()) != 0) return;
  auto& f = *flight_;
  std::unique_lock<std::mutex> lock(f.mu);
  if (f.failed) return; // reported by the next sweep
  if (shadow_open_) { // the next step reads what the speculation's outcome decides
    deferred_prefetch_ = read;
    return;
  }
  f.prefetch_mask = read;
  f.prefetch_next = 0;
  pump(lock);
}

void swap_store::pump(std::unique_lock<std::mutex>& lock) {
  auto& f = *flight_;
  while (f.prefetch_mask != 0 && !f.failed && f.prefetch_next < chunks()) {
    const std::int64_t c = chunk_at(f.prefetch_next);
    if (f.holding(c)) {
      ++f.prefetch_next;
      continue;
    }
    flight::slot* s = f.free_slot();
    if (f.writing(c) || !s) return; // the completion that frees a set comes back here
    *s = flight::slot{flight::use::reading, c, f.prefetch_mask, 0};
    ++f.prefetch_next;
    transfer(lock, static_cast<std::size_t>(s - f.slots.data()), aio_op::read, f.prefetch_mask, reading_for::next_sweep);
  }
  f.prefetch_mask = 0; // every chunk is read ahead (or an error stopped it)
}

void swap_store::wait_idle() {
  auto& f = *flight_;
  std::unique_lock<std::mutex> lock(f.mu);
  f.cv.wait(lock, [&] { return f.quiet(); });
}

swap_stats swap_store::stats() const {
  auto& f = *flight_;
  std::lock_guard<std::mutex> lock(f.mu);
  swap_stats s = f.stats;
  s.bytes_read = bytes_read_.load();
  s.bytes_written = bytes_written_.load();
  return s;
}

status swap_store::flush() {
  auto& f = *flight_;
  std::unique_lock<std::mutex> lock(f.mu);
  f.cv.wait(lock, [&] { return f.quiet(); });
  if (f.failed) return settle(lock);
  return {};
}

} // namespace dsa::aio
