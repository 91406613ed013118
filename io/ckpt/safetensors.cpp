// safetensors read and write, and the check of a file's tensors against what a
// loader expects.
#include "io/ckpt/safetensors.hpp"

#include "core/file_backed.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "io/ckpt/safetensors_format.hpp"

#include <sys/mman.h>

#include <nlohmann/json.hpp>

#include <cstring>

// Tensor bytes are written and read as they lie in memory; safetensors is little-endian.
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dsactor's safetensors code assumes a little-endian host"
#endif

namespace dsa::ckpt {
namespace {

using json = nlohmann::json;

// A JSON string literal; invalid UTF-8 is an error rather than an exception.
expected<std::string> quoted(const std::string& text, const std::string& path, const char* what) {
  try {
    return json(text).dump();
  } catch (const json::exception&) {
    return make_error(errc::invalid_argument, "cannot write '{}': {} '{}' is not valid UTF-8", path,
                      what, text);
  }
}

status check_writable(const std::string& path, const std::string& name, const tensor& t) {
  if (name == "__metadata__")
    return make_error(errc::invalid_argument,
                      "cannot write '{}': '__metadata__' is reserved, not a tensor name", path);
  if (!t.defined())
    return make_error(errc::invalid_argument, "cannot write '{}': tensor '{}' is undefined", path,
                      name);
  if (!t.dev().is_cpu())
    return make_error(errc::invalid_argument,
                      "cannot write '{}': tensor '{}' is {}, not on the CPU", path, name,
                      t.describe());
  if (!t.is_contiguous())
    return make_error(errc::invalid_argument,
                      "cannot write '{}': tensor '{}' ({}) is not contiguous", path, name,
                      t.describe());
  return {};
}

// One tensor of a header: its name, dtype, shape and bytes.
struct header_entry {
  std::string name;
  dtype type;
  shape_t shape;
  std::uint64_t bytes;
};

// The JSON header: "__metadata__" first, then tensors in the given (name) order with
// their data laid out back to back in the same order; padded with spaces so that the
// data section starts at a multiple of 8 bytes.
expected<std::string> build_header(const std::string& path, const std::vector<header_entry>& tensors,
                                   const metadata_map& metadata) {
  std::string out = "{";
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      DSA_ASSIGN_OR_RETURN(std::string k, quoted(key, path, "metadata key"));
      DSA_ASSIGN_OR_RETURN(std::string v, quoted(value, path, "metadata value"));
      out += fmt::format("{}{}:{}", first ? "" : ",", k, v);
      first = false;
    }
    out += "}";
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__")
      return make_error(errc::invalid_argument,
                        "cannot write '{}': '__metadata__' is reserved, not a tensor name", path);
    DSA_ASSIGN_OR_RETURN(std::string key, quoted(t.name, path, "tensor name"));
    std::uint64_t end = offset + t.bytes;
    out += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                       out.size() > 1 ? "," : "", key, detail::safetensors_tag(t.type),
                       fmt::join(t.shape, ","), offset, end);
    offset = end;
  }
  out += "}";
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

} // namespace

namespace {

// The length prefix and the header, into a new temporary file.
expected<atomic_file> start_file(const std::string& path, const std::vector<header_entry>& entries,
                                 const metadata_map& metadata) {
  DSA_ASSIGN_OR_RETURN(std::string header, build_header(path, entries, metadata));
  unsigned char prefix[8];
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    prefix[i] = static_cast<unsigned char>(n >> (8 * i));
  DSA_ASSIGN_OR_RETURN(atomic_file file, atomic_file::create(path));
  DSA_TRY(file.write(prefix, sizeof prefix));
  DSA_TRY(file.write(header));
  return file;
}

} // namespace

status write_safetensors(const std::string& path, const named_tensors& tensors,
                         const metadata_map& metadata) {
  std::vector<header_entry> entries;
  for (const auto& [name, t] : tensors) {
    DSA_TRY(check_writable(path, name, t));
    entries.push_back({name, t.type(), t.shape(), t.nbytes()});
  }
  DSA_ASSIGN_OR_RETURN(atomic_file file, start_file(path, entries, metadata));
  for (const auto& [name, t] : tensors)
    if (t.nbytes() > 0)
      DSA_TRY(file.write(t.raw_data(), t.nbytes()));
  return file.commit();
}

status write_safetensors_streamed(const std::string& path, const std::map<std::string, tensor_spec>& specs,
                                  const metadata_map& metadata, const tensor_source& next) {
  std::vector<header_entry> entries;
  for (const auto& [name, s] : specs)
    entries.push_back({name, s.type, s.shape, static_cast<std::uint64_t>(shape_numel(s.shape)) * dtype_size(s.type)});
  DSA_ASSIGN_OR_RETURN(atomic_file file, start_file(path, entries, metadata));
  for (const auto& [name, s] : specs) {
    DSA_ASSIGN_OR_RETURN(tensor t, next(name, s));
    DSA_TRY(check_writable(path, name, t));
    if (t.type() != s.type || t.shape() != s.shape)
      return make_error(errc::invalid_argument, "cannot write '{}': tensor '{}' is {}, its header says {}{}", path, name,
                        t.describe(), dtype_name(s.type), shape_string(s.shape));
    if (t.nbytes() > 0) DSA_TRY(file.write(t.raw_data(), t.nbytes()));
  }
  return file.commit();
}

namespace {

error unloadable_dtype(const std::string& path, const std::string& name, const safetensors_entry& e) {
  return make_error(errc::unsupported,
                    "safetensors file '{}': tensor '{}' has dtype '{}', which dsactor cannot load (supported: {})",
                    path, name, e.dtype_tag, detail::supported_tags());
}

} // namespace

expected<safetensors_file> read_safetensors(const std::string& path) {
  DSA_ASSIGN_OR_RETURN(unique_fd fd, open_for_read(path));
  DSA_ASSIGN_OR_RETURN(std::uint64_t size, file_size(fd, path));
  DSA_ASSIGN_OR_RETURN(safetensors_header header, detail::read_header(fd, path, size));

  safetensors_file out;
  out.metadata = std::move(header.metadata);
  for (const auto& [name, e] : header.tensors) {
    if (!e.type) return unloadable_dtype(path, name, e);
    tensor t = tensor::empty(e.shape, *e.type);
    if (t.nbytes() > 0) {
      status st = pread_exact(fd, path, t.raw_data(), t.nbytes(), header.data_offset + e.begin);
      if (!st)
        return make_error(st.err().code, "{} (reading tensor '{}')", st.err().message, name);
    }
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

expected<safetensors_file> map_safetensors(const std::string& path) {
  DSA_ASSIGN_OR_RETURN(unique_fd fd, open_for_read(path));
  DSA_ASSIGN_OR_RETURN(std::uint64_t size, file_size(fd, path));
  DSA_ASSIGN_OR_RETURN(safetensors_header header, detail::read_header(fd, path, size));
  std::shared_ptr<storage> mapped;
  if (header.data_bytes > 0) {
    void* at = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (at != MAP_FAILED) {
      const auto bytes = static_cast<std::size_t>(size);
      register_read_only_mapping(at, bytes, path); // page_out may drop what a reader is done with
      mapped = storage::wrap(at, bytes, device::cpu(), [bytes](void* p) {
        unregister_mapping(p);
        ::munmap(p, bytes);
      });
    }
  }
  safetensors_file out;
  out.metadata = std::move(header.metadata);
  for (const auto& [name, e] : header.tensors) {
    if (!e.type) return unloadable_dtype(path, name, e);
    const std::uint64_t offset = header.data_offset + e.begin;
    if (mapped && offset % dtype_size(*e.type) == 0) {
      out.tensors.emplace(name, tensor::from_storage(mapped, static_cast<std::size_t>(offset), e.shape, *e.type));
      continue;
    }
    tensor t = tensor::empty(e.shape, *e.type); // no mapping, or misaligned: read it
    if (t.nbytes() > 0) {
      status st = pread_exact(fd, path, t.raw_data(), t.nbytes(), offset);
      if (!st) return make_error(st.err().code, "{} (reading tensor '{}')", st.err().message, name);
    }
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

status check_tensors(const std::string& path, const named_tensors& file,
                     const std::map<std::string, tensor_spec>& expected_specs) {
  auto describe = [](const tensor_spec& s) {
    return fmt::format("{}{}", dtype_name(s.type), shape_string(s.shape));
  };
  // Walk both sorted maps together so the error names the alphabetically first problem.
  auto f = file.begin();
  auto x = expected_specs.begin();
  while (f != file.end() || x != expected_specs.end()) {
    if (x == expected_specs.end() || (f != file.end() && f->first < x->first))
      return make_error(errc::format, "'{}': unexpected tensor '{}' ({})", path, f->first,
                        f->second.describe());
    if (f == file.end() || x->first < f->first)
      return make_error(errc::not_found, "'{}': missing tensor '{}' (expected {})", path, x->first,
                        describe(x->second));
    const tensor& t = f->second;
    if (!t.defined() || t.type() != x->second.type || t.shape() != x->second.shape)
      return make_error(errc::format, "'{}': tensor '{}' is {}, expected {}", path, f->first,
                        t.defined()
                            ? fmt::format("{}{}", dtype_name(t.type()), shape_string(t.shape()))
                            : "undefined",
                        describe(x->second));
    ++f;
    ++x;
  }
  return {};
}

} // namespace dsa::ckpt
