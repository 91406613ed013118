// The transport's wire headers as a receiver checks them: the UCX transport's
// active-message header (am_header.hpp) and a collective's header (wire.hpp). The fuzz
// target tests/fuzz/fuzz_wire.cpp throws arbitrary bytes at the same two checks.
#include "io/net/am_header.hpp"
#include "io/net/wire.hpp"

#include <doctest/doctest.h>

#include <string>

namespace dsa::test {
namespace {

using namespace net::ucx_detail;

net::bytes head_of(const std::string& s) {
  net::bytes b(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) b[i] = static_cast<std::byte>(s[i]);
  return b;
}

std::string message_of(const status& s) { return s ? std::string() : s.err().message; }

TEST_CASE("an active-message header round-trips and a foreign or malformed one is refused by name") {
  net::bytes h = am_header(am_kind::data, 7, 2, 99, head_of("abcd"));
  put<std::uint64_t>(h.data(), at_seq, 5);
  auto f = parse_am_header(h.data(), h.size(), 7, 0, 4);
  REQUIRE(f.has_value());
  CHECK(f->kind == am_kind::data);
  CHECK(f->from == 2);
  CHECK(f->tag == 99);
  CHECK(f->seq == 5);
  REQUIRE(f->head_bytes == 4);
  CHECK(static_cast<char>(f->head[3]) == 'd');

  auto refused = [&](const net::bytes& bad, std::size_t bytes, std::uint64_t token, int size) {
    auto r = parse_am_header(bad.data(), bytes, token, 0, size);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().code == errc::protocol);
    return r.err().message;
  };
  CHECK(refused(h, am_fixed_bytes - 1, 7, 4).find("without dsactor's header") != std::string::npos);
  CHECK(refused(h, h.size(), 8, 4).find("job token") != std::string::npos);
  CHECK(refused(h, h.size(), 7, 2).find("rank 2 of 2") != std::string::npos); // no rank 2 in a job of 2
  CHECK(refused(h, h.size() - 1, 7, 4).find("head of 4 bytes in a 43-byte header") != std::string::npos);
  net::bytes odd = h;
  put<std::uint8_t>(odd.data(), at_kind, 9);
  CHECK(refused(odd, odd.size(), 7, 4).find("unknown kind 9") != std::string::npos);
  net::bytes negative = h;
  put<std::int32_t>(negative.data(), at_rank, -1);
  CHECK(refused(negative, negative.size(), 7, 4).find("rank -1 of 4") != std::string::npos);
}

TEST_CASE("a collective's message is checked field by field against what the receiver expects") {
  net::wire_header expect;
  expect.kind = net::op_kind::allgather;
  expect.type = dtype::bf16;
  expect.seq = 3;
  expect.count = 4;
  expect.block = 1;
  expect.payload_bytes = 8;
  const std::byte payload[8] = {};
  const net::bytes good = net::wire_encode(expect, payload, sizeof payload);
  CHECK(net::check_wire_message(0, 1, expect, good.data(), good.size(), good.size()).has_value());

  auto differs = [&](net::wire_header sent, const char* field) {
    const auto m = net::wire_encode(sent, payload, sizeof payload);
    const std::string msg = message_of(net::check_wire_message(0, 1, expect, m.data(), m.size(), m.size()));
    INFO(msg);
    CHECK(msg.find(field) != std::string::npos);
    CHECK(msg.find("rank 0 <- rank 1, call #3") != std::string::npos);
  };
  net::wire_header h = expect;
  h.kind = net::op_kind::broadcast;
  differs(h, "collective broadcast");
  h = expect;
  h.seq = 4;
  differs(h, "sequence number 4");
  h = expect;
  h.type = static_cast<dtype>(200); // an unknown dtype byte is named, not trusted
  differs(h, "dtype ?");
  h = expect;
  h.count = 5;
  differs(h, "count 5");
  h = expect;
  h.block = 2;
  differs(h, "block 2");
  // Cut short: the header announces 8 payload bytes, 3 arrived.
  const std::string cut = message_of(net::check_wire_message(0, 1, expect, good.data(), good.size(), good.size() - 5));
  CHECK(cut.find("payload bytes 3") != std::string::npos);
  // Too short for a header, or without its magic.
  CHECK(message_of(net::check_wire_message(0, 1, expect, good.data(), 10, 10)).find("without the collective header") !=
        std::string::npos);
  net::bytes no_magic = good;
  no_magic[0] = std::byte{0};
  CHECK(message_of(net::check_wire_message(0, 1, expect, no_magic.data(), no_magic.size(), no_magic.size()))
            .find("without the collective header") != std::string::npos);
}

} // namespace
} // namespace dsa::test
