// Encoding and checked decoding of rendezvous frames; see rendezvous_frame.hpp.
#include "io/net/rendezvous_frame.hpp"

#include <cstring>

namespace dsa::net {
namespace {

class writer {
public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i)
      u8(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    u32(static_cast<std::uint32_t>(v));
    u32(static_cast<std::uint32_t>(v >> 32));
  }
  void raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void blob(const bytes& b) {
    u32(static_cast<std::uint32_t>(b.size()));
    raw(b.data(), b.size());
  }
  bytes take() { return std::move(out_); }

private:
  bytes out_;
};

// Reads fields in order; the first short read sets failed() and every later read yields 0s.
class reader {
public:
  explicit reader(const bytes& in) : in_(in) {}
  std::uint8_t u8() { return have(1) ? static_cast<std::uint8_t>(in_[pos_++]) : 0; }
  std::uint32_t u32() {
    if (!have(4))
      return 0;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<std::uint32_t>(in_[pos_++]) << (8 * i);
    return v;
  }
  std::uint64_t u64() {
    const std::uint64_t lo = u32();
    return lo | static_cast<std::uint64_t>(u32()) << 32;
  }
  std::string str() {
    std::uint32_t n = u32();
    if (!have(n))
      return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  bytes blob() {
    std::uint32_t n = u32();
    if (!have(n))
      return {};
    bytes b(in_.begin() + static_cast<std::ptrdiff_t>(pos_),
            in_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return b;
  }
  // A count of items that each need at least `min_item_bytes`: bounded by what is left, so
  // a forged count cannot make the decoder reserve or loop beyond the payload.
  std::uint32_t count(std::size_t min_item_bytes) {
    std::uint32_t n = u32();
    if (!failed_ && n > (in_.size() - pos_) / min_item_bytes)
      failed_ = true;
    return failed_ ? 0 : n;
  }
  // The whole payload was read, and nothing was missing.
  bool complete() const { return !failed_ && pos_ == in_.size(); }

private:
  bool have(std::size_t n) {
    if (failed_ || in_.size() - pos_ < n)
      failed_ = true;
    return !failed_;
  }
  const bytes& in_;
  std::size_t pos_ = 0;
  bool failed_ = false;
};

error malformed(const char* what) {
  return make_error(errc::protocol, "malformed rendezvous {} message", what);
}

} // namespace

bytes encode_frame(frame_type type, const bytes& payload) {
  writer w;
  w.u32(static_cast<std::uint32_t>(payload.size() + 1));
  w.u8(static_cast<std::uint8_t>(type));
  w.raw(payload.data(), payload.size());
  return w.take();
}

bytes encode_hello(const hello_msg& m) {
  writer w;
  w.u32(hello_magic);
  w.u32(hello_version);
  w.str(m.job_token);
  w.u32(static_cast<std::uint32_t>(m.rank));
  w.u32(static_cast<std::uint32_t>(m.world_size));
  w.u32(static_cast<std::uint32_t>(m.config.size()));
  for (const auto& [k, v] : m.config) {
    w.str(k);
    w.str(v);
  }
  w.blob(m.blob);
  return w.take();
}

bytes encode_blobs(const std::vector<bytes>& blobs) {
  writer w;
  w.u32(static_cast<std::uint32_t>(blobs.size()));
  for (const auto& b : blobs)
    w.blob(b);
  return w.take();
}

bytes encode_abort(const abort_msg& m) {
  writer w;
  w.u8(static_cast<std::uint8_t>(m.code));
  w.str(m.text);
  return w.take();
}

bytes encode_keyed(const keyed_blobs& m) {
  writer w;
  w.str(m.key);
  bytes rest = encode_blobs(m.blobs);
  w.raw(rest.data(), rest.size());
  return w.take();
}

bytes encode_clock(const clock_msg& m) {
  writer w;
  w.u64(m.sequence);
  w.u64(m.steady_ns);
  return w.take();
}

expected<hello_msg> decode_hello(const bytes& payload) {
  reader r(payload);
  if (r.u32() != hello_magic)
    return make_error(errc::protocol, "not a dsactor rendezvous hello (bad magic number)");
  std::uint32_t version = r.u32();
  if (version != hello_version)
    return make_error(errc::protocol, "rendezvous protocol version {}, this build speaks {}",
                      version, hello_version);
  hello_msg m;
  m.job_token = r.str();
  m.rank = static_cast<std::int32_t>(r.u32());
  m.world_size = static_cast<std::int32_t>(r.u32());
  std::uint32_t n = r.count(8);
  for (std::uint32_t i = 0; i < n; ++i) {
    std::string k = r.str();
    m.config[k] = r.str();
  }
  m.blob = r.blob();
  if (!r.complete())
    return malformed("hello");
  return m;
}

expected<std::vector<bytes>> decode_blobs(const bytes& payload) {
  reader r(payload);
  std::uint32_t n = r.count(4);
  std::vector<bytes> blobs;
  blobs.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i)
    blobs.push_back(r.blob());
  if (!r.complete())
    return malformed("welcome");
  return blobs;
}

expected<abort_msg> decode_abort(const bytes& payload) {
  reader r(payload);
  abort_msg m;
  std::uint8_t code = r.u8();
  m.text = r.str();
  if (!r.complete() || code > static_cast<std::uint8_t>(errc::protocol))
    return malformed("abort");
  m.code = static_cast<errc>(code);
  return m;
}

expected<keyed_blobs> decode_keyed(const bytes& payload) {
  reader r(payload);
  keyed_blobs m;
  m.key = r.str();
  std::uint32_t n = r.count(4);
  for (std::uint32_t i = 0; i < n; ++i)
    m.blobs.push_back(r.blob());
  if (!r.complete())
    return malformed("gather");
  return m;
}

expected<clock_msg> decode_clock(const bytes& payload) {
  reader r(payload);
  clock_msg m;
  m.sequence = r.u64();
  m.steady_ns = r.u64();
  if (!r.complete())
    return malformed("clock");
  return m;
}

void frame_buffer::append(const std::byte* data, std::size_t n) {
  if (start_ > 0 && start_ == data_.size()) { // everything consumed: reuse the buffer
    data_.clear();
    start_ = 0;
  }
  data_.insert(data_.end(), data, data + n);
}

expected<std::optional<frame>> frame_buffer::next(std::size_t limit, const std::string& peer) {
  const std::size_t avail = data_.size() - start_;
  if (avail < 4)
    return std::optional<frame>();
  std::uint32_t length = 0;
  for (int i = 0; i < 4; ++i)
    length |= static_cast<std::uint32_t>(data_[start_ + i]) << (8 * i);
  if (length == 0 || length > limit)
    return make_error(errc::protocol, "{} sent a frame of {} bytes (allowed 1..{})", peer, length,
                      limit);
  if (avail < 4 + std::size_t(length))
    return std::optional<frame>();
  auto type = static_cast<std::uint8_t>(data_[start_ + 4]);
  if (type < static_cast<std::uint8_t>(frame_type::hello) ||
      type > static_cast<std::uint8_t>(frame_type::flight_dump))
    return make_error(errc::protocol, "{} sent a frame of unknown type {}", peer, type);
  frame f;
  f.type = static_cast<frame_type>(type);
  auto first = data_.begin() + static_cast<std::ptrdiff_t>(start_ + 5);
  f.payload.assign(first, first + (length - 1));
  start_ += 4 + std::size_t(length);
  if (start_ > (std::size_t(1) << 16) && start_ * 2 > data_.size()) { // drop the consumed head
    data_.erase(data_.begin(), data_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  return std::optional<frame>(std::move(f));
}

} // namespace dsa::net
