// kernels/cpu/philox_vec and isa: every vector path this CPU has (AVX-512, AVX2) gives the
// Philox words of core/philox.hpp's philox4x32 for every block, at awkward block counts and
// offsets (whole vectors, tails, counters wrapping at 2^32), and the run-time ISA choice
// never exceeds the CPU's.
#include "core/philox.hpp"
#include "kernels/cpu/isa.hpp"
#include "tests/support/isa_paths.hpp"
#include "kernels/cpu/philox_vec.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dsa;

TEST_CASE("philox_words: each vector path equals philox4x32 block by block") {
  const auto paths = test::isa_paths();
  MESSAGE("this CPU's best vector path: " << cpu::isa_name(paths.back()));
  const philox_stream streams[] = {{42, 7, 3, 5, 2}, {0xDEADBEEFCAFEF00Dull, 123456, 0, 11, 255}};
  struct range {
    std::uint32_t first;
    std::int64_t blocks;
  };
  const range ranges[] = {{0, 0}, {0, 1}, {5, 7}, {0, 16}, {3, 17}, {100, 64}, {1, 129}, {7, 48}, {0xFFFFFFF0u, 40}};
  for (const auto& stream : streams)
    for (const auto& r : ranges)
      for (cpu::isa path : paths) {
        CAPTURE(cpu::isa_name(path));
        CAPTURE(r.first);
        CAPTURE(r.blocks);
        std::vector<std::uint32_t> got(static_cast<std::size_t>(4 * r.blocks + 1), 0xA5A5A5A5u);
        cpu::philox_words(path, stream, r.first, r.blocks, got.data());
        for (std::int64_t b = 0; b < r.blocks; ++b) {
          const philox_counter want = philox4x32(stream.counter(r.first + static_cast<std::uint32_t>(b)), stream.key());
          for (int k = 0; k < 4; ++k) REQUIRE(got[static_cast<std::size_t>(4 * b + k)] == want[static_cast<std::size_t>(k)]);
          const auto u = stream.uniform4(r.first + static_cast<std::uint32_t>(b));
          CHECK(cpu::philox_uniform(got[static_cast<std::size_t>(4 * b)]) == u[0]);
        }
        CHECK(got.back() == 0xA5A5A5A5u); // nothing written past the blocks
      }
}

TEST_CASE("isa: the active path is at most the CPU's best and is named in the report") {
  CHECK(static_cast<int>(cpu::active_isa()) <= static_cast<int>(cpu::best_isa()));
  const std::string report = cpu::isa_report();
  CHECK(report.find(cpu::isa_name(cpu::active_isa())) != std::string::npos);
  CHECK(report.find(cpu::isa_name(cpu::best_isa())) != std::string::npos);
}
