// The manifest.json of a checkpoint directory: format version, step, samples
// seen, the caller's free-form state (config, RNG, data cursor, loss scaler,
// scheduler, world layout ...) and the size and CRC32C of every tensor file.
#pragma once

#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dsa::ckpt {

// The manifest version this build writes and the only one it reads.
inline constexpr int checkpoint_format_version = 1;

// One tensor file of a checkpoint: group "model" is "model.safetensors".
struct checkpoint_file {
  std::string group;
  std::string name; // file name inside the checkpoint directory
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0;
};

struct checkpoint_manifest {
  int format_version = checkpoint_format_version;
  std::uint64_t step = 0;
  std::uint64_t global_samples = 0;
  nlohmann::json state = nlohmann::json::object(); // caller's payload, stored verbatim
  std::vector<checkpoint_file> files;              // sorted by group
};

// The manifest as JSON text:
// {"format":"dsactor-checkpoint","format_version":1,"step":..,"global_samples":..,
//  "checksum":"crc32c","files":[{"group":"model","name":"model.safetensors",
//  "bytes":..,"crc32c":"e3069283"}, ...],"state":{...}}
// errc::invalid_argument when the state holds a string that is not valid UTF-8.
expected<std::string> manifest_to_json(const checkpoint_manifest& manifest);

// Parses and validates manifest text; `path` names the file in errors.
// errc::format for malformed JSON or fields, errc::unsupported for another
// format_version.
expected<checkpoint_manifest> parse_manifest(const std::string& text, const std::string& path);

// Whether `group` can name a tensor group: 1 to 64 of [A-Za-z0-9_-], so that
// "<group>.safetensors" is a plain file name.
bool valid_group_name(const std::string& group);

} // namespace dsa::ckpt
