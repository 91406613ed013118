// BERT config: named sizes, parsing from the "model" table, key errors.
#include "models/bert/bert_config.hpp"

#include <doctest/doctest.h>

#include <string>

namespace {

using namespace dsa;

expected<bert::bert_config> parse(const std::string& text) {
  auto cfg = config::parse(text, "test.toml");
  REQUIRE(cfg.has_value());
  return bert::parse_bert_config(*cfg);
}

void check_error(const std::string& text, const std::string& needle) {
  auto r = parse(text);
  REQUIRE_FALSE(r.has_value());
  INFO(r.err().message);
  CHECK(r.err().message.find(needle) != std::string::npos);
}

} // namespace

TEST_CASE("bert config: named sizes") {
  struct row {
    bert::model_size size;
    std::int64_t layers, hidden, heads;
  };
  for (const row& r :
       {row{bert::model_size::tiny, 2, 128, 2}, row{bert::model_size::mini, 4, 256, 4},
        row{bert::model_size::small, 4, 512, 8}, row{bert::model_size::medium, 8, 512, 8},
        row{bert::model_size::base, 12, 768, 12}, row{bert::model_size::large, 24, 1024, 16}}) {
    const auto c = bert::bert_config_for(r.size);
    CHECK(c.num_layers == r.layers);
    CHECK(c.hidden_size == r.hidden);
    CHECK(c.num_heads == r.heads);
    CHECK(c.intermediate_size == 4 * r.hidden);
    CHECK(c.vocab_size == 30522);
    CHECK(c.validate().has_value());
  }
}

TEST_CASE("bert config: parse a size with overrides and flags") {
  auto c = parse(R"(
[model]
size = "tiny"
vocab_size = 1000
hidden_dropout = 0.2
layer_norm = "pre"
head = "squad"
normalize_invertible = true
gelu_checkpoint = true
)");
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.err().to_string()));
  CHECK(c->num_layers == 2);
  CHECK(c->hidden_size == 128);
  CHECK(c->intermediate_size == 512);
  CHECK(c->vocab_size == 1000);
  CHECK(c->hidden_dropout == doctest::Approx(0.2));
  CHECK(c->attention_dropout == doctest::Approx(0.1));
  CHECK(c->norm == bert::layer_norm_placement::pre);
  CHECK(c->head == bert::head_kind::squad);
  CHECK(c->memory.normalize_invertible);
  CHECK_FALSE(c->memory.attn_dropout_checkpoint);
  CHECK(c->memory.gelu_checkpoint);
  CHECK(bert::describe(*c).find("bert-tiny") == 0);

  auto custom =
      parse("[model]\nsize = \"custom\"\nnum_layers = 3\nhidden_size = 48\nnum_heads = 3\n");
  REQUIRE(custom.has_value());
  CHECK(custom->intermediate_size == 192);
  auto defaults = parse("[model]\n");
  REQUIRE(defaults.has_value());
  CHECK(defaults->hidden_size == 768);
  CHECK(defaults->norm == bert::layer_norm_placement::post);
}

TEST_CASE("bert config: errors name the key") {
  check_error("[model]\nsize = \"tiny\"\nhiden_size = 64\n", "model.hiden_size");
  check_error("[model]\nsize = \"tiny\"\nhiden_size = 64\n", "did you mean 'hidden_size'");
  check_error("[model]\nsize = \"huge\"\n", "unknown model size 'huge'");
  check_error("[model]\nsize = \"custom\"\nnum_layers = 2\n", "model.hidden_size");
  check_error("[model]\nlayer_norm = \"middle\"\n", "model.layer_norm");
  check_error("[model]\nhead = \"ner\"\n", "model.head");
  check_error("[model]\nnum_heads = \"twelve\"\n", "model.num_heads");
  check_error("[model]\nsize = \"tiny\"\nnum_heads = 3\n", "multiple of num_heads");
  check_error("[model]\nattention_dropout = 1.5\n", "attention_dropout");
}
