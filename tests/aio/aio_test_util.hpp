// Helpers for the NVMe engine tests: patterned aligned buffers, engine construction, and
// synchronous round trips through the engine's futures.
#pragma once

#include "io/aio/aio_engine.hpp"
#include "tests/io/io_test_util.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace dsa::test {

struct aligned_bytes {
  explicit aligned_bytes(std::size_t n, std::size_t align = 4096) : size(n) {
    void* p = nullptr;
    REQUIRE(::posix_memalign(&p, align, n == 0 ? align : n) == 0);
    data.reset(static_cast<unsigned char*>(p));
    std::memset(p, 0xEE, n == 0 ? align : n);
  }
  struct free_deleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, free_deleter> data;
  std::size_t size;
};

// Byte i of the pattern for `seed`: no period of 4096, so a block written at the wrong offset
// shows.
inline unsigned char pattern_byte(std::size_t i, unsigned seed) {
  return static_cast<unsigned char>((i * 131 + (i >> 12) * 7 + seed * 29 + 1) & 0xff);
}

inline void fill_pattern(unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i)
    p[i] = pattern_byte(i, seed);
}

// The first index where p differs from the pattern, or n.
inline std::size_t first_mismatch(const unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != pattern_byte(i, seed))
      return i;
  return n;
}

inline std::unique_ptr<aio::aio_engine> make_engine(const aio::aio_config& config,
                                                    aio::direct_io mode = aio::direct_io::prefer,
                                                    aio::open_fn open_call = nullptr) {
  aio::engine_options options;
  options.config = config;
  options.mode = mode;
  options.open_call = open_call;
  auto engine = aio::aio_engine::create(options);
  REQUIRE_MESSAGE(engine.has_value(), engine.err().to_string());
  return std::move(*engine);
}

inline aio::aio_completion run_request(aio::aio_engine& engine, aio::aio_op op,
                                       const std::string& path, aligned_bytes& buf,
                                       std::size_t bytes) {
  aio::aio_request req;
  req.op = op;
  req.path = path;
  req.buffer = buf.data.get();
  req.buffer_bytes = buf.size;
  req.bytes = bytes;
  return engine.submit(std::move(req)).get();
}

} // namespace dsa::test
