// Tensor: dtype, device, shape and strides over ref-counted storage.
// CPU storage is 64-byte aligned; views (row slices, reshapes of contiguous
// data) share storage and cost no copy. Every allocation is accounted per device.
#pragma once

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace dsa {

using shape_t = std::vector<std::int64_t>;

std::string shape_string(const shape_t& shape);
std::int64_t shape_numel(const shape_t& shape);

// Allocates raw device memory. The CPU allocator is built in; a CUDA build
// registers its caching allocator for device_kind::cuda.
class allocator {
public:
  virtual ~allocator() = default;
  virtual void* allocate(std::size_t bytes, device dev) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, device dev) = 0;
};
void register_allocator(device_kind kind, allocator* alloc);

// Bytes on one device. Owned through shared_ptr; frees (and un-accounts) on destruction.
class storage {
public:
  static std::shared_ptr<storage> allocate(std::size_t bytes, device dev);
  // Wraps memory owned elsewhere (a mapped file, a pinned buffer); `release` runs on destruction.
  static std::shared_ptr<storage> wrap(void* data, std::size_t bytes, device dev,
                                       std::function<void(void*)> release);
  ~storage();
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  device dev() const { return dev_; }

private:
  storage(void* data, std::size_t bytes, device dev, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), dev_(dev), release_(std::move(release)) {}
  void* data_;
  std::size_t bytes_;
  device dev_;
  std::function<void(void*)> release_;
};

class tensor {
public:
  tensor() = default; // undefined tensor

  static tensor empty(const shape_t& shape, dtype type, device dev = device::cpu());
  static tensor zeros(const shape_t& shape, dtype type, device dev = device::cpu());
  // A tensor over existing storage (contiguous, starting at byte offset).
  static tensor from_storage(std::shared_ptr<storage> s, std::size_t byte_offset,
                             const shape_t& shape, dtype type);

  bool defined() const { return static_cast<bool>(storage_); }
  dtype type() const { return type_; }
  device dev() const { return storage_ ? storage_->dev() : device::cpu(); }
  const shape_t& shape() const { return shape_; }
  const shape_t& strides() const { return strides_; } // in elements
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(type_); }
  bool is_contiguous() const;
  const std::shared_ptr<storage>& storage_ptr() const { return storage_; }
  std::size_t byte_offset() const { return offset_; }

  void* raw_data() const;
  // Typed access; checks that T matches the dtype (std::uint16_t for f16/bf16).
  template <class T> T* data() const {
    DSA_CHECK(defined(), "data() on an undefined tensor");
    DSA_CHECK(element_matches<T>(type_), "data<{}-byte type>() on a {} tensor", sizeof(T), dtype_name(type_));
    return static_cast<T*>(raw_data());
  }

  // Views sharing storage.
  tensor slice_rows(std::int64_t begin, std::int64_t end) const; // along dim 0
  tensor reshape(const shape_t& shape) const;                     // one -1 allowed; needs contiguity
  tensor flatten() const { return reshape({numel()}); }

  // Copies (CPU).
  tensor clone() const;
  void copy_from(const tensor& src); // same shape and dtype
  void zero();
  std::string describe() const; // "f32[2, 3] on cpu"

private:
  template <class T> static bool element_matches(dtype t) {
    if constexpr (std::is_same_v<T, std::uint16_t>) return t == dtype::f16 || t == dtype::bf16;
    else if constexpr (std::is_same_v<T, void>) return true;
    else return dtype_of<std::remove_const_t<T>>::value == t;
  }

  std::shared_ptr<storage> storage_;
  std::size_t offset_ = 0; // bytes into storage
  shape_t shape_;
  shape_t strides_;
  dtype type_ = dtype::f32;
};

} // namespace dsa
