// The engine's round trips against plain reads of the file: every size class, every setting
// combination at small scale, ranges, and the buffered fallback.
#include "tests/aio/aio_test_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace dsa::test {
namespace {

const std::size_t sizes[] = {0, 1, 4095, 4096, (std::size_t{1} << 20) + 3, std::size_t{7} << 20};

// Writes `bytes` through the engine, checks the file with plain reads, reads it back through
// the engine and checks the buffer.
void check_round_trip(aio::aio_engine& engine, const std::string& path, std::size_t bytes,
                      unsigned seed) {
  CAPTURE(path);
  CAPTURE(bytes);
  std::size_t cap = engine.padded_size(bytes);
  aligned_bytes src(cap);
  fill_pattern(src.data.get(), bytes, seed);
  auto w = run_request(engine, aio::aio_op::write, path, src, bytes);
  REQUIRE_MESSAGE(w.result.has_value(), w.result.err().to_string());
  CHECK(w.bytes == bytes);
  std::string on_disk = read_raw(path);
  REQUIRE(on_disk.size() == bytes); // the padding was cut off, the tail kept
  CHECK(first_mismatch(reinterpret_cast<const unsigned char*>(on_disk.data()), bytes, seed) ==
        bytes);
  aligned_bytes dst(cap);
  auto r = run_request(engine, aio::aio_op::read, path, dst, bytes);
  REQUIRE_MESSAGE(r.result.has_value(), r.result.err().to_string());
  CHECK(first_mismatch(dst.data.get(), bytes, seed) == bytes);
}

TEST_CASE("aio: round trip of awkward sizes under every setting combination") {
  scratch_dir dir;
  unsigned seed = 0;
  for (std::size_t block : {std::size_t{8192}, std::size_t{64} << 10})
    for (unsigned depth : {1u, 4u})
      for (unsigned threads : {1u, 3u})
        for (bool single : {false, true})
          for (bool overlap : {false, true}) {
            aio::aio_config c;
            c.block_size = block;
            c.queue_depth = depth;
            c.intra_op_parallelism = threads;
            c.single_submit = single;
            c.overlap_events = overlap;
            CAPTURE(c.summary());
            auto engine = make_engine(c);
            for (std::size_t bytes : sizes) {
              ++seed;
              check_round_trip(*engine, dir.file("f" + std::to_string(seed % 3)), bytes, seed);
            }
          }
}

TEST_CASE("aio: a rewrite with fewer bytes leaves exactly the new length") {
  scratch_dir dir;
  auto engine = make_engine({});
  check_round_trip(*engine, dir.file("f"), std::size_t{7} << 20, 1);
  check_round_trip(*engine, dir.file("f"), 4095, 2);
}

TEST_CASE("aio: an aligned range in the middle of a larger file") {
  scratch_dir dir;
  aio::aio_config c;
  c.block_size = 8192;
  c.intra_op_parallelism = 2;
  auto engine = make_engine(c);
  const std::size_t total = 5 * 4096 + 17;
  check_round_trip(*engine, dir.file("f"), total, 9);
  aligned_bytes dst(8192);
  aio::aio_request req;
  req.op = aio::aio_op::read;
  req.path = dir.file("f");
  req.buffer = dst.data.get();
  req.buffer_bytes = dst.size;
  req.bytes = 8192;
  req.file_offset = 4096;
  req.expect_file_size = total;
  auto r = engine->submit(std::move(req)).get();
  REQUIRE_MESSAGE(r.result.has_value(), r.result.err().to_string());
  for (std::size_t i = 0; i < 8192; ++i)
    REQUIRE(dst.data.get()[i] == pattern_byte(4096 + i, 9));
}

// A file system without O_DIRECT: open(2) refuses the flag with EINVAL, as tmpfs did before
// Linux 6.6 (this kernel's tmpfs accepts it, so the refusal is simulated).
int open_without_direct(const char* path, int flags, unsigned mode) {
  if (flags & O_DIRECT) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags, mode);
}

TEST_CASE("aio: EINVAL for O_DIRECT at open falls back to buffered I/O") {
  scratch_dir dir;
  aio::aio_config c;
  c.block_size = 8192;
  c.intra_op_parallelism = 2;
  auto engine = make_engine(c, aio::direct_io::prefer, open_without_direct);
  for (std::size_t bytes : sizes)
    check_round_trip(*engine, dir.file("f"), bytes, 40 + static_cast<unsigned>(bytes % 7));
  aligned_bytes buf(4096);
  auto w = run_request(*engine, aio::aio_op::write, dir.file("g"), buf, 100);
  REQUIRE(w.result.has_value());
  CHECK_FALSE(w.direct);
}

TEST_CASE("aio: O_DIRECT is used where the file system has it; buffered mode never uses it") {
  scratch_dir dir;
  aligned_bytes buf(4096);
  auto direct = make_engine({});
  auto w = run_request(*direct, aio::aio_op::write, dir.file("d"), buf, 4096);
  REQUIRE(w.result.has_value());
  int probe = ::open(dir.file("probe").c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
  bool fs_has_direct = probe >= 0;
  if (probe >= 0)
    ::close(probe);
  CHECK(w.direct == fs_has_direct);
  auto buffered = make_engine({}, aio::direct_io::buffered);
  w = run_request(*buffered, aio::aio_op::write, dir.file("b"), buf, 4096);
  REQUIRE(w.result.has_value());
  CHECK_FALSE(w.direct);
  check_round_trip(*buffered, dir.file("b"), 4095, 77);
}

} // namespace
} // namespace dsa::test
