// Tests for optim/partition_checkpoint: the names a rank saves, repartitioning to another
// rank count (and from a whole-tensor state) then continuing bit for bit as the
// uninterrupted run, assembling whole tensors one at a time, and errors for incomplete
// or inconsistent sets of rank files.
#include "optim/partition_checkpoint.hpp"

#include "core/memory_stats.hpp"
#include "tests/optim/zero_ranks.hpp"

#include <doctest/doctest.h>

#include <string>

namespace {

using namespace dsa;
using namespace dsa::test::zero;
using optim::optimizer_config;
using optim::optimizer_type;
using optim::saved_partition;
using optim::saved_partitions;
using optim::state_map;

optimizer_config config_of(optimizer_type type) {
  optimizer_config cfg;
  cfg.type = type;
  cfg.weight_decay = 0.01;
  return cfg;
}

// What a rank writes, copied as a file would hold it.
state_map saved_copy(const partitioned_optimizer& opt) {
  state_map m = optim::partition_payload(opt.layout(), opt.rank(), opt.state());
  for (auto& [key, t] : m) t = t.clone();
  return m;
}

std::vector<saved_partition> save_all(const zero_group& z) {
  std::vector<saved_partition> out;
  for (const auto& r : z.ranks) out.push_back(optim::saved_partition_of(saved_copy(r)));
  return out;
}

saved_partitions must_index(std::vector<saved_partition> ranks) {
  auto s = saved_partitions::index(std::move(ranks));
  if (!s) FAIL(s.err().to_string());
  return std::move(*s);
}

std::string index_error(std::vector<saved_partition> ranks) {
  auto s = saved_partitions::index(std::move(ranks));
  return s ? std::string("(no error)") : s.err().message;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("partition payload: names by tensor range, views of the state") {
  std::vector<optim::flat_tensor_spec> specs{{"a", {3, 5}, true}, {"b", {1}, false}, {"c", {9}, true}};
  auto layout = flat_layout::create(specs, 3, 4); // rank 1 holds a[12:15), b[0:1), c[0:4)
  REQUIRE(layout.has_value());
  auto opt = partitioned_optimizer::create(config_of(optimizer_type::adamw), *layout, 1, initial_params(specs));
  REQUIRE(opt.has_value());
  state_map p = optim::partition_payload(*layout, 1, opt->state());
  std::vector<std::string> keys;
  for (const auto& [k, t] : p) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"a.exp_avg[12:15]", "a.exp_avg_sq[12:15]", "b.exp_avg[0:1]",
                                         "b.exp_avg_sq[0:1]", "c.exp_avg[0:4]", "c.exp_avg_sq[0:4]", "master.a[12:15]",
                                         "master.b[0:1]", "master.c[0:4]", "optimizer_step_count", "shape.a", "shape.b",
                                         "shape.c"});
  // b sits at flat 16, element 4 of rank 1's partition: a view, no copy.
  CHECK(p.at("master.b[0:1]").data<float>() == opt->state().master.data<float>() + 4);
  CHECK(p.at("shape.a").numel() == 2);
  CHECK(p.at("shape.a").data<std::int64_t>()[1] == 5);
}

TEST_CASE("repartitioned state continues exactly as the uninterrupted run") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  const auto first = step_inputs(specs, 3, 0), second = step_inputs(specs, 3, 3);
  struct variant {
    optimizer_type type;
    std::uint32_t old_ranks, new_ranks;
    std::int64_t old_alignment, new_alignment;
  };
  for (variant var : {variant{optimizer_type::adamw, 2, 3, 1, 5}, variant{optimizer_type::lamb, 2, 3, 2048, 2048},
                      variant{optimizer_type::adam, 3, 1, 7, 1}, variant{optimizer_type::lamb, 4, 2, 4096, 2048}}) {
    CAPTURE(var.old_ranks);
    CAPTURE(var.new_ranks);
    CAPTURE(static_cast<int>(var.type));
    const optimizer_config cfg = config_of(var.type);
    reference ref(cfg, specs, initial, dtype::bf16);
    auto old_layout = flat_layout::create(specs, var.old_ranks, var.old_alignment);
    REQUIRE(old_layout.has_value());
    zero_group before(cfg, *old_layout, initial, dtype::bf16);
    for (const auto& in : first) {
      ref.step(in);
      before.step(in);
    }
    saved_partitions saved = must_index(save_all(before));
    CHECK(saved.step() == 3);

    auto new_layout = flat_layout::create(specs, var.new_ranks, var.new_alignment);
    REQUIRE(new_layout.has_value());
    std::vector<optim::partition_state> states;
    for (std::uint32_t r = 0; r < var.new_ranks; ++r) {
      auto s = saved.partition(*new_layout, r);
      REQUIRE_MESSAGE(s.has_value(), s.err().to_string());
      states.push_back(std::move(*s));
    }
    zero_group after(cfg, *new_layout, std::move(states), dtype::bf16);
    for (std::uint32_t r = 0; r < var.new_ranks; ++r) CHECK(after.ranks[r].step_count() == 3);
    for (const auto& in : second) {
      ref.step(in);
      after.step(in);
      check_same_as_reference(after, ref, var.type);
    }
  }
}

TEST_CASE("a whole-tensor (ZeRO-0) optimizer state partitions over three ranks") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  const auto inputs = step_inputs(specs, 4);
  const optimizer_config cfg = config_of(optimizer_type::lamb);
  reference ref(cfg, specs, initial, dtype::f32);
  for (int k = 0; k < 2; ++k) ref.step(inputs[k]);
  // The names train::whole_shard::payload writes.
  state_map whole;
  for (const auto& s : ref.slots) whole["master." + s.name] = s.param.clone();
  for (auto& [key, t] : ref.opt->save_state().tensors) whole[key] = t;
  tensor count = tensor::empty({1}, dtype::i64);
  count.data<std::int64_t>()[0] = ref.opt->step_count();
  whole["optimizer_step_count"] = count;
  saved_partitions saved = must_index({optim::saved_partition_of(whole)});

  auto layout = flat_layout::create(specs, 3);
  REQUIRE(layout.has_value());
  std::vector<optim::partition_state> states;
  for (std::uint32_t r = 0; r < 3; ++r) {
    auto s = saved.partition(*layout, r);
    REQUIRE_MESSAGE(s.has_value(), s.err().to_string());
    states.push_back(std::move(*s));
  }
  zero_group z(cfg, *layout, std::move(states), dtype::f32);
  for (int k = 2; k < 4; ++k) {
    ref.step(inputs[k]);
    z.step(inputs[k]);
    check_same_as_reference(z, ref, cfg.type);
  }
}

TEST_CASE("assembling whole tensors from every rank's file, one tensor at a time") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  const optimizer_config cfg = config_of(optimizer_type::adamw);
  reference ref(cfg, specs, initial, dtype::f32);
  auto layout = flat_layout::create(specs, 3, 1);
  REQUIRE(layout.has_value());
  zero_group z(cfg, *layout, initial, dtype::f32);
  for (const auto& in : step_inputs(specs, 3)) {
    ref.step(in);
    z.step(in);
  }
  saved_partitions saved = must_index(save_all(z));
  CHECK(saved.step() == 3);
  std::vector<std::string> seen;
  const std::int64_t before = memory_usage_of(device::cpu()).current_bytes;
  auto done = saved.assemble([&](const optim::assembled_tensor& t) -> status {
    seen.push_back(t.name);
    // Only this tensor's three arrays are allocated (the in-memory pieces are read as views).
    CHECK(memory_usage_of(device::cpu()).current_bytes - before == static_cast<std::int64_t>(3 * t.master.nbytes()));
    const auto& slot = ref.slots[*layout->find(t.name)];
    INFO(t.name);
    CHECK(t.master.shape() == slot.param.shape());
    CHECK(same_bits(t.master, slot.param));
    CHECK(same_bits(t.exp_avg, slot.m));
    CHECK(same_bits(t.exp_avg_sq, slot.v));
    return {};
  });
  REQUIRE_MESSAGE(done.has_value(), done.err().to_string());
  CHECK(seen == saved.names());
  CHECK(seen.size() == specs.size());
  CHECK(std::is_sorted(seen.begin(), seen.end()));

  // The sink's error stops the walk.
  int calls = 0;
  auto stopped = saved.assemble([&](const optim::assembled_tensor&) -> status {
    ++calls;
    return make_error(errc::io, "disk full");
  });
  CHECK_FALSE(stopped.has_value());
  CHECK(calls == 1);
}

TEST_CASE("partition checkpoint: incomplete or inconsistent rank files are errors naming the cause") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  auto layout = flat_layout::create(specs, 3, 1);
  REQUIRE(layout.has_value());
  zero_group z(config_of(optimizer_type::adamw), *layout, initial, dtype::f32);
  z.step(step_inputs(specs, 1)[0]);
  std::vector<state_map> files;
  for (const auto& r : z.ranks) files.push_back(saved_copy(r));
  auto sources = [](const std::vector<state_map>& maps) {
    std::vector<saved_partition> out;
    for (const auto& m : maps) out.push_back(optim::saved_partition_of(m));
    return out;
  };

  SUBCASE("a missing rank") {
    std::string e = index_error(sources({files[0], files[2]}));
    CHECK(contains(e, "bert.pooler.dense.weight")); // the tensor spanning ranks 0..2
    CHECK(contains(e, "missing"));
  }
  SUBCASE("a rank given twice") {
    CHECK(contains(index_error(sources({files[0], files[1], files[1], files[2]})), "overlaps"));
  }
  SUBCASE("step counts that differ") {
    auto changed = files;
    changed[2]["optimizer_step_count"] = changed[2]["optimizer_step_count"].clone();
    changed[2]["optimizer_step_count"].data<std::int64_t>()[0] = 7;
    std::string e = index_error(sources(changed));
    CHECK(contains(e, "rank 2 has step count 7"));
  }
  SUBCASE("no step count") {
    auto changed = files;
    changed[1].erase("optimizer_step_count");
    CHECK(contains(index_error(sources(changed)), "rank 1: no 'optimizer_step_count'"));
  }
  SUBCASE("unknown keys and bad ranges") {
    auto changed = files;
    changed[0]["foo"] = tensor::zeros({1}, dtype::f32);
    CHECK(contains(index_error(sources(changed)), "unknown key 'foo'"));
    changed = files;
    changed[0]["master.x[5:3]"] = tensor::zeros({1}, dtype::f32);
    CHECK(contains(index_error(sources(changed)), "'master.x[5:3]' has no valid [lo:hi] range"));
  }
  SUBCASE("shapes that disagree") {
    auto changed = files;
    tensor shape = tensor::empty({2}, dtype::i64);
    shape.data<std::int64_t>()[0] = 157;
    shape.data<std::int64_t>()[1] = 131;
    changed[1]["shape.bert.pooler.dense.weight"] = shape;
    CHECK(contains(index_error(sources(changed)), "has shape [157, 131] in rank"));
  }
  SUBCASE("a piece of the wrong size is found when read") {
    auto changed = files;
    std::string key;
    for (const auto& [k, t] : changed[1])
      if (k.rfind("master.bert.pooler.dense.weight[", 0) == 0) key = k;
    REQUIRE_FALSE(key.empty());
    changed[1][key] = tensor::zeros({3}, dtype::f32);
    saved_partitions saved = must_index(sources(changed));
    auto s = saved.partition(*layout, 1);
    REQUIRE_FALSE(s.has_value());
    CHECK(contains(s.err().message, key));
    CHECK(contains(s.err().message, "rank 1"));
  }
  SUBCASE("a layout that does not match the saved tensors") {
    saved_partitions saved = must_index(sources(files));
    auto fewer_specs = specs;
    fewer_specs.pop_back();
    auto fewer = flat_layout::create(fewer_specs, 2);
    REQUIRE(fewer.has_value());
    auto s = saved.partition(*fewer, 0);
    REQUIRE_FALSE(s.has_value());
    CHECK(contains(s.err().message, "'cls.predictions.bias' is not a parameter of this stage"));
    auto more_specs = specs;
    more_specs.push_back(optim::bert_flat_tensor("cls.seq_relationship.bias", {2}));
    auto more = flat_layout::create(more_specs, 2);
    REQUIRE(more.has_value());
    s = saved.partition(*more, 0);
    REQUIRE_FALSE(s.has_value());
    CHECK(contains(s.err().message, "no pieces of tensor 'cls.seq_relationship.bias'"));
    auto reshaped_specs = specs;
    reshaped_specs[0].shape = {61, 97};
    auto reshaped = flat_layout::create(reshaped_specs, 2);
    REQUIRE(reshaped.has_value());
    s = saved.partition(*reshaped, 0);
    REQUIRE_FALSE(s.has_value());
    CHECK(contains(s.err().message, "saved with shape [97, 61]"));
  }
}

namespace {

// A rank's file read as a file reader would be: shapes without data, and pieces by
// element range, counting the elements read; reading a whole f32 piece is counted apart.
struct counting_source {
  std::int64_t range_elements = 0, whole_piece_reads = 0;

  saved_partition over(state_map m) {
    auto held = std::make_shared<state_map>(std::move(m));
    saved_partition s;
    for (const auto& [key, t] : *held) s.keys.push_back(key);
    s.read = [this, held](const std::string& key) -> expected<tensor> {
      const tensor& t = held->at(key);
      if (t.type() == dtype::f32) ++whole_piece_reads;
      return t;
    };
    s.shape = [held](const std::string& key) -> expected<shape_t> { return held->at(key).shape(); };
    s.read_range = [this, held](const std::string& key, std::int64_t lo, std::int64_t hi) -> expected<tensor> {
      range_elements += hi - lo;
      return held->at(key).flatten().slice_rows(lo, hi).clone();
    };
    return s;
  }
};

} // namespace

TEST_CASE("a partition read by ranges reads only its own elements and equals the whole assembly bit for bit") {
  const auto specs = awkward_specs();
  const auto initial = initial_params(specs);
  const optimizer_config cfg = config_of(optimizer_type::adamw);
  std::int64_t stage_numel = 0;
  for (const auto& s : specs) stage_numel += shape_numel(s.shape);
  for (auto [old_ranks, new_ranks] : {std::pair<std::uint32_t, std::uint32_t>{4, 2}, {2, 4}}) {
    CAPTURE(old_ranks);
    CAPTURE(new_ranks);
    auto old_layout = flat_layout::create(specs, old_ranks);
    auto new_layout = flat_layout::create(specs, new_ranks);
    REQUIRE(old_layout.has_value());
    REQUIRE(new_layout.has_value());
    zero_group z(cfg, *old_layout, initial, dtype::f32);
    for (const auto& in : step_inputs(specs, 2)) z.step(in);

    // Today's whole path: assemble every tensor, then cut the partition from them.
    state_map whole;
    auto assembled = must_index(save_all(z)).assemble([&](const optim::assembled_tensor& t) -> status {
      whole["master." + t.name] = t.master;
      whole[t.name + ".exp_avg"] = t.exp_avg;
      whole[t.name + ".exp_avg_sq"] = t.exp_avg_sq;
      return {};
    });
    REQUIRE(assembled.has_value());
    tensor count = tensor::empty({1}, dtype::i64);
    count.data<std::int64_t>()[0] = 2;
    whole["optimizer_step_count"] = count;
    saved_partitions from_whole = must_index({optim::saved_partition_of(whole)});

    for (std::uint32_t r = 0; r < new_ranks; ++r) {
      CAPTURE(r);
      counting_source counter;
      std::vector<saved_partition> files;
      for (const auto& rank : z.ranks) files.push_back(counter.over(saved_copy(rank)));
      auto mine = must_index(std::move(files)).partition(*new_layout, r);
      REQUIRE_MESSAGE(mine.has_value(), mine.err().to_string());
      // Exactly the partition's elements of the three arrays, not the stage's.
      std::int64_t own = 0;
      for (const auto& p : new_layout->pieces(new_layout->partition(r))) own += p.count;
      CHECK(counter.range_elements == 3 * own);
      CHECK(counter.whole_piece_reads == 0);
      CHECK(own < stage_numel);
      auto expected_state = from_whole.partition(*new_layout, r);
      REQUIRE(expected_state.has_value());
      check_same_partition(*mine, *expected_state);
      CHECK(mine->step == 2);
    }
  }
}
