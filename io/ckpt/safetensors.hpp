// safetensors read and write (8-byte little-endian header length, JSON header,
// raw little-endian data). Reads validate everything the header claims; writes
// are atomic (temporary file, fsync, rename).
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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

// The same tensors, mapped read-only from the file instead of read (mmap, MAP_PRIVATE):
// their pages are the page cache's, which the kernel may drop and read again, so a large
// file does not hold anonymous memory; the mapping lives as long as any of its tensors.
// The same validation; a tensor whose data is not aligned to its element size, or a file
// that cannot be mapped, is read as read_safetensors does. The tensors must not be written.
expected<safetensors_file> map_safetensors(const std::string& path);

// Writes CPU tensors (contiguous; f32, f16, bf16, i32, i64, u8) atomically.
status write_safetensors(const std::string& path, const named_tensors& tensors,
                         const metadata_map& metadata = {});

// One tensor as the header describes it, without its data.
struct safetensors_entry {
  std::string dtype_tag;     // safetensors spelling: "F32", "BF16", "I64", "BOOL", ...
  std::optional<dtype> type; // set when dsactor can load this dtype
  shape_t shape;
  std::uint64_t begin = 0; // byte offsets into the data section, [begin, end)
  std::uint64_t end = 0;
};

struct safetensors_header {
  std::map<std::string, safetensors_entry> tensors;
  metadata_map metadata;
  std::uint64_t data_offset = 0; // file offset of the data section (8 + header length)
  std::uint64_t data_bytes = 0;  // length of the data section
};

// Reads and validates only the header (names, dtypes, shapes, offsets) of a
// safetensors file, for inspecting files such as HuggingFace checkpoints. Every
// dtype of the safetensors spec is accepted here (F64, BOOL, ...); the same
// validation as read_safetensors applies otherwise.
expected<safetensors_header> read_safetensors_header(const std::string& path);

// What a loader expects of one tensor.
struct tensor_spec {
  shape_t shape;
  dtype type;
};

// Checks that `file` holds exactly the tensors of `expected_specs` (same names,
// shapes, and dtypes), naming `path` and the first missing, extra or mis-shaped tensor.
status check_tensors(const std::string& path, const named_tensors& file,
                     const std::map<std::string, tensor_spec>& expected_specs);

// Each tensor's data when a streamed write reaches it (contiguous, CPU, the spec's dtype
// and shape), or an error that ends the write.
using tensor_source = std::function<expected<tensor>(const std::string& name, const tensor_spec& spec)>;

// Writes a file tensor by tensor, atomically like write_safetensors: the header from
// `specs`, then each tensor's data from `next`, in name order, so only the tensor being
// written needs to be in memory.
status write_safetensors_streamed(const std::string& path, const std::map<std::string, tensor_spec>& specs,
                                  const metadata_map& metadata, const tensor_source& next);

} // namespace dsa::ckpt
