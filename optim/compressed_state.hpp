// What a checkpoint keeps of a compressed optimizer (1-bit Adam, 0/1 Adam, 1-bit LAMB) on
// one rank: the step count, the moments and the optimizer's own extra arrays by name. The
// exchange's error buffers are not part of it (the caller keeps them), and neither are 0/1
// Adam's momentum accumulator and parameter anchor: as in DeepSpeed, a load restarts those
// from a synchronised point (every rank loads the same parameters).
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsa::optim {

struct compressed_state {
  std::int64_t step = 0;
  std::vector<float> exp_avg, exp_avg_sq;
  std::map<std::string, std::vector<float>> extra;
};

// A state of the step count and moments (copies), no extra arrays.
inline compressed_state moments_state(std::int64_t step, const std::vector<float>& m, const std::vector<float>& v) {
  compressed_state s;
  s.step = step;
  s.exp_avg = m;
  s.exp_avg_sq = v;
  return s;
}

// The moments must hold `numel` values each and the step count be >= 0.
inline status check_moments(const compressed_state& s, std::int64_t numel, const char* who) {
  const auto n = static_cast<std::size_t>(numel);
  if (s.exp_avg.size() != n || s.exp_avg_sq.size() != n || s.step < 0)
    return make_error(errc::invalid_argument, "{} state: {} and {} moment values and step {} for {} parameters", who,
                      s.exp_avg.size(), s.exp_avg_sq.size(), s.step, numel);
  return {};
}

} // namespace dsa::optim
