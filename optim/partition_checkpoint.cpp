// Saving, repartitioning and assembling ZeRO partition state by named tensor pieces.
#include "optim/partition_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string_view>

namespace dsa::optim {
namespace {

constexpr const char* kind_names[3] = {"master", "exp_avg", "exp_avg_sq"};
constexpr std::string_view step_key = "optimizer_step_count";
constexpr std::string_view shape_prefix = "shape.";
constexpr std::string_view master_prefix = "master.";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

enum class key_kind { master, exp_avg, exp_avg_sq, shape, step };

struct parsed_key {
  key_kind kind = key_kind::step;
  std::string name;
  bool whole = true; // no [lo:hi]
  std::int64_t lo = 0, hi = 0;
};

bool parse_index(std::string_view s, std::int64_t& out) {
  if (s.empty() || s.size() > 18) return false;
  out = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return true;
}

expected<parsed_key> parse_key(const std::string& key, std::size_t rank) {
  parsed_key k;
  if (key == step_key) return k;
  if (starts_with(key, shape_prefix)) {
    k.kind = key_kind::shape;
    k.name = key.substr(shape_prefix.size());
    return k;
  }
  std::string_view base = key;
  if (ends_with(base, "]")) {
    const auto open = base.rfind('['), colon = base.rfind(':');
    if (open == std::string_view::npos || colon == std::string_view::npos || colon < open ||
        !parse_index(base.substr(open + 1, colon - open - 1), k.lo) ||
        !parse_index(base.substr(colon + 1, base.size() - colon - 2), k.hi) || k.lo >= k.hi)
      return make_error(errc::format, "optimizer state of rank {}: key '{}' has no valid [lo:hi] range", rank, key);
    k.whole = false;
    base = base.substr(0, open);
  }
  if (starts_with(base, master_prefix)) {
    k.kind = key_kind::master;
    k.name = std::string(base.substr(master_prefix.size()));
  } else if (ends_with(base, ".exp_avg_sq")) {
    k.kind = key_kind::exp_avg_sq;
    k.name = std::string(base.substr(0, base.size() - 11));
  } else if (ends_with(base, ".exp_avg")) {
    k.kind = key_kind::exp_avg;
    k.name = std::string(base.substr(0, base.size() - 8));
  } else {
    return make_error(errc::format, "optimizer state of rank {}: unknown key '{}'", rank, key);
  }
  if (k.name.empty()) return make_error(errc::format, "optimizer state of rank {}: key '{}' names no tensor", rank, key);
  return k;
}

tensor view_of(const tensor& flat, std::int64_t at, std::int64_t count) {
  return tensor::from_storage(flat.storage_ptr(), flat.byte_offset() + static_cast<std::size_t>(at) * sizeof(float),
                              {count}, dtype::f32);
}

expected<tensor> read_key(const saved_partition& src, std::size_t rank, const std::string& key) {
  auto t = src.read(key);
  if (!t) return make_error(t.err().code, "optimizer state of rank {}: reading '{}': {}", rank, key, t.err().message);
  if (!t->defined() || !t->dev().is_cpu() || !t->is_contiguous())
    return make_error(errc::format, "optimizer state of rank {}: '{}' is not a contiguous CPU tensor", rank, key);
  return t;
}

} // namespace

expected<std::string> tensor_of_key(const std::string& key) {
  DSA_ASSIGN_OR_RETURN(parsed_key k, parse_key(key, 0));
  return k.name;
}

expected<saved_partition> only_tensors(saved_partition from, const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> kept;
  for (const auto& key : from.keys) {
    DSA_ASSIGN_OR_RETURN(std::string name, tensor_of_key(key));
    if (name.empty() || keep(name)) kept.push_back(key);
  }
  from.keys = std::move(kept);
  return from;
}

state_map partition_payload(const flat_layout& layout, std::uint32_t rank, const partition_state& state) {
  state_map out;
  const flat_range part = layout.partition(rank);
  for (const auto& p : layout.pieces(part)) {
    const flat_tensor& t = layout.tensors()[p.tensor];
    const std::int64_t at = p.flat_offset - part.lo;
    const std::string range = fmt::format("[{}:{}]", p.tensor_offset, p.tensor_offset + p.count);
    if (state.master.defined()) out["master." + t.name + range] = view_of(state.master, at, p.count);
    if (state.exp_avg.defined()) out[t.name + ".exp_avg" + range] = view_of(state.exp_avg, at, p.count);
    if (state.exp_avg_sq.defined()) out[t.name + ".exp_avg_sq" + range] = view_of(state.exp_avg_sq, at, p.count);
    tensor shape = tensor::empty({static_cast<std::int64_t>(t.shape.size())}, dtype::i64);
    std::copy(t.shape.begin(), t.shape.end(), shape.data<std::int64_t>());
    out[std::string(shape_prefix) + t.name] = shape;
  }
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = state.step;
  out[std::string(step_key)] = count;
  return out;
}

status partition_payload_chunks(const partitioned_optimizer& opt, unsigned which,
                                const std::function<status(std::int64_t chunk, state_map pieces)>& fn) {
  const flat_layout& layout = opt.layout();
  const flat_range part = opt.partition();
  const auto pieces = layout.pieces(part);
  const char* suffix[state_arrays] = {nullptr, ".exp_avg", ".exp_avg_sq"};
  return opt.read_chunks(which, [&](const state_chunk& c) -> status {
    state_map out;
    for (const auto& p : pieces) {
      const std::int64_t from = std::max(p.flat_offset - part.lo, c.lo);
      const std::int64_t to = std::min(p.flat_offset - part.lo + p.count, c.hi);
      if (from >= to) continue;
      const flat_tensor& t = layout.tensors()[p.tensor];
      const std::int64_t lo = p.tensor_offset + (from - (p.flat_offset - part.lo));
      const std::string range = fmt::format("[{}:{}]", lo, lo + (to - from));
      for (unsigned a = 0; a < state_arrays; ++a) {
        if (!(which & (1u << a))) continue;
        tensor piece = tensor::empty({to - from}, dtype::f32);
        std::memcpy(piece.data<float>(), c.arrays[a] + (from - c.lo), static_cast<std::size_t>(to - from) * sizeof(float));
        out[a == master_array ? "master." + t.name + range : t.name + suffix[a] + range] = std::move(piece);
      }
      tensor shape = tensor::empty({static_cast<std::int64_t>(t.shape.size())}, dtype::i64);
      std::copy(t.shape.begin(), t.shape.end(), shape.data<std::int64_t>());
      out[std::string(shape_prefix) + t.name] = shape;
    }
    tensor count = tensor::empty({1}, dtype::i64);
    count.data<std::int64_t>()[0] = opt.step_count();
    out[std::string(step_key)] = count;
    return fn(c.index, std::move(out));
  });
}

saved_partition saved_partition_of(state_map tensors) {
  auto held = std::make_shared<state_map>(std::move(tensors));
  saved_partition s;
  for (const auto& [key, t] : *held) s.keys.push_back(key);
  s.read = [held](const std::string& key) -> expected<tensor> {
    auto it = held->find(key);
    if (it == held->end()) return make_error(errc::not_found, "no tensor '{}'", key);
    return it->second;
  };
  return s;
}

expected<saved_partitions> saved_partitions::index(std::vector<saved_partition> ranks) {
  if (ranks.empty()) return make_error(errc::invalid_argument, "optimizer state: no ranks' files to load");
  saved_partitions out;
  out.ranks_ = std::move(ranks);
  for (std::size_t r = 0; r < out.ranks_.size(); ++r) {
    const saved_partition& src = out.ranks_[r];
    if (!src.read) return make_error(errc::invalid_argument, "optimizer state of rank {}: no reader", r);
    bool has_step = false;
    for (const std::string& key : src.keys) {
      auto k = parse_key(key, r);
      if (!k) return k.err();
      if (k->kind == key_kind::step) {
        auto t = read_key(src, r, key);
        if (!t) return t.err();
        if (t->type() != dtype::i64 || t->numel() != 1)
          return make_error(errc::format, "optimizer state of rank {}: '{}' is {}, expected i64[1]", r, key, t->describe());
        const std::int64_t step = t->data<std::int64_t>()[0];
        if (r > 0 && step != out.step_)
          return make_error(errc::format, "optimizer state: rank {} has step count {}, rank 0 has {}", r, step, out.step_);
        out.step_ = step;
        has_step = true;
        continue;
      }
      entry& e = out.tensors_[k->name];
      if (k->whole && k->kind != key_kind::shape && src.shape) {
        // A file gives the shape from its header: the tensor itself is read by ranges later.
        auto shape = src.shape(key);
        if (!shape)
          return make_error(shape.err().code, "optimizer state of rank {}: '{}': {}", r, key, shape.err().message);
        k->hi = shape_numel(*shape);
        DSA_TRY(note_shape(e, k->name, *shape, r));
      } else if (k->kind == key_kind::shape || k->whole) {
        auto t = read_key(src, r, key);
        if (!t) return t.err();
        shape_t shape;
        if (k->kind == key_kind::shape) {
          if (t->type() != dtype::i64 || t->ndim() != 1)
            return make_error(errc::format, "optimizer state of rank {}: '{}' is {}, expected i64 dims", r, key, t->describe());
          const auto* dims = t->data<std::int64_t>();
          shape.assign(dims, dims + t->numel());
        } else {
          shape = t->shape();
          k->hi = t->numel();
        }
        DSA_TRY(note_shape(e, k->name, shape, r));
        if (k->kind == key_kind::shape) continue;
      }
      e.kinds[static_cast<int>(k->kind)].push_back({r, key, k->lo, k->hi});
    }
    if (!has_step) return make_error(errc::not_found, "optimizer state of rank {}: no '{}'", r, step_key);
  }
  for (auto& [name, e] : out.tensors_)
    for (auto& pieces : e.kinds)
      std::sort(pieces.begin(), pieces.end(), [](const piece_ref& a, const piece_ref& b) { return a.lo < b.lo; });
  DSA_TRY(out.check_coverage());
  return out;
}

status saved_partitions::note_shape(entry& e, const std::string& name, const shape_t& shape, std::size_t rank) {
  if (e.has_shape && shape != e.shape)
    return make_error(errc::format, "optimizer state: tensor '{}' has shape {} in rank {}'s file, {} in another", name,
                      shape_string(shape), rank, shape_string(e.shape));
  e.shape = shape;
  e.has_shape = true;
  return {};
}

status saved_partitions::check_coverage() const {
  for (const auto& [name, e] : tensors_) {
    if (!e.has_shape) return make_error(errc::format, "optimizer state: tensor '{}' has pieces but no shape", name);
    const std::int64_t numel = shape_numel(e.shape);
    for (int kind = 0; kind < 3; ++kind) {
      std::int64_t at = 0;
      for (const auto& p : e.kinds[kind]) {
        if (p.lo != at)
          return make_error(errc::format, "optimizer state: {} of tensor '{}' {} at element {} (piece '{}' of rank {} starts at {}){}",
                            kind_names[kind], name, p.lo > at ? "has a gap" : "overlaps", at, p.key, p.rank, p.lo,
                            p.lo > at ? "; is a rank's file missing?" : "");
        at = p.hi;
      }
      if (at != numel)
        return make_error(errc::format, "optimizer state: {} of tensor '{}' covers [0, {}) of its {} elements; is a rank's file missing?",
                          kind_names[kind], name, at, numel);
    }
  }
  return {};
}

std::vector<std::string> saved_partitions::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

status saved_partitions::copy_range(float* out, const entry& e, int kind, std::int64_t lo, std::int64_t hi) const {
  const auto& pieces = e.kinds[kind];
  auto it = std::upper_bound(pieces.begin(), pieces.end(), lo,
                             [](std::int64_t x, const piece_ref& p) { return x < p.hi; });
  for (; it != pieces.end() && it->lo < hi; ++it) {
    const std::int64_t begin = std::max(lo, it->lo), end = std::min(hi, it->hi);
    const saved_partition& src = ranks_[it->rank];
    if (src.read_range) {
      // Only the piece's elements inside [lo, hi): a resume reads its own partition.
      auto t = src.read_range(it->key, begin - it->lo, end - it->lo);
      if (!t)
        return make_error(t.err().code, "optimizer state of rank {}: reading '{}' [{}, {}): {}", it->rank, it->key,
                          begin - it->lo, end - it->lo, t.err().message);
      if (!t->defined() || t->type() != dtype::f32 || t->numel() != end - begin || !t->is_contiguous())
        return make_error(errc::format, "optimizer state of rank {}: '{}' [{}, {}) read as {}, expected f32 with {} elements",
                          it->rank, it->key, begin - it->lo, end - it->lo, t->describe(), end - begin);
      std::memcpy(out + (begin - lo), t->data<float>(), static_cast<std::size_t>(end - begin) * sizeof(float));
      continue;
    }
    auto t = read_key(src, it->rank, it->key);
    if (!t) return t.err();
    if (t->type() != dtype::f32 || t->numel() != it->hi - it->lo)
      return make_error(errc::format, "optimizer state of rank {}: '{}' is {}, expected f32 with {} elements", it->rank,
                        it->key, t->describe(), it->hi - it->lo);
    std::memcpy(out + (begin - lo), t->data<float>() + (begin - it->lo), static_cast<std::size_t>(end - begin) * sizeof(float));
  }
  return {};
}

status saved_partitions::check(const flat_layout& layout, std::uint32_t rank) const {
  if (rank >= layout.ranks())
    return make_error(errc::invalid_argument, "optimizer state: rank {} of a layout of {} ranks", rank, layout.ranks());
  for (const auto& t : layout.tensors()) {
    auto it = tensors_.find(t.name);
    if (it == tensors_.end()) return make_error(errc::not_found, "optimizer state: no pieces of tensor '{}'", t.name);
    if (it->second.shape != t.shape)
      return make_error(errc::format, "optimizer state: tensor '{}' was saved with shape {}, the stage has {}", t.name,
                        shape_string(it->second.shape), shape_string(t.shape));
  }
  for (const auto& [name, e] : tensors_)
    if (!layout.find(name))
      return make_error(errc::format, "optimizer state: tensor '{}' is not a parameter of this stage", name);
  return {};
}

status saved_partitions::fill(const flat_layout& layout, std::uint32_t rank, std::int64_t lo, std::int64_t hi,
                              float* const arrays[3]) const {
  const flat_range part = layout.partition(rank);
  for (int kind = 0; kind < 3; ++kind) std::memset(arrays[kind], 0, static_cast<std::size_t>(hi - lo) * sizeof(float));
  for (const auto& p : layout.pieces(part)) {
    // The piece's elements inside [lo, hi), in partition coordinates.
    const std::int64_t from = std::max(p.flat_offset - part.lo, lo), to = std::min(p.flat_offset - part.lo + p.count, hi);
    if (from >= to) continue;
    const entry& e = tensors_.at(layout.tensors()[p.tensor].name);
    const std::int64_t element = p.tensor_offset + (from - (p.flat_offset - part.lo));
    for (int kind = 0; kind < 3; ++kind) DSA_TRY(copy_range(arrays[kind] + (from - lo), e, kind, element, element + (to - from)));
  }
  return {};
}

expected<partition_state> saved_partitions::partition(const flat_layout& layout, std::uint32_t rank) const {
  DSA_TRY(check(layout, rank));
  const std::int64_t size = layout.partition_numel();
  partition_state state{tensor::zeros({size}, dtype::f32), tensor::zeros({size}, dtype::f32),
                        tensor::zeros({size}, dtype::f32), step_};
  float* flat[3] = {state.master.data<float>(), state.exp_avg.data<float>(), state.exp_avg_sq.data<float>()};
  DSA_TRY(fill(layout, rank, 0, size, flat));
  return state;
}

status saved_partitions::assemble(const std::function<status(const assembled_tensor&)>& sink) const {
  for (const auto& [name, e] : tensors_) {
    assembled_tensor whole{name, tensor::empty(e.shape, dtype::f32), tensor::empty(e.shape, dtype::f32),
                           tensor::empty(e.shape, dtype::f32)};
    tensor* out[3] = {&whole.master, &whole.exp_avg, &whole.exp_avg_sq};
    for (int kind = 0; kind < 3; ++kind)
      DSA_TRY(copy_range(out[kind]->data<float>(), e, kind, 0, shape_numel(e.shape)));
    DSA_TRY(sink(whole));
  }
  return {};
}

} // namespace dsa::optim
