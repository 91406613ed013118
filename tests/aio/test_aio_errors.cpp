// The engine's failures: wrong file sizes, missing and unwritable places, a file size limit
// (EFBIG after a short write), malformed requests; each error names the file.
#include "tests/aio/aio_test_util.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace dsa::test {
namespace {

bool mentions(const status& s, const std::string& text) {
  return !s.has_value() && s.err().message.find(text) != std::string::npos;
}

TEST_CASE("aio: reading a file whose size is not the expected one is an error naming it") {
  scratch_dir dir;
  auto engine = make_engine({});
  const std::size_t bytes = (std::size_t{1} << 20) + 3;
  aligned_bytes buf(engine->padded_size(bytes));
  REQUIRE(run_request(*engine, aio::aio_op::write, dir.file("t"), buf, bytes).result.has_value());
  REQUIRE(::truncate(dir.file("t").c_str(), 1 << 20) == 0);
  auto r = run_request(*engine, aio::aio_op::read, dir.file("t"), buf, bytes);
  CHECK(mentions(r.result, dir.file("t")));
  CHECK(mentions(r.result, "expected " + std::to_string(bytes)));
  // Longer than expected is wrong too (a stale or foreign file).
  r = run_request(*engine, aio::aio_op::read, dir.file("t"), buf, 4096);
  CHECK(mentions(r.result, "has 1048576 bytes"));
  r = run_request(*engine, aio::aio_op::read, dir.file("missing"), buf, 4096);
  REQUIRE_FALSE(r.result.has_value());
  CHECK(r.result.err().code == errc::not_found);
  CHECK(mentions(r.result, dir.file("missing")));
}

TEST_CASE("aio: writing where no file can be created names the place") {
  scratch_dir dir;
  auto engine = make_engine({});
  aligned_bytes buf(4096);
  // A regular file used as a directory (ENOTDIR) fails for root too.
  write_raw(dir.file("plain"), "x");
  auto w = run_request(*engine, aio::aio_op::write, dir.file("plain") + "/f", buf, 10);
  CHECK(mentions(w.result, dir.file("plain") + "/f"));
  CHECK(mentions(w.result, "Not a directory"));
  REQUIRE(::mkdir(dir.file("ro").c_str(), 0500) == 0);
  w = run_request(*engine, aio::aio_op::write, dir.file("ro") + "/f", buf, 10);
  if (::geteuid() == 0) {
    MESSAGE("running as root: a 0500 directory is writable, only ENOTDIR is checked");
    CHECK(w.result.has_value());
  } else {
    CHECK(mentions(w.result, dir.file("ro")));
    CHECK(mentions(w.result, "Permission denied"));
  }
}

// RLIMIT_FSIZE makes the kernel complete the write up to the limit (a short completion the
// engine resubmits), then fail the rest with EFBIG: the same path as a full device (ENOSPC).
TEST_CASE("aio: a file size limit gives a short write, then an error naming the file") {
  scratch_dir dir;
  aio::aio_config c;
  c.block_size = 1 << 20;
  auto engine = make_engine(c);
  const std::size_t bytes = 3 << 20;
  aligned_bytes buf(bytes);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN); // EFBIG instead of a signal
  rlimit lim = old;
  lim.rlim_cur = (1 << 20) + (256 << 10);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  auto w = run_request(*engine, aio::aio_op::write, dir.file("big"), buf, bytes);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, old_handler);
  CHECK(mentions(w.result, dir.file("big")));
  CHECK(mentions(w.result, std::strerror(EFBIG)));
  CHECK(mentions(w.result, "aio write"));
}

TEST_CASE("aio: malformed requests are refused at submit and get no completion") {
  scratch_dir dir;
  auto engine = make_engine({});
  aligned_bytes buf(3 * 4096);
  int calls = 0;
  auto count = [&calls](aio::aio_completion&&) { ++calls; };
  aio::aio_request req;
  req.op = aio::aio_op::write;
  req.path = dir.file("m");
  req.buffer = buf.data.get() + 512;
  req.buffer_bytes = 2 * 4096;
  req.bytes = 100;
  auto id = engine->submit(req, count);
  REQUIRE_FALSE(id.has_value());
  CHECK(id.err().code == errc::invalid_argument);
  CHECK(id.err().message.find("not aligned") != std::string::npos);
  req.buffer = buf.data.get();
  req.bytes = 2 * 4096 + 1; // pads to 3 blocks, the buffer holds 2
  id = engine->submit(req, count);
  REQUIRE_FALSE(id.has_value());
  CHECK(id.err().message.find("smaller than") != std::string::npos);
  req.bytes = 100;
  req.file_offset = 100;
  id = engine->submit(req, count);
  REQUIRE_FALSE(id.has_value());
  CHECK(id.err().message.find(dir.file("m")) != std::string::npos);
  auto f = engine->submit(req).get();
  CHECK(f.id == 0);
  CHECK(mentions(f.result, "file offset 100"));
  engine.reset();
  CHECK(calls == 0);
}

} // namespace
} // namespace dsa::test
