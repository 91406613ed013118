// Tests for actors/train/param_store: ZeRO-3's weight partition in memory and on NVMe,
// written whole or window by window (as the optimizer shard writes each new version),
// read back in any range; the errors of a write out of order or cut short.
#include "actors/train/stage/param_store.hpp"
#include "kernels/cpu/convert.hpp"
#include "tests/aio/aio_test_util.hpp"
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace dsa;

// (n) f32 values with no repeating pattern, exact in f16 after the cast as much as f16 allows.
tensor values(std::int64_t n, float offset) {
  tensor t = tensor::empty({n}, dtype::f32);
  for (std::int64_t i = 0; i < n; ++i) t.data<float>()[i] = offset + static_cast<float>((i * 37) % 1000) / 64.0f;
  return t;
}

tensor cast(const tensor& t, dtype type) {
  tensor out = tensor::empty(t.shape(), type);
  cpu::cast(out.raw_data(), type, t.raw_data(), t.type(), t.numel());
  return out;
}

bool same_bytes(const void* a, const void* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

// Elements [lo, lo + count) read back equal the partition's.
void check_reads(train::param_store& store, const tensor& want) {
  const std::size_t size = dtype_size(want.type());
  for (auto [lo, count] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {0, want.numel()}, {0, 1}, {999, 2}, {1000, 3000}, {2999, 5001}, {want.numel() - 7, 7}}) {
    CAPTURE(lo);
    CAPTURE(count);
    std::vector<unsigned char> out(static_cast<std::size_t>(count) * size);
    REQUIRE(store.read(lo, count, out.data()).has_value());
    CHECK(same_bytes(out.data(), static_cast<const unsigned char*>(want.raw_data()) + static_cast<std::size_t>(lo) * size,
                     out.size()));
  }
}

struct nvme_fixture {
  test::temp_dir dir;
  std::shared_ptr<aio::aio_engine> engine = test::make_engine(aio::aio_config{});
  std::string path = dir.path() + "/stage0.params.swp";
  std::unique_ptr<train::param_store> make(std::int64_t numel, std::int64_t max_in_cpu) {
    train::nvme_param_options o{engine, path, max_in_cpu, 3000, 2};
    auto store = train::nvme_param_store(numel, dtype::f16, o);
    REQUIRE_MESSAGE(store.has_value(), store.err().message);
    return std::move(*store);
  }
};

} // namespace

TEST_CASE("param store on NVMe: a version appended in odd windows reads back as the whole write") {
  nvme_fixture f;
  const std::int64_t n = 10'007;
  for (std::int64_t head : {std::int64_t{0}, std::int64_t{1000}, n}) {
    CAPTURE(head);
    auto store = f.make(n, head);
    const tensor first = values(n, 0.0f), second = values(n, 3.0f);
    REQUIRE(store->write(first).has_value());
    check_reads(*store, cast(first, dtype::f16));
    // The next version in windows that straddle the head and the 3000-element buffers.
    REQUIRE(store->begin_write().has_value());
    std::int64_t at = 0;
    for (std::int64_t w : {999, 1, 2500, 4000, 1}) {
      REQUIRE(store->append(second.slice_rows(at, at + w)).has_value());
      at += w;
    }
    REQUIRE(store->append(second.slice_rows(at, n)).has_value());
    REQUIRE(store->end_write().has_value());
    check_reads(*store, cast(second, dtype::f16));
  }
}

TEST_CASE("param store: a write out of order or cut short is an error, and the store stays usable") {
  nvme_fixture f;
  const std::int64_t n = 10'007;
  auto nvme = f.make(n, 1000);
  auto memory = train::memory_param_store(n, dtype::f16);
  for (train::param_store* store : {nvme.get(), memory.get()}) {
    CAPTURE(store->where());
    const tensor v = values(n, 1.0f);
    CHECK_FALSE(store->append(v.slice_rows(0, 10)).has_value()); // no write begun
    REQUIRE(store->begin_write().has_value());
    CHECK_FALSE(store->begin_write().has_value());
    REQUIRE(store->append(v.slice_rows(0, 5000)).has_value());
    CHECK_FALSE(store->append(v).has_value()); // beyond the partition
    auto short_end = store->end_write();
    REQUIRE_FALSE(short_end.has_value());
    CHECK(short_end.err().message.find("5000 of 10007") != std::string::npos);
    // A whole write afterwards works.
    REQUIRE(store->write(v).has_value());
    check_reads(*store, cast(v, dtype::f16));
  }
  // No read may come between the windows of a write (a gather would see a torn version).
  for (train::param_store* store : {nvme.get(), memory.get()}) {
    CAPTURE(store->where());
    REQUIRE(store->begin_write().has_value());
    std::vector<unsigned char> out(16);
    auto during = store->read(0, 8, out.data());
    REQUIRE_FALSE(during.has_value());
    CHECK(during.err().message.find("during a write") != std::string::npos);
    (void)store->end_write(); // nothing appended: refused on NVMe, an in-place version in memory
  }
}

TEST_CASE("param store in memory: the partition updated in place is the version, appending nothing") {
  auto store = train::memory_param_store(10'007, dtype::f32);
  const tensor v = values(10'007, 2.0f);
  tensor in_place = store->in_memory();
  REQUIRE(in_place.defined());
  REQUIRE(store->begin_write().has_value());
  in_place.copy_from(v);
  REQUIRE(store->end_write().has_value());
  check_reads(*store, v);
}

TEST_CASE("param store on NVMe: a swap file cut under the run fails the next write, naming it") {
  nvme_fixture f;
  const std::int64_t n = 10'007;
  auto store = f.make(n, 0);
  REQUIRE(store->write(values(n, 0.0f)).has_value());
  REQUIRE(::truncate(f.path.c_str(), 4096) == 0);
  auto cut = store->write(values(n, 1.0f));
  REQUIRE_FALSE(cut.has_value());
  CHECK(cut.err().message.find(f.path) != std::string::npos);
}
