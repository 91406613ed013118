// Readers over a checkpoint's optimizer and model files for a ZeRO resume.
#include "actors/train/partition_resume.hpp"

#include "actors/train/precision.hpp"

#include <fmt/format.h>

#include <set>
#include <string_view>

namespace dsa::train {
namespace {

constexpr std::string_view shape_prefix = "shape.", step_key = "optimizer_step_count", master_prefix = "master.";

tensor as_f32(tensor t) { return t.type() == dtype::f32 ? t : cast_to(t, dtype::f32); }

// A saved_partition over `reader`: key k is the file's tensor file_name(k); keys in
// `held` are answered from memory. Reads are whole (small tensors) or by range.
optim::saved_partition file_partition(std::shared_ptr<ckpt::safetensors_reader> reader, std::vector<std::string> keys,
                                      std::function<std::string(const std::string&)> file_name,
                                      std::shared_ptr<const optim::state_map> held) {
  optim::saved_partition p;
  p.keys = std::move(keys);
  p.read = [=](const std::string& key) -> expected<tensor> {
    if (auto it = held->find(key); it != held->end()) return it->second;
    DSA_ASSIGN_OR_RETURN(tensor t, reader->read(file_name(key)));
    return t.type() == dtype::i64 ? t : as_f32(t);
  };
  p.shape = [=](const std::string& key) -> expected<shape_t> {
    if (auto it = held->find(key); it != held->end()) return it->second.shape();
    DSA_ASSIGN_OR_RETURN(const ckpt::safetensors_entry* e, reader->entry(file_name(key)));
    return e->shape;
  };
  p.read_range = [=](const std::string& key, std::int64_t lo, std::int64_t hi) -> expected<tensor> {
    if (auto it = held->find(key); it != held->end())
      return as_f32(it->second.flatten().slice_rows(lo, hi));
    DSA_ASSIGN_OR_RETURN(tensor t, reader->read_range(file_name(key), lo, hi));
    return as_f32(t);
  };
  return p;
}

std::string same(const std::string& key) { return key; }

} // namespace

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
  stage_sources out;
  std::set<std::string> names;
  tensor count;
  auto none = std::make_shared<const optim::state_map>();
  for (const auto& f : manifest.files) {
    if (has_whole ? f.group != whole : f.group.rfind(prefix, 0) != 0) continue;
    auto reader = ckpt::safetensors_reader::open(dir + "/" + f.name, f.bytes);
    if (!reader) return make_error(reader.err().code, "checkpoint '{}': {}", dir, reader.err().message);
    std::vector<std::string> keys;
    for (const auto& [key, e] : (*reader)->header().tensors) {
      keys.push_back(key);
      if (key.rfind(shape_prefix, 0) == 0) names.insert(key.substr(shape_prefix.size()));
      // A whole-tensor group names its tensors by their moments only.
      constexpr std::string_view moment = ".exp_avg";
      if (has_whole && key.size() > moment.size() && key.compare(key.size() - moment.size(), moment.size(), moment) == 0)
        names.insert(key.substr(0, key.size() - moment.size()));
      if (key == step_key && !count.defined()) {
        auto t = (*reader)->read(key);
        if (!t) return make_error(t.err().code, "checkpoint '{}': {}", dir, t.err().message);
        count = *t;
      }
    }
    out.parts.push_back(file_partition(*reader, std::move(keys), same, none));
    out.readers.push_back(std::move(*reader));
  }
  if (out.parts.empty()) return make_error(errc::not_found, "checkpoint '{}': no optimizer state for stage {}", dir, stage);
  if (!count.defined()) return make_error(errc::format, "checkpoint '{}': stage {}'s optimizer state has no step count", dir, stage);
  const ckpt::checkpoint_file* model = nullptr;
  for (const auto& f : manifest.files)
    if (f.group == "model") model = &f;
  if (!model) return make_error(errc::format, "checkpoint '{}': no model weights", dir);
  auto reader = ckpt::safetensors_reader::open(dir + "/" + model->name, model->bytes);
  if (!reader) return make_error(reader.err().code, "checkpoint '{}': {}", dir, reader.err().message);
  std::vector<std::string> keys{std::string(step_key)};
  for (const auto& name : names) {
    if (!(*reader)->header().tensors.count(name))
      return make_error(errc::format, "checkpoint '{}': the model file lacks '{}', which stage {}'s optimizer state holds",
                        dir, name, stage);
    keys.push_back(std::string(master_prefix) + name);
  }
  // The masters' record carries the stage's step count, as every rank's does.
  auto held = std::make_shared<const optim::state_map>(optim::state_map{{std::string(step_key), count}});
  out.parts.push_back(file_partition(*reader, std::move(keys),
                                     [](const std::string& key) { return key.substr(master_prefix.size()); }, held));
  out.readers.push_back(std::move(*reader));
  return out;
}

} // namespace dsa::train
