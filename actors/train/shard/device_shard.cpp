// A shard with its state on a device; see device_shard.hpp.
#include "actors/train/shard/device_shard.hpp"

#include "optim/grad_clip.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {

device_shard::device_shard(shard_options options) : shard_base(std::move(options)), device_(options_.device) {
  DSA_CHECK(device_ != nullptr, "device_shard for stage {} without a device", options_.participant);
}

void device_shard::init(const std::vector<tensor>& initial) {
  cfg_ = options_.optimizer;
  if (cfg_.type != optim::optimizer_type::adam && cfg_.type != optim::optimizer_type::adamw)
    throw std::runtime_error(fmt::format("optimizer shard {} on {}: the GPU-resident optimizer runs Adam and AdamW, "
                                         "not {}",
                                         options_.participant, device_->where(), optim::optimizer_name(cfg_.type)));
  const std::vector<tensor> start = starting_masters(initial);
  const optim::optimizer_state* resumed = options_.resume_state ? &*options_.resume_state : nullptr;
  for (std::size_t i = 0; i < start.size(); ++i) {
    const std::string& name = options_.specs[i].name;
    tensor m, v;
    if (resumed) {
      auto fm = resumed->tensors.find(name + ".exp_avg"), fv = resumed->tensors.find(name + ".exp_avg_sq");
      if (fm == resumed->tensors.end() || fv == resumed->tensors.end())
        throw std::runtime_error(fmt::format("optimizer state: the moments of '{}' are missing", name));
      m = fm->second;
      v = fv->second;
    }
    device_->add(cast_to(start[i], dtype::f32), m, v);
    grads_.push_back(tensor::zeros(start[i].shape(), dtype::f32));
    decay_.push_back(optim::bert_no_decay(name) ? 0.0 : cfg_.weight_decay);
  }
  steps_ = resumed ? resumed->step : 0;
}

void device_shard::advance(std::uint32_t, const step_decision& d) {
  if (d.skip) return;
  if (d.set_betas) {
    cfg_.beta1 = d.beta1;
    cfg_.beta2 = d.beta2;
  }
  ++steps_;
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    optim::scale_in_place(grads_[i], d.grad_scale);
    device_->step(i, grads_[i], optim::adam_step_params(cfg_, d.lr, decay_[i], steps_));
  }
}

void device_shard::publish(const step_decision&, std::vector<tensor>& out) {
  out.resize(grads_.size());
  version_bytes_ = 0;
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    device_->read_version(i, out[i]);
    version_bytes_ += static_cast<std::int64_t>(out[i].nbytes());
  }
  device_->wait_reads();
}

void device_shard::back_up() {
  backup& b = backup_;
  const std::size_t n = grads_.size();
  b.masters.resize(n);
  b.m.resize(n);
  b.v.resize(n);
  b.grads.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    device_->read_state(i, b.masters[i], b.m[i], b.v[i]);
    keep_copy(b.grads[i], grads_[i]);
  }
  device_->wait_reads();
  b.steps = steps_;
  b.beta1 = cfg_.beta1;
  b.beta2 = cfg_.beta2;
}

void device_shard::roll_back() {
  const backup& b = backup_;
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    device_->write_state(i, b.masters[i], b.m[i], b.v[i]);
    grads_[i].copy_from(b.grads[i]);
  }
  steps_ = b.steps;
  cfg_.beta1 = b.beta1;
  cfg_.beta2 = b.beta2;
}

state_payload device_shard::payload() const {
  state_payload p;
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    const std::string& name = options_.specs[i].name;
    tensor master, m, v;
    device_->read_state(i, master, m, v);
    p["master." + name] = master; // tensors share storage: filled once wait_reads returns
    p[name + ".exp_avg"] = m;
    p[name + ".exp_avg_sq"] = v;
  }
  device_->wait_reads();
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = steps_;
  p["optimizer_step_count"] = count;
  return p;
}

shard_bytes device_shard::held_bytes() const {
  // Host memory: the reduced gradients and the version; the masters, moments and working
  // copies too when the device is the host one (a GPU's are reported with its memory).
  shard_bytes b;
  for (const tensor& g : grads_) b.gradients += static_cast<std::int64_t>(g.nbytes());
  b.version = version_bytes_;
  if (device_->where() == "host") {
    b.masters = b.gradients;     // f32, one per parameter, as the gradients
    b.moments = 2 * b.gradients; // two f32 moments
    b.half_masters = device_->bytes() - b.masters - b.moments;
  }
  return b;
}

} // namespace dsa::train
