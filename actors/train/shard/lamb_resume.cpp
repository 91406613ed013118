// 1-bit LAMB's per-tensor state across pipeline layouts; see lamb_resume.hpp.
#include "actors/train/shard/lamb_resume.hpp"

#include "optim/onebit_lamb.hpp"
#include "optim/optimizer.hpp"

#include <fmt/format.h>

#include <cstring>
#include <optional>

namespace dsa::train {
namespace {

const char* const fields[] = {"coeff", "factor", "scaling"};

// One tensor's share of the state.
struct tensor_lamb {
  float value[3] = {0, 1, 0}; // coeff, factor, scaling
  bool has_scaling = false;
  tensor fresh; // undefined before the freeze
};

expected<const tensor*> f32_entry(const std::map<std::string, tensor>& m, const std::string& key, std::int64_t want,
                                  bool may_be_empty) {
  auto it = m.find(key);
  if (it == m.end()) return make_error(errc::invalid_argument, "1-bit LAMB state: no '{}'", key);
  if (it->second.type() != dtype::f32 || !(it->second.numel() == want || (may_be_empty && it->second.numel() == 0)))
    return make_error(errc::invalid_argument, "1-bit LAMB state: '{}' is {}, expected {} f32 values", key,
                      it->second.describe(), want);
  return &it->second;
}

tensor f32_of(const std::vector<float>& v) {
  tensor t = tensor::empty({static_cast<std::int64_t>(v.size())}, dtype::f32);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(float));
  return t;
}

} // namespace

expected<std::map<std::string, tensor>> lamb_state_of_group(const std::vector<bert::param_spec>& specs,
                                                            const std::map<std::string, tensor>& group) {
  const std::string prefix = fmt::format("compressed.{}.", optim::onebit_lamb_group);
  if (!group.count(prefix + "coeff")) return std::map<std::string, tensor>{};
  // The whole shard's one group: the decay tensors in the stage's order, then the others.
  std::vector<std::size_t> members;
  for (const bool no_decay : {false, true})
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (optim::bert_no_decay(specs[i].name) == no_decay) members.push_back(i);
  const auto n = static_cast<std::int64_t>(members.size());
  std::map<std::string, tensor> out;
  for (const char* field : fields) {
    DSA_ASSIGN_OR_RETURN(const tensor* t, f32_entry(group, prefix + field, n, std::string(field) == "scaling"));
    std::vector<float> by_spec(t->numel() == 0 ? 0 : specs.size());
    for (std::size_t j = 0; j < by_spec.size(); ++j) by_spec[members[j]] = t->data<float>()[j];
    out[field] = f32_of(by_spec);
  }
  std::int64_t total = 0;
  for (const auto& s : specs) total += shape_numel(s.shape);
  DSA_ASSIGN_OR_RETURN(const tensor* fresh, f32_entry(group, prefix + "exp_avg_sq_fresh", total, true));
  if (fresh->numel() > 0) {
    std::int64_t at = 0;
    for (std::size_t i : members) {
      tensor x = tensor::empty(specs[i].shape, dtype::f32);
      std::memcpy(x.raw_data(), fresh->data<float>() + at, x.nbytes());
      at += x.numel();
      out[specs[i].name + ".exp_avg_sq_fresh"] = x;
    }
  }
  return out;
}

expected<std::map<std::string, tensor>> repartition_lamb_state(const std::vector<saved_lamb_stage>& saved,
                                                               const std::vector<bert::param_spec>& specs) {
  std::map<std::string, tensor_lamb> by_name;
  bool every_scaling = true, any_fresh = false;
  for (std::size_t k = 0; k < saved.size(); ++k) {
    const auto& st = saved[k];
    const auto n = static_cast<std::int64_t>(st.specs.size());
    const tensor* values[3] = {};
    for (int f = 0; f < 3; ++f) {
      auto t = f32_entry(st.lamb_state, fields[f], n, f == 2);
      if (!t) return make_error(t.err().code, "saved stage {}: {}", k, t.err().message);
      values[f] = *t;
    }
    every_scaling = every_scaling && values[2]->numel() == n;
    for (std::size_t i = 0; i < st.specs.size(); ++i) {
      const auto& name = st.specs[i].name;
      if (by_name.count(name)) continue;
      tensor_lamb& x = by_name[name];
      for (int f = 0; f < 3; ++f)
        if (values[f]->numel() > 0) x.value[f] = values[f]->data<float>()[i];
      x.has_scaling = values[2]->numel() > 0;
      if (auto it = st.lamb_state.find(name + ".exp_avg_sq_fresh"); it != st.lamb_state.end()) {
        x.fresh = it->second;
        any_fresh = true;
      }
    }
  }
  std::map<std::string, tensor> out;
  std::vector<float> columns[3];
  for (const auto& spec : specs) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end())
      return make_error(errc::not_found, "1-bit LAMB state: no saved stage of {} holds '{}'", saved.size(), spec.name);
    for (int f = 0; f < 3; ++f) columns[f].push_back(it->second.value[f]);
    if (!any_fresh) continue;
    const tensor& fresh = it->second.fresh;
    if (!fresh.defined() || fresh.type() != dtype::f32 || fresh.numel() != shape_numel(spec.shape))
      return make_error(errc::invalid_argument, "1-bit LAMB state: '{}.exp_avg_sq_fresh' missing or not {} f32 values",
                        spec.name, shape_numel(spec.shape));
    out[spec.name + ".exp_avg_sq_fresh"] = fresh;
  }
  if (!every_scaling) columns[2].clear(); // saved before the momentum scalings existed
  for (int f = 0; f < 3; ++f) out[fields[f]] = f32_of(columns[f]);
  return out;
}

} // namespace dsa::train
