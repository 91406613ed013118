// Tensor storage, accounting and views.
#include "core/tensor.hpp"

#include "core/host_allocator.hpp"
#include "core/memory_stats.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace dsa {
namespace {

class cpu_allocator final : public allocator {
public:
  void* allocate(std::size_t bytes, device) override { return host_allocate(bytes); }
  void deallocate(void* ptr, std::size_t bytes, device) override { host_free(ptr, bytes); }
};

cpu_allocator g_cpu_allocator;
allocator* g_allocators[2] = {&g_cpu_allocator, nullptr};

shape_t contiguous_strides(const shape_t& shape) {
  shape_t strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

} // namespace

std::string shape_string(const shape_t& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::int64_t shape_numel(const shape_t& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void register_allocator(device_kind kind, allocator* alloc) { g_allocators[static_cast<int>(kind)] = alloc; }

std::shared_ptr<storage> storage::allocate(std::size_t bytes, device dev) {
  allocator* alloc = g_allocators[static_cast<int>(dev.kind)];
  DSA_CHECK(alloc != nullptr, "no allocator for {} (this build has no CUDA support)", dev.to_string());
  void* p = alloc->allocate(bytes, dev);
  memory_note_alloc(dev, bytes);
  return std::shared_ptr<storage>(new storage(p, bytes, dev, [alloc, bytes, dev](void* ptr) {
    alloc->deallocate(ptr, bytes, dev);
    memory_note_free(dev, bytes);
  }));
}

std::shared_ptr<storage> storage::wrap(void* data, std::size_t bytes, device dev,
                                       std::function<void(void*)> release) {
  return std::shared_ptr<storage>(new storage(data, bytes, dev, std::move(release)));
}

storage::~storage() {
  if (release_) release_(data_);
}

tensor tensor::empty(const shape_t& shape, dtype type, device dev) {
  for (auto d : shape) DSA_CHECK(d >= 0, "negative dimension in shape {}", shape_string(shape));
  tensor t;
  t.storage_ = storage::allocate(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(type), dev);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.type_ = type;
  return t;
}

tensor tensor::zeros(const shape_t& shape, dtype type, device dev) {
  tensor t = empty(shape, type, dev);
  t.zero();
  return t;
}

tensor tensor::from_storage(std::shared_ptr<storage> s, std::size_t byte_offset, const shape_t& shape,
                            dtype type) {
  std::size_t need = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(type);
  DSA_CHECK(byte_offset + need <= s->bytes(), "view of {} bytes at offset {} exceeds storage of {} bytes", need,
            byte_offset, s->bytes());
  tensor t;
  t.storage_ = std::move(s);
  t.offset_ = byte_offset;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.type_ = type;
  return t;
}

std::int64_t tensor::dim(int i) const {
  int n = ndim();
  int k = i < 0 ? i + n : i;
  DSA_CHECK(k >= 0 && k < n, "dim({}) of a {}-d tensor", i, n);
  return shape_[static_cast<std::size_t>(k)];
}

bool tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

void* tensor::raw_data() const {
  DSA_CHECK(defined(), "raw_data() on an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

tensor tensor::slice_rows(std::int64_t begin, std::int64_t end) const {
  DSA_CHECK(ndim() >= 1, "slice_rows on a 0-d tensor");
  DSA_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice_rows({}, {}) of {}", begin, end,
            shape_string(shape_));
  tensor t = *this;
  t.offset_ = offset_ + static_cast<std::size_t>(begin * strides_[0]) * dtype_size(type_);
  t.shape_[0] = end - begin;
  return t;
}

tensor tensor::reshape(const shape_t& shape) const {
  DSA_CHECK(is_contiguous(), "reshape of a non-contiguous tensor {}", describe());
  shape_t out = shape;
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      DSA_CHECK(infer < 0, "reshape {} has more than one -1", shape_string(shape));
      infer = static_cast<int>(i);
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    DSA_CHECK(known > 0 && numel() % known == 0, "cannot reshape {} to {}", describe(), shape_string(shape));
    out[static_cast<std::size_t>(infer)] = numel() / known;
  }
  DSA_CHECK(shape_numel(out) == numel(), "cannot reshape {} to {}", describe(), shape_string(shape));
  tensor t = *this;
  t.shape_ = out;
  t.strides_ = contiguous_strides(out);
  return t;
}

tensor tensor::clone() const {
  tensor t = empty(shape_, type_, dev());
  t.copy_from(*this);
  return t;
}

void tensor::copy_from(const tensor& src) {
  DSA_CHECK(src.shape_ == shape_ && src.type_ == type_, "copy_from {} into {}", src.describe(), describe());
  DSA_CHECK(dev().is_cpu() && src.dev().is_cpu(), "tensor::copy_from is CPU-only ({} <- {})", describe(),
            src.describe());
  DSA_CHECK(is_contiguous() && src.is_contiguous(), "copy_from needs contiguous tensors");
  if (nbytes() > 0) std::memmove(raw_data(), src.raw_data(), nbytes());
}

void tensor::zero() {
  DSA_CHECK(dev().is_cpu(), "tensor::zero is CPU-only ({})", describe());
  DSA_CHECK(is_contiguous(), "zero() needs a contiguous tensor");
  if (nbytes() > 0) std::memset(raw_data(), 0, nbytes());
}

std::string tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{}{} on {}", dtype_name(type_), shape_string(shape_), dev().to_string());
}

} // namespace dsa
