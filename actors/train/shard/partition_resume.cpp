// Readers over a checkpoint's optimizer and model files for a ZeRO resume.
#include "actors/train/shard/partition_resume.hpp"

#include "actors/train/config/precision.hpp"

#include <fmt/format.h>

#include <set>
#include <string_view>

namespace dsa::train {
namespace {

constexpr std::string_view shape_prefix = "shape.", step_key = "optimizer_step_count", master_prefix = "master.";

tensor as_f32(tensor t) { return t.type() == dtype::f32 ? t : cast_to(t, dtype::f32); }

// A group's tensors as a saved_partition: key k is the group's tensor name_of(k); keys in
// `held` are answered from memory. Reads are whole (small tensors) or by range.
optim::saved_partition mapped_partition(const tensor_source& src, std::vector<std::string> keys,
                                        std::function<std::string(const std::string&)> name_of,
                                        std::shared_ptr<const optim::state_map> held) {
  optim::saved_partition p;
  p.keys = std::move(keys);
  p.read = [=](const std::string& key) -> expected<tensor> {
    if (auto it = held->find(key); it != held->end()) return it->second;
    DSA_ASSIGN_OR_RETURN(tensor t, src.read(name_of(key)));
    return t.type() == dtype::i64 ? t : as_f32(t);
  };
  p.shape = [=](const std::string& key) -> expected<shape_t> {
    if (auto it = held->find(key); it != held->end()) return it->second.shape();
    return src.shape(name_of(key));
  };
  p.read_range = [=](const std::string& key, std::int64_t lo, std::int64_t hi) -> expected<tensor> {
    if (auto it = held->find(key); it != held->end()) return as_f32(it->second.flatten().slice_rows(lo, hi));
    DSA_ASSIGN_OR_RETURN(tensor t, src.read_range(name_of(key), lo, hi));
    return as_f32(t);
  };
  return p;
}

std::string same(const std::string& key) { return key; }

} // namespace

tensor_source file_source(std::shared_ptr<const ckpt::safetensors_reader> reader) {
  tensor_source s;
  for (const auto& [name, e] : reader->header().tensors) s.names.push_back(name);
  s.shape = [reader](const std::string& name) -> expected<shape_t> {
    DSA_ASSIGN_OR_RETURN(const ckpt::safetensors_entry* e, reader->entry(name));
    return e->shape;
  };
  s.read = [reader](const std::string& name) { return reader->read(name); };
  s.read_range = [reader](const std::string& name, std::int64_t lo, std::int64_t hi) {
    return reader->read_range(name, lo, hi);
  };
  return s;
}

tensor_source memory_source(const ckpt::named_tensors& tensors, const std::string& where) {
  auto held = std::make_shared<const ckpt::named_tensors>(tensors);
  auto find = [held, where](const std::string& name) -> expected<tensor> {
    auto it = held->find(name);
    if (it == held->end()) return make_error(errc::not_found, "{}: no tensor '{}'", where, name);
    return it->second;
  };
  tensor_source s;
  for (const auto& [name, t] : *held) s.names.push_back(name);
  s.shape = [find](const std::string& name) -> expected<shape_t> {
    DSA_ASSIGN_OR_RETURN(tensor t, find(name));
    return t.shape();
  };
  s.read = find;
  s.read_range = [find](const std::string& name, std::int64_t lo, std::int64_t hi) -> expected<tensor> {
    DSA_ASSIGN_OR_RETURN(tensor t, find(name));
    return t.flatten().slice_rows(lo, hi);
  };
  return s;
}

expected<std::vector<optim::saved_partition>> stage_partitions(const std::vector<tensor_source>& optimizer,
                                                               const tensor_source& model, bool whole_group,
                                                               std::uint32_t stage, const std::string& where) {
  std::vector<optim::saved_partition> out;
  std::set<std::string> names;
  tensor count;
  auto none = std::make_shared<const optim::state_map>();
  for (const auto& src : optimizer) {
    for (const auto& key : src.names) {
      if (key.rfind(shape_prefix, 0) == 0) names.insert(key.substr(shape_prefix.size()));
      // A whole-tensor group names its tensors by their moments only.
      constexpr std::string_view moment = ".exp_avg";
      if (whole_group && key.size() > moment.size() && key.compare(key.size() - moment.size(), moment.size(), moment) == 0)
        names.insert(key.substr(0, key.size() - moment.size()));
      if (key == step_key && !count.defined()) {
        auto t = src.read(key);
        if (!t) return make_error(t.err().code, "{}: {}", where, t.err().message);
        count = *t;
      }
    }
    out.push_back(mapped_partition(src, src.names, same, none));
  }
  if (out.empty()) return make_error(errc::not_found, "{}: no optimizer state for stage {}", where, stage);
  if (!count.defined()) return make_error(errc::format, "{}: stage {}'s optimizer state has no step count", where, stage);
  std::vector<std::string> keys{std::string(step_key)};
  const std::set<std::string> in_model(model.names.begin(), model.names.end());
  for (const auto& name : names) {
    if (!in_model.count(name))
      return make_error(errc::format, "{}: the model file lacks '{}', which stage {}'s optimizer state holds", where,
                        name, stage);
    keys.push_back(std::string(master_prefix) + name);
  }
  // The masters' record carries the stage's step count, as every rank's does.
  auto held = std::make_shared<const optim::state_map>(optim::state_map{{std::string(step_key), count}});
  out.push_back(mapped_partition(model, std::move(keys),
                                 [](const std::string& key) { return key.substr(master_prefix.size()); }, held));
  return out;
}

std::uint64_t stage_sources::bytes_read() const {
  std::uint64_t n = 0;
  for (const auto& r : readers) n += r->bytes_read();
  return n;
}

expected<stage_sources> open_stage_sources(const std::string& dir, const ckpt::checkpoint_manifest& manifest,
                                           std::uint32_t stage) {
  const std::string whole = fmt::format("optimizer_{}", stage), prefix = whole + "_rank";
  bool has_whole = false;
  for (const auto& f : manifest.files) has_whole = has_whole || f.group == whole;
  const std::string where = fmt::format("checkpoint '{}'", dir);
  stage_sources out;
  auto open = [&](const ckpt::checkpoint_file& f) -> expected<tensor_source> {
    auto reader = ckpt::safetensors_reader::open(dir + "/" + f.name, f.bytes);
    if (!reader) return make_error(reader.err().code, "{}: {}", where, reader.err().message);
    out.readers.push_back(*reader);
    return file_source(*reader);
  };
  std::vector<tensor_source> optimizer;
  const ckpt::checkpoint_file* model = nullptr;
  for (const auto& f : manifest.files) {
    if (f.group == "model") model = &f;
    if (has_whole ? f.group != whole : f.group.rfind(prefix, 0) != 0) continue;
    DSA_ASSIGN_OR_RETURN(auto src, open(f));
    optimizer.push_back(std::move(src));
  }
  if (optimizer.empty()) return make_error(errc::not_found, "{}: no optimizer state for stage {}", where, stage);
  if (!model) return make_error(errc::format, "{}: no model weights", where);
  DSA_ASSIGN_OR_RETURN(auto masters, open(*model));
  DSA_ASSIGN_OR_RETURN(out.parts, stage_partitions(optimizer, masters, has_whole, stage, where));
  return out;
}

expected<stage_sources> open_repartitioned_sources(const std::string& dir, const ckpt::checkpoint_manifest& manifest,
                                                   std::uint32_t saved_stages, const std::set<std::string>& names) {
  stage_sources out;
  std::set<std::string> claimed;
  for (std::uint32_t k = 0; k < saved_stages && claimed.size() < names.size(); ++k) {
    DSA_ASSIGN_OR_RETURN(auto saved, open_stage_sources(dir, manifest, k));
    // The tensors stage k holds that this stage wants and no earlier saved stage gave.
    std::set<std::string> mine;
    for (const auto& part : saved.parts)
      for (const auto& key : part.keys) {
        auto name = optim::tensor_of_key(key);
        if (!name) return make_error(name.err().code, "checkpoint '{}': stage {}: {}", dir, k, name.err().message);
        if (!name->empty() && names.count(*name) && !claimed.count(*name)) mine.insert(*name);
      }
    if (mine.empty()) continue;
    for (auto& part : saved.parts) {
      DSA_ASSIGN_OR_RETURN(auto kept, optim::only_tensors(std::move(part),
                                                          [&](const std::string& n) { return mine.count(n) > 0; }));
      out.parts.push_back(std::move(kept));
    }
    for (auto& r : saved.readers) out.readers.push_back(std::move(r));
    claimed.insert(mine.begin(), mine.end());
  }
  for (const auto& name : names)
    if (!claimed.count(name))
      return make_error(errc::not_found, "checkpoint '{}': no saved stage of {} holds optimizer state for '{}'", dir,
                        saved_stages, name);
  return out;
}

} // namespace dsa::train
