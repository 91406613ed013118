// Parsing and validation of safetensors headers: every claim the header makes
// (dtypes, shapes, offsets, coverage of the data section) is checked before
// any data is trusted.
#include "io/ckpt/safetensors_format.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

namespace dsa::ckpt {
namespace {

using json = nlohmann::json;

struct tag_info {
  const char* tag;
  std::size_t size;
  std::optional<dtype> type;
};

// Every dtype of the safetensors spec with a whole-byte element size.
constexpr tag_info tag_table[] = {
    {"F32", 4, dtype::f32}, {"F16", 2, dtype::f16}, {"BF16", 2, dtype::bf16},
    {"I32", 4, dtype::i32}, {"I64", 8, dtype::i64}, {"U8", 1, dtype::u8},
    {"BOOL", 1, {}},        {"I8", 1, {}},          {"F8_E5M2", 1, {}},
    {"F8_E4M3", 1, {}},     {"I16", 2, {}},         {"U16", 2, {}},
    {"U32", 4, {}},         {"F64", 8, {}},         {"U64", 8, {}},
};

const tag_info* find_tag(std::string_view tag) {
  for (const auto& t : tag_table)
    if (tag == t.tag)
      return &t;
  return nullptr;
}

template <class... Args>
error header_error(const std::string& path, fmt::format_string<Args...> format, Args&&... args) {
  return make_error(errc::format, "safetensors file '{}': {}", path,
                    fmt::format(format, std::forward<Args>(args)...));
}

template <class... Args>
error tensor_error(const std::string& path, const std::string& name,
                   fmt::format_string<Args...> format, Args&&... args) {
  return make_error(errc::format, "safetensors file '{}': tensor '{}': {}", path, name,
                    fmt::format(format, std::forward<Args>(args)...));
}

// a * b, or nothing on overflow.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a)
    return std::nullopt;
  return a * b;
}

expected<const json*> field(const std::string& path, const std::string& name, const json& entry,
                            const char* key, json::value_t kind, const char* kind_name) {
  auto it = entry.find(key);
  if (it == entry.end())
    return tensor_error(path, name, "missing field '{}'", key);
  if (it->type() != kind)
    return tensor_error(path, name, "field '{}' is {}, expected {}", key, it->type_name(),
                        kind_name);
  return &*it;
}

expected<shape_t> parse_shape(const std::string& path, const std::string& name, const json& shape) {
  shape_t out;
  for (const auto& d : shape) {
    if (d.is_number_integer() && !d.is_number_unsigned())
      return tensor_error(path, name, "shape {} has a negative dimension", shape.dump());
    if (!d.is_number_unsigned() || d.get<std::uint64_t>() > std::uint64_t{1} << 62)
      return tensor_error(path, name, "shape {} is not a list of non-negative integers",
                          shape.dump());
    out.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
  }
  return out;
}

expected<safetensors_entry> parse_entry(const std::string& path, const std::string& name,
                                        const json& entry, std::uint64_t data_bytes) {
  if (!entry.is_object())
    return tensor_error(path, name, "entry is {}, expected an object", entry.type_name());
  DSA_ASSIGN_OR_RETURN(const json* tag,
                       field(path, name, entry, "dtype", json::value_t::string, "a string"));
  DSA_ASSIGN_OR_RETURN(const json* shape,
                       field(path, name, entry, "shape", json::value_t::array, "an array"));
  DSA_ASSIGN_OR_RETURN(const json* offsets,
                       field(path, name, entry, "data_offsets", json::value_t::array, "an array"));

  safetensors_entry out;
  out.dtype_tag = tag->get<std::string>();
  const tag_info* info = find_tag(out.dtype_tag);
  if (info == nullptr)
    return tensor_error(path, name, "unknown dtype '{}' (dsactor loads {})", out.dtype_tag,
                        detail::supported_tags());
  out.type = info->type;
  DSA_ASSIGN_OR_RETURN(out.shape, parse_shape(path, name, *shape));

  if (offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    return tensor_error(path, name, "data_offsets {} is not a pair of non-negative integers",
                        offsets->dump());
  out.begin = (*offsets)[0].get<std::uint64_t>();
  out.end = (*offsets)[1].get<std::uint64_t>();
  if (out.end < out.begin)
    return tensor_error(path, name, "data_offsets [{}, {}] end before they begin", out.begin,
                        out.end);

  std::optional<std::uint64_t> bytes = info->size;
  for (auto d : out.shape)
    if (bytes)
      bytes = checked_mul(*bytes, static_cast<std::uint64_t>(d));
  if (!bytes)
    return tensor_error(path, name, "shape {} overflows 64-bit byte counts",
                        shape_string(out.shape));
  if (out.end - out.begin != *bytes)
    return tensor_error(path, name, "data_offsets [{}, {}] hold {} bytes, but {} {} needs {}",
                        out.begin, out.end, out.end - out.begin, out.dtype_tag,
                        shape_string(out.shape), *bytes);
  if (out.end > data_bytes)
    return tensor_error(path, name, "data_offsets [{}, {}] run past the data section of {} bytes",
                        out.begin, out.end, data_bytes);
  return out;
}

expected<metadata_map> parse_metadata(const std::string& path, const json& meta) {
  if (!meta.is_object())
    return header_error(path, "__metadata__ is {}, expected an object", meta.type_name());
  metadata_map out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string())
      return header_error(path, "__metadata__ value of '{}' is {}, expected a string", key,
                          value.type_name());
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// The spec requires the tensors to tile the data section exactly: no overlap,
// no hole, nothing left over.
status check_coverage(const std::string& path, const safetensors_header& header) {
  std::vector<std::tuple<std::uint64_t, std::uint64_t, const std::string*>> spans;
  for (const auto& [name, e] : header.tensors)
    spans.emplace_back(e.begin, e.end, &name);
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), *std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), *std::get<2>(b));
  });
  std::uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (const auto& [begin, end, name] : spans) {
    if (begin < cursor)
      return tensor_error(path, *name,
                          "data_offsets [{}, {}] overlap tensor '{}', which ends at {}", begin, end,
                          *previous, cursor);
    if (begin > cursor)
      return tensor_error(
          path, *name,
          "hole in the data section: bytes [{}, {}) before this tensor belong to no tensor", cursor,
          begin);
    cursor = end;
    previous = name;
  }
  if (cursor != header.data_bytes)
    return header_error(path,
                        "data section has {} bytes but the tensors cover only {} (trailing bytes)",
                        header.data_bytes, cursor);
  return {};
}

// Parses the JSON, rejecting duplicate tensor names (nlohmann would keep the last silently).
expected<json> parse_json(const std::string& path, const std::string& text) {
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  // nlohmann stops at a NUL byte as if the input ended there; the spec pads with spaces only.
  if (std::size_t nul = text.find('\0'); nul != std::string::npos)
    return header_error(path, "header is not valid JSON: NUL byte at header offset {}", nul);
  if (text.empty() || text[0] != '{')
    return header_error(path, "header must begin with '{{'");
  json root;
  try {
    root = json::parse(text, on_event);
  } catch (const json::exception& e) {
    return header_error(path, "header is not valid JSON: {}", e.what());
  }
  if (!duplicate.empty())
    return header_error(path, "header names '{}' twice", duplicate);
  if (!root.is_object())
    return header_error(path, "header is {}, expected a JSON object", root.type_name());
  return root;
}

} // namespace

namespace detail {

const char* safetensors_tag(dtype type) {
  for (const auto& t : tag_table)
    if (t.type == type)
      return t.tag;
  return "?";
}

std::string supported_tags() {
  std::string out;
  for (const auto& t : tag_table)
    if (t.type)
      out += out.empty() ? t.tag : fmt::format(", {}", t.tag);
  return out;
}

expected<safetensors_header> read_header(const unique_fd& fd, const std::string& path,
                                         std::uint64_t file_bytes) {
  if (file_bytes < 8)
    return header_error(path, "file has {} bytes, shorter than the 8-byte header length",
                        file_bytes);
  unsigned char prefix[8];
  DSA_TRY(pread_exact(fd, path, prefix, sizeof prefix, 0));
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i)
    header_bytes = (header_bytes << 8) | prefix[i];
  if (header_bytes > file_bytes - 8)
    return header_error(path,
                        "header length {} is larger than the {} bytes after the length prefix",
                        header_bytes, file_bytes - 8);

  std::string text(static_cast<std::size_t>(header_bytes), '\0');
  DSA_TRY(pread_exact(fd, path, text.data(), text.size(), 8));
  DSA_ASSIGN_OR_RETURN(json root, parse_json(path, text));

  safetensors_header header;
  header.data_offset = 8 + header_bytes;
  header.data_bytes = file_bytes - header.data_offset;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      DSA_ASSIGN_OR_RETURN(header.metadata, parse_metadata(path, entry));
      continue;
    }
    DSA_ASSIGN_OR_RETURN(safetensors_entry parsed,
                         parse_entry(path, name, entry, header.data_bytes));
    header.tensors.emplace(name, std::move(parsed));
  }
  DSA_TRY(check_coverage(path, header));
  return header;
}

} // namespace detail

expected<safetensors_header> read_safetensors_header(const std::string& path) {
  DSA_ASSIGN_OR_RETURN(unique_fd fd, open_for_read(path));
  DSA_ASSIGN_OR_RETURN(std::uint64_t size, file_size(fd, path));
  return detail::read_header(fd, path, size);
}

} // namespace dsa::ckpt
