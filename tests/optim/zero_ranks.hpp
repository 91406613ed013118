// Test support for ZeRO partitioning: a stage's parameters with awkward sizes, R
// simulated ranks on threads whose LAMB norm exchange meets at a barrier, and the
// whole-tensor optim::optimizer as the reference, fed as train::whole_shard feeds it.
#pragma once

#include "core/tensor.hpp"
#include "kernels/cpu/lamb.hpp"
#include "optim/flat_layout.hpp"
#include "optim/grad_clip.hpp"
#include "optim/optimizer.hpp"
#include "optim/partitioned_optimizer.hpp"

#include <doctest/doctest.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace dsa::test::zero {

using optim::flat_layout;
using optim::flat_tensor_spec;
using optim::partitioned_optimizer;

// BERT-named tensors of awkward sizes: one element, primes, a product of primes, and
// one above 16384 (several OpenMP chunks, eleven LAMB norm blocks) placed so that it
// spans three ranks for R = 3 (alignment 1) and R = 4 (alignment 2048). Biases and
// LayerNorm take no weight decay.
inline std::vector<flat_tensor_spec> awkward_specs() {
  std::vector<flat_tensor_spec> s;
  s.push_back(optim::bert_flat_tensor("bert.embeddings.word_embeddings.weight", {97, 61}));
  s.push_back(optim::bert_flat_tensor("bert.embeddings.LayerNorm.weight", {1}));
  s.push_back(optim::bert_flat_tensor("bert.embeddings.LayerNorm.bias", {7}));
  s.push_back(optim::bert_flat_tensor("bert.pooler.dense.weight", {131, 157}));
  s.push_back(optim::bert_flat_tensor("bert.encoder.layer.0.attention.self.query.weight", {13, 11}));
  s.push_back(optim::bert_flat_tensor("bert.encoder.layer.0.attention.self.query.bias", {13}));
  s.push_back(optim::bert_flat_tensor("bert.encoder.layer.0.output.dense.weight", {3, 1367}));
  s.push_back(optim::bert_flat_tensor("cls.predictions.bias", {2053}));
  return s;
}

inline tensor uniform_tensor(const shape_t& shape, float lo, float hi, std::uint32_t seed) {
  tensor t = tensor::empty(shape, dtype::f32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  float* x = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) x[i] = u(rng);
  return t;
}

inline std::vector<tensor> initial_params(const std::vector<flat_tensor_spec>& specs) {
  std::vector<tensor> out;
  for (std::size_t i = 0; i < specs.size(); ++i)
    out.push_back(uniform_tensor(specs[i].shape, -1.0f, 1.0f, 100 + static_cast<std::uint32_t>(i)));
  return out;
}

// What one step feeds the optimizer: whole-tensor gradients (as summed over the ranks),
// the combined unscale/clip factor, the lr and, optionally, OneCycle's betas.
struct step_input {
  std::vector<tensor> grads;
  double grad_scale = 1.0;
  double lr = 1e-3;
  bool set_betas = false;
  double beta1 = 0.9, beta2 = 0.999;
};

inline std::vector<step_input> step_inputs(const std::vector<flat_tensor_spec>& specs, int steps, int first_seed = 0) {
  std::vector<step_input> out;
  for (int k = 0; k < steps; ++k) {
    step_input in;
    const int seed = first_seed + k;
    for (std::size_t i = 0; i < specs.size(); ++i)
      in.grads.push_back(uniform_tensor(specs[i].shape, -2.0f, 2.0f, 1000 + 37 * static_cast<std::uint32_t>(seed) +
                                                                         static_cast<std::uint32_t>(i)));
    in.grad_scale = (seed % 3 == 1) ? 0.5 : (seed % 3 == 2 ? 0.25 : 1.0);
    in.lr = 1e-3 * (1 + seed % 4);
    // From the third step on, betas set every step, as OneCycle's momentum cycling does.
    in.set_betas = seed >= 2;
    in.beta1 = 0.85 + 0.01 * (seed % 3);
    in.beta2 = 0.99;
    out.push_back(std::move(in));
  }
  return out;
}

// The whole-tensor reference: optim::optimizer over BERT groups, with a half copy when
// `half` is f16/bf16, stepped as train::shard_base::update does.
struct reference {
  std::vector<optim::param_slot> slots; // in spec order, sharing tensors with the groups
  std::optional<optim::optimizer> opt;

  reference(const optim::optimizer_config& cfg, const std::vector<flat_tensor_spec>& specs,
            const std::vector<tensor>& initial, dtype half) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      optim::param_slot s;
      s.name = specs[i].name;
      s.param = initial[i].clone();
      s.grad = tensor::zeros(specs[i].shape, dtype::f32);
      s.m = tensor::zeros(specs[i].shape, dtype::f32);
      s.v = tensor::zeros(specs[i].shape, dtype::f32);
      if (half != dtype::f32) s.half_copy = tensor::zeros(specs[i].shape, half);
      slots.push_back(s);
    }
    auto created = optim::optimizer::create(cfg, optim::bert_param_groups(slots, cfg.weight_decay, cfg.lr));
    REQUIRE(created.has_value());
    opt.emplace(std::move(*created));
  }

  void step(const step_input& in) {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      slots[i].grad.copy_from(in.grads[i]);
      optim::scale_in_place(slots[i].grad, in.grad_scale);
    }
    opt->set_lr(in.lr);
    if (in.set_betas) opt->set_betas(in.beta1, in.beta2);
    if (opt->settings().type == optim::optimizer_type::lamb) note_lamb_sums();
    opt->step();
  }

  // LAMB's whole-tensor sums {sum p^2, sum u^2} of the step about to run, from the kernel's
  // first pass over copies of each whole tensor's state.
  std::map<std::string, std::pair<double, double>> lamb_sums;
  void note_lamb_sums() {
    const auto& cfg = opt->settings();
    for (const auto& g : opt->groups())
      for (const auto& s : g.params) {
        cpu::lamb_params p;
        p.beta1 = static_cast<float>(cfg.beta1);
        p.beta2 = static_cast<float>(cfg.beta2);
        p.eps = static_cast<float>(cfg.eps);
        p.weight_decay = static_cast<float>(g.weight_decay);
        p.correction = cfg.bias_correction ? cpu::bias_correction::on : cpu::bias_correction::off;
        p.step = opt->step_count() + 1;
        tensor m = s.m.clone(), v = s.v.clone(), work = tensor::empty(s.param.shape(), dtype::f32);
        std::vector<double> blocks(static_cast<std::size_t>(2 * cpu::lamb_norm_blocks(s.param.numel())));
        cpu::lamb_first_pass(m.data<float>(), v.data<float>(), work.data<float>(), blocks.data(), s.param.data<float>(),
                             s.grad.data<float>(), p, s.param.numel());
        double totals[2] = {0.0, 0.0};
        cpu::lamb_norm_totals(totals, blocks.data(), cpu::lamb_norm_blocks(s.param.numel()));
        lamb_sums[s.name] = {totals[0], totals[1]};
      }
  }

  // The reference's trust ratio of a tensor in the last LAMB step.
  float lamb_coeff(const std::string& name) const {
    std::size_t k = 0;
    for (const auto& g : opt->groups())
      for (const auto& s : g.params) {
        if (s.name == name) return opt->last_lamb_coeffs().at(k);
        ++k;
      }
    FAIL("no parameter " << name);
    return 0.0f;
  }
};

// A reusable barrier for a fixed number of threads (no std::barrier in C++17).
class rank_barrier {
public:
  explicit rank_barrier(std::uint32_t count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint32_t count_;
  std::uint32_t arrived_ = 0;
  std::uint64_t generation_ = 0;
};

// The LAMB norm exchange of R ranks in one process, done as the lead would with the
// communicator: an allgather of every rank's vector, then add_gathered.
class simulated_exchange {
public:
  explicit simulated_exchange(std::uint32_t ranks) : ranks_(ranks), slots_(ranks), barrier_(ranks), calls_(ranks) {}

  optim::norm_combine for_rank(std::uint32_t rank) {
    return [this, rank](const std::vector<double>& partial) -> expected<std::vector<double>> {
      slots_[rank] = partial;
      barrier_.arrive_and_wait();
      std::vector<double> gathered;
      for (const auto& s : slots_) gathered.insert(gathered.end(), s.begin(), s.end());
      barrier_.arrive_and_wait(); // every rank has read the slots before any writes the next step's
      ++calls_[rank];
      return partitioned_optimizer::add_gathered(gathered, ranks_);
    };
  }
  int calls(std::uint32_t rank) const { return calls_[rank]; }

private:
  std::uint32_t ranks_;
  std::vector<std::vector<double>> slots_;
  rank_barrier barrier_;
  std::vector<int> calls_; // each rank's thread writes its own
};

// Runs fn(rank) for every rank on its own thread and joins them.
template <class Fn> void run_ranks(std::uint32_t ranks, Fn fn) {
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < ranks; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// A rank's partition of whole-tensor gradients; padding elements are NaN, so a read of
// one would show in every result.
inline tensor grad_partition(const flat_layout& layout, std::uint32_t rank, const std::vector<tensor>& grads) {
  const optim::flat_range part = layout.partition(rank);
  tensor out = tensor::empty({part.size()}, dtype::f32);
  float* g = out.data<float>();
  std::fill(g, g + part.size(), std::numeric_limits<float>::quiet_NaN());
  for (const auto& p : layout.pieces(part))
    std::memcpy(g + (p.flat_offset - part.lo), grads[p.tensor].data<float>() + p.tensor_offset,
                static_cast<std::size_t>(p.count) * sizeof(float));
  return out;
}

// Whole tensors (f32) from every rank's flat buffer of one kind (piece by piece).
inline std::vector<tensor> unflatten(const flat_layout& layout, const std::vector<tensor>& partitions) {
  std::vector<tensor> out;
  for (const auto& t : layout.tensors()) out.push_back(tensor::empty(t.shape, partitions.at(0).type()));
  for (std::uint32_t r = 0; r < layout.ranks(); ++r) {
    const optim::flat_range part = layout.partition(r);
    const std::size_t width = dtype_size(partitions[r].type());
    for (const auto& p : layout.pieces(part))
      std::memcpy(static_cast<char*>(out[p.tensor].raw_data()) + p.tensor_offset * static_cast<std::int64_t>(width),
                  static_cast<const char*>(partitions[r].raw_data()) + (p.flat_offset - part.lo) * static_cast<std::int64_t>(width),
                  static_cast<std::size_t>(p.count) * width);
  }
  return out;
}

inline bool same_bits(const tensor& a, const tensor& b) {
  return a.type() == b.type() && a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A loaded partition equals the expected one bit for bit, step count included.
inline void check_same_partition(const optim::partition_state& got, const optim::partition_state& want) {
  CHECK(same_bits(got.master, want.master));
  CHECK(same_bits(got.exp_avg, want.exp_avg));
  CHECK(same_bits(got.exp_avg_sq, want.exp_avg_sq));
  CHECK(got.step == want.step);
}

// R partitioned optimizers and their working buffers, stepped together.
struct zero_group {
  flat_layout layout;
  std::vector<partitioned_optimizer> ranks;
  std::vector<tensor> working;
  simulated_exchange exchange;

  // store_for(rank): where the rank's state lives (nullptr: in memory).
  using store_factory = std::function<std::unique_ptr<optim::chunked_state>(std::uint32_t rank)>;
  zero_group(const optim::optimizer_config& cfg, flat_layout l, const std::vector<tensor>& initial, dtype working_type,
             const store_factory& store_for = nullptr)
      : layout(std::move(l)), exchange(layout.ranks()) {
    for (std::uint32_t r = 0; r < layout.ranks(); ++r) {
      auto opt = partitioned_optimizer::create(cfg, layout, r, initial, store_for ? store_for(r) : nullptr);
      REQUIRE_MESSAGE(opt.has_value(), opt.err().to_string());
      ranks.push_back(std::move(*opt));
      working.push_back(tensor::empty({layout.partition_numel()}, working_type));
    }
  }
  // From each rank's loaded state.
  zero_group(const optim::optimizer_config& cfg, flat_layout l, std::vector<optim::partition_state> states,
             dtype working_type)
      : layout(std::move(l)), exchange(layout.ranks()) {
    for (std::uint32_t r = 0; r < layout.ranks(); ++r) {
      auto opt = partitioned_optimizer::create(cfg, layout, r, std::move(states.at(r)));
      REQUIRE_MESSAGE(opt.has_value(), opt.err().to_string());
      ranks.push_back(std::move(*opt));
      working.push_back(tensor::empty({layout.partition_numel()}, working_type));
    }
  }

  // One step on every rank, each on its own thread.
  void step(const step_input& in) {
    std::vector<std::string> errors(ranks.size());
    run_ranks(layout.ranks(), [&](std::uint32_t r) {
      optim::partition_step s;
      s.grad = grad_partition(layout, r, in.grads);
      s.grad_scale = in.grad_scale;
      s.working = working[r];
      s.combine = exchange.for_rank(r);
      ranks[r].set_lr(in.lr);
      if (in.set_betas) ranks[r].set_betas(in.beta1, in.beta2);
      auto done = ranks[r].step(s);
      if (!done) errors[r] = done.err().to_string();
    });
    for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
  }

  std::vector<tensor> gathered(tensor optim::partition_state::*kind) const {
    std::vector<tensor> parts;
    for (const auto& r : ranks) {
      auto st = r.read_state();
      REQUIRE_MESSAGE(st.has_value(), st.err().to_string());
      parts.push_back((*st).*kind);
    }
    return unflatten(layout, parts);
  }
};

// Every element of a rank's flat buffer outside its pieces is +0.
inline void check_padding_zero(const flat_layout& layout, std::uint32_t rank, const tensor& flat, const char* what) {
  const optim::flat_range part = layout.partition(rank);
  std::vector<bool> covered(static_cast<std::size_t>(part.size()), false);
  for (const auto& p : layout.pieces(part))
    for (std::int64_t i = 0; i < p.count; ++i) covered[static_cast<std::size_t>(p.flat_offset - part.lo + i)] = true;
  const std::size_t width = dtype_size(flat.type());
  const auto* bytes = static_cast<const unsigned char*>(flat.raw_data());
  std::int64_t nonzero = 0;
  for (std::int64_t i = 0; i < part.size(); ++i)
    if (!covered[static_cast<std::size_t>(i)])
      for (std::size_t b = 0; b < width; ++b) nonzero += bytes[static_cast<std::size_t>(i) * width + b] != 0;
  INFO("rank " << rank << " " << what);
  CHECK(nonzero == 0);
}

inline void check_same_as_reference(const zero_group& z, const reference& ref, optim::optimizer_type type) {
  auto masters = z.gathered(&optim::partition_state::master);
  auto m = z.gathered(&optim::partition_state::exp_avg);
  auto v = z.gathered(&optim::partition_state::exp_avg_sq);
  auto working = unflatten(z.layout, z.working); // what the ranks' all-gather assembles
  for (std::size_t i = 0; i < ref.slots.size(); ++i) {
    const auto& s = ref.slots[i];
    INFO(s.name);
    CHECK(same_bits(masters[i], s.param));
    CHECK(same_bits(m[i], s.m));
    CHECK(same_bits(v[i], s.v));
    CHECK(same_bits(working[i], s.half_copy.defined() ? s.half_copy : s.param));
  }
  for (std::uint32_t r = 0; r < z.layout.ranks(); ++r) {
    const auto& opt = z.ranks[r];
    auto st = opt.read_state();
    REQUIRE_MESSAGE(st.has_value(), st.err().to_string());
    check_padding_zero(z.layout, r, st->master, "master");
    check_padding_zero(z.layout, r, st->exp_avg, "exp_avg");
    check_padding_zero(z.layout, r, st->exp_avg_sq, "exp_avg_sq");
    check_padding_zero(z.layout, r, z.working[r], "working");
    if (type != optim::optimizer_type::lamb) continue;
    REQUIRE(opt.last_lamb_coeffs().size() == opt.pieces().size());
    for (std::size_t k = 0; k < opt.pieces().size(); ++k) {
      const std::string& name = z.layout.tensors()[opt.pieces()[k].tensor].name;
      INFO("rank " << r << " trust ratio of " << name);
      CHECK(opt.last_lamb_coeffs()[k] == ref.lamb_coeff(name));
      // The norms themselves, not only the f32 ratio they round to, are the whole tensor's.
      CHECK(opt.last_lamb_sums()[2 * k] == ref.lamb_sums.at(name).first);
      CHECK(opt.last_lamb_sums()[2 * k + 1] == ref.lamb_sums.at(name).second);
    }
  }
}

} // namespace dsa::test::zero
