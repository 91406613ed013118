// Philox + Box-Muller normal initialisation of BERT parameters.
#include "models/bert/param_init.hpp"

#include "models/bert/bert_dropout.hpp"

#include <algorithm>
#include <cmath>

namespace dsa::bert {

std::uint32_t name_hash(std::string_view name) {
  std::uint32_t h = 2166136261u;
  for (char ch : name) {
    h ^= static_cast<std::uint8_t>(ch);
    h *= 16777619u;
  }
  return h;
}

void normal_fill(float* out, std::int64_t n, float stddev, std::uint64_t seed,
                 std::string_view name) {
  philox_stream stream;
  stream.seed = seed;
  stream.step = 0xffffffffu; // never a training step's dropout stream
  stream.micro_batch = name_hash(name);
  stream.layer = 0;
  stream.site = site::parameter_init;
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (std::int64_t block = 0; block * 4 < n; ++block) {
    auto u = stream.uniform4(static_cast<std::uint32_t>(block));
    double z[4];
    for (int pair = 0; pair < 2; ++pair) {
      // 1 - u lies in (0, 1]: the logarithm is finite.
      double radius = std::sqrt(-2.0 * std::log(1.0 - static_cast<double>(u[2 * pair])));
      double angle = two_pi * static_cast<double>(u[2 * pair + 1]);
      z[2 * pair] = radius * std::cos(angle);
      z[2 * pair + 1] = radius * std::sin(angle);
    }
    std::int64_t count = std::min<std::int64_t>(4, n - block * 4);
    for (std::int64_t j = 0; j < count; ++j)
      out[block * 4 + j] = static_cast<float>(stddev * z[j]);
  }
}

void init_parameter(const tensor& value, const param_spec& spec, const bert_config& cfg,
                    std::uint64_t seed) {
  DSA_CHECK(value.type() == dtype::f32 && value.shape() == spec.shape, "init of {}: got {}",
            spec.name, value.describe());
  float* data = value.data<float>();
  const std::int64_t n = value.numel();
  switch (spec.init) {
  case init_kind::zeros:
    std::fill(data, data + n, 0.0f);
    break;
  case init_kind::ones:
    std::fill(data, data + n, 1.0f);
    break;
  case init_kind::normal:
    normal_fill(data, n, cfg.initializer_range, seed, spec.name);
    break;
  case init_kind::normal_pad_zero: {
    normal_fill(data, n, cfg.initializer_range, seed, spec.name);
    if (cfg.pad_token_id >= 0) {
      const std::int64_t c = spec.shape.back();
      std::fill(data + cfg.pad_token_id * c, data + (cfg.pad_token_id + 1) * c, 0.0f);
    }
    break;
  }
  }
}

} // namespace dsa::bert
