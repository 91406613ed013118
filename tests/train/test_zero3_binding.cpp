// ZeRO-3's bindings around each part the model runs (zero3_binding.hpp), against a fake
// device that records what is bound: the CPU stage and the GPU stage share this
// bookkeeping and differ only in their binder. With a real parameter fetcher on one rank:
// each part's weights and (backward) gradients are bound as it starts, each gradient is
// handed to the partition once per micro-batch with every part's contribution in it, and
// between micro-batches only the persistent weights stay bound.
#include "actors/train/stage/zero3_binding.hpp"
#include "io/net/local_transport.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <vector>

using namespace dsa;

namespace {

// Tensors a (5000), b (300), c (7000), d (100); parts 0 = {a, b}, 1 = {c}, 2 = {a, d}: a is
// read by the first and the last part, as the tied word embedding by the embeddings and the
// head.
optim::flat_layout binding_layout() {
  std::vector<optim::flat_tensor_spec> specs{
      {"a", {50, 100}, true}, {"b", {300}, true}, {"c", {7, 1000}, true}, {"d", {100}, false}};
  auto l = optim::flat_layout::create(std::move(specs), 1);
  REQUIRE(l.has_value());
  return *l;
}
std::vector<train::fetch_part> binding_parts() { return {{0, {0, 1}}, {1, {2}}, {2, {0, 3}}}; }

// What a device would hold: bound values and gradients, and what was handed over.
struct fake_device final : train::zero3_binder {
  std::vector<std::int64_t> numel;
  std::map<std::size_t, tensor> values;
  std::map<std::size_t, std::vector<float>> grads;
  struct handed_over {
    std::size_t tensor;
    std::vector<float> grad;
    std::uint32_t step;
  };
  std::vector<handed_over> handed;
  std::int64_t live = 0, peak = 0; // value elements bound
  std::vector<std::string> errors;

  void bind_values(std::vector<std::pair<std::size_t, tensor>> v) override {
    for (auto& [i, t] : v) {
      if (!values.count(i)) live += numel[i];
      values[i] = std::move(t);
    }
    peak = std::max(peak, live);
  }
  void unbind_values(const std::vector<std::size_t>& indices) override {
    for (std::size_t i : indices) {
      if (!values.erase(i)) errors.push_back("unbound a value not bound: " + std::to_string(i));
      else live -= numel[i];
    }
  }
  void bind_gradients(const std::vector<std::size_t>& indices) override {
    for (std::size_t i : indices) {
      if (grads.count(i)) errors.push_back("a gradient bound twice: " + std::to_string(i));
      grads[i].assign(static_cast<std::size_t>(numel[i]), 0.0f);
    }
  }
  void hand_over(const std::vector<std::size_t>& indices, std::uint32_t step) override {
    for (std::size_t i : indices) {
      auto it = grads.find(i);
      if (it == grads.end()) {
        errors.push_back("handed over a gradient not bound: " + std::to_string(i));
        continue;
      }
      handed.push_back({i, std::move(it->second), step});
      grads.erase(it);
    }
  }
};

// One micro-batch as the model runs it: the forward's parts, then the backward's in reverse,
// each part adding (micro_batch + 1) * (part + 1) to every gradient it holds.
void run_micro_batch(train::zero3_binding& binding, fake_device& dev, const std::vector<train::fetch_part>& parts,
                     std::uint32_t step, int micro_batch) {
  binding.begin(step, false);
  for (const auto& p : parts) {
    binding.enter(p.id);
    for (std::size_t t : p.tensors) CHECK_MESSAGE(dev.values.count(t), "forward part ", p.id, " tensor ", t);
    binding.leave(p.id);
  }
  binding.begin(step, true);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    binding.enter(it->id);
    for (std::size_t t : it->tensors) {
      CHECK_MESSAGE(dev.values.count(t), "backward part ", it->id, " tensor ", t);
      REQUIRE_MESSAGE(dev.grads.count(t), "backward part ", it->id, " gradient ", t);
      for (float& g : dev.grads[t]) g += static_cast<float>((micro_batch + 1) * (it->id + 1));
    }
    binding.leave(it->id);
  }
}

} // namespace

TEST_CASE("zero3 binding: each part bound as it runs, each gradient handed over once per micro-batch, whole") {
  const auto layout = binding_layout();
  const auto parts = binding_parts();
  for (std::int64_t threshold : {0, 500}) { // 500: b and d persistent
    CAPTURE(threshold);
    net::local_group group(1);
    train::fetch_settings s;
    s.persistence_threshold = threshold;
    train::param_fetcher fetcher(layout, 0, dtype::f32, std::make_shared<net::communicator>(group.at(0)), parts,
                                 train::zero3_sequence(parts), 2, s);
    std::vector<tensor> whole;
    for (const auto& t : layout.tensors()) whole.push_back(tensor::zeros(t.shape, dtype::f32));
    fetcher.take_whole(whole);
    fake_device dev;
    for (const auto& t : layout.tensors()) dev.numel.push_back(t.numel);
    train::zero3_binding binding(parts, layout.tensors().size(), &fetcher, dev);
    for (std::uint32_t step = 0; step < 2; ++step) {
      if (step > 0) fetcher.load(tensor::zeros({layout.partition_numel()}, dtype::f32)); // the next version
      fetcher.allow(step);
      for (int m = 0; m < 2; ++m) {
        dev.handed.clear();
        run_micro_batch(binding, dev, parts, step, m);
        // Final after the last backward part that holds it: d after part 2, c after 1, a and b after 0.
        std::vector<std::size_t> order;
        for (const auto& h : dev.handed) order.push_back(h.tensor);
        CHECK(order == std::vector<std::size_t>{3, 2, 0, 1});
        const std::map<std::size_t, float> want{{0, 4.0f}, {1, 1.0f}, {2, 2.0f}, {3, 3.0f}}; // a: parts 2 and 0
        for (const auto& h : dev.handed) {
          CHECK(h.step == step);
          CHECK(h.grad.size() == static_cast<std::size_t>(dev.numel[h.tensor]));
          CHECK(std::all_of(h.grad.begin(), h.grad.end(),
                            [&](float g) { return g == want.at(h.tensor) * static_cast<float>(m + 1); }));
        }
        CHECK(binding.gradients_bound() == 0);
        CHECK(dev.grads.empty());
        // The first part's weights stay from one micro-batch's backward to the next one's
        // forward; after the step's last only the persistent ones stay.
        if (m == 1)
          for (const auto& [t, v] : dev.values) CHECK_MESSAGE(fetcher.persistent(t), "tensor ", t, " still bound");
      }
    }
    CHECK(dev.errors.empty());
    // Never the whole stage at once: at most the persistent tensors and two parts.
    CHECK(dev.peak < 5000 + 300 + 7000 + 100);
  }
}

TEST_CASE("zero3 binding: ZeRO-2 moves gradients only, and a part the stage lacks is refused") {
  const auto parts = binding_parts();
  fake_device dev;
  dev.numel = {5000, 300, 7000, 100};
  for (std::size_t t = 0; t < 4; ++t) dev.values[t] = tensor::zeros({dev.numel[t]}, dtype::f32);
  train::zero3_binding binding(parts, 4, nullptr, dev);
  run_micro_batch(binding, dev, parts, 0, 0);
  CHECK(dev.values.size() == 4); // the weights stay whole
  CHECK(dev.handed.size() == 4);
  CHECK(dev.errors.empty());
  for (const bool backward : {false, true}) {
    binding.begin(0, backward);
    CHECK_THROWS_WITH(binding.enter(7), doctest::Contains("part 7"));
  }
  CHECK_THROWS_WITH(train::zero3_binding({{0, {9}}}, 4, nullptr, dev), doctest::Contains("tensor 9"));
}

TEST_CASE("zero3 binding: a device window of parts waits for the part that many back to leave") {
  // Two parts at once: the third part's bindings wait for the first's end, the fourth's
  // for the second's; ends recorded in alternating slots.
  train::bind_window two(2);
  CHECK(two.parts() == 2);
  CHECK_FALSE(two.enter().has_value());
  CHECK(two.leave() == 0);
  CHECK_FALSE(two.enter().has_value());
  CHECK(two.leave() == 1);
  CHECK(two.enter() == std::optional<std::size_t>(0)); // part 0's end
  CHECK(two.leave() == 0);                             // part 2's end, once part 0's was waited for
  CHECK(two.enter() == std::optional<std::size_t>(1)); // part 1's
  CHECK(two.leave() == 1);
  CHECK(two.enter() == std::optional<std::size_t>(0)); // part 2's
  // One part: each waits for the one before it (no overlap).
  train::bind_window one(1);
  CHECK_FALSE(one.enter().has_value());
  CHECK(one.leave() == 0);
  CHECK(one.enter() == std::optional<std::size_t>(0));
  // Enter and leave alternate; a window of nothing is refused.
  CHECK_THROWS_WITH_AS(one.enter(), doctest::Contains("entered before the previous one left"), std::runtime_error);
  train::bind_window three(3);
  CHECK_THROWS_WITH_AS(three.leave(), doctest::Contains("did not enter"), std::runtime_error);
  CHECK_THROWS_WITH_AS(train::bind_window(0), doctest::Contains("window of no parts"), std::runtime_error);
}

TEST_CASE("zero3 binding: an upload buffer holds the persistent tensors and the largest part, padded") {
  // Tensors of 10, 100, 3 and 40 elements; the second and the fourth persistent. Parts: {0},
  // {1, 2} and {2, 3} (a tensor may be read by two parts).
  const std::vector<std::int64_t> numel{10, 100, 3, 40};
  const std::vector<bool> persistent{false, true, false, true};
  const std::vector<train::fetch_part> parts{{7, {0}}, {8, {1, 2}}, {9, {2, 3}}};
  // bf16: the persistent 200 and 80 bytes padded to 256 and 128; part 7's 20 bytes to 64,
  // part 8's and 9's gathered tensor (6 bytes) to 64: the largest part is 64.
  CHECK(train::zero3_upload_bytes(parts, numel, persistent, 2) == 256 + 128 + 64);
  // f32, nothing persistent: part 8's 400 + 12 bytes padded to 448 + 64.
  CHECK(train::zero3_upload_bytes(parts, numel, {false, false, false, false}, 4) == 448 + 64);
  CHECK_THROWS_WITH_AS(train::zero3_upload_bytes(parts, {10, 100}, {false, false}, 2),
                       doctest::Contains("names tensor 2 of a stage of 2"), std::runtime_error);
  CHECK_THROWS_WITH_AS(train::zero3_upload_bytes(parts, numel, {false}, 2), doctest::Contains("persistence flags"),
                       std::runtime_error);
}
