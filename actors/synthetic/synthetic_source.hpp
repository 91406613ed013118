// A synthetic batch source: inputs and labels of shape (rows, width) that are
// fixed functions of (step, micro_batch + micro_batch_offset, row, col). A
// data-parallel rank r of M micro-batches per step uses offset r * M, so the
// ranks together feed what one rank of R * M micro-batches would.
#pragma once

#include "actors/compute.hpp"

namespace dsa::actors {

class synthetic_source : public batch_source {
public:
  synthetic_source(std::int64_t rows, std::int64_t width, std::uint32_t micro_batch_offset = 0)
      : rows_(rows), width_(width), offset_(micro_batch_offset) {}
  void fill(std::uint32_t step, std::uint32_t micro_batch, tensor& input, tensor& labels) override;

private:
  std::int64_t rows_, width_;
  std::uint32_t offset_;
};

} // namespace dsa::actors
