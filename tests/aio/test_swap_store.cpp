// Tests for io/aio/swap_store: the partition state in NVMe swap files gives the same
// bits as in memory (the partitioned optimizer against the whole-tensor reference with
// many small chunks and every pipelining mode), round trips, the buffers it needs, and
// the errors of a full disk, a cut file and a place where no file can be written; the
// observer and statistics the trace and the end-of-run log read.
#include "io/aio/swap_store.hpp"
#include "tests/aio/aio_test_util.hpp"
#include "tests/aio/swap_test_util.hpp"
#include "tests/optim/zero_ranks.hpp"

#include <doctest/doctest.h>

#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <filesystem>
#include <utility>
#include <vector>

namespace {

using namespace dsa;
using namespace dsa::test;
using namespace dsa::test::zero;

} // namespace

TEST_CASE("swap store: arrays written chunk by chunk read back bit for bit in every pipelining mode") {
  scratch_dir dir;
  auto engine = shared_engine();
  const std::int64_t numel = 5 * 2048; // chunks of 2 x 2048: two whole, one short
  const auto arrays = patterned_arrays(numel);
  for (bool pr : {false, true})
    for (bool pw : {false, true}) {
      CAPTURE(pr);
      CAPTURE(pw);
      auto store = make_store(engine, options_for(dir.path(), numel, 3000, pr, pw)); // rounded up to 4096
      CHECK(store->chunk_numel() == 4096);
      CHECK(store->chunks() == 3);
      CHECK(store->buffers() == aio::swap_buffers_needed(pr, pw));
      CHECK(store->resident_bytes() == static_cast<std::int64_t>(store->buffers()) * 4096 * 4);
      REQUIRE(optim::write_arrays(*store, arrays).has_value());
      REQUIRE(store->flush().has_value()); // with pipeline_write the last writes may still be in flight
      for (unsigned a = 0; a < 3; ++a)
        CHECK(std::filesystem::file_size(store->path(static_cast<optim::state_array>(a))) ==
              static_cast<std::uintmax_t>(numel) * 4);
      auto back = optim::read_arrays(*store);
      REQUIRE_MESSAGE(back.has_value(), back.err().to_string());
      for (unsigned a = 0; a < 3; ++a) CHECK(same_bits((*back)[a], arrays[a]));
      CHECK(store->bytes_written() == 3u * numel * 4);
      CHECK(store->bytes_read() == 3u * numel * 4);
      // A sweep that reads and writes one array leaves the others alone, in chunk order.
      std::vector<std::int64_t> order;
      REQUIRE(store->sweep(optim::array_bit(optim::master_array), optim::array_bit(optim::master_array),
                           [&](const optim::state_chunk& c) -> status {
                             order.push_back(c.index);
                             CHECK(c.arrays[optim::exp_avg_array] == nullptr);
                             for (std::int64_t i = 0; i < c.hi - c.lo; ++i) c.arrays[optim::master_array][i] += 1.0f;
                             return {};
                           }).has_value());
      CHECK(order == std::vector<std::int64_t>{0, 1, 2});
      auto again = optim::read_arrays(*store);
      REQUIRE(again.has_value());
      CHECK(same_bits((*again)[1], arrays[1]));
      CHECK((*again)[0].data<float>()[numel - 1] == arrays[0].data<float>()[numel - 1] + 1.0f);
      const std::string path = store->path(optim::master_array);
      store.reset();
      CHECK_FALSE(std::filesystem::exists(path)); // scratch: removed with the store
    }
}

TEST_CASE("swap store: prefetched chunks are not read again, and a file cut after the prefetch is still caught") {
  scratch_dir dir;
  auto engine = shared_engine();
  const std::int64_t numel = 5 * 2048; // chunks of 4096, 4096 and 2048 elements
  const auto arrays = patterned_arrays(numel);
  auto store = make_store(engine, options_for(dir.path(), numel, 4096, true, true)); // 3 buffer sets
  REQUIRE(optim::write_arrays(*store, arrays).has_value());
  REQUIRE(store->flush().has_value());
  store->prefetch(optim::all_arrays); // 3 free sets: every chunk
  REQUIRE(store->flush().has_value());
  CHECK(store->bytes_read() == 3u * numel * 4);
  auto back = optim::read_arrays(*store);
  REQUIRE(back.has_value());
  for (unsigned a = 0; a < 3; ++a) CHECK(same_bits((*back)[a], arrays[a]));
  CHECK(store->bytes_read() == 3u * numel * 4); // nothing read twice
  // After a prefetch of the master alone, a sweep of a moment reads it afresh.
  store->prefetch(optim::array_bit(optim::master_array));
  REQUIRE(store->flush().has_value());
  const auto before = store->bytes_read();
  REQUIRE(store->sweep(optim::array_bit(optim::exp_avg_array), 0, [&](const optim::state_chunk& c) -> status {
    CHECK(std::memcmp(c.arrays[optim::exp_avg_array], arrays[1].data<float>() + c.lo,
                      static_cast<std::size_t>(c.hi - c.lo) * 4) == 0);
    return {};
  }).has_value());
  CHECK(store->bytes_read() == before + numel * 4u);
  // Read ahead, then cut under the run: the step's first write names the file.
  store->prefetch(optim::all_arrays);
  REQUIRE(store->flush().has_value());
  REQUIRE(::truncate(store->path(optim::exp_avg_sq_array).c_str(), 4096) == 0);
  auto step = store->sweep(optim::all_arrays, optim::all_arrays, [](const optim::state_chunk&) -> status { return {}; });
  if (step) step = store->flush();
  REQUIRE_FALSE(step.has_value());
  CHECK(step.err().message.find(store->path(optim::exp_avg_sq_array)) != std::string::npos);
}

TEST_CASE("swap store: a prefetch goes on as write-behind frees buffer sets, until every set holds a chunk") {
  scratch_dir dir;
  auto engine = shared_engine();
  const std::int64_t numel = 5 * 2048; // 5 chunks of 2048, 3 buffer sets
  const auto arrays = patterned_arrays(numel);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto store = make_store(engine, options_for(dir.path(), numel, 2048, true, true));
    REQUIRE(optim::write_arrays(*store, arrays).has_value()); // the last chunk's write may still be in flight
    store->prefetch(optim::all_arrays);                         // at once: whatever sets are free, then the rest
    REQUIRE(store->flush().has_value());
    const std::uint64_t chunk_bytes = 3u * 2048u * 4u;
    CHECK(store->bytes_read() == 3 * chunk_bytes); // all three sets, whatever the timing
    // A sweep then finds chunks 0-2 and reads only 3 and 4.
    auto back = optim::read_arrays(*store);
    REQUIRE(back.has_value());
    for (unsigned a = 0; a < 3; ++a) CHECK(same_bits((*back)[a], arrays[a]));
    CHECK(store->bytes_read() == 5 * chunk_bytes);
  }
}

TEST_CASE("partitioned optimizer with its state swapped to NVMe equals the whole-tensor reference, bit for bit") {
  scratch_dir dir;
  auto engine = shared_engine();
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  const auto inputs = step_inputs(specs, 3);
  struct variant {
    optim::optimizer_type type;
    bool pr, pw;
    dtype working;
  };
  for (variant v : {variant{optim::optimizer_type::adamw, false, false, dtype::f32},
                    variant{optim::optimizer_type::adam, true, true, dtype::f16},
                    variant{optim::optimizer_type::lamb, true, false, dtype::bf16},
                    variant{optim::optimizer_type::lamb, false, true, dtype::f32}}) {
    for (std::uint32_t ranks : {1u, 3u}) {
      CAPTURE(static_cast<int>(v.type));
      CAPTURE(v.pr);
      CAPTURE(v.pw);
      CAPTURE(ranks);
      optim::optimizer_config cfg;
      cfg.type = v.type;
      cfg.lr = 1e-3;
      cfg.weight_decay = 0.01;
      auto layout = flat_layout::create(specs, ranks);
      REQUIRE(layout.has_value());
      reference ref(cfg, specs, initial, v.working);
      zero_group z(cfg, *layout, initial, v.working, [&](std::uint32_t r) -> std::unique_ptr<optim::chunked_state> {
        auto o = options_for(dir.path(), layout->partition_numel(), 2048, v.pr, v.pw); // one norm block per chunk
        o.name = fmt::format("r{}", r);
        return make_store(engine, o);
      });
      for (std::uint32_t r = 0; r < ranks; ++r) CHECK(z.ranks[r].store().where() == "nvme: " + dir.path());
      CHECK(z.ranks[0].store().chunks() > 5);
      for (const auto& in : inputs) {
        ref.step(in);
        z.step(in);
        check_same_as_reference(z, ref, v.type);
      }
    }
  }
}

TEST_CASE("swap store: the buffers a pipeline needs are asked for at creation, naming the key and the count") {
  scratch_dir dir;
  auto engine = shared_engine();
  CHECK(aio::swap_buffers_needed(false, false) == 3);
  CHECK(aio::swap_buffers_needed(true, false) == 6);
  CHECK(aio::swap_buffers_needed(true, true) == 9);
  // Every buffer asked for is used, in whole sets of 3: the sets beyond the pipeline's
  // hold chunks read ahead for the next step.
  auto roomy = options_for(dir.path(), 4096, 2048, false, false);
  roomy.buffer_count = 7;
  auto more = make_store(engine, roomy);
  CHECK(more->buffers() == 6);
  CHECK(more->resident_bytes() == 6 * 2048 * 4);
  REQUIRE(optim::write_arrays(*more, patterned_arrays(4096)).has_value());
  more->prefetch(optim::all_arrays); // both chunks fit: the next sweep reads nothing
  REQUIRE(more->flush().has_value());
  const auto read_before = more->bytes_read();
  REQUIRE(optim::read_arrays(*more).has_value());
  CHECK(more->bytes_read() == read_before);
  auto o = options_for(dir.path(), 4096, 2048, true, true);
  o.buffer_count = 4; // DeepSpeed's default
  auto store = aio::swap_store::create(engine, o);
  REQUIRE_FALSE(store.has_value());
  CHECK(store.err().code == errc::config);
  CHECK(store.err().message.find("offload_optimizer.buffer_count = 4") != std::string::npos);
  CHECK(store.err().message.find("9 buffers are needed") != std::string::npos);
}

TEST_CASE("swap store: no place to write, a full disk and a cut file are errors naming the path") {
  scratch_dir dir;
  auto engine = shared_engine();
  const auto arrays = patterned_arrays(4096);
  SUBCASE("a directory that does not exist") {
    auto store = aio::swap_store::create(engine, options_for(dir.file("missing"), 4096, 2048, false, false));
    REQUIRE_FALSE(store.has_value());
    CHECK(store.err().message.find(dir.file("missing")) != std::string::npos);
  }
  SUBCASE("a full disk: a 16 KiB tmpfs made by the test (or, where mounting is not allowed, a file size limit)") {
    const std::string small = dir.file("small");
    std::filesystem::create_directory(small);
    const bool mounted = ::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=16k") == 0;
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN); // EFBIG instead of a signal
    if (!mounted) {
      MESSAGE("cannot mount a tmpfs here (" << std::strerror(errno) << "): a file size limit stands in for the full disk");
      rlimit lim = old;
      lim.rlim_cur = 8192;
      REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
    }
    status written;
    {
      auto store = make_store(engine, options_for(small, 4096, 2048, false, true)); // 3 x 16 KiB
      written = optim::write_arrays(*store, arrays);
      if (written) written = store->flush(); // a write behind fails here
    }
    if (mounted) ::umount2(small.c_str(), MNT_DETACH);
    else REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
    std::signal(SIGXFSZ, old_handler);
    REQUIRE_FALSE(written.has_value());
    INFO(written.err().message);
    CHECK(written.err().message.find(small + "/part.") != std::string::npos);
    CHECK(written.err().message.find(std::strerror(mounted ? ENOSPC : EFBIG)) != std::string::npos);
  }
  SUBCASE("a swap file cut short under the run") {
    auto store = make_store(engine, options_for(dir.path(), 4096, 2048, true, false));
    REQUIRE(optim::write_arrays(*store, arrays).has_value());
    REQUIRE(::truncate(store->path(optim::exp_avg_array).c_str(), 4096) == 0);
    auto back = optim::read_arrays(*store);
    REQUIRE_FALSE(back.has_value());
    CHECK(back.err().message.find(store->path(optim::exp_avg_array)) != std::string::npos);
    CHECK(back.err().message.find("expected 16384") != std::string::npos);
  }
  SUBCASE("a write after the cut fails naming the file instead of filling the gap with zeros") {
    auto store = make_store(engine, options_for(dir.path(), 4096, 2048, false, false));
    REQUIRE(optim::write_arrays(*store, arrays).has_value());
    const std::string master = store->path(optim::master_array);
    REQUIRE(::truncate(master.c_str(), 4096) == 0);
    auto rewritten = optim::write_arrays(*store, arrays);
    REQUIRE_FALSE(rewritten.has_value());
    CHECK(rewritten.err().message.find("aio write '" + master + "': the file has 4096 bytes, expected 16384") !=
          std::string::npos);
    CHECK(std::filesystem::file_size(master) == 4096);
  }
  SUBCASE("reading before anything was written") {
    auto store = make_store(engine, options_for(dir.path(), 4096, 2048, false, false));
    auto back = optim::read_arrays(*store);
    REQUIRE_FALSE(back.has_value());
    CHECK(back.err().code == errc::protocol);
  }
}

TEST_CASE("swap store: the observer sees each chunk transfer and chunk update once, tagged with its sweep; the stats "
          "count them") {
  scratch_dir dir;
  auto engine = shared_engine();
  const std::int64_t numel = 5 * 2048; // chunks of 4096, 4096 and 2048 elements
  std::mutex mu;
  std::vector<aio::swap_transfer> seen, computed;
  auto o = options_for(dir.path(), numel, 4096, true, false); // 2 buffer sets
  o.observer = [&](const aio::swap_transfer& t) {
    std::lock_guard<std::mutex> lock(mu);
    (t.compute ? computed : seen).push_back(t);
  };
  auto computed_in = [&](std::uint64_t sweep) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::int64_t> chunks;
    for (const auto& t : computed) {
      CHECK(t.t0_ns <= t.t1_ns);
      CHECK(t.ok);
      if (t.sweep == sweep) chunks.push_back(t.chunk);
    }
    return chunks;
  };
  auto compute_of = [&](std::uint64_t sweep, std::int64_t chunk) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& t : computed)
      if (t.sweep == sweep && t.chunk == chunk) return t;
    FAIL("no update of chunk ", chunk, " in sweep ", sweep);
    return aio::swap_transfer{};
  };
  auto store = make_store(engine, o);
  auto taken = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(seen, {});
  };
  auto chunk_bytes = [&](std::int64_t c) { return static_cast<std::uint64_t>(c == 2 ? 2048 : 4096) * 4 * 3; };
  REQUIRE(optim::write_arrays(*store, patterned_arrays(numel)).has_value()); // sweep 1
  REQUIRE(store->flush().has_value());
  auto writes = taken();
  CHECK(computed_in(1) == std::vector<std::int64_t>{0, 1, 2});
  REQUIRE(writes.size() == 3);
  for (std::size_t i = 0; i < writes.size(); ++i) {
    CAPTURE(i);
    CHECK(writes[i].op == aio::aio_op::write);
    CHECK(writes[i].chunk == static_cast<std::int64_t>(i)); // without write-behind: in order
    CHECK(writes[i].bytes == chunk_bytes(writes[i].chunk));
    CHECK(writes[i].sweep == 1);
    CHECK_FALSE(writes[i].prefetch);
    CHECK(writes[i].ok);
    CHECK(writes[i].t0_ns <= writes[i].t1_ns);
  }
  store->prefetch(optim::all_arrays); // two free sets: chunks 0 and 1, for sweep 2
  store->wait_idle();
  auto ahead = taken();
  REQUIRE(ahead.size() == 2);
  for (const auto& t : ahead) {
    CHECK(t.op == aio::aio_op::read);
    CHECK(t.prefetch);
    CHECK(t.sweep == 2);
    CHECK(t.chunk < 2);
  }
  REQUIRE(optim::read_arrays(*store).has_value()); // sweep 2 reads only chunk 2
  REQUIRE(store->flush().has_value());
  auto rest = taken();
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].chunk == 2);
  CHECK(rest[0].sweep == 2);
  CHECK_FALSE(rest[0].prefetch);
  CHECK(computed_in(2) == std::vector<std::int64_t>{0, 1, 2});
  // Read ahead (pipeline_read): chunk 2's read was under way before chunk 1's update began.
  CHECK(rest[0].t0_ns <= compute_of(2, 1).t0_ns);
  CHECK(store->sweeps() == 2);
  const aio::swap_stats s = store->stats();
  CHECK(s.chunk_writes == 3);
  CHECK(s.chunk_reads == 3);
  CHECK(s.chunks_prefetched == 2);
  CHECK(s.bytes_written == 3u * numel * 4);
  CHECK(s.bytes_read == 3u * numel * 4);
  CHECK(s.busy_ns > 0);
}

// A speculative update's sweeps write the second files: the state reads back as before
// until commit_shadow makes them the state; discard_shadow forgets them; an updating sweep
// may not read what the speculation wrote; the second files go with the store.
TEST_CASE("swap store: speculative sweeps write aside, committed or discarded") {
  scratch_dir dir;
  auto engine = shared_engine();
  const std::int64_t numel = 5 * 2048;
  const auto arrays = patterned_arrays(numel);
  auto store = make_store(engine, options_for(dir.path(), numel, 2048, true, true));
  REQUIRE(optim::write_arrays(*store, arrays).has_value());
  const unsigned m = optim::array_bit(optim::master_array);
  auto add = [&](float x) {
    return store->sweep(m, m, [x](const optim::state_chunk& c) -> status {
      for (std::int64_t i = 0; i < c.hi - c.lo; ++i) c.arrays[optim::master_array][i] += x;
      return {};
    });
  };
  auto master_at_end = [&] {
    auto back = optim::read_arrays(*store);
    REQUIRE(back.has_value());
    return (*back)[0].data<float>()[numel - 1];
  };
  const float first = arrays[0].data<float>()[numel - 1];
  for (bool pipelined_prefetch : {false, true}) {
    CAPTURE(pipelined_prefetch);
    const float before = master_at_end();
    if (pipelined_prefetch) store->prefetch(optim::all_arrays); // waits for the outcome once a speculation is open
    REQUIRE(store->begin_shadow().has_value());
    REQUIRE(add(1.0f).has_value());
    CHECK(master_at_end() == before); // a checkpoint during the speculation reads the state before it
    // Reading back what this speculation wrote, to update it again, is refused.
    auto twice = add(1.0f);
    REQUIRE_FALSE(twice.has_value());
    CHECK(twice.err().message.find("speculative sweep reads arrays it wrote") != std::string::npos);
    REQUIRE(store->discard_shadow().has_value());
    CHECK(master_at_end() == before); // discarded
    REQUIRE(store->begin_shadow().has_value());
    REQUIRE(add(2.0f).has_value());
    REQUIRE(store->commit_shadow().has_value());
    CHECK(master_at_end() == before + 2.0f); // committed: the second files are the state
    auto back = optim::read_arrays(*store);
    REQUIRE(back.has_value());
    CHECK(same_bits((*back)[1], arrays[1])); // the arrays the speculation did not write stay
  }
  CHECK(master_at_end() == first + 4.0f);
  CHECK_FALSE(store->commit_shadow().has_value()); // none open
  store.reset();
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    CHECK_MESSAGE(!e.is_regular_file(), "left behind: " << e.path().string());
}
