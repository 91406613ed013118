// Stage states to the job's rank 0; see stage_states.hpp.
#include "actors/train/run/stage_states.hpp"

#include <cstring>
#include <vector>

namespace dsa::train {

namespace {

template <class T> void put(net::bytes& out, T v) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

class head_reader {
public:
  head_reader(const net::bytes& in, int from) : in_(in), from_(from) {}
  template <class T> expected<T> get() {
    if (at_ + sizeof(T) > in_.size())
      return make_error(errc::protocol, "stage states from process {}: a head cut short at byte {}", from_, at_);
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  expected<std::string> get_string(std::uint32_t n) {
    if (at_ + n > in_.size())
      return make_error(errc::protocol, "stage states from process {}: a name cut short at byte {}", from_, at_);
    std::string s(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return s;
  }

private:
  const net::bytes& in_;
  int from_;
  std::size_t at_ = 0;
};

} // namespace

status send_named_tensors(net::transport& t, int to, const named_tensors& tensors) {
  net::bytes head;
  put(head, static_cast<std::uint32_t>(tensors.size()));
  std::vector<tensor> payloads;
  for (const auto& [name, value] : tensors) {
    if (!value.defined() || !value.dev().is_cpu())
      return make_error(errc::unsupported, "stage state '{}': only defined host tensors travel, got {}", name,
                        value.defined() ? value.describe() : std::string("an undefined tensor"));
    put(head, static_cast<std::uint32_t>(name.size()));
    const auto at = head.size();
    head.resize(at + name.size());
    std::memcpy(head.data() + at, name.data(), name.size());
    put(head, static_cast<std::uint8_t>(value.type()));
    put(head, static_cast<std::uint8_t>(value.ndim()));
    for (auto d : value.shape()) put(head, static_cast<std::int64_t>(d));
    payloads.push_back(value.is_contiguous() ? value : value.clone());
  }
  DSA_TRY(t.send(to, stage_states_tag, std::move(head)));
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
  head_reader r(head, from);
  DSA_ASSIGN_OR_RETURN(auto count, r.get<std::uint32_t>());
  named_tensors out;
  std::vector<tensor*> order;
  for (std::uint32_t i = 0; i < count; ++i) {
    DSA_ASSIGN_OR_RETURN(auto length, r.get<std::uint32_t>());
    DSA_ASSIGN_OR_RETURN(std::string name, r.get_string(length));
    DSA_ASSIGN_OR_RETURN(auto type, r.get<std::uint8_t>());
    DSA_ASSIGN_OR_RETURN(auto dims, r.get<std::uint8_t>());
    if (type > static_cast<std::uint8_t>(dtype::u8) || dims > 8)
      return make_error(errc::protocol, "stage states from process {}: '{}' of dtype {} and {} dimensions", from, name,
                        static_cast<int>(type), static_cast<int>(dims));
    shape_t shape(dims);
    for (auto& d : shape) {
      DSA_ASSIGN_OR_RETURN(d, r.get<std::int64_t>());
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

namespace {

void put_string(net::bytes& out, const std::string& s) {
  put(out, static_cast<std::uint32_t>(s.size()));
  const auto at = out.size();
  out.resize(at + s.size());
  std::memcpy(out.data() + at, s.data(), s.size());
}

} // namespace

status send_checkpoint_part(net::transport& t, int to, const stage_checkpoint_part& part) {
  net::bytes files;
  put(files, static_cast<std::uint32_t>(part.staged.size()));
  for (const auto& f : part.staged) {
    put_string(files, f.group);
    put_string(files, f.name);
    put(files, f.bytes);
    put(files, f.crc32c);
  }
  DSA_TRY(t.send(to, stage_states_tag, std::move(files)));
  return send_named_tensors(t, to, part.payload);
}

expected<stage_checkpoint_part> recv_checkpoint_part(net::transport& t, int from) {
  DSA_ASSIGN_OR_RETURN(net::bytes files, t.recv(from, stage_states_tag));
  head_reader r(files, from);
  DSA_ASSIGN_OR_RETURN(auto count, r.get<std::uint32_t>());
  stage_checkpoint_part part;
  for (std::uint32_t i = 0; i < count; ++i) {
    ckpt::checkpoint_file f;
    DSA_ASSIGN_OR_RETURN(auto group_length, r.get<std::uint32_t>());
    DSA_ASSIGN_OR_RETURN(f.group, r.get_string(group_length));
    DSA_ASSIGN_OR_RETURN(auto name_length, r.get<std::uint32_t>());
    DSA_ASSIGN_OR_RETURN(f.name, r.get_string(name_length));
    DSA_ASSIGN_OR_RETURN(f.bytes, r.get<std::uint64_t>());
    DSA_ASSIGN_OR_RETURN(f.crc32c, r.get<std::uint32_t>());
    part.staged.push_back(std::move(f));
  }
  DSA_ASSIGN_OR_RETURN(part.payload, recv_named_tensors(t, from));
  return part;
}

} // namespace dsa::train
