// Helpers for the checkpoint directory tests: tensors with awkward bit patterns
// (NaN payloads, -0, subnormals), a checkpoint with several groups and a rich
// state, and bit-for-bit comparison of tensor groups.
#pragma once

#include "io/ckpt/checkpoint_dir.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace dsa::test {

inline std::uint32_t next_bits(std::uint64_t& x) {
  x = x * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<std::uint32_t>(x >> 32);
}

// f32 tensor of random bit patterns, with NaN payloads, -0, inf and a subnormal first.
inline tensor f32_tensor(const shape_t& shape, std::uint64_t seed) {
  tensor t = tensor::empty(shape, dtype::f32);
  auto* p = static_cast<std::uint32_t*>(t.raw_data());
  const std::uint32_t specials[] = {0x7fc01234u, 0x80000000u, 0x7f800000u, 0x00000001u};
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = i < 4 ? specials[i] : next_bits(seed);
  return t;
}

inline tensor u16_tensor(const shape_t& shape, dtype type, std::uint64_t seed) {
  tensor t = tensor::empty(shape, type);
  auto* p = t.data<std::uint16_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<std::uint16_t>(next_bits(seed));
  return t;
}

inline tensor i64_tensor(const shape_t& shape, std::uint64_t seed) {
  tensor t = tensor::empty(shape, dtype::i64);
  auto* p = t.data<std::int64_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<std::int64_t>((std::uint64_t{next_bits(seed)} << 32) | next_bits(seed));
  return t;
}

// A checkpoint of `step` with a model, two optimizer partitions, an RNG group
// and a state holding the things a resume needs; `seed` varies the bits.
inline ckpt::checkpoint_contents sample_contents(std::uint64_t step, std::uint64_t seed = 1) {
  ckpt::checkpoint_contents c;
  c.step = step;
  c.global_samples = step * 32 + 7;
  c.groups["model"]["bert.embeddings.word_embeddings.weight"] = f32_tensor({13, 3}, seed);
  c.groups["model"]["bert.encoder.layer.0.attention.self.query.bias"] =
      u16_tensor({5}, dtype::bf16, seed + 1);
  c.groups["model"]["cls.predictions.bias"] = f32_tensor({1}, seed + 2);
  c.groups["optimizer_0"]["exp_avg.bert.embeddings.word_embeddings.weight"] =
      f32_tensor({13, 3}, seed + 3);
  c.groups["optimizer_0"]["step"] = i64_tensor({1}, seed + 4);
  c.groups["optimizer_1"]["exp_avg_sq.cls.predictions.bias"] =
      u16_tensor({7}, dtype::f16, seed + 5);
  c.groups["rng"]["dropout_state"] = i64_tensor({4}, seed + 6);
  c.state = {
      {"config", "train_batch_size = 32\n[optimizer]\ntype = \"AdamW\"\n"},
      {"rng", {{"seed", 42}, {"offset", std::numeric_limits<std::uint64_t>::max() - seed}}},
      {"data_cursor", {{"epoch", 1}, {"index", step * 32}}},
      {"loss_scaler", {{"scale", 65536.0 / 3.0}, {"good_steps", 17}, {"hysteresis", 2}}},
      {"scheduler", {{"last_lr", 0.1 + 1e-17 * static_cast<double>(seed)}}},
      {"world", {{"dp", 1}, {"pp", 2}}},
  };
  return c;
}

// Same dtype, shape and bytes.
inline bool same_bits(const tensor& a, const tensor& b) {
  return a.type() == b.type() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

inline void check_groups_equal(const ckpt::tensor_groups& got, const ckpt::tensor_groups& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [group, tensors] : want) {
    CAPTURE(group);
    REQUIRE(got.count(group) == 1);
    const ckpt::named_tensors& g = got.at(group);
    REQUIRE(g.size() == tensors.size());
    for (const auto& [name, t] : tensors) {
      CAPTURE(name);
      REQUIRE(g.count(name) == 1);
      CHECK(same_bits(g.at(name), t));
    }
  }
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace dsa::test
