// Helpers for the swap store tests: an engine that splits chunks into several iocbs, the
// options of a small store, and patterned state arrays.
#pragma once

#include "io/aio/swap_store.hpp"
#include "tests/aio/aio_test_util.hpp"
#include "tests/optim/zero_ranks.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dsa::test {

inline std::shared_ptr<aio::aio_engine> shared_engine() {
  aio::aio_config cfg;
  cfg.block_size = 8192; // several iocbs per chunk
  cfg.queue_depth = 4;
  cfg.intra_op_parallelism = 2;
  return make_engine(cfg);
}

inline aio::swap_options options_for(const std::string& dir, std::int64_t numel, std::int64_t sub_group, bool pr, bool pw) {
  aio::swap_options o;
  o.dir = dir;
  o.name = "part";
  o.numel = numel;
  o.sub_group = sub_group;
  o.granule = 2048;
  o.buffer_count = aio::swap_buffers_needed(pr, pw);
  o.pipeline_read = pr;
  o.pipeline_write = pw;
  return o;
}

inline std::unique_ptr<aio::swap_store> make_store(std::shared_ptr<aio::aio_engine> engine, const aio::swap_options& o) {
  auto store = aio::swap_store::create(std::move(engine), o);
  REQUIRE_MESSAGE(store.has_value(), store.err().to_string());
  return std::move(*store);
}

inline std::vector<tensor> patterned_arrays(std::int64_t numel) {
  std::vector<tensor> out;
  for (std::uint32_t a = 0; a < 3; ++a) out.push_back(zero::uniform_tensor({numel}, -3.0f, 3.0f, 7 + a));
  return out;
}

} // namespace dsa::test
