// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final
// xor 0xFFFFFFFF): the checksum of checkpoint files named in their manifests.
// Same function as iSCSI (RFC 3720), ext4 and Btrfs; crc32c("123456789") = 0xE3069283.
#pragma once

#include "core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsa::ckpt {

// Extends `crc` (the CRC32C of the bytes before) over `bytes` more bytes; start
// with 0. crc32c(a + b) == crc32c_extend(crc32c_extend(0, a), b).
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t bytes);

inline std::uint32_t crc32c(const void* data, std::size_t bytes) {
  return crc32c_extend(0, data, bytes);
}

// Size and CRC32C of a whole file, read in chunks. errc::not_found when the
// file does not exist; other failures are errc::io naming the path.
struct file_digest {
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0;
};
expected<file_digest> digest_file(const std::string& path);

} // namespace dsa::ckpt
