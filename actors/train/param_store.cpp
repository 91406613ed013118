// ZeRO-3's partition of the working weights in memory or on NVMe; see param_store.hpp.
#include "actors/train/param_store.hpp"

#include "io/aio/aligned_buffer_pool.hpp"
#include "kernels/cpu/convert.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <utility>

namespace dsa::train {
namespace {

std::byte* at(void* base, std::int64_t element, dtype type) {
  return static_cast<std::byte*>(base) + static_cast<std::size_t>(element) * dtype_size(type);
}

class memory_store final : public param_store {
public:
  memory_store(std::int64_t numel, dtype type) : data_(tensor::zeros({numel}, type)) {}
  status write(const tensor& partition) override {
    cpu::cast(data_.raw_data(), data_.type(), partition.raw_data(), partition.type(), data_.numel());
    return {};
  }
  status read(std::int64_t lo, std::int64_t count, void* out) override {
    std::memcpy(out, at(data_.raw_data(), lo, data_.type()), static_cast<std::size_t>(count) * dtype_size(data_.type()));
    return {};
  }
  std::int64_t numel() const override { return data_.numel(); }
  std::int64_t resident_bytes() const override { return static_cast<std::int64_t>(data_.nbytes()); }
  std::string where() const override { return "memory"; }

private:
  tensor data_;
};

// Elements [0, head) in memory, [head, numel) in the file, element e at byte (e - head) x size.
class nvme_store final : public param_store {
public:
  nvme_store(std::int64_t numel, dtype type, nvme_param_options o, std::int64_t head,
             std::unique_ptr<aio::aligned_buffer_pool> pool)
      : numel_(numel), type_(type), options_(std::move(o)), head_(tensor::zeros({head}, type)),
        file_bytes_(static_cast<std::uint64_t>(numel - head) * dtype_size(type)), pool_(std::move(pool)) {}
  ~nvme_store() override { ::unlink(options_.path.c_str()); } // scratch: a missing file is fine

  status write(const tensor& partition) override {
    std::lock_guard<std::mutex> lk(mu_);
    const std::int64_t head = head_.numel();
    cpu::cast(head_.raw_data(), type_, partition.raw_data(), partition.type(), head);
    const std::size_t in_size = dtype_size(partition.type()), size = dtype_size(type_);
    return transfer(aio::aio_op::write, 0, file_bytes_, [&](std::uint64_t offset, std::uint64_t bytes, void* buffer) {
      const std::int64_t first = head + static_cast<std::int64_t>(offset / size);
      cpu::cast(buffer, type_, static_cast<const std::byte*>(partition.raw_data()) + static_cast<std::size_t>(first) * in_size,
                partition.type(), static_cast<std::int64_t>(bytes / size));
    }, nullptr);
  }

  status read(std::int64_t lo, std::int64_t count, void* out) override {
    std::lock_guard<std::mutex> lk(mu_);
    const std::int64_t head = head_.numel();
    const std::size_t size = dtype_size(type_);
    const std::int64_t in_memory = std::clamp<std::int64_t>(head - lo, 0, count);
    if (in_memory > 0) std::memcpy(out, at(head_.raw_data(), lo, type_), static_cast<std::size_t>(in_memory) * size);
    if (in_memory == count) return {};
    // The rest from the file: from the alignment below its first byte, copied out per chunk.
    const std::uint64_t first = static_cast<std::uint64_t>(lo + in_memory - head) * size;
    const std::uint64_t last = static_cast<std::uint64_t>(lo + count - head) * size;
    const std::uint64_t start = first / pool_->alignment() * pool_->alignment();
    std::byte* dst = static_cast<std::byte*>(out) + static_cast<std::size_t>(in_memory) * size;
    return transfer(aio::aio_op::read, start, last, nullptr, [&](std::uint64_t offset, std::uint64_t bytes, const void* buffer) {
      const std::uint64_t from = std::max(offset, first), to = std::min(offset + bytes, last);
      if (to > from) std::memcpy(dst + (from - first), static_cast<const std::byte*>(buffer) + (from - offset), to - from);
    });
  }

  std::int64_t numel() const override { return numel_; }
  std::int64_t resident_bytes() const override {
    return static_cast<std::int64_t>(head_.nbytes() + pool_->buffer_count() * pool_->buffer_bytes());
  }
  std::string where() const override {
    return fmt::format("nvme: {} ({} of {} elements on NVMe)", options_.path, numel_ - head_.numel(), numel_);
  }

private:
  using fill_fn = std::function<void(std::uint64_t offset, std::uint64_t bytes, void* buffer)>;
  using drain_fn = std::function<void(std::uint64_t offset, std::uint64_t bytes, const void* buffer)>;

  // Bytes [from, to) of the file in chunks of one buffer, up to the pool's buffers in flight;
  // writes fill each buffer before submitting, reads drain each in file order.
  status transfer(aio::aio_op op, std::uint64_t from, std::uint64_t to, const fill_fn& fill, const drain_fn& drain) {
    struct flight {
      aio::pool_buffer buffer;
      std::uint64_t offset = 0, bytes = 0;
      std::future<aio::aio_completion> done;
    };
    std::vector<flight> in_flight;
    status result;
    auto finish_one = [&]() {
      flight f = std::move(in_flight.front());
      in_flight.erase(in_flight.begin());
      aio::aio_completion c = f.done.get();
      if (!c.result && result) result = c.result;
      if (c.result && drain) drain(f.offset, f.bytes, f.buffer.data());
    };
    for (std::uint64_t offset = from; offset < to && result;) {
      if (in_flight.size() == pool_->buffer_count()) finish_one();
      auto buffer = pool_->try_acquire();
      if (!buffer) {
        finish_one();
        continue;
      }
      const std::uint64_t bytes = std::min<std::uint64_t>(buffer->size(), to - offset);
      if (fill) fill(offset, bytes, buffer->data());
      aio::aio_request r;
      r.op = op;
      r.path = options_.path;
      r.buffer = buffer->data();
      r.buffer_bytes = buffer->size();
      r.bytes = static_cast<std::size_t>(op == aio::aio_op::read ? std::min<std::uint64_t>(bytes, file_bytes_ - offset) : bytes);
      r.file_offset = offset;
      if (op == aio::aio_op::read) {
        r.expect_file_size = file_bytes_;
      } else {
        r.file_length = file_bytes_;
        if (written_) r.expect_file_size = file_bytes_; // a file cut under the run is an error
      }
      auto future = options_.engine->submit(std::move(r));
      in_flight.push_back(flight{std::move(*buffer), offset, bytes, std::move(future)});
      offset += bytes;
    }
    while (!in_flight.empty()) finish_one();
    if (op == aio::aio_op::write && result) written_ = true;
    return result;
  }

  std::int64_t numel_;
  dtype type_;
  nvme_param_options options_;
  tensor head_;
  std::uint64_t file_bytes_;
  std::unique_ptr<aio::aligned_buffer_pool> pool_;
  bool written_ = false;
  std::mutex mu_;
};

} // namespace

param_buffers nvme_param_buffers(std::int64_t numel, dtype type, std::int64_t max_in_cpu, std::int64_t buffer_size,
                                 std::int64_t buffer_count, std::size_t alignment) {
  const auto a = static_cast<std::uint64_t>(alignment);
  const std::uint64_t file_bytes = static_cast<std::uint64_t>(numel - std::min(max_in_cpu, numel)) * dtype_size(type);
  const std::uint64_t wanted = static_cast<std::uint64_t>(buffer_size) * dtype_size(type);
  const std::uint64_t bytes = std::max<std::uint64_t>(a, (std::min(wanted, file_bytes) + a - 1) / a * a);
  const std::uint64_t chunks = std::max<std::uint64_t>(1, (file_bytes + bytes - 1) / bytes);
  return {static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(buffer_count), chunks)),
          static_cast<std::int64_t>(bytes)};
}

std::unique_ptr<param_store> memory_param_store(std::int64_t numel, dtype type) {
  return std::make_unique<memory_store>(numel, type);
}

expected<std::unique_ptr<param_store>> nvme_param_store(std::int64_t numel, dtype type, const nvme_param_options& o) {
  if (!o.engine) return make_error(errc::invalid_argument, "offload_param: no NVMe engine for {}", o.path);
  if (o.buffer_size < 1 || o.buffer_count < 1 || o.max_in_cpu < 0)
    return make_error(errc::invalid_argument, "offload_param: buffer_size {} and buffer_count {} must be >= 1, "
                      "max_in_cpu {} >= 0", o.buffer_size, o.buffer_count, o.max_in_cpu);
  const std::int64_t head = std::min(o.max_in_cpu, numel);
  const std::size_t alignment = std::max<std::size_t>(o.engine->alignment(), 4096);
  const param_buffers b = nvme_param_buffers(numel, type, o.max_in_cpu, o.buffer_size, o.buffer_count, alignment);
  aio::pool_options po;
  po.buffer_count = static_cast<std::size_t>(b.count);
  po.buffer_bytes = static_cast<std::size_t>(b.bytes);
  po.alignment = alignment;
  DSA_ASSIGN_OR_RETURN(auto pool, aio::aligned_buffer_pool::create(po));
  return std::unique_ptr<param_store>(std::make_unique<nvme_store>(numel, type, o, head, std::move(pool)));
}

} // namespace dsa::train
