// Private to io/ckpt: the safetensors dtype tags and the header parser shared by
// the full reader and the header-only reader.
#pragma once

#include "io/ckpt/posix_file.hpp"
#include "io/ckpt/safetensors.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace dsa::ckpt::detail {

// Our dtypes as safetensors spells them.
const char* safetensors_tag(dtype type);
// "F32, F16, BF16, I32, I64, U8".
std::string supported_tags();

// Reads the length prefix and the header through `fd` and validates it against
// `file_bytes`; errors name `path` and the tensor at fault.
expected<safetensors_header> read_header(const unique_fd& fd, const std::string& path,
                                         std::uint64_t file_bytes);

} // namespace dsa::ckpt::detail
