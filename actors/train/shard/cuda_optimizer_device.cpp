// The CUDA optimizer_device (CUDA builds): the GPU-resident shard's masters, moments and
// working copies on one device, stepped by cuda::adam_update on the shard's own stream
// (see optimizer_device.hpp). Gradients come from the host, uploaded per parameter into one
// scratch array; versions and checkpoints are read back with one wait per read-back
// (wait_reads) on the shard's worker.
#include "actors/train/shard/optimizer_device.hpp"

#include "core/device_waits.hpp"
#include "kernels/cuda/adam.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/device_context.hpp"
#include "models/bert/cuda_layer.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <stdexcept>
#include <vector>

namespace dsa::train {
namespace {

using bert::gpu::device_array;

class cuda_optimizer_device final : public optimizer_device {
public:
  cuda_optimizer_device(int index, dtype working) : index_(index), working_(working) {
    set_device();
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the optimizer's stream");
    stream_ = std::make_unique<cuda::stream_handle>(s);
  }
  ~cuda_optimizer_device() override {
    cudaSetDevice(index_); // the arrays free in stream order on the shard's device
    slots_.clear();
    scratch_ = device_array();
  }

  void add(const tensor& master, const tensor& m, const tensor& v) override {
    set_device();
    slot s;
    s.shape = master.shape();
    s.numel = master.numel();
    const auto bytes = static_cast<std::size_t>(s.numel) * 4;
    s.master = device_array(bytes, stream());
    s.m = device_array(bytes, stream());
    s.v = device_array(bytes, stream());
    upload(s.master, master, s.numel, "a master");
    if (m.defined()) upload(s.m, m, s.numel, "a first moment");
    else check(cudaMemsetAsync(s.m.get(), 0, bytes, stream()), "zeroing a moment");
    if (v.defined()) upload(s.v, v, s.numel, "a second moment");
    else check(cudaMemsetAsync(s.v.get(), 0, bytes, stream()), "zeroing a moment");
    if (working_ != dtype::f32) {
      s.working = device_array(static_cast<std::size_t>(s.numel) * 2, stream());
      check(cuda::convert(s.working.get(), half(), s.master.get(), cuda::elem::f32, s.numel, stream()),
            "a working copy");
    }
    bytes_ += static_cast<std::int64_t>(bytes * 3) + (working_ != dtype::f32 ? s.numel * 2 : 0);
    slots_.push_back(std::move(s));
  }

  void step(std::size_t i, const tensor& grad, const cpu::adam_params& params) override {
    set_device();
    slot& s = slots_.at(i);
    if (grad.numel() != s.numel || grad.type() != dtype::f32 || !grad.is_contiguous())
      throw std::runtime_error(fmt::format("optimizer on {}: gradient {} is {}, expected {} f32 elements", where(), i,
                                           grad.describe(), s.numel));
    if (s.numel > scratch_elements_) {
      scratch_ = device_array(static_cast<std::size_t>(s.numel) * 4, stream());
      bytes_ += (s.numel - scratch_elements_) * 4;
      scratch_elements_ = s.numel;
    }
    // Pageable memory: staged before the call returns, so the reducer may write it again.
    check(cudaMemcpyAsync(scratch_.get(), grad.raw_data(), static_cast<std::size_t>(s.numel) * 4,
                          cudaMemcpyHostToDevice, stream()),
          "uploading a gradient");
    check(cuda::adam_update(s.master.as<float>(), s.m.as<float>(), s.v.as<float>(), scratch_.as<float>(),
                            s.working.get() ? s.working.as<std::uint16_t>() : nullptr, half(),
                            cpu::make_adam_consts(params), s.numel, stream()),
          "the Adam step");
  }

  void read_version(std::size_t i, tensor& out) override {
    set_device();
    const slot& s = slots_.at(i);
    const bool has_half = s.working.get() != nullptr;
    download(out, has_half ? s.working : s.master, s, has_half ? working_ : dtype::f32);
  }

  void read_state(std::size_t i, tensor& master, tensor& m, tensor& v) override {
    set_device();
    const slot& s = slots_.at(i);
    download(master, s.master, s, dtype::f32);
    download(m, s.m, s, dtype::f32);
    download(v, s.v, s, dtype::f32);
  }

  void wait_reads() override {
    set_device();
    device_wait("cudaStreamSynchronize (the GPU optimizer's host copies)");
    check(cudaStreamSynchronize(stream()), "reading the optimizer's arrays");
  }

  void write_state(std::size_t i, const tensor& master, const tensor& m, const tensor& v) override {
    set_device();
    slot& s = slots_.at(i);
    upload(s.master, master, s.numel, "a master");
    upload(s.m, m, s.numel, "a first moment");
    upload(s.v, v, s.numel, "a second moment");
    if (s.working.get())
      check(cuda::convert(s.working.get(), half(), s.master.get(), cuda::elem::f32, s.numel, stream()),
            "a working copy");
  }

  std::int64_t bytes() const override { return bytes_; }
  std::string where() const override { return fmt::format("cuda:{}", index_); }

private:
  struct slot {
    shape_t shape;
    std::int64_t numel = 0;
    device_array master, m, v, working;
  };

  cudaStream_t stream() const { return stream_->get(); }
  cuda::elem half() const { return working_ == dtype::bf16 ? cuda::elem::bf16 : cuda::elem::f16; }
  void set_device() const { check(cudaSetDevice(index_), "cudaSetDevice"); }
  void check(cudaError_t e, const char* what) const {
    if (e != cudaSuccess)
      throw std::runtime_error(fmt::format("optimizer on cuda:{}: {} failed: {}", index_, what, cudaGetErrorString(e)));
  }
  // Pageable memory: staged before the call returns, so `src` may change at once.
  void upload(device_array& dst, const tensor& src, std::int64_t numel, const char* what) {
    if (!src.defined() || src.type() != dtype::f32 || !src.is_contiguous() || src.numel() != numel)
      throw std::runtime_error(fmt::format("optimizer on {}: {} given as {}, expected {} contiguous f32 elements",
                                           where(), what, src.defined() ? src.describe() : "(none)", numel));
    check(cudaMemcpyAsync(dst.get(), src.raw_data(), static_cast<std::size_t>(numel) * 4, cudaMemcpyHostToDevice,
                          stream()),
          what);
  }
  void download(tensor& out, const device_array& src, const slot& s, dtype type) {
    if (!out.defined() || out.shape() != s.shape || out.type() != type || !out.is_contiguous())
      out = tensor::empty(s.shape, type);
    check(cudaMemcpyAsync(out.raw_data(), src.get(), out.nbytes(), cudaMemcpyDeviceToHost, stream()),
          "a download");
  }

  int index_;
  dtype working_;
  std::unique_ptr<cuda::stream_handle> stream_; // before the arrays: destroyed after them
  std::vector<slot> slots_;
  device_array scratch_;
  std::int64_t scratch_elements_ = 0;
  std::int64_t bytes_ = 0;
};

} // namespace

std::unique_ptr<optimizer_device> make_cuda_optimizer_device(int index, dtype working) {
  return std::make_unique<cuda_optimizer_device>(index, working);
}

} // namespace dsa::train
