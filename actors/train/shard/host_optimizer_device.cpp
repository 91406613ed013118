// The host optimizer_device: the GPU-resident shard's arrays in host memory, stepped by
// the CPU kernel with the same parameters optim::optimizer uses (see optimizer_device.hpp).
#include "actors/train/config/precision.hpp"
#include "actors/train/shard/optimizer_device.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

namespace dsa::train {
namespace {

// dst = a copy of src, reallocated unless it has src's shape and type.
void copy_into(tensor& dst, const tensor& src) {
  if (!dst.defined() || dst.shape() != src.shape() || dst.type() != src.type()) dst = tensor::empty(src.shape(), src.type());
  dst.copy_from(src);
}

class host_optimizer_device final : public optimizer_device {
public:
  explicit host_optimizer_device(dtype working) : working_(working) {}

  void add(const tensor& master, const tensor& m, const tensor& v) override {
    slot s;
    s.master = master.clone();
    s.m = m.defined() ? m.clone().reshape(master.shape()) : tensor::zeros(master.shape(), dtype::f32);
    s.v = v.defined() ? v.clone().reshape(master.shape()) : tensor::zeros(master.shape(), dtype::f32);
    if (working_ != dtype::f32) s.working = cast_to(s.master, working_);
    slots_.push_back(std::move(s));
  }

  void step(std::size_t i, const tensor& grad, const cpu::adam_params& params) override {
    slot& s = slots_.at(i);
    if (grad.numel() != s.master.numel())
      throw std::runtime_error(fmt::format("host optimizer: gradient {} has {} elements, expected {}", i, grad.numel(),
                                           s.master.numel()));
    cpu::adam_update(s.master.data<float>(), s.m.data<float>(), s.v.data<float>(), grad.data<float>(),
                     s.working.defined() ? s.working.data<std::uint16_t>() : nullptr,
                     s.working.defined() ? s.working.type() : dtype::f16, params, s.master.numel());
  }

  void read_version(std::size_t i, tensor& out) override {
    const slot& s = slots_.at(i);
    copy_into(out, s.working.defined() ? s.working : s.master);
  }

  void read_state(std::size_t i, tensor& master, tensor& m, tensor& v) override {
    const slot& s = slots_.at(i);
    copy_into(master, s.master);
    copy_into(m, s.m);
    copy_into(v, s.v);
  }

  void wait_reads() override {} // the copies were made in the calls

  void write_state(std::size_t i, const tensor& master, const tensor& m, const tensor& v) override {
    slot& s = slots_.at(i);
    s.master.copy_from(master.reshape(s.master.shape()));
    s.m.copy_from(m.reshape(s.master.shape()));
    s.v.copy_from(v.reshape(s.master.shape()));
    if (s.working.defined()) cast_into(s.working, s.master, working_);
  }

  std::int64_t bytes() const override {
    std::int64_t b = 0;
    for (const slot& s : slots_)
      b += static_cast<std::int64_t>(s.master.nbytes() + s.m.nbytes() + s.v.nbytes() +
                                     (s.working.defined() ? s.working.nbytes() : 0));
    return b;
  }

  std::string where() const override { return "host"; }

private:
  struct slot {
    tensor master, m, v, working;
  };
  dtype working_;
  std::vector<slot> slots_;
};

} // namespace

std::unique_ptr<optimizer_device> make_host_optimizer_device(dtype working) {
  return std::make_unique<host_optimizer_device>(working);
}

} // namespace dsa::train
