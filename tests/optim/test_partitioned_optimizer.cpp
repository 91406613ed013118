// Tests for optim/partitioned_optimizer: R simulated ranks (threads; the LAMB norm
// exchange meets at a barrier) against optim::optimizer on whole tensors, bit for bit,
// for Adam (L2), AdamW and LAMB, R = 1..4, f32/f16/bf16 working weights; padding never
// read and never changed; the memory each rank holds; errors.
#include "tests/optim/zero_ranks.hpp"

#include "core/memory_stats.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

namespace {

using namespace dsa;
using namespace dsa::test::zero;
using optim::optimizer_config;
using optim::optimizer_type;

optimizer_config config_of(optimizer_type type) {
  optimizer_config cfg;
  cfg.type = type;
  cfg.lr = 1e-3;
  cfg.weight_decay = 0.01;
  cfg.adam_w_mode = false; // type adam: L2 decay; adamw is always decoupled
  return cfg;
}

const char* type_name(optimizer_type t) {
  return t == optimizer_type::adam ? "adam(L2)" : t == optimizer_type::adamw ? "adamw" : "lamb";
}

} // namespace

TEST_CASE("partitioned optimizer on R ranks equals optim::optimizer on whole tensors, bit for bit") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  const auto inputs = step_inputs(specs, 4);
  struct variant {
    optimizer_type type;
    std::int64_t alignment;
  };
  for (variant var : {variant{optimizer_type::adam, 1}, variant{optimizer_type::adamw, 1},
                      variant{optimizer_type::adamw, 2048}, variant{optimizer_type::lamb, 2048},
                      variant{optimizer_type::lamb, 6144}}) {
    for (std::uint32_t ranks : {1u, 2u, 3u, 4u}) {
      for (dtype working_type : {dtype::f32, dtype::f16, dtype::bf16}) {
        CAPTURE(type_name(var.type));
        CAPTURE(var.alignment);
        CAPTURE(ranks);
        CAPTURE(dtype_name(working_type));
        const optimizer_config cfg = config_of(var.type);
        auto layout = flat_layout::create(specs, ranks, var.alignment);
        REQUIRE(layout.has_value());
        reference ref(cfg, specs, initial, working_type);
        zero_group z(cfg, *layout, initial, working_type);
        for (const auto& in : inputs) {
          ref.step(in);
          z.step(in);
          check_same_as_reference(z, ref, var.type);
        }
        for (std::uint32_t r = 0; r < ranks; ++r) {
          CHECK(z.ranks[r].step_count() == 4);
          // A skipped step's working weights (converted from the masters) are the step's.
          tensor again = tensor::empty({z.layout.partition_numel()}, working_type);
          REQUIRE(z.ranks[r].write_working(again).has_value());
          CHECK(same_bits(again, z.working[r]));
          // LAMB exchanges norms exactly when a tensor spans ranks, once per step.
          const bool spans = ranks > 1 && var.type == optimizer_type::lamb;
          CHECK((z.ranks[r].exchange_size() > 0) == spans);
          CHECK(z.exchange.calls(r) == (spans ? 4 : 0));
        }
      }
    }
  }
}

TEST_CASE("the awkward layouts split the large tensor over three ranks, at odd offsets with alignment 1") {
  const auto specs = awkward_specs();
  auto a1 = flat_layout::create(specs, 3, 1);
  auto a2048 = flat_layout::create(specs, 4, 2048);
  REQUIRE(a1.has_value());
  REQUIRE(a2048.has_value());
  const std::size_t pooler = *a1->find("bert.pooler.dense.weight");
  CHECK(a1->first_owner(pooler) == 0);
  CHECK(a1->last_owner(pooler) == 2);
  CHECK(a2048->first_owner(pooler) == 0);
  CHECK(a2048->last_owner(pooler) == 2);
  // With alignment 1 the boundaries fall at odd offsets inside the tensor.
  auto pieces = a1->pieces(a1->partition(1));
  REQUIRE(pieces.size() == 1);
  CHECK(pieces[0].tensor == pooler);
  CHECK(pieces[0].tensor_offset % 2 == 1);
}

TEST_CASE("partitioned optimizer: tensors of one and three elements over four ranks, two ranks holding only padding") {
  std::vector<optim::flat_tensor_spec> specs{optim::bert_flat_tensor("bert.embeddings.LayerNorm.weight", {1}),
                                             optim::bert_flat_tensor("bert.pooler.dense.bias", {3})};
  const auto initial = initial_params(specs);
  const auto inputs = step_inputs(specs, 3);
  for (optimizer_type type : {optimizer_type::adamw, optimizer_type::lamb}) {
    CAPTURE(type_name(type));
    auto layout = flat_layout::create(specs, 4, type == optimizer_type::lamb ? 2048 : 4);
    REQUIRE(layout.has_value());
    reference ref(config_of(type), specs, initial, dtype::bf16);
    zero_group z(config_of(type), *layout, initial, dtype::bf16);
    CHECK(z.ranks[2].pieces().empty());
    CHECK(z.ranks[3].pieces().empty());
    for (const auto& in : inputs) {
      ref.step(in);
      z.step(in);
      check_same_as_reference(z, ref, type);
    }
  }
}

TEST_CASE("partitioned optimizer holds 12 bytes per partition element, and allocates nothing else as tensors") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  for (optimizer_type type : {optimizer_type::adamw, optimizer_type::lamb}) {
    for (std::uint32_t ranks : {1u, 2u, 3u, 4u}) {
      CAPTURE(type_name(type));
      CAPTURE(ranks);
      auto layout = flat_layout::create(specs, ranks);
      REQUIRE(layout.has_value());
      std::int64_t total = 0;
      for (std::uint32_t r = 0; r < ranks; ++r) {
        const std::int64_t before = memory_usage_of(device::cpu()).current_bytes;
        auto opt = partitioned_optimizer::create(config_of(type), *layout, r, initial);
        REQUIRE(opt.has_value());
        const std::int64_t held = memory_usage_of(device::cpu()).current_bytes - before;
        CHECK(opt->state_bytes() == 12 * layout->partition_numel());
        CHECK(held == opt->state_bytes());
        total += opt->state_bytes();
        // LAMB's scratch: block sums, a few bytes per 2048 elements.
        if (type == optimizer_type::lamb) CHECK(opt->scratch_bytes() <= 16 * (layout->padded_numel() / 2048 + 8));
        else CHECK(opt->scratch_bytes() == 0);
      }
      CHECK(total == 12 * layout->padded_numel());
      // Padding is under one alignment per tensor plus the end's ranks x alignment.
      CHECK(layout->padded_numel() - layout->numel() <
            static_cast<std::int64_t>(specs.size() + ranks) * layout->alignment());
    }
  }
}

TEST_CASE("partitioned optimizer: write_working and grad_sum_of_squares leave padding out") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  auto layout = flat_layout::create(specs, 3, 1);
  REQUIRE(layout.has_value());
  const auto grads = step_inputs(specs, 1)[0].grads;
  double whole = 0.0, parts = 0.0;
  for (const auto& g : grads) whole += optim::sum_of_squares(g);
  std::vector<tensor> working;
  for (std::uint32_t r = 0; r < 3; ++r) {
    auto opt = partitioned_optimizer::create(config_of(optimizer_type::adamw), *layout, r, initial);
    REQUIRE(opt.has_value());
    parts += opt->grad_sum_of_squares(grad_partition(*layout, r, grads)); // NaN padding would show
    tensor w = tensor::empty({layout->partition_numel()}, dtype::bf16);
    REQUIRE(opt->write_working(w).has_value());
    working.push_back(w);
  }
  CHECK(std::isfinite(parts));
  CHECK(parts == doctest::Approx(whole).epsilon(1e-12));
  auto gathered = unflatten(*layout, working);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    tensor expected = tensor::empty(specs[i].shape, dtype::bf16);
    for (std::int64_t k = 0; k < expected.numel(); ++k)
      expected.data<std::uint16_t>()[k] = f32_to_bf16(initial[i].data<float>()[k]);
    CHECK(same_bits(gathered[i], expected));
  }
}

// Speculation's rollback (train::partition_shard): a step taken from a copy of the state, then
// undone with restore_state and redone with another gradient scale, gives the bits of
// the redone step alone (LAMB's trust ratios from the restored masters).
TEST_CASE("partitioned optimizer: restore_state undoes a step; the redone step equals it alone, bit for bit") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  auto layout = flat_layout::create(specs, 1); // LAMB's alignment: norm blocks
  REQUIRE(layout.has_value());
  const auto inputs = step_inputs(specs, 2);
  for (auto type : {optimizer_type::adamw, optimizer_type::lamb}) {
    CAPTURE(std::string(type_name(type)));
    auto undone = partitioned_optimizer::create(config_of(type), *layout, 0, initial);
    auto plain = partitioned_optimizer::create(config_of(type), *layout, 0, initial);
    REQUIRE_MESSAGE(undone.has_value(), (undone ? std::string() : undone.err().message));
    REQUIRE(plain.has_value());
    REQUIRE(undone->resident());
    tensor w_undone = tensor::empty({layout->partition_numel()}, dtype::f16);
    tensor w_plain = tensor::empty({layout->partition_numel()}, dtype::f16);
    auto step = [&](partitioned_optimizer& o, const tensor& working, int k, double scale) {
      optim::partition_step in;
      in.grad = grad_partition(*layout, 0, inputs[k].grads);
      in.grad_scale = scale;
      in.working = working;
      REQUIRE(o.step(in).has_value());
    };
    step(*undone, w_undone, 0, 1.0);
    step(*plain, w_plain, 0, 1.0);
    const optim::partition_state live = undone->state();
    const optim::partition_state saved{live.master.clone(), live.exp_avg.clone(), live.exp_avg_sq.clone(), live.step};
    step(*undone, w_undone, 1, 1.0); // the speculation: assumed unclipped
    CHECK(!same_bits(undone->state().master, saved.master));
    undone->restore_state(saved);
    check_same_partition(undone->state(), saved);
    step(*undone, w_undone, 1, 0.25); // the redo with the clip factor
    step(*plain, w_plain, 1, 0.25);
    check_same_partition(undone->state(), plain->state());
    CHECK(same_bits(w_undone, w_plain));
  }
}

TEST_CASE("partitioned optimizer: errors name the rank and what is wrong") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  auto a1 = flat_layout::create(specs, 2, 1);
  auto a2048 = flat_layout::create(specs, 2);
  REQUIRE(a1.has_value());
  REQUIRE(a2048.has_value());

  SUBCASE("LAMB needs the norm-block alignment") {
    auto opt = partitioned_optimizer::create(config_of(optimizer_type::lamb), *a1, 0, initial);
    REQUIRE_FALSE(opt.has_value());
    CHECK(opt.err().message.find("multiple of 2048") != std::string::npos);
  }
  SUBCASE("rank out of range, wrong initial tensors") {
    CHECK_FALSE(partitioned_optimizer::create(config_of(optimizer_type::adamw), *a1, 2, initial).has_value());
    auto fewer = initial;
    fewer.pop_back();
    CHECK_FALSE(partitioned_optimizer::create(config_of(optimizer_type::adamw), *a1, 0, fewer).has_value());
    auto reshaped = initial;
    reshaped[0] = reshaped[0].flatten();
    auto opt = partitioned_optimizer::create(config_of(optimizer_type::adamw), *a1, 1, reshaped);
    REQUIRE_FALSE(opt.has_value());
    CHECK(opt.err().message.find("bert.embeddings.word_embeddings.weight") != std::string::npos);
    CHECK(opt.err().message.find("rank 1") != std::string::npos);
  }
  SUBCASE("a gradient of the wrong size") {
    auto opt = partitioned_optimizer::create(config_of(optimizer_type::adamw), *a1, 1, initial);
    REQUIRE(opt.has_value());
    optim::partition_step s;
    s.grad = tensor::zeros({a1->partition_numel() + 1}, dtype::f32);
    auto done = opt->step(s);
    REQUIRE_FALSE(done.has_value());
    CHECK(done.err().message.find("grad") != std::string::npos);
    CHECK(opt->step_count() == 0);
  }
  SUBCASE("a failing or short exchange") {
    for (int failing = 0; failing < 2; ++failing) {
      auto opt = partitioned_optimizer::create(config_of(optimizer_type::lamb), *a2048, 0, initial);
      REQUIRE(opt.has_value());
      REQUIRE(opt->exchange_size() > 0);
      optim::partition_step s;
      s.grad = grad_partition(*a2048, 0, step_inputs(specs, 1)[0].grads);
      s.combine = [&](const std::vector<double>& partial) -> expected<std::vector<double>> {
        if (failing) return make_error(errc::protocol, "peer 1 went away");
        return std::vector<double>(partial.size() - 2, 0.0);
      };
      auto done = opt->step(s);
      REQUIRE_FALSE(done.has_value());
      CHECK(done.err().message.find("rank 0") != std::string::npos);
      CHECK(done.err().message.find(failing ? "peer 1 went away" : "LAMB norm sums") != std::string::npos);
    }
  }
  SUBCASE("a state with non-zero padding") {
    auto opt = partitioned_optimizer::create(config_of(optimizer_type::adamw), *a2048, 1, initial);
    REQUIRE(opt.has_value());
    optim::partition_state state{opt->state().master.clone(), opt->state().exp_avg.clone(),
                                 opt->state().exp_avg_sq.clone(), 0};
    state.exp_avg.data<float>()[a2048->partition_numel() - 1] = -0.0f; // the end padding
    auto loaded = partitioned_optimizer::create(config_of(optimizer_type::adamw), *a2048, 1, state);
    REQUIRE_FALSE(loaded.has_value());
    CHECK(loaded.err().message.find("padding") != std::string::npos);
  }
}

// ZeRO-3 hands each version to the weight store window by window (train::partition_shard with a
// fetcher): the windows, put end to end, are the bits of the whole working tensor, for a
// step, for LAMB's second pass and for a skipped step's copy of the masters.
TEST_CASE("partitioned optimizer: working weights through a sink, in windows, equal the whole tensor") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  const auto inputs = step_inputs(specs, 2);
  auto layout = flat_layout::create(specs, 1); // padding between the tensors (norm blocks)
  REQUIRE(layout.has_value());
  const std::int64_t n = layout->partition_numel();
  for (auto type : {optimizer_type::adamw, optimizer_type::lamb}) {
    for (dtype working_type : {dtype::f32, dtype::bf16}) {
      CAPTURE(std::string(type_name(type)));
      CAPTURE(std::string(dtype_name(working_type)));
      auto whole = partitioned_optimizer::create(config_of(type), *layout, 0, initial);
      auto sunk = partitioned_optimizer::create(config_of(type), *layout, 0, initial);
      REQUIRE(whole.has_value());
      REQUIRE(sunk.has_value());
      const std::int64_t window = 1000; // not a multiple of the layout's alignment
      auto garbage = [&] { // what the windows (or the whole step) must overwrite
        tensor t = tensor::empty({n}, working_type);
        std::memset(t.raw_data(), 0x3c, t.nbytes());
        return t;
      };
      tensor collected = garbage();
      std::int64_t at = 0, windows = 0;
      bool too_big = false;
      optim::working_sink sink = [&](const tensor& w) -> status {
        too_big = too_big || w.numel() > window;
        auto* out = static_cast<std::byte*>(collected.raw_data()) + static_cast<std::size_t>(at) * dtype_size(working_type);
        std::memcpy(out, w.raw_data(), w.nbytes());
        at += w.numel();
        ++windows;
        return {};
      };
      auto each_step = [&](int k) {
        tensor expected = garbage();
        optim::partition_step a, b;
        a.grad = grad_partition(*layout, 0, inputs[k].grads);
        a.working = expected;
        b.grad = grad_partition(*layout, 0, inputs[k].grads);
        b.sink = sink;
        b.sink_type = working_type;
        b.sink_window = window;
        at = 0;
        REQUIRE(whole->step(a).has_value());
        REQUIRE(sunk->step(b).has_value());
        CHECK(at == n);
        CHECK(same_bits(collected, expected));
      };
      each_step(0);
      CHECK(windows >= n / window);
      CHECK_FALSE(too_big);
      each_step(1);
      // A skipped step: the masters as working weights.
      tensor expected = tensor::zeros({n}, working_type);
      REQUIRE(whole->write_working(expected).has_value());
      at = 0;
      REQUIRE(sunk->write_working(sink, working_type, window).has_value());
      CHECK(at == n);
      CHECK(same_bits(collected, expected));
      // A sink's error stops the step and is returned.
      optim::partition_step c;
      c.grad = grad_partition(*layout, 0, inputs[0].grads);
      c.sink = [](const tensor&) -> status { return make_error(errc::io, "disk gone"); };
      c.sink_type = working_type;
      auto failed = sunk->step(c);
      REQUIRE_FALSE(failed.has_value());
      CHECK(failed.err().message.find("disk gone") != std::string::npos);
    }
  }
}

TEST_CASE("add_gathered sums an allgather of exchange vectors in rank order") {
  std::vector<double> gathered{1.0, 0.0, 0.0, 0.0, 2.5, 0.0, 0.0, 0.0, 4.0};
  auto sums = partitioned_optimizer::add_gathered(gathered, 3);
  CHECK(sums == std::vector<double>{1.0, 2.5, 4.0});
}
