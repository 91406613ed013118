// The compressed optimizers inside a stage's shard; see compressed_shard.hpp.
#include "actors/train/shard/compressed_shard.hpp"

#include "actors/data_parallel.hpp"
#include "actors/train/config/precision.hpp"
#include "optim/grad_clip.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <stdexcept>

namespace dsa::train {
namespace {

template <class... F> struct overloaded : F... { using F::operator()...; };
template <class... F> overloaded(F...) -> overloaded<F...>;

} // namespace

compressed_shard::compressed_shard(compressed_shard_options options, const std::vector<tensor>& initial)
    : options_(std::move(options)), channel_(options_.peers, options_.logger, options_.caller) {
  const auto& specs = options_.specs;
  const auto& cfg = options_.optimizer;
  DSA_CHECK(cfg.compressed(), "{}: compressed_shard for a non-compressed optimizer", options_.caller);
  DSA_CHECK(initial.size() == specs.size(), "{}: {} initial tensors for {} parameters", options_.caller,
            initial.size(), specs.size());
  // BERT's groups, as optim::bert_param_groups splits them: decay first, then no_decay.
  // 1-bit LAMB fuses them into one buffer and one exchange, as DeepSpeed's OnebitLamb does
  // (its momentum scalings then even out every tensor, whatever its group).
  const bool fused = cfg.type == optim::optimizer_type::onebit_lamb;
  const std::vector<std::vector<const char*>> layout =
      fused ? std::vector<std::vector<const char*>>{{"decay", "no_decay"}}
            : std::vector<std::vector<const char*>>{{"decay"}, {"no_decay"}};
  for (const auto& parts : layout) {
    group g;
    g.name = fused ? optim::onebit_lamb_group : parts.front();
    std::int64_t numel = 0;
    for (const std::string part : parts)
      for (std::size_t i = 0; i < specs.size(); ++i) {
        if (optim::bert_no_decay(specs[i].name) != (part == "no_decay")) continue;
        g.members.push_back(i);
        g.offsets.push_back(numel);
        numel += shape_numel(specs[i].shape);
      }
    if (g.members.empty()) continue;
    g.master = tensor::zeros({numel}, dtype::f32);
    g.grad = tensor::zeros({numel}, dtype::f32);
    groups_.push_back(std::move(g));
  }
  params_.resize(specs.size());
  grads_.resize(specs.size());
  for (auto& g : groups_) {
    std::vector<float> mask;
    std::vector<std::int64_t> sizes;
    bool masked = false;
    for (std::size_t k = 0; k < g.members.size(); ++k) {
      const std::size_t i = g.members[k];
      const std::int64_t n = shape_numel(specs[i].shape), off = g.offsets[k];
      params_[i] = g.master.slice_rows(off, off + n).reshape(specs[i].shape);
      grads_[i] = g.grad.slice_rows(off, off + n).reshape(specs[i].shape);
      const tensor& from = initial[i];
      DSA_CHECK(from.numel() == n, "{}: initial {} for {} of {} elements", options_.caller, from.describe(),
                specs[i].name, n);
      params_[i].copy_from(cast_to(from, dtype::f32).reshape(specs[i].shape));
      sizes.push_back(n);
      std::vector<float> keep(static_cast<std::size_t>(n), 1.0f);
      if (specs[i].name == bert::position_embeddings_name() && options_.mask_positions_from >= 0 && specs[i].shape.size() == 2) {
        const std::int64_t width = specs[i].shape[1];
        for (std::int64_t r = options_.mask_positions_from; r < specs[i].shape[0]; ++r)
          for (std::int64_t c = 0; c < width; ++c) keep[static_cast<std::size_t>(r * width + c)] = 0.0f;
        masked = options_.mask_positions_from < specs[i].shape[0];
      }
      mask.insert(mask.end(), keep.begin(), keep.end());
    }
    const double wd = g.name == "decay" ? cfg.weight_decay : 0.0;
    const auto lr = static_cast<float>(cfg.lr), b1 = static_cast<float>(cfg.beta1),
               b2 = static_cast<float>(cfg.beta2), eps = static_cast<float>(cfg.eps), decay = static_cast<float>(wd);
    if (cfg.type == optim::optimizer_type::onebit_adam) {
      optim::onebit_adam_params p{lr, b1, b2, eps, decay, cfg.freeze_step, cfg.dummy_first_step, cfg.bias_correction};
      g.opt.emplace(std::in_place_type<optim::onebit_adam>, p, g.master.numel());
    } else if (cfg.type == optim::optimizer_type::zeroone_adam) {
      optim::zeroone_adam_params p{lr, b1, b2, eps, decay, cfg.var_freeze_step, cfg.var_update_scaler,
                                   cfg.local_step_scaler, cfg.local_step_clipper, cfg.bias_correction,
                                   cfg.dummy_first_step};
      g.opt.emplace(std::in_place_type<optim::zeroone_adam>, p, g.master.numel());
    } else {
      std::vector<float> decays;
      for (std::size_t i : g.members)
        decays.push_back(optim::bert_no_decay(specs[i].name) ? 0.0f : static_cast<float>(cfg.weight_decay));
      g.opt.emplace(std::in_place_type<optim::onebit_lamb>, optim::onebit_lamb_params_of(cfg, cfg.lr, wd), sizes,
                    std::move(decays));
    }
    if (masked) {
      status s = std::visit([&](auto& o) { return o.set_mask(std::move(mask)); }, *g.opt);
      DSA_CHECK(static_cast<bool>(s), "{}: {}", options_.caller, s.err().message);
    }
  }
  refresh_local_next();
}

bool compressed_shard::wants_local(const group& g) const {
  if (!options_.peers || options_.peers->size() == 1) return false;
  return std::visit(overloaded{[](const optim::onebit_adam& o) { return o.compressed_next(); },
                               [](const optim::zeroone_adam& o) { return !o.full_gradient_next(); },
                               [](const optim::onebit_lamb& o) { return o.compressed_next(); }},
                    *g.opt);
}

void compressed_shard::refresh_local_next() {
  local_next_.store(std::any_of(groups_.begin(), groups_.end(), [&](const group& g) { return wants_local(g); }),
                    std::memory_order_release);
}

actors::grad_totals compressed_shard::local_totals(const actors::grad_totals& totals) {
  return channel_.local_totals(totals);
}

status compressed_shard::step(double lr, double grad_scale, std::optional<std::pair<double, double>> betas) {
  const bool local = local_next();
  const int ranks = options_.peers ? options_.peers->size() : 1;
  const double scale = local ? grad_scale * ranks : grad_scale;
  std::int64_t elements = 0;
  for (auto& g : groups_) {
    if (betas)
      std::visit([&](auto& o) { o.set_betas(static_cast<float>(betas->first), static_cast<float>(betas->second)); },
                 *g.opt);
    if (scale != 1.0) optim::scale_in_place(g.grad, scale);
    float* p = g.master.data<float>();
    const float* grad = g.grad.data<float>();
    const std::int64_t n = g.master.numel();
    elements += n;
    status s = std::visit(
        overloaded{[&](optim::onebit_adam& o) {
                     o.set_lr(static_cast<float>(lr));
                     return o.step(p, grad, [&](float* v, std::int64_t c) { return channel_.exchange(g.name, v, c); });
                   },
                   [&](optim::zeroone_adam& o) -> status {
                     o.set_lr(static_cast<float>(lr));
                     auto r = o.step(p, grad, [&](float* v, std::int64_t c, bool reset) { return channel_.exchange(g.name, v, c, reset); });
                     return r ? status{} : status(r.err());
                   },
                   [&](optim::onebit_lamb& o) {
                     o.set_lr(static_cast<float>(lr));
                     return o.step(p, grad, [&](float* v, std::int64_t c) { return channel_.exchange(g.name, v, c); });
                   }},
        *g.opt);
    if (!s) return s;
  }
  channel_.count_step(elements, local);
  refresh_local_next();
  return {};
}

std::int64_t compressed_shard::step_count() const {
  if (groups_.empty()) return 0;
  return std::visit([](const auto& o) { return o.step_count(); }, *groups_.front().opt);
}

std::map<std::string, tensor> compressed_shard::state_tensors() const {
  std::map<std::string, tensor> out;
  for (const auto& g : groups_) {
    const optim::compressed_state st = std::visit([](const auto& o) { return o.save(); }, *g.opt);
    for (std::size_t k = 0; k < g.members.size(); ++k) {
      const auto& spec = options_.specs[g.members[k]];
      const auto off = static_cast<std::size_t>(g.offsets[k]);
      const auto n = static_cast<std::size_t>(shape_numel(spec.shape));
      for (const auto& [suffix, src] : {std::pair{".exp_avg", &st.exp_avg}, std::pair{".exp_avg_sq", &st.exp_avg_sq}}) {
        tensor t = tensor::empty(spec.shape, dtype::f32);
        std::memcpy(t.raw_data(), src->data() + off, n * sizeof(float));
        out[spec.name + suffix] = t;
      }
    }
    for (const auto& [field, values] : st.extra) out["compressed." + g.name + "." + field] = f32_tensor(values);
  }
  return out;
}

status compressed_shard::load_state(const std::map<std::string, tensor>& tensors, std::int64_t step) {
  for (auto& g : groups_) {
    optim::compressed_state st;
    st.step = step;
    st.exp_avg.resize(static_cast<std::size_t>(g.master.numel()));
    st.exp_avg_sq.resize(st.exp_avg.size());
    for (std::size_t k = 0; k < g.members.size(); ++k) {
      const auto& spec = options_.specs[g.members[k]];
      const auto off = static_cast<std::size_t>(g.offsets[k]);
      for (const auto& [suffix, dst] : {std::pair{".exp_avg", &st.exp_avg}, std::pair{".exp_avg_sq", &st.exp_avg_sq}}) {
        auto it = tensors.find(spec.name + suffix);
        if (it == tensors.end())
          return make_error(errc::invalid_argument, "checkpoint has no optimizer tensor {}{}", spec.name, suffix);
        if (it->second.type() != dtype::f32 || it->second.numel() != shape_numel(spec.shape))
          return make_error(errc::invalid_argument, "checkpoint tensor {}{} is {}, expected f32 of {} elements",
                            spec.name, suffix, it->second.describe(), shape_numel(spec.shape));
        std::memcpy(dst->data() + off, it->second.raw_data(), it->second.nbytes());
      }
    }
    const std::string prefix = "compressed." + g.name + ".";
    for (const auto& [name, t] : tensors)
      if (name.rfind(prefix, 0) == 0 && t.type() == dtype::f32) st.extra[name.substr(prefix.size())] = f32_values(t);
    status s = std::visit([&](auto& o) { return o.load(st); }, *g.opt);
    if (!s) return make_error(s.err().code, "checkpoint group {}: {}", g.name, s.err().message);
  }
  channel_.reset_errors();
  refresh_local_next();
  return {};
}

std::map<std::string, tensor> compressed_shard::error_tensors() const { return channel_.error_tensors(); }

status compressed_shard::load_errors(const std::map<std::string, tensor>& tensors) {
  std::map<std::string, std::int64_t> numel;
  for (const auto& g : groups_) numel[g.name] = g.master.numel();
  return channel_.load_errors(tensors, numel);
}

} // namespace dsa::train
