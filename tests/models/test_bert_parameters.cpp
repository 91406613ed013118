// HF names, counts and shapes; deterministic init; state export and load
// (HF extras, half precision, old names, errors naming the tensor).
#include "tests/models/bert_fixture.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/tolerances.hpp"

#include "core/file_backed.hpp"
#include "core/half.hpp"
#include "models/bert/bert_state.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <set>

namespace {

using namespace dsa;
using bert::head_kind;
using bert::layer_norm_placement;

shape_t shape_of(const std::vector<bert::param_spec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (s.name == name)
      return s.shape;
  FAIL("no parameter " << name);
  return {};
}

std::map<std::string, tensor> cloned(const std::map<std::string, tensor>& dict) {
  std::map<std::string, tensor> out;
  for (const auto& [k, v] : dict)
    out.emplace(k, v.clone());
  return out;
}

tensor to_half(const tensor& t, dtype type) {
  tensor out = tensor::empty(t.shape(), type);
  const float* in = t.data<float>();
  std::uint16_t* o = out.data<std::uint16_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    o[i] = type == dtype::f16 ? f32_to_f16(in[i]) : f32_to_bf16(in[i]);
  return out;
}

} // namespace

TEST_CASE("bert parameters: bert-base has HF's names, shapes and counts") {
  bert::bert_config base = bert::bert_config_for(bert::model_size::base);
  const auto specs = bert::parameter_specs(base, bert::bert_range::whole(base));
  // HF BertForPreTraining.named_parameters() (tied decoder counted once): 5 embedding
  // tensors, 16 per layer, pooler 2, transform 2 + 2, predictions.bias, seq_relationship 2.
  CHECK(specs.size() == 5 + 16 * 12 + 2 + 4 + 1 + 2);
  // 109,482,240 for BertModel plus the pretraining heads' 624,188.
  CHECK(bert::parameter_count(specs) == 110106428);
  CHECK(shape_of(specs, "bert.embeddings.word_embeddings.weight") == shape_t{30522, 768});
  CHECK(shape_of(specs, "bert.encoder.layer.11.intermediate.dense.weight") == shape_t{3072, 768});
  CHECK(shape_of(specs, "bert.encoder.layer.0.output.dense.weight") == shape_t{768, 3072});
  CHECK(shape_of(specs, "cls.predictions.bias") == shape_t{30522});
  CHECK(shape_of(specs, "cls.seq_relationship.weight") == shape_t{2, 768});
  std::set<std::string> names;
  for (const auto& s : specs)
    names.insert(s.name);
  CHECK(names.size() == specs.size());
  CHECK(names.count("cls.predictions.decoder.weight") == 0);

  base.head = head_kind::squad; // BertForQuestionAnswering: no pooler, qa_outputs
  const auto squad = bert::parameter_specs(base, bert::bert_range::whole(base));
  CHECK(bert::parameter_count(squad) == 108893186);
  CHECK(shape_of(squad, "qa_outputs.weight") == shape_t{2, 768});
  for (const auto& s : squad)
    CHECK(s.name.rfind("bert.pooler", 0) != 0);

  bert::bert_config large = bert::bert_config_for(bert::model_size::large);
  CHECK(bert::parameter_count(bert::parameter_specs(large, bert::bert_range::whole(large))) ==
        336226108);
  base.head = head_kind::pretraining;
  base.norm = layer_norm_placement::pre;
  const auto pre = bert::parameter_specs(base, bert::bert_range::whole(base));
  CHECK(shape_of(pre, "bert.encoder.final_layernorm.weight") == shape_t{768});
}

TEST_CASE("bert init: normal(0, initializer_range), zero biases, unit LayerNorm, zero pad row") {
  bert::bert_config cfg = test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  cfg.vocab_size = 2000;
  bert::bert_parameters p(cfg, bert::bert_range::whole(cfg));
  p.init(1);
  const auto& word = p.find(bert::word_embeddings_name())->value;
  double sum = 0.0, sq = 0.0;
  const float* w = word.data<float>();
  for (std::int64_t i = 16; i < word.numel(); ++i) {
    sum += w[i];
    sq += double(w[i]) * w[i];
  }
  const double n = static_cast<double>(word.numel() - 16);
  CHECK(std::fabs(sum / n) < 1e-3);
  CHECK(std::sqrt(sq / n) == doctest::Approx(0.02).epsilon(0.02));
  for (int c = 0; c < 16; ++c)
    CHECK(w[c] == 0.0f); // pad_token_id 0
  CHECK(p.find("bert.encoder.layer.1.attention.self.key.bias")->value.data<float>()[3] == 0.0f);
  CHECK(p.find("bert.encoder.layer.1.output.LayerNorm.weight")->value.data<float>()[3] == 1.0f);
  bert::bert_parameters again(cfg, bert::bert_range::whole(cfg));
  again.init(1);
  CHECK(std::equal(w, w + word.numel(),
                   again.find(bert::word_embeddings_name())->value.data<float>()));
  again.init(2);
  CHECK_FALSE(std::equal(w, w + word.numel(),
                         again.find(bert::word_embeddings_name())->value.data<float>()));
}

// ZeRO-3's start-up on NVMe builds a stage's weights in a file (bert_parameters'
// value_maker): the same values as in memory, in f32 and bf16, and none of their pages left
// resident after init or a load (each tensor paged out once written).
TEST_CASE("bert init and load into values made in a file: the same values, paged out") {
  bert::bert_config cfg = test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  cfg.vocab_size = 2000;
  char tmpl[] = "bert_values_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  struct statfs fs_info {};
  // Residency (mincore) is checked on ext4 and XFS only: tmpfs keeps its pages, overlay and
  // network file systems cache their own way (the values are checked everywhere).
  const bool checked = ::statfs(dir.c_str(), &fs_info) == 0 &&
                       (fs_info.f_type == EXT4_SUPER_MAGIC || fs_info.f_type == XFS_SUPER_MAGIC);
  for (const dtype type : {dtype::f32, dtype::bf16}) {
    CAPTURE(dtype_name(type));
    auto arena = file_backed_zeros(dir + "/values.swp", 64 << 20, dtype::u8);
    REQUIRE(arena.has_value());
    std::int64_t at = 0;
    const bert::bert_parameters::value_maker make = [&](const bert::param_spec& spec, dtype t) {
      tensor v = tensor::from_storage(arena->storage_ptr(), static_cast<std::size_t>(at), spec.shape, t);
      at += (static_cast<std::int64_t>(v.nbytes()) + 4095) / 4096 * 4096;
      return v;
    };
    bert::bert_parameters in_file(cfg, bert::bert_range::whole(cfg), type, false, make);
    bert::bert_parameters in_memory(cfg, bert::bert_range::whole(cfg), type, false);
    REQUIRE(at <= arena->numel());
    in_file.init(5);
    in_memory.init(5);
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    auto resident = [&] {
      const std::size_t pages = (static_cast<std::size_t>(at) + page - 1) / page;
      std::vector<unsigned char> v(pages);
      REQUIRE(::mincore(arena->raw_data(), pages * page, v.data()) == 0);
      std::size_t n = 0;
      for (unsigned char c : v) n += c & 1;
      return n;
    };
    if (checked) CHECK(resident() == 0);
    for (std::size_t i = 0; i < in_file.entries().size(); ++i) {
      const tensor& a = in_file.entries()[i].value;
      const tensor& b = in_memory.entries()[i].value;
      CHECK(is_file_backed(a));
      CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
    }
    bert::bert_parameters other(cfg, bert::bert_range::whole(cfg), type, false);
    other.init(6);
    REQUIRE(bert::load_state(in_file, bert::state(other)).has_value());
    if (checked) CHECK(resident() == 0);
    for (std::size_t i = 0; i < in_file.entries().size(); ++i)
      CHECK(std::memcmp(in_file.entries()[i].value.raw_data(), other.entries()[i].value.raw_data(),
                        other.entries()[i].value.nbytes()) == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("bert state: export and load round trip; HF extras, f16/bf16 and old names accepted") {
  const bert::bert_config cfg =
      test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  bert::bert_parameters src(cfg, bert::bert_range::whole(cfg));
  src.init(3);
  auto dict = cloned(bert::state(src));
  CHECK(dict.size() == src.entries().size());
  CHECK(dict.count("cls.predictions.decoder.weight") == 0);

  bert::bert_parameters dst(cfg, bert::bert_range::whole(cfg));
  auto report = bert::load_state(dst, dict);
  REQUIRE_MESSAGE(report.has_value(), (report ? "" : report.err().to_string()));
  CHECK(report->loaded.size() == dst.entries().size());
  for (const auto& e : dst.entries())
    CHECK(std::equal(e.value.data<float>(), e.value.data<float>() + e.value.numel(),
                     src.find(e.spec.name)->value.data<float>()));

  // As HF writes it: tied duplicates, buffers, an old LayerNorm name, half precision.
  auto hf = cloned(dict);
  hf["cls.predictions.decoder.weight"] = dict.at(bert::word_embeddings_name()).clone();
  hf["cls.predictions.decoder.bias"] = dict.at("cls.predictions.bias").clone();
  hf["bert.embeddings.position_ids"] = tensor::zeros({1, 16}, dtype::i64);
  hf["bert.embeddings.LayerNorm.gamma"] = hf.at("bert.embeddings.LayerNorm.weight");
  hf.erase("bert.embeddings.LayerNorm.weight");
  const std::string q = "bert.encoder.layer.0.attention.self.query.weight";
  hf[q] = to_half(dict.at(q), dtype::f16);
  const std::string ffn = "bert.encoder.layer.1.intermediate.dense.weight";
  hf[ffn] = to_half(dict.at(ffn), dtype::bf16);
  bert::bert_parameters dst2(cfg, bert::bert_range::whole(cfg));
  report = bert::load_state(dst2, hf);
  REQUIRE_MESSAGE(report.has_value(), (report ? "" : report.err().to_string()));
  CHECK(report->ignored.size() == 3);
  DSA_CHECK_CLOSE(dst2.find(q)->value.data<float>(), dict.at(q).data<float>(), dict.at(q).numel(),
                  test::f16_roundtrip);
  DSA_CHECK_CLOSE(dst2.find(ffn)->value.data<float>(), dict.at(ffn).data<float>(),
                  dict.at(ffn).numel(), test::bf16_roundtrip);
}

TEST_CASE("bert state: errors name the missing, mis-shaped, untied or unexpected tensor") {
  const bert::bert_config cfg =
      test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  bert::bert_parameters p(cfg, bert::bert_range::whole(cfg));
  p.init(3);
  const auto good = cloned(bert::state(p));
  auto expect_error = [&](const std::map<std::string, tensor>& dict, const std::string& needle) {
    bert::bert_parameters dst(cfg, bert::bert_range::whole(cfg));
    auto r = bert::load_state(dst, dict);
    REQUIRE_FALSE(r.has_value());
    INFO(r.err().message);
    CHECK(r.err().message.find(needle) != std::string::npos);
    // Nothing is written on error.
    CHECK(dst.find("bert.encoder.layer.0.attention.self.query.weight")->value.data<float>()[0] ==
          0.0f);
  };
  auto missing = good;
  missing.erase("bert.encoder.layer.1.output.dense.bias");
  expect_error(missing, "missing tensor 'bert.encoder.layer.1.output.dense.bias'");
  auto wrong = good;
  wrong["cls.seq_relationship.weight"] = tensor::zeros({3, 16}, dtype::f32);
  expect_error(wrong, "'cls.seq_relationship.weight' has shape [3, 16]");
  auto ints = good;
  ints["bert.pooler.dense.bias"] = tensor::zeros({16}, dtype::i32);
  expect_error(ints, "'bert.pooler.dense.bias' has dtype i32");
  auto untied = good;
  untied["cls.predictions.decoder.weight"] = tensor::zeros({50, 16}, dtype::f32);
  expect_error(untied, "cls.predictions.decoder.weight");
  auto extra = good;
  extra["bert.encoder.layer.7.output.dense.bias"] = tensor::zeros({16}, dtype::f32);
  expect_error(extra, "unexpected tensor 'bert.encoder.layer.7.output.dense.bias'");
}

TEST_CASE("bert state: SQuAD fine-tuning from a pretraining dict; a stage loads only its range") {
  const bert::bert_config pre_cfg =
      test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  bert::bert_parameters pretrained(pre_cfg, bert::bert_range::whole(pre_cfg));
  pretrained.init(8);
  const auto dict = cloned(bert::state(pretrained));

  const bert::bert_config squad_cfg =
      test::small_bert(layer_norm_placement::post, head_kind::squad);
  bert::bert_parameters squad(squad_cfg, bert::bert_range::whole(squad_cfg));
  auto strict = bert::load_state(squad, dict);
  REQUIRE_FALSE(strict.has_value());
  CHECK(strict.err().message.find("qa_outputs.weight") != std::string::npos);
  bert::load_options lenient;
  lenient.head = bert::missing_head::keep_current;
  auto r = bert::load_state(squad, dict, lenient);
  REQUIRE(r.has_value());
  CHECK(r->kept == std::vector<std::string>{"qa_outputs.weight", "qa_outputs.bias"});

  // The last pipeline stage of a pretraining model: its layer, head, and the tied copy.
  bert::bert_parameters last(pre_cfg, bert::bert_range::layers(1, 2).with_head());
  r = bert::load_state(last, dict);
  REQUIRE(r.has_value());
  CHECK(r->loaded.size() == last.entries().size());
  const auto& word = last.find(bert::word_embeddings_name())->value;
  CHECK(std::equal(word.data<float>(), word.data<float>() + word.numel(),
                   dict.at(bert::word_embeddings_name()).data<float>()));
  CHECK(bert::state(last).count(bert::word_embeddings_name()) == 0); // the copy is not exported
}
