// Plain values packed into a byte message and read back with bounds checks: the frames of
// the pipeline's messages between processes (actors/pipe_link.cpp) and of the stage states
// sent to rank 0 (actors/train/run/stage_states.cpp). Host byte order: both ends are the same
// program on the same architecture.
#pragma once

#include "core/error.hpp"

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace dsa {

class byte_writer {
public:
  template <class T> void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  // A u32 length, then the characters.
  void put_string(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    const auto at = out_.size();
    out_.resize(at + s.size());
    std::memcpy(out_.data() + at, s.data(), s.size());
  }
  std::vector<std::byte> take() { return std::move(out_); }

private:
  std::vector<std::byte> out_;
};

// Reads what a byte_writer wrote; a read past the end is an errc::protocol error naming
// `what` (the message, its sender) and the field.
class byte_reader {
public:
  byte_reader(const std::vector<std::byte>& in, std::string what) : in_(in), what_(std::move(what)) {}
  template <class T> expected<T> get(const char* field) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (at_ + sizeof(T) > in_.size())
      return make_error(errc::protocol, "{} of {} bytes ends before its {}", what_, in_.size(), field);
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  expected<std::string> get_string(const char* field) {
    DSA_ASSIGN_OR_RETURN(auto n, get<std::uint32_t>(field));
    if (at_ + n > in_.size())
      return make_error(errc::protocol, "{} of {} bytes ends inside its {}", what_, in_.size(), field);
    std::string s(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return s;
  }
  bool at_end() const { return at_ == in_.size(); }

private:
  const std::vector<std::byte>& in_;
  std::string what_;
  std::size_t at_ = 0;
};

} // namespace dsa
