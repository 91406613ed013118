// Tensor storage, views, alignment and allocation accounting.
#include "core/memory_stats.hpp"
#include "core/tensor.hpp"

#include <doctest/doctest.h>

#include <cstdint>

using namespace dsa;

TEST_CASE("CPU storage is 64-byte aligned and accounted") {
  auto before = memory_usage_of(device::cpu());
  {
    tensor t = tensor::empty({3, 5}, dtype::f32);
    CHECK(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64 == 0);
    auto during = memory_usage_of(device::cpu());
    CHECK(during.current_bytes - before.current_bytes == 60);
    CHECK(during.peak_bytes >= during.current_bytes);
    tensor view = t.slice_rows(1, 3);
    CHECK(memory_usage_of(device::cpu()).current_bytes == during.current_bytes); // views allocate nothing
  }
  CHECK(memory_usage_of(device::cpu()).current_bytes == before.current_bytes);
}

TEST_CASE("row slices and reshapes share storage") {
  tensor t = tensor::zeros({4, 3}, dtype::f32);
  float* p = t.data<float>();
  for (int i = 0; i < 12; ++i) p[i] = static_cast<float>(i);
  tensor rows = t.slice_rows(1, 3);
  CHECK(rows.shape() == shape_t{2, 3});
  CHECK(rows.data<float>()[0] == 3.0f);
  rows.data<float>()[0] = 100.0f;
  CHECK(p[3] == 100.0f);
  tensor flat = t.reshape({-1});
  CHECK(flat.shape() == shape_t{12});
  tensor r = t.reshape({2, -1, 2});
  CHECK(r.shape() == shape_t{2, 3, 2});
  CHECK(t.clone().data<float>() != p);
  CHECK(t.clone().data<float>()[3] == 100.0f);
}

TEST_CASE("typed access checks the dtype") {
  tensor h = tensor::zeros({2}, dtype::f16);
  CHECK(h.data<std::uint16_t>() != nullptr);
  tensor i = tensor::zeros({2}, dtype::i64);
  CHECK(i.nbytes() == 16);
  CHECK(i.describe() == "i64[2] on cpu");
}

TEST_CASE("dtype and device names parse") {
  CHECK(*parse_dtype("bfloat16") == dtype::bf16);
  CHECK_FALSE(parse_dtype("f8").has_value());
  CHECK(parse_device("cuda:3")->index == 3);
  CHECK(parse_device("cpu")->is_cpu());
  CHECK_FALSE(parse_device("cuda:x").has_value());
  CHECK(parse_device("gpu").err().message.find("gpu") != std::string::npos);
}
