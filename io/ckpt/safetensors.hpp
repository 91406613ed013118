// safetensors read and write (8-byte little-endian header length, JSON header,
// raw little-endian data). Reads validate everything the header claims; writes
// are atomic (temporary file, fsync, rename).
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"

#include <map>
#include <string>

namespace dsa::ckpt {

// Tensors by name (sorted, as safetensors orders its header) and the optional
// string-to-string "__metadata__" map.
using named_tensors = std::map<std::string, tensor>;
using metadata_map = std::map<std::string, std::string>;

struct safetensors_file {
  named_tensors tensors;
  metadata_map metadata;
};

// Reads a whole file into CPU tensors. Errors name the file and, where one is
// at fault, the tensor: truncated file, header length past the end, bad JSON,
// unknown dtype, offsets that overlap, leave gaps, run past the data or do not
// match shape x dtype size.
expected<safetensors_file> read_safetensors(const std::string& path);

// Writes CPU tensors (contiguous; f32, f16, bf16, i32, i64, u8) atomically.
status write_safetensors(const std::string& path, const named_tensors& tensors,
                         const metadata_map& metadata = {});

// What a loader expects of one tensor.
struct tensor_spec {
  shape_t shape;
  dtype type;
};

// Checks that `file` holds exactly the tensors of `expected_specs` (same names,
// shapes, and dtypes), naming `path` and the first missing, extra or mis-shaped tensor.
status check_tensors(const std::string& path, const named_tensors& file,
                     const std::map<std::string, tensor_spec>& expected_specs);

} // namespace dsa::ckpt
