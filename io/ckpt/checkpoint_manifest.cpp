// manifest.json of checkpoint directories: writing and strict parsing.
#include "io/ckpt/checkpoint_manifest.hpp"

#include <cstdlib>

namespace dsa::ckpt {
namespace {

using json = nlohmann::json;

constexpr const char* format_tag = "dsactor-checkpoint";

error bad_field(const std::string& path, const std::string& what) {
  return make_error(errc::format, "corrupt manifest '{}': {}", path, what);
}

expected<std::uint64_t> get_u64(const json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end())
    return bad_field(path, fmt::format("missing key '{}'", key));
  if (!it->is_number_unsigned())
    return bad_field(path, fmt::format("'{}' is not an unsigned integer", key));
  return it->get<std::uint64_t>();
}

expected<std::string> get_string(const json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end())
    return bad_field(path, fmt::format("missing key '{}'", key));
  if (!it->is_string())
    return bad_field(path, fmt::format("'{}' is not a string", key));
  return it->get<std::string>();
}

expected<std::uint32_t> parse_crc(const std::string& hex, const std::string& path,
                                  const std::string& file) {
  bool ok = hex.size() == 8;
  for (char c : hex)
    ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (!ok)
    return bad_field(path,
                     fmt::format("crc32c '{}' of '{}' is not 8 lowercase hex digits", hex, file));
  return static_cast<std::uint32_t>(std::strtoul(hex.c_str(), nullptr, 16));
}

expected<checkpoint_file> parse_file_entry(const json& entry, const std::string& path) {
  if (!entry.is_object())
    return bad_field(path, "an entry of 'files' is not an object");
  checkpoint_file f;
  DSA_ASSIGN_OR_RETURN(f.group, get_string(entry, "group", path));
  DSA_ASSIGN_OR_RETURN(f.name, get_string(entry, "name", path));
  DSA_ASSIGN_OR_RETURN(f.bytes, get_u64(entry, "bytes", path));
  DSA_ASSIGN_OR_RETURN(std::string hex, get_string(entry, "crc32c", path));
  DSA_ASSIGN_OR_RETURN(f.crc32c, parse_crc(hex, path, f.name));
  if (!valid_group_name(f.group) || f.name != f.group + ".safetensors")
    return bad_field(path, fmt::format("file entry '{}' of group '{}' is not '<group>.safetensors'"
                                       " with a plain group name",
                                       f.name, f.group));
  return f;
}

expected<checkpoint_manifest> parse_manifest_json(const json& doc, const std::string& path) {
  if (!doc.is_object())
    return bad_field(path, "the top level is not a JSON object");
  DSA_ASSIGN_OR_RETURN(std::string format, get_string(doc, "format", path));
  if (format != format_tag)
    return bad_field(path, fmt::format("format is '{}', expected '{}'", format, format_tag));
  DSA_ASSIGN_OR_RETURN(std::uint64_t version, get_u64(doc, "format_version", path));
  if (version != static_cast<std::uint64_t>(checkpoint_format_version))
    return make_error(errc::unsupported,
                      "manifest '{}' has unknown format_version {}; this build reads version {}",
                      path, version, checkpoint_format_version);
  checkpoint_manifest m;
  m.format_version = checkpoint_format_version;
  DSA_ASSIGN_OR_RETURN(m.step, get_u64(doc, "step", path));
  DSA_ASSIGN_OR_RETURN(m.global_samples, get_u64(doc, "global_samples", path));
  DSA_ASSIGN_OR_RETURN(std::string checksum, get_string(doc, "checksum", path));
  if (checksum != "crc32c")
    return bad_field(path, fmt::format("unknown checksum '{}', expected 'crc32c'", checksum));
  auto state = doc.find("state");
  if (state == doc.end() || !state->is_object())
    return bad_field(path, "'state' is missing or not an object");
  m.state = *state;
  auto files = doc.find("files");
  if (files == doc.end() || !files->is_array())
    return bad_field(path, "'files' is missing or not an array");
  for (const json& entry : *files) {
    DSA_ASSIGN_OR_RETURN(checkpoint_file f, parse_file_entry(entry, path));
    for (const checkpoint_file& seen : m.files)
      if (seen.group == f.group)
        return bad_field(path, fmt::format("group '{}' is listed twice", f.group));
    m.files.push_back(std::move(f));
  }
  return m;
}

} // namespace

bool valid_group_name(const std::string& group) {
  if (group.empty() || group.size() > 64)
    return false;
  for (char c : group)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return false;
  return true;
}

expected<std::string> manifest_to_json(const checkpoint_manifest& manifest) {
  json files = json::array();
  for (const checkpoint_file& f : manifest.files)
    files.push_back({{"group", f.group},
                     {"name", f.name},
                     {"bytes", f.bytes},
                     {"crc32c", fmt::format("{:08x}", f.crc32c)}});
  json doc = {{"format", format_tag},   {"format_version", manifest.format_version},
              {"step", manifest.step},  {"global_samples", manifest.global_samples},
              {"checksum", "crc32c"},   {"files", std::move(files)},
              {"state", manifest.state}};
  try {
    return doc.dump(2) + "\n";
  } catch (const json::exception& e) {
    return make_error(errc::invalid_argument, "cannot write the manifest of step {}: {}",
                      manifest.step, e.what());
  }
}

expected<checkpoint_manifest> parse_manifest(const std::string& text, const std::string& path) {
  try {
    return parse_manifest_json(json::parse(text), path);
  } catch (const json::exception& e) {
    return bad_field(path, e.what());
  }
}

} // namespace dsa::ckpt
