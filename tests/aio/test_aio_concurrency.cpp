// Many requests in flight at once: every completion arrives exactly once, with the id submit
// returned, and every file holds what was written.
#include "tests/aio/aio_test_util.hpp"

#include <map>
#include <mutex>
#include <vector>

namespace dsa::test {
namespace {

TEST_CASE("aio: many concurrent requests complete exactly once each") {
  scratch_dir dir;
  aio::aio_config c;
  c.block_size = 16 << 10;
  c.queue_depth = 4;
  c.intra_op_parallelism = 3;
  auto engine = make_engine(c);
  const int n = 48;
  std::vector<aligned_bytes> bufs;
  std::vector<std::size_t> lengths;
  for (int i = 0; i < n; ++i) {
    lengths.push_back(static_cast<std::size_t>(i) * 12289 + 1); // 1 .. ~580 KiB, unaligned
    bufs.emplace_back(engine->padded_size(lengths.back()));
    fill_pattern(bufs.back().data.get(), lengths.back(), static_cast<unsigned>(i));
  }
  std::mutex mutex;
  std::map<std::uint64_t, int> seen;
  std::map<std::uint64_t, std::string> errors;
  std::vector<std::uint64_t> ids;
  auto on_done = [&](aio::aio_completion&& done) {
    std::lock_guard<std::mutex> lock(mutex);
    ++seen[done.id];
    if (!done.result)
      errors[done.id] = done.result.err().to_string();
  };
  for (int i = 0; i < n; ++i) {
    aio::aio_request req;
    req.op = aio::aio_op::write;
    req.path = dir.file("c" + std::to_string(i));
    req.buffer = bufs[i].data.get();
    req.buffer_bytes = bufs[i].size;
    req.bytes = lengths[i];
    auto id = engine->submit(std::move(req), on_done);
    REQUIRE(id.has_value());
    ids.push_back(*id);
  }
  // Reads of the same files, posted while the writes may still run, go to new buffers after
  // the writes: wait for the writes by destroying the engine (it finishes accepted requests).
  engine.reset();
  CHECK(errors.empty());
  REQUIRE(seen.size() == ids.size());
  for (auto id : ids)
    CHECK(seen[id] == 1);
  engine = make_engine(c);
  std::vector<std::future<aio::aio_completion>> reads;
  std::vector<aligned_bytes> back;
  for (int i = 0; i < n; ++i)
    back.emplace_back(engine->padded_size(lengths[i]));
  for (int i = 0; i < n; ++i) {
    aio::aio_request req;
    req.path = dir.file("c" + std::to_string(i));
    req.buffer = back[i].data.get();
    req.buffer_bytes = back[i].size;
    req.bytes = lengths[i];
    reads.push_back(engine->submit(std::move(req)));
  }
  for (int i = 0; i < n; ++i) {
    auto done = reads[i].get();
    REQUIRE_MESSAGE(done.result.has_value(), done.result.err().to_string());
    CHECK(first_mismatch(back[i].data.get(), lengths[i], static_cast<unsigned>(i)) == lengths[i]);
  }
}

} // namespace
} // namespace dsa::test
