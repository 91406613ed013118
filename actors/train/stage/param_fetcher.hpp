// ZeRO stage 3's parameter fetcher for one pipeline stage of one data-parallel rank.
//
// Under ZeRO-3 a rank keeps only its partition of the stage's working weights (the
// elements of optim::flat_layout::partition(rank), as the optimizer shard writes them),
// plus the tensors of at most `persistence_threshold` elements whole (DeepSpeed's
// stage3_param_persistence_threshold: biases and LayerNorm vectors cost more to gather
// than to keep). Before the model runs a part of the stage (the embeddings, one encoder
// layer, the head) the fetcher gathers that part's other tensors whole from the ranks
// that own their elements, and after the part it frees them.
//
// Every rank runs the same sequence of uses per step: for each micro-batch the forward's
// parts, then the backward's (a stage with 1F1B and one stash slot runs F0 B0 F1 B1 ...).
// What each use gathers and what each release frees is fixed by that sequence alone:
// use i gathers the tensors of part(i) that part(i - 1) does not hold, and the release of
// use i frees the tensors that part(i + 1) does not hold (so the head, used at the end of
// the forward and again at the start of the backward, is gathered once; and so is the
// word embedding from one micro-batch's backward to the next one's forward). So every
// rank issues the same collectives in the same order whatever the timing, and a gather
// may run ahead of the compute: a thread of the fetcher's own gathers use after use,
// ahead of the compute by up to `prefetch_elements` (stage3_prefetch_bucket_size) while
// the gathered tensors stay within `max_live_elements` (stage3_max_live_parameters); the
// use the compute waits for is always gathered. A use the compute asks for out of that
// order is an error, never a mismatched collective.
//
// Gathering a tensor: each rank owning a piece of it (a contiguous element range, since
// the layout keeps tensors whole in flat order) broadcasts that piece; the bytes are the
// owner's working weights, unchanged, so a gathered tensor is bit for bit the whole one.
//
// Threads: load, acquire and release from one compute thread; the gathers on the
// fetcher's thread, the only user of its communicator (gather_all after stop_thread).
#pragma once

#include "actors/train/stage/param_store.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "io/net/comms_logger.hpp"
#include "io/net/communicator.hpp"
#include "optim/flat_layout.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dsa::train {

struct fetch_settings {
  std::int64_t persistence_threshold = 100'000; // elements; tensors this small stay whole
  std::int64_t prefetch_elements = 50'000'000;  // gathered ahead of the compute, at most
  std::int64_t max_live_elements = 1'000'000'000; // gathered tensors resident, at most (but the one needed now)
  net::comms_logger* logger = nullptr; // comms_logger: each broadcast as `caller`
  std::string caller;
};

// A part of the stage the model runs as one: an id the model names it by and its
// tensors (indices into the layout's tensors).
struct fetch_part {
  std::int64_t id = 0;
  std::vector<std::size_t> tensors;
};

struct fetch_stats {
  std::int64_t gathers = 0;            // tensors gathered
  std::int64_t gathered_elements = 0;  // their elements
  std::int64_t peak_live_elements = 0; // gathered tensors resident at once, at most
  std::int64_t ahead = 0;              // uses gathered before the compute asked for them
  std::int64_t waits = 0;              // acquires that found their use not gathered yet
};

class param_fetcher {
public:
  // layout: the stage's (the optimizer shard's); comm: this fetcher's own channel, every
  // rank's fetcher of the stage on the same one; sequence: the part ids of one micro-batch's
  // uses in order (forward, then backward), repeated micro_batches times per step.
  // store: where the partition lives between gathers (param_store.hpp); null: in memory.
  param_fetcher(optim::flat_layout layout, std::uint32_t rank, dtype working, std::shared_ptr<net::communicator> comm,
                std::vector<fetch_part> parts, std::vector<std::int64_t> sequence, std::uint32_t micro_batches,
                fetch_settings settings, std::unique_ptr<param_store> store = nullptr);
  ~param_fetcher();
  param_fetcher(const param_fetcher&) = delete;
  param_fetcher& operator=(const param_fetcher&) = delete;

  // Whether tensor t stays whole on every rank (persistent).
  bool persistent(std::size_t t) const { return persistent_[t]; }
  // This rank's partition taken from whole tensors (the initial or restored weights, in
  // layout order, any float dtype): the state before the first step.
  void take_whole(const std::vector<tensor>& whole);
  // A new version: (partition_numel) elements in the working dtype, as the shard writes
  // them. Only between steps (every use of the last step released). Undefined: the shard
  // wrote it into the store itself (below) since the last load.
  void load(const tensor& partition);
  // The shard writes a new version straight into the store, as it updates it (so no
  // partition-sized copy exists in between): begin_version, then either the in-memory
  // partition updated in place (version_memory(), when the store keeps it whole) or
  // windows in partition order (version_window), then end_version. Only between steps;
  // from the shard's thread while the stage's compute waits for that version.
  status begin_version();
  tensor version_memory() const { return store_->in_memory(); }
  status version_window(const tensor& values) { return store_->append(values); }
  status end_version();
  // A skipped step: the store holds that version already (nothing written).
  status keep_version();

  // The compute's next use must be part `id` of step `step`: waits until it is gathered
  // and returns the tensors to bind (index, whole tensor): on a step's first use the
  // persistent tensors as well. A step's gathers start only once the step is allowed.
  // Throws on a failed gather, a use out of sequence, or cancel().
  std::vector<std::pair<std::size_t, tensor>> acquire(std::int64_t id, std::uint32_t step);
  // Steps up to `step` may gather (every rank will run them); any thread.
  void allow(std::uint32_t step);
  // The run ends: a waiting acquire throws, no further gathers start; any thread.
  void cancel();
  // The compute is done with its current use; returns the tensors to unbind (freed once
  // the caller drops its references).
  std::vector<std::size_t> release(std::int64_t id);

  // After the run (every rank, the same point): ends the gathering thread, then gathers
  // every tensor whole on the caller's thread; layout order.
  std::vector<tensor> gather_all();

  // Bytes held between uses: the partition (what of it is in memory, with NVMe offload
  // and the transfer buffers) and the persistent tensors.
  std::int64_t held_bytes() const;
  std::string partition_location() const { return store_->where(); }
  std::int64_t persistent_elements() const { return persistent_elements_; }
  fetch_stats stats() const;
  // Tests and tools: waits at most `timeout` until the open step's first `uses` uses are
  // gathered; whether they are.
  bool wait_gathered(std::size_t uses, std::chrono::milliseconds timeout);
  const optim::flat_layout& layout() const { return layout_; }

private:
  struct use_plan {
    std::size_t part = 0;
    std::vector<std::size_t> gather; // tensors first needed here
    // Tensors the next use does not hold, with the use that gathered them.
    std::vector<std::pair<std::size_t, std::size_t>> free;
    std::int64_t gather_elements = 0, free_elements = 0;
  };
  void plan_uses(const std::vector<std::int64_t>& sequence, std::uint32_t micro_batches);
  void run_thread();
  bool may_gather(std::size_t i) const; // under mu_
  expected<tensor> gather_tensor(std::size_t t);
  status gather_persistent();

  optim::flat_layout layout_;
  std::uint32_t rank_ = 0;
  dtype working_ = dtype::f32;
  std::shared_ptr<net::communicator> comm_;
  std::vector<fetch_part> parts_;
  fetch_settings settings_;
  std::vector<bool> persistent_;
  std::int64_t persistent_elements_ = 0;
  std::vector<use_plan> uses_; // one step's
  std::unique_ptr<param_store> store_; // this rank's working weights, (partition_numel)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool cancelled_ = false;
  std::int64_t allowed_ = -1;   // the last step allowed to gather
  bool step_open_ = false;      // the compute has asked for this step's first use
  bool writing_version_ = false; // between begin_version and end_version
  bool version_written_ = false; // a version written by the shard, not loaded yet
  std::size_t fetched_ = 0;     // uses of this step gathered
  std::size_t next_use_ = 0;    // the use the compute acquires next
  bool in_use_ = false;         // the compute holds use next_use_ - 1
  bool waiting_ = false;        // the compute waits for use next_use_
  std::int64_t live_ = 0;       // gathered elements resident (persistent excluded)
  std::optional<error> failed_;
  // Gathered tensors by (the use that gathered them, layout index): a tensor released by
  // one use may already be gathered again for a later one.
  std::map<std::pair<std::size_t, std::size_t>, tensor> resident_;
  std::vector<std::pair<std::size_t, tensor>> persistent_whole_;
  fetch_stats stats_;
  std::thread thread_;
};

} // namespace dsa::train
