// ZeRO-3's partition of the working weights in memory or on NVMe; see param_store.hpp.
#include "actors/train/stage/param_store.hpp"

#include "io/aio/aligned_buffer_pool.hpp"
#include "kernels/cpu/convert.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <optional>
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
  status begin_write() override {
    if (next_ >= 0) return make_error(errc::protocol, "ZeRO-3 weight partition: a write began twice");
    next_ = 0;
    return {};
  }
  status append(const tensor& values) override {
    if (next_ < 0 || next_ + values.numel() > data_.numel())
      return make_error(errc::protocol, "ZeRO-3 weight partition: {} elements appended at {} of {}", values.numel(),
                        next_, data_.numel());
    cpu::cast(at(data_.raw_data(), next_, data_.type()), data_.type(), values.raw_data(), values.type(), values.numel());
    next_ += values.numel();
    return {};
  }
  status end_write() override {
    // Nothing appended: the shard updated the partition in place (in_memory()).
    const bool whole = next_ == data_.numel() || next_ == 0;
    const std::int64_t came = next_;
    next_ = -1;
    if (!whole) return make_error(errc::protocol, "ZeRO-3 weight partition: {} of {} elements written", came, data_.numel());
    return {};
  }
  status read(std::int64_t lo, std::int64_t count, void* out) override {
    if (next_ >= 0) return make_error(errc::protocol, "ZeRO-3 weight partition: read during a write");
    std::memcpy(out, at(data_.raw_data(), lo, data_.type()), static_cast<std::size_t>(count) * dtype_size(data_.type()));
    return {};
  }
  tensor in_memory() const override { return data_; }
  std::int64_t numel() const override { return data_.numel(); }
  std::int64_t resident_bytes() const override { return static_cast<std::int64_t>(data_.nbytes()); }
  std::string where() const override { return "memory"; }

private:
  tensor data_;
  std::int64_t next_ = -1; // elements appended so far in a write; -1: no write open
};

// Elements [0, head) in memory, [head, numel) in the file, element e at byte (e - head) x size.
class nvme_store final : public param_store {
public:
  nvme_store(std::int64_t numel, dtype type, nvme_param_options o, std::int64_t head,
             std::unique_ptr<aio::aligned_buffer_pool> pool)
      : numel_(numel), type_(type), options_(std::move(o)), head_(tensor::zeros({head}, type)),
        file_bytes_(static_cast<std::uint64_t>(numel - head) * dtype_size(type)), pool_(std::move(pool)) {}
  ~nvme_store() override { ::unlink(options_.path.c_str()); } // scratch: a missing file is fine

  status begin_write() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (next_ >= 0) return make_error(errc::protocol, "{}: a write began twice", options_.path);
    next_ = 0;
    file_at_ = 0;
    write_error_ = {};
    return {};
  }

  // Elements below the head go to memory; the rest fill buffers, each written as it fills.
  status append(const tensor& values) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (next_ < 0 || next_ + values.numel() > numel_)
      return make_error(errc::protocol, "{}: {} elements appended at {} of {}", options_.path, values.numel(), next_, numel_);
    const std::int64_t head = head_.numel();
    const std::size_t size = dtype_size(type_), in_size = dtype_size(values.type());
    const auto* src = static_cast<const std::byte*>(values.raw_data());
    std::int64_t done = 0;
    if (next_ < head) {
      done = std::min(values.numel(), head - next_);
      cpu::cast(at(head_.raw_data(), next_, type_), type_, src, values.type(), done);
    }
    while (done < values.numel() && write_error_) {
      if (!filling_) {
        while (!(filling_ = pool_->try_acquire())) finish_write();
        filled_ = 0;
      }
      const auto room = static_cast<std::int64_t>((filling_->size() - filled_) / size);
      const std::int64_t n = std::min(room, values.numel() - done);
      cpu::cast(static_cast<std::byte*>(filling_->data()) + filled_, type_, src + static_cast<std::size_t>(done) * in_size,
                values.type(), n);
      filled_ += static_cast<std::uint64_t>(n) * size;
      done += n;
      if (filled_ == filling_->size()) submit_write();
    }
    next_ += values.numel();
    return write_error_;
  }

  status end_write() override {
    std::lock_guard<std::mutex> lk(mu_);
    const std::int64_t came = next_;
    next_ = -1;
    if (filling_ && filled_ > 0) submit_write();
    filling_.reset();
    while (!writes_.empty()) finish_write();
    if (!write_error_) return write_error_;
    if (came != numel_) return make_error(errc::protocol, "{}: {} of {} elements written", options_.path, came, numel_);
    written_ = true;
    return {};
  }

  status read(std::int64_t lo, std::int64_t count, void* out) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (next_ >= 0) return make_error(errc::protocol, "{}: read during a write", options_.path);
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
    return read_file(start, last, [&](std::uint64_t offset, std::uint64_t bytes, const void* buffer) {
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
  // The filled buffer to the file at file_at_ (under mu_).
  void submit_write() {
    aio::aio_request r;
    r.op = aio::aio_op::write;
    r.path = options_.path;
    r.buffer = filling_->data();
    r.buffer_bytes = filling_->size();
    r.bytes = static_cast<std::size_t>(filled_);
    r.file_offset = file_at_;
    r.file_length = file_bytes_;
    if (written_) r.expect_file_size = file_bytes_; // a file cut under the run is an error
    writes_.push_back(write_flight{std::move(*filling_),
                                   aio::submit_future(*options_.engine, std::move(r), aio::io_priority::update)});
    filling_.reset();
    file_at_ += filled_;
    filled_ = 0;
  }
  // Waits for the oldest write in flight, keeping the first error (under mu_).
  void finish_write() {
    write_flight f = std::move(writes_.front());
    writes_.pop_front();
    aio::aio_completion c = f.done.get();
    if (!c.result && write_error_) write_error_ = c.result;
  }

  using drain_fn = std::function<void(std::uint64_t offset, std::uint64_t bytes, const void* buffer)>;

  // Reads bytes [from, to) of the file in chunks of one buffer, up to the pool's buffers in
  // flight, draining each in file order.
  status read_file(std::uint64_t from, std::uint64_t to, const drain_fn& drain) {
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
      aio::aio_request r;
      r.op = aio::aio_op::read;
      r.path = options_.path;
      r.buffer = buffer->data();
      r.buffer_bytes = buffer->size();
      r.bytes = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, file_bytes_ - offset));
      r.file_offset = offset;
      r.expect_file_size = file_bytes_;
      auto future = aio::submit_future(*options_.engine, std::move(r), aio::io_priority::fetch);
      in_flight.push_back(flight{std::move(*buffer), offset, bytes, std::move(future)});
      offset += bytes;
    }
    while (!in_flight.empty()) finish_one();
    return result;
  }

  std::int64_t numel_;
  dtype type_;
  nvme_param_options options_;
  tensor head_;
  std::uint64_t file_bytes_;
  std::unique_ptr<aio::aligned_buffer_pool> pool_;
  bool written_ = false;
  // A write in progress: elements appended (-1: none open), the buffer being filled and
  // its bytes, where it goes in the file, the writes in flight, the first error.
  struct write_flight {
    aio::pool_buffer buffer;
    std::future<aio::aio_completion> done;
  };
  std::int64_t next_ = -1;
  std::optional<aio::pool_buffer> filling_;
  std::uint64_t filled_ = 0, file_at_ = 0;
  std::deque<write_flight> writes_;
  status write_error_;
  std::mutex mu_;
};

} // namespace

status param_store::write(const tensor& partition) {
  DSA_TRY(begin_write());
  status appended = append(partition.flatten());
  status ended = end_write(); // always: closes the write
  DSA_TRY(appended);
  return ended;
}

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
