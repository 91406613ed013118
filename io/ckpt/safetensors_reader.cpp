// Reads of a safetensors file by tensor and by element range.
#include "io/ckpt/safetensors_reader.hpp"

#include "io/ckpt/safetensors_format.hpp"

namespace dsa::ckpt {

expected<std::shared_ptr<safetensors_reader>> safetensors_reader::open(const std::string& path,
                                                                       std::uint64_t expected_bytes) {
  std::shared_ptr<safetensors_reader> r(new safetensors_reader());
  r->path_ = path;
  DSA_ASSIGN_OR_RETURN(r->fd_, open_for_read(path));
  DSA_ASSIGN_OR_RETURN(std::uint64_t size, file_size(r->fd_, path));
  if (expected_bytes != 0 && size != expected_bytes)
    return make_error(errc::format, "safetensors file '{}': {} bytes, the manifest says {} (truncated or overwritten)",
                      path, size, expected_bytes);
  DSA_ASSIGN_OR_RETURN(r->header_, detail::read_header(r->fd_, path, size));
  return r;
}

expected<const safetensors_entry*> safetensors_reader::entry(const std::string& name) const {
  auto it = header_.tensors.find(name);
  if (it == header_.tensors.end())
    return make_error(errc::not_found, "safetensors file '{}': no tensor '{}'", path_, name);
  if (!it->second.type)
    return make_error(errc::unsupported, "safetensors file '{}': tensor '{}' has dtype '{}', which dsactor cannot load",
                      path_, name, it->second.dtype_tag);
  return &it->second;
}

expected<tensor> safetensors_reader::read(const std::string& name) const {
  DSA_ASSIGN_OR_RETURN(const safetensors_entry* e, entry(name));
  DSA_ASSIGN_OR_RETURN(tensor flat, read_range(name, 0, shape_numel(e->shape)));
  return flat.reshape(e->shape);
}

expected<tensor> safetensors_reader::read_range(const std::string& name, std::int64_t lo, std::int64_t hi) const {
  DSA_ASSIGN_OR_RETURN(const safetensors_entry* e, entry(name));
  const std::int64_t numel = shape_numel(e->shape);
  if (lo < 0 || lo > hi || hi > numel)
    return make_error(errc::invalid_argument, "safetensors file '{}': elements [{}, {}) of tensor '{}', which has {}",
                      path_, lo, hi, name, numel);
  tensor t = tensor::empty({hi - lo}, *e->type);
  const std::size_t width = dtype_size(*e->type);
  if (t.nbytes() > 0) {
    status st = pread_exact(fd_, path_, t.raw_data(), t.nbytes(),
                            header_.data_offset + e->begin + static_cast<std::uint64_t>(lo) * width);
    if (!st) return make_error(st.err().code, "{} (reading tensor '{}')", st.err().message, name);
    bytes_read_ += t.nbytes();
  }
  return t;
}

} // namespace dsa::ckpt
