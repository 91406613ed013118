// Stage partitioning: balanced contiguous splits and DeepSpeed's partition methods.
#include "actors/train/config/layer_partition.hpp"

#include <doctest/doctest.h>

using namespace dsa;

TEST_CASE("balanced_split minimises the largest contiguous run") {
  CHECK(train::balanced_split({1, 1, 1, 1}, 2) == std::vector<std::size_t>{0, 2});
  CHECK(train::balanced_split({5, 1, 1, 1, 1, 1}, 2) == std::vector<std::size_t>{0, 1});
  CHECK(train::balanced_split({1, 2, 3, 4, 5}, 3) == std::vector<std::size_t>{0, 3, 4});
  CHECK(train::balanced_split({7}, 1) == std::vector<std::size_t>{0});
  CHECK(train::balanced_split({1, 1, 1}, 3) == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("uniform partition gives equal layer counts with embeddings first and head last") {
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::base);
  auto r = train::partition_layers(cfg, 4, "uniform");
  REQUIRE(r.has_value());
  REQUIRE(r->size() == 4);
  for (std::size_t s = 0; s < 4; ++s) {
    CHECK((*r)[s].layer_count() == 3);
    CHECK((*r)[s].has_embeddings() == (s == 0));
    CHECK((*r)[s].has_head() == (s == 3));
  }
  CHECK((*r)[3].last_layer == 12);
  auto t = train::partition_layers(cfg, 4, "type:BertLayer");
  REQUIRE(t.has_value());
  CHECK((*t)[1].first_layer == 3);
}

TEST_CASE("parameters partition gives the embedding stage fewer layers") {
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::base);
  auto r = train::partition_layers(cfg, 2, "parameters");
  REQUIRE(r.has_value());
  // Embeddings (~23.8M with 30522 x 768 words) and the head's tied copy (~24.4M) weigh about
  // as much as 3 layers (7.1M each): both ends lose layers equally, so the split stays 6/6.
  CHECK((*r)[0].layer_count() + (*r)[1].layer_count() == 12);
  bert::bert_config squad = cfg;
  squad.head = bert::head_kind::squad; // a light head: the embedding stage must get fewer layers
  auto q = train::partition_layers(squad, 2, "parameters");
  REQUIRE(q.has_value());
  CHECK((*q)[0].layer_count() < (*q)[1].layer_count());
}

TEST_CASE("bad partition settings name the key") {
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::tiny);
  auto many = train::partition_layers(cfg, 3, "uniform");
  REQUIRE_FALSE(many.has_value());
  CHECK(many.err().message.find("pipeline.stages") != std::string::npos);
  auto bad = train::partition_layers(cfg, 2, "balanced");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.find("pipeline.partition") != std::string::npos);
  auto nomatch = train::partition_layers(cfg, 2, "type:Embedding");
  REQUIRE_FALSE(nomatch.has_value());
}

TEST_CASE("layers:<counts> gives each stage the encoder layers named, and refuses counts that do not fit") {
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::base);
  cfg.num_layers = 6;
  auto r = train::partition_layers(cfg, 3, "layers:1,3,2");
  REQUIRE(r.has_value());
  CHECK(train::describe_layout(*r) == "embeddings + layers [0, 1) | layers [1, 4) | layers [4, 6) + head");
  for (const char* bad : {"layers:1,3", "layers:2,2,3", "layers:0,4,2", "layers:1,x,4", "layers:", "layers:1,,5"}) {
    CAPTURE(bad);
    auto e = train::partition_layers(cfg, 3, bad);
    REQUIRE_FALSE(e.has_value());
    CHECK(e.err().message.find("pipeline.partition") != std::string::npos);
  }
}

TEST_CASE("a checkpoint's saved layout text reads back into the same ranges, and bad text is named") {
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::base);
  cfg.num_layers = 6;
  for (std::uint32_t stages : {1u, 2u, 3u, 6u}) {
    CAPTURE(stages);
    auto r = train::partition_layers(cfg, stages, "uniform");
    REQUIRE(r.has_value());
    auto back = train::parse_layout(train::describe_layout(*r), cfg);
    REQUIRE(back.has_value());
    CHECK(train::describe_layout(*back) == train::describe_layout(*r));
    REQUIRE(back->size() == r->size());
    for (std::size_t s = 0; s < r->size(); ++s) {
      CHECK((*back)[s].first_layer == (*r)[s].first_layer);
      CHECK((*back)[s].last_layer == (*r)[s].last_layer);
      CHECK((*back)[s].has_embeddings() == (*r)[s].has_embeddings());
      CHECK((*back)[s].has_head() == (*r)[s].has_head());
    }
  }
  for (const char* bad : {"", "layers [0, 6)", "embeddings + layers [0, 3) | layers [3, 7) + head",
                          "embeddings + layers [0, 3) || layers [3, 6) + head", "embeddings + layers [0, 3 + head"}) {
    CAPTURE(bad);
    auto e = train::parse_layout(bad, cfg);
    REQUIRE_FALSE(e.has_value());
    CHECK(e.err().message.find("pipeline layout") != std::string::npos);
  }
}
