// 1-bit LAMB's state beyond a ZeRO partition (partitioned_optimizer::lamb_state and
// load_lamb_state): saved from 4 ranks with the fresh variance gathered whole, it loads
// into 2 ranks' partitions, each rank getting exactly its own elements (tensors of several
// norm blocks spanning partition boundaries), padding zero, the per-tensor arrays intact.
#include "optim/partitioned_optimizer.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace dsa;
using optim::flat_layout;
using optim::partitioned_optimizer;

// The value the test puts at element i of tensor t's fresh variance.
float fresh_value(std::size_t t, std::int64_t i) { return static_cast<float>(t * 100000 + static_cast<std::size_t>(i) + 1); }

std::vector<partitioned_optimizer> ranks_of(const flat_layout& layout, const optim::optimizer_config& cfg) {
  std::vector<partitioned_optimizer> out;
  for (std::uint32_t r = 0; r < layout.ranks(); ++r) {
    const std::int64_t n = layout.partition_numel();
    optim::partition_state st{tensor::zeros({n}, dtype::f32), tensor::zeros({n}, dtype::f32),
                              tensor::zeros({n}, dtype::f32), cfg.freeze_step}; // frozen: the fresh variance counts
    auto opt = partitioned_optimizer::create(cfg, layout, r, st);
    REQUIRE(opt.has_value());
    out.push_back(std::move(*opt));
  }
  return out;
}

// Every rank's fresh variance holds fresh_value at its pieces and zeros elsewhere.
void check_partitions(const std::vector<partitioned_optimizer>& ranks) {
  for (const auto& opt : ranks) {
    CAPTURE(opt.rank());
    const std::vector<float>& fresh = opt.lamb_fresh();
    REQUIRE(static_cast<std::int64_t>(fresh.size()) == opt.layout().partition_numel());
    std::vector<bool> covered(fresh.size(), false);
    const std::int64_t lo = opt.partition().lo;
    for (const auto& piece : opt.pieces())
      for (std::int64_t j = 0; j < piece.count; ++j) {
        const auto at = static_cast<std::size_t>(piece.flat_offset - lo + j);
        REQUIRE(fresh[at] == fresh_value(piece.tensor, piece.tensor_offset + j));
        covered[at] = true;
      }
    for (std::size_t i = 0; i < fresh.size(); ++i)
      if (!covered[i]) REQUIRE(fresh[i] == 0.0f);
  }
}

} // namespace

TEST_CASE("1-bit LAMB's state beyond the partitions: saved from 4 ranks, loaded into 2, each rank its own elements") {
  // 5000 and 4099 elements: three norm blocks each, cut by the partition boundaries.
  const std::vector<optim::flat_tensor_spec> specs{{"big", {5000}, true}, {"bias", {7}, false}, {"w", {4099}, true}};
  auto four = flat_layout::create(specs, 4), two = flat_layout::create(specs, 2);
  REQUIRE(four.has_value());
  REQUIRE(two.has_value());
  optim::optimizer_config cfg;
  cfg.type = optim::optimizer_type::onebit_lamb;
  cfg.freeze_step = 3;
  std::map<std::string, tensor> state;
  for (const char* field : {"coeff", "factor", "scaling"}) {
    tensor t = tensor::empty({3}, dtype::f32);
    for (int i = 0; i < 3; ++i) t.data<float>()[i] = 0.5f + static_cast<float>(i) + (field[0] == 'f' ? 10.0f : 0.0f);
    state[field] = t;
  }
  for (std::size_t t = 0; t < specs.size(); ++t) {
    tensor x = tensor::empty(specs[t].shape, dtype::f32);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = fresh_value(t, i);
    state[specs[t].name + ".exp_avg_sq_fresh"] = x;
  }
  auto old_ranks = ranks_of(*four, cfg);
  for (auto& opt : old_ranks) REQUIRE(opt.load_lamb_state(state).has_value());
  check_partitions(old_ranks);
  // The checkpoint: every rank's fresh variance gathered in rank order, saved by rank 0.
  std::vector<float> whole;
  for (const auto& opt : old_ranks) whole.insert(whole.end(), opt.lamb_fresh().begin(), opt.lamb_fresh().end());
  REQUIRE(static_cast<std::int64_t>(whole.size()) == four->padded_numel());
  const auto saved = old_ranks[0].lamb_state(whole.data());
  for (const auto& [name, t] : state) {
    INFO(name);
    REQUIRE(saved.count(name) == 1);
    REQUIRE(saved.at(name).numel() == t.numel());
    CHECK(std::memcmp(saved.at(name).raw_data(), t.raw_data(), t.nbytes()) == 0);
  }
  auto new_ranks = ranks_of(*two, cfg);
  for (auto& opt : new_ranks) REQUIRE(opt.load_lamb_state(saved).has_value());
  check_partitions(new_ranks);
  // A missing tensor is named.
  auto broken = saved;
  broken.erase("w.exp_avg_sq_fresh");
  const auto refused = new_ranks[1].load_lamb_state(broken);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("'w.exp_avg_sq_fresh' missing") != std::string::npos);
}
