// A synthetic batch source: inputs and labels of shape (rows, width) that are
// fixed functions of (step, micro_batch, row, col).
#pragma once

#include "actors/compute.hpp"

namespace dsa::actors {

class synthetic_source : public batch_source {
public:
  synthetic_source(std::int64_t rows, std::int64_t width) : rows_(rows), width_(width) {}
  void fill(std::uint32_t step, std::uint32_t micro_batch, tensor& input, tensor& labels) override;

private:
  std::int64_t rows_, width_;
};

} // namespace dsa::actors
