// Tests for optim/flat_layout: offsets and padding by hand, partitions that tile the
// padded space, pieces that cover every tensor element exactly once, owners, errors.
#include "optim/flat_layout.hpp"

#include "tests/optim/zero_ranks.hpp"

#include <doctest/doctest.h>

namespace {

using dsa::optim::flat_layout;
using dsa::optim::flat_tensor_spec;

flat_layout must(dsa::expected<flat_layout> l) {
  if (!l) FAIL(l.err().to_string());
  return std::move(*l);
}

} // namespace

TEST_CASE("flat layout: offsets aligned, end padded to ranks x alignment, by hand") {
  std::vector<flat_tensor_spec> specs{{"a", {3, 5}, true}, {"b", {1}, false}, {"c", {9}, true}};
  // alignment 4: a at 0 (15), b at 16 (1), c at 20 (9), end 29; 3 ranks -> 36, 12 each.
  flat_layout l = must(flat_layout::create(specs, 3, 4));
  REQUIRE(l.tensors().size() == 3);
  CHECK(l.tensors()[0].offset == 0);
  CHECK(l.tensors()[1].offset == 16);
  CHECK(l.tensors()[2].offset == 20);
  CHECK(l.tensors()[1].decay == false);
  CHECK(l.numel() == 25);
  CHECK(l.padded_numel() == 36);
  CHECK(l.partition_numel() == 12);
  CHECK(l.partition(1).lo == 12);
  CHECK(l.partition(1).hi == 24);
  // Rank 1 holds a[12:15), b[0:1) and c[0:4).
  auto p = l.pieces(l.partition(1));
  REQUIRE(p.size() == 3);
  CHECK((p[0].tensor == 0 && p[0].tensor_offset == 12 && p[0].flat_offset == 12 && p[0].count == 3));
  CHECK((p[1].tensor == 1 && p[1].tensor_offset == 0 && p[1].flat_offset == 16 && p[1].count == 1));
  CHECK((p[2].tensor == 2 && p[2].tensor_offset == 0 && p[2].flat_offset == 20 && p[2].count == 4));
  CHECK(l.first_owner(0) == 0);
  CHECK(l.last_owner(0) == 1);
  CHECK(l.first_owner(2) == 1);
  CHECK(l.last_owner(2) == 2);
  CHECK(l.spans_ranks(2));
  CHECK_FALSE(l.spans_ranks(1));
  CHECK(*l.find("c") == 2);
  CHECK_FALSE(l.find("d").has_value());

  // Another rank count keeps every offset; only the end padding changes.
  flat_layout two = must(l.with_ranks(2));
  CHECK(two.tensors()[2].offset == 20);
  CHECK(two.padded_numel() == 32);
  CHECK(two.alignment() == 4);
}

TEST_CASE("flat layout: pieces of any range cover each tensor element exactly once") {
  const auto specs = dsa::test::zero::awkward_specs();
  for (std::int64_t alignment : {1, 3, 2048}) {
    for (std::uint32_t ranks : {1u, 2u, 3u, 4u, 7u}) {
      CAPTURE(alignment);
      CAPTURE(ranks);
      flat_layout l = must(flat_layout::create(specs, ranks, alignment));
      CHECK(l.padded_numel() % (ranks * alignment) == 0);
      std::vector<std::vector<int>> seen;
      for (const auto& t : l.tensors()) {
        CHECK(t.offset % alignment == 0);
        seen.emplace_back(static_cast<std::size_t>(t.numel), 0);
      }
      std::int64_t previous_hi = 0;
      for (std::uint32_t r = 0; r < ranks; ++r) {
        auto part = l.partition(r);
        CHECK(part.lo == previous_hi);
        CHECK(part.size() == l.partition_numel());
        previous_hi = part.hi;
        for (const auto& p : l.pieces(part)) {
          const auto& t = l.tensors()[p.tensor];
          CHECK(p.flat_offset == t.offset + p.tensor_offset);
          CHECK(p.tensor_offset % alignment == 0); // boundaries fall on the alignment inside tensors
          CHECK(l.first_owner(p.tensor) <= r);
          CHECK(l.last_owner(p.tensor) >= r);
          for (std::int64_t i = 0; i < p.count; ++i) ++seen[p.tensor][static_cast<std::size_t>(p.tensor_offset + i)];
        }
      }
      CHECK(previous_hi == l.padded_numel());
      for (const auto& s : seen)
        for (int count : s) REQUIRE(count == 1);
      // An arbitrary range: the pieces stay inside it.
      auto inner = l.pieces(5, l.numel() / 2 + 1);
      for (const auto& p : inner) CHECK((p.flat_offset >= 5 && p.flat_offset + p.count <= l.numel() / 2 + 1));
    }
  }
}

TEST_CASE("flat layout: errors name the parameter") {
  auto dup = flat_layout::create({{"x", {2}, true}, {"x", {3}, true}}, 2);
  REQUIRE_FALSE(dup.has_value());
  CHECK(dup.err().message.find("'x' appears twice") != std::string::npos);
  auto empty = flat_layout::create({{"y", {2, 0}, true}}, 2);
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.err().message.find("'y'") != std::string::npos);
  CHECK_FALSE(flat_layout::create({{"z", {2}, true}}, 0).has_value());
  CHECK_FALSE(flat_layout::create({{"z", {2}, true}}, 2, 0).has_value());
}

TEST_CASE("bert_flat_tensor applies the BERT no-decay rule") {
  CHECK(dsa::optim::bert_flat_tensor("bert.pooler.dense.weight", {4, 4}).decay);
  CHECK_FALSE(dsa::optim::bert_flat_tensor("bert.pooler.dense.bias", {4}).decay);
  CHECK_FALSE(dsa::optim::bert_flat_tensor("bert.embeddings.LayerNorm.weight", {4}).decay);
}
