// Checkpoint contents of a run.
#include "actors/train/run/run_checkpoint.hpp"

#include "actors/train/config/precision.hpp"
#include "actors/train/shard/partition_resume.hpp"
#include "io/ckpt/safetensors.hpp"
#include "io/ckpt/safetensors_reader.hpp"

#include <filesystem>

#include <fmt/format.h>

namespace dsa::train {

nlohmann::json progress_to_json(const run_progress_state& s) {
  nlohmann::json j;
  j["next_step"] = s.next_step;
  j["schedule_iteration"] = s.schedule_iteration;
  j["loss_scaler"] = {{"cur_scale", s.scaler.cur_scale},
                      {"cur_iter", s.scaler.cur_iter},
                      {"last_overflow_iter", s.scaler.last_overflow_iter},
                      {"cur_hysteresis", s.scaler.cur_hysteresis}};
  j["data_cursor"] = s.data_cursor;
  j["skipped_steps"] = s.skipped_steps;
  j["stages"] = s.stages;
  j["layout"] = s.layout;
  j["precision"] = s.precision;
  j["micro_batch_size"] = s.micro_batch_size;
  j["gradient_accumulation"] = s.gradient_accumulation;
  j["data_parallel_size"] = s.data_parallel_size;
  j["config"] = s.config_toml;
  return j;
}

expected<run_progress_state> progress_from_json(const nlohmann::json& j, const std::string& where) {
  run_progress_state s;
  try {
    s.next_step = j.at("next_step").get<std::uint64_t>();
    s.schedule_iteration = j.at("schedule_iteration").get<std::int64_t>();
    const auto& ls = j.at("loss_scaler");
    s.scaler.cur_scale = ls.at("cur_scale").get<double>();
    s.scaler.cur_iter = ls.at("cur_iter").get<std::int64_t>();
    s.scaler.last_overflow_iter = ls.at("last_overflow_iter").get<std::int64_t>();
    s.scaler.cur_hysteresis = ls.at("cur_hysteresis").get<std::int64_t>();
    s.data_cursor = j.at("data_cursor").get<std::vector<std::uint64_t>>();
    s.skipped_steps = j.at("skipped_steps").get<std::int64_t>();
    s.stages = j.at("stages").get<std::uint32_t>();
    s.layout = j.at("layout").get<std::string>();
    s.precision = j.at("precision").get<std::string>();
    s.micro_batch_size = j.at("micro_batch_size").get<std::int64_t>();
    s.gradient_accumulation = j.at("gradient_accumulation").get<std::int64_t>();
    s.data_parallel_size = j.value("data_parallel_size", std::int64_t{1});
    s.config_toml = j.at("config").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::format, "{}: manifest state: {}", where, e.what());
  }
  return s;
}

ckpt::tensor_groups checkpoint_groups(std::vector<state_payload>& payloads) {
  ckpt::tensor_groups groups;
  auto& model = groups["model"];
  for (std::size_t s = 0; s < payloads.size(); ++s) {
    auto& opt = groups[fmt::format("optimizer_{}", s)];
    for (auto& [name, t] : payloads[s]) {
      if (name.rfind("master.", 0) == 0) {
        // The tied copy on the last stage equals the owner's: keep the first one.
        model.emplace(name.substr(7), t);
      } else {
        opt.emplace(name, t);
      }
    }
    // A ZeRO shard's payload holds masters only: its ranks write their own partitions.
    if (opt.empty()) groups.erase(fmt::format("optimizer_{}", s));
  }
  return groups;
}

expected<optim::optimizer_state> optimizer_state_of(const ckpt::loaded_checkpoint& ck, std::uint32_t stage) {
  optim::optimizer_state st;
  auto it = ck.groups.find(fmt::format("optimizer_{}", stage));
  if (it != ck.groups.end()) {
    for (const auto& [name, t] : it->second) {
      if (name == "optimizer_step_count") st.step = t.data<std::int64_t>()[0];
      else st.tensors[name] = t;
    }
    return st;
  }
  // ZeRO's per-rank form: whole tensors one at a time from the ranks' groups where `ck`
  // loaded them, else from their files, read by range.
  const std::string prefix = fmt::format("optimizer_{}_rank", stage), where = fmt::format("checkpoint '{}'", ck.dir);
  std::vector<tensor_source> loaded;
  for (const auto& [group, tensors] : ck.groups)
    if (group.rfind(prefix, 0) == 0) loaded.push_back(memory_source(tensors, where + " group " + group));
  auto model = ck.groups.find("model");
  std::vector<optim::saved_partition> parts;
  if (!loaded.empty() && model != ck.groups.end()) {
    DSA_ASSIGN_OR_RETURN(parts, stage_partitions(loaded, memory_source(model->second, where + " group model"), false,
                                                 stage, where));
  } else {
    DSA_ASSIGN_OR_RETURN(auto sources, open_stage_sources(ck.dir, ck.manifest, stage));
    parts = std::move(sources.parts);
  }
  auto index = optim::saved_partitions::index(std::move(parts));
  if (!index) return make_error(index.err().code, "{}: stage {}'s optimizer partitions: {}", ck.dir, stage, index.err().message);
  st.step = index->step();
  DSA_TRY(index->assemble([&](const optim::assembled_tensor& a) -> status {
    st.tensors[a.name + ".exp_avg"] = a.exp_avg;
    st.tensors[a.name + ".exp_avg_sq"] = a.exp_avg_sq;
    return {};
  }));
  return st;
}

expected<std::string> weights_file_of(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return make_error(errc::not_found, "{}: no such file or directory", path);
  if (!fs::is_directory(path, ec)) return path;
  if (fs::exists(fs::path(path) / "model.safetensors", ec)) return (fs::path(path) / "model.safetensors").string();
  DSA_ASSIGN_OR_RETURN(std::string dir, ckpt::resolve_checkpoint(path, "latest"));
  return (fs::path(dir) / "model.safetensors").string();
}

expected<converted> convert_to_fp32(const std::string& checkpoint, const std::string& out) {
  DSA_ASSIGN_OR_RETURN(std::string file, weights_file_of(checkpoint));
  DSA_ASSIGN_OR_RETURN(auto reader, ckpt::safetensors_reader::open(file));
  converted c;
  c.source = file;
  std::map<std::string, ckpt::tensor_spec> fp32;
  for (const auto& [name, e] : reader->header().tensors) {
    // Integer buffers (HuggingFace's position_ids) are not weights: left out, and counted.
    if (!e.type || (*e.type != dtype::f32 && *e.type != dtype::f16 && *e.type != dtype::bf16)) {
      c.skipped.push_back(name);
      continue;
    }
    fp32[name] = ckpt::tensor_spec{e.shape, dtype::f32};
    ++c.tensors;
    c.parameters += shape_numel(e.shape);
  }
  // Tensor by tensor: one tensor (and its widened copy) in memory at a time.
  DSA_TRY(ckpt::write_safetensors_streamed(out, fp32, {{"format", "pt"}},
                                           [&](const std::string& name, const ckpt::tensor_spec&) -> expected<tensor> {
                                             DSA_ASSIGN_OR_RETURN(tensor t, reader->read(name));
                                             return t.type() == dtype::f32 ? t : cast_to(t, dtype::f32);
                                           }));
  return c;
}

} // namespace dsa::train
