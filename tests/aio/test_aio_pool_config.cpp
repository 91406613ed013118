// The aligned buffer pool (loans, alignment, locking) and the [aio] settings.
#include "io/aio/aio_config.hpp"
#include "io/aio/aio_file.hpp"
#include "io/aio/aligned_buffer_pool.hpp"
#include "tests/io/io_test_util.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <set>

namespace dsa::test {
namespace {

TEST_CASE("aio pool: a fixed number of aligned buffers, handed out and returned") {
  aio::pool_options o;
  o.buffer_count = 3;
  o.buffer_bytes = 5000; // rounded up to 8192
  o.alignment = 8192;
  auto pool = aio::aligned_buffer_pool::create(o);
  REQUIRE(pool.has_value());
  auto& p = **pool;
  CHECK(p.buffer_bytes() == 8192);
  std::vector<aio::pool_buffer> held;
  std::set<void*> distinct;
  for (int i = 0; i < 3; ++i) {
    auto b = p.try_acquire();
    REQUIRE(b.has_value());
    CHECK(reinterpret_cast<std::uintptr_t>(b->data()) % 8192 == 0);
    CHECK(b->size() == 8192);
    distinct.insert(b->data());
    held.push_back(std::move(*b));
  }
  CHECK(distinct.size() == 3);
  CHECK(p.available() == 0);
  CHECK_FALSE(p.try_acquire().has_value());
  held.pop_back();
  CHECK(p.available() == 1);
  auto again = p.try_acquire();
  REQUIRE(again.has_value());
  aio::pool_buffer moved = std::move(*again);
  CHECK_FALSE(again->valid());
  CHECK(p.available() == 0);
  held.clear();
  moved = aio::pool_buffer();
  CHECK(p.available() == 3);
}

TEST_CASE("aio pool: locked buffers, and bad options") {
  aio::pool_options o;
  o.buffer_count = 2;
  o.buffer_bytes = 64 << 10;
  o.pinning = aio::memory_pinning::locked;
  auto pool = aio::aligned_buffer_pool::create(o);
  // Either locked, or refused with the reason (a memlock limit below 128 KiB).
  if (!pool.has_value())
    CHECK(pool.err().message.find("mlock") != std::string::npos);
  else
    CHECK((*pool)->available() == 2);
  o.alignment = 4096 + 512;
  CHECK_FALSE(aio::aligned_buffer_pool::create(o).has_value());
  o.alignment = 4096;
  o.buffer_count = 0;
  CHECK_FALSE(aio::aligned_buffer_pool::create(o).has_value());
}

TEST_CASE("aio config: DeepSpeed's defaults, validation naming the key, the TOML section") {
  aio::aio_config c;
  CHECK(c.block_size == 1048576);
  CHECK(c.queue_depth == 8);
  CHECK(c.intra_op_parallelism == 1);
  CHECK_FALSE(c.single_submit);
  CHECK(c.overlap_events);
  CHECK(c.validate().has_value());
  c.block_size = 1000;
  REQUIRE_FALSE(c.validate().has_value());
  CHECK(c.validate().err().message.find("aio.block_size") != std::string::npos);
  c = {};
  c.queue_depth = 0;
  CHECK(c.validate().err().message.find("aio.queue_depth") != std::string::npos);
  c = {};
  c.intra_op_parallelism = 0;
  CHECK(c.validate().err().message.find("aio.intra_op_parallelism") != std::string::npos);
  c = {};
  c.single_submit = true;
  CHECK(c.to_toml() == "[aio]\nblock_size = 1048576\nqueue_depth = 8\nintra_op_parallelism = 1\n"
                       "single_submit = true\noverlap_events = true\n");
}

TEST_CASE("aio: the O_DIRECT alignment of a directory's file system") {
  scratch_dir dir;
  auto a = aio::direct_io_alignment(dir.path());
  REQUIRE(a.has_value());
  CHECK(*a >= 4096);
  CHECK((*a & (*a - 1)) == 0);
  auto missing = aio::direct_io_alignment(dir.file("nope"));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message.find(dir.file("nope")) != std::string::npos);
}

} // namespace
} // namespace dsa::test
