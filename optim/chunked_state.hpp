// Where a ZeRO partition's three fp32 arrays (master, exp_avg, exp_avg_sq) live
// between steps, as the partitioned optimizer sees it: a sequence of chunks it
// visits in order. Each visit asks for some arrays to be present (read) and
// some to be kept afterwards (written back), so an update moves only what it
// needs: Adam reads and writes all three; LAMB's second pass only the master.
//
// resident_state keeps the arrays in memory as one chunk (nothing moves); the
// NVMe store (io/aio/swap_store.hpp) keeps them in files and streams
// sub_group_size chunks through a few buffers, reading the next chunk and
// writing the last while the current one is updated. The update kernels are
// element-wise (LAMB's norms per block of a tensor, and chunks start on block
// boundaries), so both give the same bits.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace dsa::optim {

enum state_array : unsigned { master_array = 0, exp_avg_array = 1, exp_avg_sq_array = 2 };
constexpr unsigned state_arrays = 3;
constexpr unsigned array_bit(state_array a) { return 1u << a; }
constexpr unsigned all_arrays = 0b111u;

// One chunk: elements [lo, hi) of the arrays (relative to the partition's start),
// and a pointer to element lo of each array asked for (read or written; nullptr
// for the others). Arrays asked to be written but not read hold unspecified
// values on entry: the function must write every element of them.
struct state_chunk {
  std::int64_t index = 0;
  std::int64_t lo = 0, hi = 0;
  float* arrays[state_arrays] = {nullptr, nullptr, nullptr};
};
using chunk_fn = std::function<status(const state_chunk&)>;
// A streamed update's gate: whether the inputs of the chunk's elements [lo, hi) are final
// (true), not yet (false), or never will be (an error, which stops the sweep). A sweep
// asks it often, with its own lock held: it must be quick and must not call the store.
using chunk_ready = std::function<expected<bool>(std::int64_t lo, std::int64_t hi)>;

class chunked_state {
public:
  virtual ~chunked_state() = default;
  virtual std::int64_t numel() const = 0;       // elements of each array
  virtual std::int64_t chunk_numel() const = 0; // elements of every chunk but perhaps the last
  std::int64_t chunks() const { return numel() == 0 ? 0 : (numel() + chunk_numel() - 1) / chunk_numel(); }
  // Calls fn on every chunk in order, with the `read` arrays (bit mask) holding
  // their values and the `write` arrays kept afterwards. The first error (from fn
  // or from moving the arrays) stops the sweep and is returned once every transfer
  // already started has ended; chunks before it are written, later ones are not.
  virtual status sweep(unsigned read, unsigned write, const chunk_fn& fn) = 0;
  // sweep(), calling fn on a chunk only once `ready` says its inputs are final; between
  // questions it waits for wake() (or the store's own events). A store that moves chunks
  // reads the next ones into free buffers meanwhile. By default the wait is in place.
  virtual status sweep_when(unsigned read, unsigned write, const chunk_ready& ready, const chunk_fn& fn);
  // What a waiting sweep_when's `ready` reads has changed: it asks again. Any thread.
  virtual void wake();
  // A hint that the next sweep reads `read`: a store may start moving its first chunks
  // now. Never blocks; errors surface in the next sweep. Nothing by default.
  virtual void prefetch(unsigned read) { (void)read; }
  // Waits for every transfer still in flight (writes behind the last sweep, prefetches);
  // their first error. Nothing to wait for by default.
  virtual status flush() { return {}; }
  // Bytes this store keeps in memory: the arrays themselves, or the chunk buffers.
  virtual std::int64_t resident_bytes() const = 0;
  // Where the arrays live, for logs: "memory" or "nvme: DIR".
  virtual std::string where() const = 0;

private:
  std::mutex gate_mu_; // the default sweep_when's wait, and the wake() calls it counts
  std::condition_variable gate_cv_;
  std::uint64_t gate_events_ = 0;
};

// The arrays in memory, taken over from three (numel) f32 tensors; one chunk.
class resident_state final : public chunked_state {
public:
  resident_state(tensor master, tensor exp_avg, tensor exp_avg_sq);

  std::int64_t numel() const override { return arrays_[0].numel(); }
  std::int64_t chunk_numel() const override { return numel() == 0 ? 1 : numel(); }
  status sweep(unsigned read, unsigned write, const chunk_fn& fn) override;
  std::int64_t resident_bytes() const override;
  std::string where() const override { return "memory"; }

  const tensor& array(state_array a) const { return arrays_[a]; }

private:
  tensor arrays_[state_arrays];
};

// The arrays in `which` (a bit mask) copied out of a store into fresh (numel) f32
// tensors, in array order; the others are left undefined (a checkpoint).
expected<std::vector<tensor>> read_arrays(chunked_state& store, unsigned which = all_arrays);
// The three (numel) f32 arrays written into a store, chunk by chunk (a resume).
status write_arrays(chunked_state& store, const std::vector<tensor>& arrays);

} // namespace dsa::optim
