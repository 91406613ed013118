// A safetensors file opened for reads on demand: the header is read and validated once,
// then a tensor, or a range of a tensor's elements, is read with one pread each. A ZeRO
// resume reads only its own partition of every saved piece this way instead of whole files.
#pragma once

#include "io/ckpt/posix_file.hpp"
#include "io/ckpt/safetensors.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace dsa::ckpt {

class safetensors_reader {
public:
  // Opens `path` and reads its header (validated as read_safetensors does). A nonzero
  // `expected_bytes` must equal the file's size (a manifest's entry; truncation shows here).
  static expected<std::shared_ptr<safetensors_reader>> open(const std::string& path, std::uint64_t expected_bytes = 0);

  const std::string& path() const { return path_; }
  const safetensors_header& header() const { return header_; }
  // The entry of `name`, or errc::not_found naming the file and the tensor.
  expected<const safetensors_entry*> entry(const std::string& name) const;
  // The whole tensor (a loadable dtype).
  expected<tensor> read(const std::string& name) const;
  // Elements [lo, hi) of the tensor in row-major order, as a 1-D tensor of its dtype.
  expected<tensor> read_range(const std::string& name, std::int64_t lo, std::int64_t hi) const;
  // Tensor data bytes read so far through this reader (not counting the header).
  std::uint64_t bytes_read() const { return bytes_read_.load(); }

private:
  safetensors_reader() = default;
  std::string path_;
  unique_fd fd_;
  safetensors_header header_;
  mutable std::atomic<std::uint64_t> bytes_read_{0};
};

} // namespace dsa::ckpt
