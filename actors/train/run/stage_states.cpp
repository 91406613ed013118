// Stage states to the job's rank 0; see stage_states.hpp.
#include "actors/train/run/stage_states.hpp"

#include "core/byte_codec.hpp"

#include <fmt/format.h>

#include <vector>

namespace dsa::train {


status send_named_tensors(net::transport& t, int to, const named_tensors& tensors) {
  byte_writer head;
  head.put(static_cast<std::uint32_t>(tensors.size()));
  std::vector<tensor> payloads;
  for (const auto& [name, value] : tensors) {
    if (!value.defined() || !value.dev().is_cpu())
      return make_error(errc::unsupported, "stage state '{}': only defined host tensors travel, got {}", name,
                        value.defined() ? value.describe() : std::string("an undefined tensor"));
    head.put_string(name);
    head.put(static_cast<std::uint8_t>(value.type()));
    head.put(static_cast<std::uint8_t>(value.ndim()));
    for (auto d : value.shape()) head.put(static_cast<std::int64_t>(d));
    payloads.push_back(value.is_contiguous() ? value : value.clone());
  }
  DSA_TRY(t.send(to, stage_states_tag, head.take()));
  std::vector<net::send_ticket> tickets;
  for (const auto& p : payloads) {
    DSA_ASSIGN_OR_RETURN(auto ticket, t.send_parts(to, stage_states_tag, {}, p.raw_data(), p.nbytes()));
    tickets.push_back(std::move(ticket));
  }
  for (auto& ticket : tickets) DSA_TRY(ticket.wait());
  return {};
}

expected<named_tensors> recv_named_tensors(net::transport& t, int from) {
  DSA_ASSIGN_OR_RETURN(net::bytes head, t.recv(from, stage_states_tag));
  byte_reader r(head, fmt::format("stage states from process {}", from));
  DSA_ASSIGN_OR_RETURN(auto count, r.get<std::uint32_t>("tensor count"));
  named_tensors out;
  std::vector<tensor*> order;
  for (std::uint32_t i = 0; i < count; ++i) {
    DSA_ASSIGN_OR_RETURN(std::string name, r.get_string("tensor name"));
    DSA_ASSIGN_OR_RETURN(auto type, r.get<std::uint8_t>("dtype"));
    DSA_ASSIGN_OR_RETURN(auto dims, r.get<std::uint8_t>("rank"));
    if (type > static_cast<std::uint8_t>(dtype::u8) || dims > 8)
      return make_error(errc::protocol, "stage states from process {}: '{}' of dtype {} and {} dimensions", from, name,
                        static_cast<int>(type), static_cast<int>(dims));
    shape_t shape(dims);
    for (auto& d : shape) {
      DSA_ASSIGN_OR_RETURN(d, r.get<std::int64_t>("dimension"));
      if (d < 0 || d > (std::int64_t{1} << 40))
        return make_error(errc::protocol, "stage states from process {}: '{}' has a dimension of {}", from, name, d);
    }
    auto [it, fresh] = out.emplace(name, tensor::empty(shape, static_cast<dtype>(type)));
    if (!fresh) return make_error(errc::protocol, "stage states from process {}: '{}' twice", from, name);
    order.push_back(&it->second);
  }
  for (tensor* value : order) {
    DSA_ASSIGN_OR_RETURN(auto got, t.recv_parts(from, stage_states_tag, 0, value->raw_data(), value->nbytes()));
    if (!got.placed)
      return make_error(errc::protocol, "stage states from process {}: {} bytes where {} were announced", from,
                        got.message.size(), value->nbytes());
  }
  return out;
}


status send_checkpoint_part(net::transport& t, int to, const stage_checkpoint_part& part) {
  byte_writer files;
  files.put(static_cast<std::uint32_t>(part.staged.size()));
  for (const auto& f : part.staged) {
    files.put_string(f.group);
    files.put_string(f.name);
    files.put(f.bytes);
    files.put(f.crc32c);
  }
  DSA_TRY(t.send(to, stage_states_tag, files.take()));
  return send_named_tensors(t, to, part.payload);
}

expected<stage_checkpoint_part> recv_checkpoint_part(net::transport& t, int from) {
  DSA_ASSIGN_OR_RETURN(net::bytes files, t.recv(from, stage_states_tag));
  byte_reader r(files, fmt::format("staged files from process {}", from));
  DSA_ASSIGN_OR_RETURN(auto count, r.get<std::uint32_t>("file count"));
  stage_checkpoint_part part;
  for (std::uint32_t i = 0; i < count; ++i) {
    ckpt::checkpoint_file f;
    DSA_ASSIGN_OR_RETURN(f.group, r.get_string("group"));
    DSA_ASSIGN_OR_RETURN(f.name, r.get_string("file name"));
    DSA_ASSIGN_OR_RETURN(f.bytes, r.get<std::uint64_t>("file bytes"));
    DSA_ASSIGN_OR_RETURN(f.crc32c, r.get<std::uint32_t>("file checksum"));
    part.staged.push_back(std::move(f));
  }
  DSA_ASSIGN_OR_RETURN(part.payload, recv_named_tensors(t, from));
  return part;
}

} // namespace dsa::train
