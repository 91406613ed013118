// CRC32C against published test vectors (RFC 3720 B.4, the "123456789" check
// value) and against the bit-at-a-time definition at awkward lengths and offsets.
#include "io/ckpt/crc32c.hpp"
#include "tests/io/io_test_util.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace dsa;
using namespace dsa::ckpt;

namespace {

// The definition: reflected polynomial 0x82F63B78, one bit at a time.
std::uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k)
      c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

std::vector<unsigned char> pattern_bytes(std::size_t n) {
  std::vector<unsigned char> out(n);
  std::uint32_t x = 12345;
  for (auto& b : out) {
    x = x * 1103515245u + 12345u;
    b = static_cast<unsigned char>(x >> 23);
  }
  return out;
}

} // namespace

TEST_CASE("crc32c matches the published check value and RFC 3720 vectors") {
  const std::string check = "123456789";
  CHECK(crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(crc32c(nullptr, 0) == 0u);
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
    down[static_cast<std::size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c(up.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c(down.data(), 32) == 0x113FDB5Cu);
}

TEST_CASE("crc32c equals the bitwise definition for awkward lengths and offsets") {
  std::vector<unsigned char> data = pattern_bytes(1031);
  for (std::size_t offset : {0u, 1u, 3u, 7u})
    for (std::size_t n : {1u, 2u, 7u, 8u, 9u, 15u, 16u, 17u, 63u, 127u, 1021u}) {
      CAPTURE(offset);
      CAPTURE(n);
      CHECK(crc32c(data.data() + offset, n) == crc32c_bitwise(data.data() + offset, n));
    }
}

TEST_CASE("crc32c extends across any split point") {
  std::vector<unsigned char> data = pattern_bytes(257);
  std::uint32_t whole = crc32c(data.data(), data.size());
  for (std::size_t cut : {0u, 1u, 5u, 8u, 13u, 128u, 256u, 257u}) {
    CAPTURE(cut);
    std::uint32_t first = crc32c(data.data(), cut);
    CHECK(crc32c_extend(first, data.data() + cut, data.size() - cut) == whole);
  }
}

TEST_CASE("digest_file reports size and crc32c, and names a missing file") {
  dsa::test::scratch_dir dir;
  std::string path = dir.file("data.bin");
  dsa::test::write_raw(path, "123456789");
  auto d = digest_file(path);
  REQUIRE(d);
  CHECK(d->bytes == 9);
  CHECK(d->crc32c == 0xE3069283u);
  dsa::test::write_raw(path, "");
  d = digest_file(path);
  REQUIRE(d);
  CHECK(d->bytes == 0);
  CHECK(d->crc32c == 0u);
  auto missing = digest_file(dir.file("nope.bin"));
  REQUIRE_FALSE(missing);
  CHECK(missing.err().code == errc::not_found);
  CHECK(missing.err().message.find("nope.bin") != std::string::npos);
}
