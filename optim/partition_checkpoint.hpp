// Checkpoint state of ZeRO partitions: what one rank saves, rebuilding a rank's
// partition for any rank count from every old rank's file, and assembling whole
// tensors from them.
//
// A rank saves, for each tensor piece it holds (element range [lo, hi) of the
// tensor in row-major order), 1-D f32 tensors
//   "master.<name>[lo:hi]", "<name>.exp_avg[lo:hi]", "<name>.exp_avg_sq[lo:hi]",
// the tensor's shape as "shape.<name>" (i64), and "optimizer_step_count" (i64[1]).
// Without their ranges these are the names a whole-tensor shard saves
// (train::whole_shard::payload), and such a whole tensor ("master.<name>", no range)
// is read as the piece [0, numel): a ZeRO-0 checkpoint repartitions the same way.
// Pieces are named by tensor ranges, not flat offsets, so neither the old rank
// count nor the old alignment matters when loading.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "optim/flat_layout.hpp"
#include "optim/partitioned_optimizer.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsa::optim {

using state_map = std::map<std::string, tensor>;

// Rank `rank`'s state under the names above, as views of `state` (no copy; valid
// while no step runs); an undefined array of `state` is left out.
state_map partition_payload(const flat_layout& layout, std::uint32_t rank, const partition_state& state);

// The same names for the arrays in `which` (chunked_state.hpp's bits), one store chunk
// at a time: fn(chunk index, the pieces inside that chunk, cut at its bounds, with their
// tensors' shapes and the step count), each a fresh copy. A checkpoint of swapped state
// then holds one chunk in memory, not the whole partition; the pieces of all chunks
// load as any pieces do.
status partition_payload_chunks(const partitioned_optimizer& opt, unsigned which,
                                const std::function<status(std::int64_t chunk, state_map pieces)>& fn);

// One old rank's saved state: its keys, and a way to read the tensor under a key
// (a view of memory, a file read on demand, ...). Keys are read one piece at a time.
// A source that can read part of a tensor (a file) also sets `shape` and `read_range`:
// then index() takes a whole tensor's shape without reading it, and a partition reads
// only the elements of each piece that fall into it.
struct saved_partition {
  std::vector<std::string> keys;
  std::function<expected<tensor>(const std::string& key)> read;
  // Optional: the shape of the tensor under a key.
  std::function<expected<shape_t>(const std::string& key)> shape;
  // Optional: elements [lo, hi) of the tensor under a key (row-major), as 1-D f32.
  std::function<expected<tensor>(const std::string& key, std::int64_t lo, std::int64_t hi)> read_range;
};
// An in-memory state (a payload, or a file read whole); holds the map.
saved_partition saved_partition_of(state_map tensors);

// The tensor a key names ("master.<name>[lo:hi]", "<name>.exp_avg", "shape.<name>", ...;
// empty for the step count), or an error naming the key.
expected<std::string> tensor_of_key(const std::string& key);
// The same saved state with only the keys of tensors `keep` accepts (and the step count):
// a pipeline repartition takes each new stage's tensors from the saved stages that held them.
expected<saved_partition> only_tensors(saved_partition from, const std::function<bool(const std::string&)>& keep);

// One tensor assembled from every rank's pieces, in its own shape.
struct assembled_tensor {
  std::string name;
  tensor master;
  tensor exp_avg;
  tensor exp_avg_sq;
};

// The pieces of every old rank, indexed by their keys: index() reads only the step
// counts, the shapes and whole-tensor entries (for their shape), no piece. It checks
// that the ranks agree on the step count and on each tensor's shape, and that each
// tensor's pieces of each kind cover it exactly once.
class saved_partitions {
public:
  static expected<saved_partitions> index(std::vector<saved_partition> ranks);

  std::int64_t step() const { return step_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;

  // Rank `rank`'s partition of `layout` (any rank count and alignment): every layout
  // tensor must be saved with its shape, and every saved tensor be in the layout.
  expected<partition_state> partition(const flat_layout& layout, std::uint32_t rank) const;
  // The same, a range at a time: check() once, then fill() writes the master, exp_avg and
  // exp_avg_sq of the partition's elements [lo, hi) into arrays (hi - lo floats each, zero
  // where no piece lies: the padding), reading only those pieces' elements.
  status check(const flat_layout& layout, std::uint32_t rank) const;
  status fill(const flat_layout& layout, std::uint32_t rank, std::int64_t lo, std::int64_t hi,
              float* const arrays[3]) const;
  // Whole tensors one at a time, in name order; only one tensor's pieces and result
  // are held at once. sink's error stops the walk and is returned.
  status assemble(const std::function<status(const assembled_tensor&)>& sink) const;

private:
  struct piece_ref {
    std::size_t rank;
    std::string key;
    std::int64_t lo, hi;
  };
  struct entry {
    shape_t shape;
    bool has_shape = false;
    std::vector<piece_ref> kinds[3]; // master, exp_avg, exp_avg_sq; sorted by lo
  };

  static status note_shape(entry& e, const std::string& name, const shape_t& shape, std::size_t rank);
  status check_coverage() const;
  // Elements [lo, hi) of one kind of a tensor, read from the pieces that hold them.
  status copy_range(float* out, const entry& e, int kind, std::int64_t lo, std::int64_t hi) const;

  std::vector<saved_partition> ranks_;
  std::map<std::string, entry> tensors_;
  std::int64_t step_ = 0;
};

} // namespace dsa::optim
