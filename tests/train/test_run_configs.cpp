// Shipped configs parse; DeepSpeed JSON configs are accepted; fp16 overflow
// skips steps, lowers the scale and leaves the LR schedule where it was;
// wall_clock_breakdown adds its timing columns to the metrics.
#include "actors/train/data/data_prepare.hpp"
#include "actors/train/stage/model_stage.hpp"
#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/run_config.hpp"
#include "io/data/shard_reader.hpp"
#include "tests/train/train_fixture.hpp"
#include "actors/train/run/trainer.hpp"
#include "tools/bench/bench_util.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace dsa;

TEST_CASE("every config in configs/ parses") {
  setenv("BERT_LARGE", "/nonexistent/bert-large", 1);
  setenv("SQUAD", "/nonexistent/squad", 1);
  setenv("SHARDS", "/nonexistent/shards", 1);
  setenv("BERT_VOCAB", "/nonexistent/vocab.txt", 1);
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(DSA_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    ++seen;
    INFO(entry.path().string());
    auto cfg = train::load_run_config(entry.path().string());
    REQUIRE_MESSAGE(cfg.has_value(), (cfg.has_value() ? "" : cfg.err().message));
    auto rc = train::parse_run_config(*cfg, "runs/x");
    CHECK_MESSAGE(rc.has_value(), (rc.has_value() ? "" : rc.err().message));
  }
  CHECK(seen >= 5);
}

TEST_CASE("a DeepSpeed JSON config supplies keys the TOML does not set") {
  test::temp_dir dir;
  std::ofstream(dir.path() + "/ds.json") << R"({
    "train_batch_size": 16, "gradient_accumulation_steps": 4,
    "optimizer": {"type": "Adam", "params": {"lr": 5e-4, "weight_decay": 0.0}},
    "fp16": {"enabled": false}, "steps_per_print": 7, "wall_clock_breakdown": false, "zero_allow": null
  })";
  std::ofstream(dir.path() + "/run.toml") << "deepspeed_config = \"ds.json\"\nsteps_per_print = 3\ntrain_steps = 1\n"
                                              "[model]\nsize = \"tiny\"\n[data]\nvocab = \"v.txt\"\ntrain_shards = \"s\"\n";
  auto cfg = train::load_run_config(dir.path() + "/run.toml");
  REQUIRE_MESSAGE(cfg.has_value(), (cfg.has_value() ? "" : cfg.err().message));
  auto rc = train::parse_run_config(*cfg, "runs/x");
  REQUIRE_MESSAGE(rc.has_value(), (rc.has_value() ? "" : rc.err().message));
  CHECK(rc->batch.train_batch_size == 16);
  CHECK(rc->batch.micro_batch_size == 4);
  CHECK(rc->optimizer.lr == doctest::Approx(5e-4));
  CHECK(rc->steps_per_print == 3); // the TOML wins
  // An unknown DeepSpeed key is named like any other.
  std::ofstream(dir.path() + "/bad.json")
      << R"({"train_batch_size": 16, "optimizer": {"type": "Adam"}, "zero_optimisation": {"stage": 1}})";
  auto bad = train::load_run_config(dir.path() + "/run.toml", dir.path() + "/bad.json");
  REQUIRE(bad.has_value());
  auto rejected = train::parse_run_config(*bad, "runs/x");
  REQUIRE_FALSE(rejected.has_value());
  CHECK(rejected.err().message.find("zero_optimisation.stage") != std::string::npos);
  CHECK(rejected.err().message.find("bad.json") != std::string::npos); // where the key came from
  // A number too large for a double (the fuzzer's find: it threw past the parse-error catch and
  // ended the process) and broken JSON are errors naming the file.
  for (const char* text : {R"({"train_batch_size": 5e99999999999999999999999999999999999999})", R"({"a": )"}) {
    CAPTURE(text);
    std::ofstream(dir.path() + "/huge.json", std::ios::trunc) << text;
    auto huge = train::load_run_config(dir.path() + "/run.toml", dir.path() + "/huge.json");
    REQUIRE_FALSE(huge.has_value());
    CHECK(huge.err().message.find("huge.json: invalid JSON") != std::string::npos);
  }
}

TEST_CASE("a DeepSpeed JSON optimizer of another type does not lend its params to the TOML's") {
  test::temp_dir dir;
  // bing_bert's Lamb section under a TOML that asks for AdamW: max_coeff would be unknown to AdamW.
  std::ofstream(dir.path() + "/ds.json") << R"({
    "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "prescale_gradients": false,
    "optimizer": {"type": "Lamb", "params": {"lr": 11e-3, "bias_correction": false, "max_coeff": 0.3}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 7}}
  })";
  std::ofstream(dir.path() + "/run.toml") << "deepspeed_config = \"ds.json\"\ntrain_steps = 1\n"
                                              "[optimizer]\ntype = \"AdamW\"\nparams = { lr = 1e-3 }\n"
                                              "[scheduler.params]\nwarmup_max_lr = 2e-3\n"
                                              "[model]\nsize = \"tiny\"\n[data]\nvocab = \"v.txt\"\ntrain_shards = \"s\"\n";
  auto cfg = train::load_run_config(dir.path() + "/run.toml");
  REQUIRE_MESSAGE(cfg.has_value(), (cfg.has_value() ? "" : cfg.err().message));
  auto rc = train::parse_run_config(*cfg, "runs/x");
  REQUIRE_MESSAGE(rc.has_value(), (rc.has_value() ? "" : rc.err().message));
  CHECK(rc->optimizer.lr == doctest::Approx(1e-3));
  CHECK(rc->optimizer.max_coeff != doctest::Approx(0.3)); // Lamb's params were not merged
  // With one replica the data-parallel averaging keys change nothing and are accepted;
  // a ZeRO stage that does not exist is refused by name, in the JSON file.
  std::ofstream(dir.path() + "/zero.json") << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
    "gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 4, "overlap_comm": true}})";
  auto zero = train::load_run_config(dir.path() + "/run.toml", dir.path() + "/zero.json");
  REQUIRE(zero.has_value());
  auto refused = train::parse_run_config(*zero, "runs/x");
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("zero_optimization.stage") != std::string::npos);
  CHECK(refused.err().message.find("zero.json") != std::string::npos);
  // The scheduler section has no type in the TOML: the JSON's type and params merge under it.
  CHECK(*cfg->get<std::string>("scheduler.type") == "WarmupLR");
  CHECK(*cfg->get<std::int64_t>("scheduler.params.warmup_num_steps") == 7);
  CHECK(*cfg->get<double>("scheduler.params.warmup_max_lr") == doctest::Approx(2e-3));
}

namespace {
std::vector<nlohmann::json> metrics_rows(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}
} // namespace

TEST_CASE("fp16 overflow skips the step, halves the scale and does not advance the schedule") {
  test::temp_dir a, b;
  std::vector<std::string> common{"fp16.enabled=true", "train_steps=10", "scheduler.type=\"WarmupLR\"",
                                  "scheduler.params.warmup_num_steps=5", "scheduler.params.warmup_min_lr=1e-4",
                                  "scheduler.params.warmup_type=\"linear\""};
  auto high = common;
  high.push_back("fp16.initial_scale_power=24");
  auto low = common;
  low.push_back("fp16.initial_scale_power=4");
  REQUIRE(test::run_config(a.path(), "a", test::tiny_config(a.path()), high) == 0);
  REQUIRE(test::run_config(b.path(), "b", test::tiny_config(b.path()), low) == 0);
  auto ra = metrics_rows(a.path() + "/run"), rb = metrics_rows(b.path() + "/run");
  REQUIRE(ra.size() == 10);
  REQUIRE(rb.size() == 10);
  int skipped = 0;
  double scale = 16777216.0;
  std::vector<double> lrs;
  for (const auto& row : ra) {
    if (row["Train/Samples/skipped"].get<double>() > 0) {
      ++skipped;
      scale /= 2;
      CHECK(row["Train/Samples/loss_scale"].get<double>() == scale); // logged after the update, as DeepSpeed
    } else {
      lrs.push_back(row["Train/Samples/lr"].get<double>());
    }
  }
  CHECK(skipped >= 2);
  CHECK(ra.front()["Train/Samples/skipped"].get<double>() == 1.0);
  // The schedule advanced only on applied steps: their lrs are the no-overflow run's first lrs.
  for (std::size_t i = 0; i < lrs.size(); ++i) CHECK(lrs[i] == rb[i]["Train/Samples/lr"].get<double>());
  for (const auto& row : rb) CHECK(row["Train/Samples/skipped"].get<double>() == 0.0);
}

TEST_CASE("epochs set the run length from the data: ceil(epochs x sequences / train_batch_size) steps") {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "ep", test::tiny_config(dir.path()), {"train_steps=0", "epochs=0.25"}) == 0);
  auto shards = train::list_shards(dir.path() + "/data/train");
  REQUIRE(shards.has_value());
  auto reader = data::shard_reader::open(*shards, {});
  REQUIRE(reader.has_value());
  const auto expected_steps =
      static_cast<std::uint64_t>(std::ceil(0.25 * static_cast<double>(reader->instances_per_epoch()) / 8.0));
  auto ck = test::load_run_checkpoint(dir.path() + "/ckpt", "latest");
  CHECK(ck.manifest.step == expected_steps);
  CHECK(metrics_rows(dir.path() + "/run").size() == expected_steps);
}

TEST_CASE("wall_clock_breakdown adds DeepSpeed's elapsed_time_ms_* columns to the metrics; off, none") {
  for (bool breakdown : {false, true}) {
    CAPTURE(breakdown);
    test::temp_dir dir;
    REQUIRE(test::run_config(dir.path(), "wcb", test::tiny_config(dir.path()),
                             {"train_steps=3", fmt::format("wall_clock_breakdown={}", breakdown)}) == 0);
    const auto rows = metrics_rows(dir.path() + "/run");
    REQUIRE(rows.size() == 3);
    for (const auto& row : rows) {
      double forward = 0, backward = 0, update = 0, iteration = 0;
      for (auto [key, out] : {std::pair{"forward", &forward}, std::pair{"backward", &backward},
                              std::pair{"step", &update}, std::pair{"iteration", &iteration}}) {
        const std::string name = std::string("Train/Samples/elapsed_time_ms_") + key;
        REQUIRE(row.contains(name) == breakdown);
        if (breakdown) *out = row[name].get<double>();
      }
      if (!breakdown) continue;
      // Each part is real work (no bound between them: the next forward may overlap the report).
      CHECK(forward > 0);
      CHECK(backward > 0);
      CHECK(update > 0);
      CHECK(iteration > 0);
    }
  }
}

// The next step's forwards may run before a step's figures are taken (its report waits for the
// hooks): each step's time is counted apart, so neither row takes the other's.
TEST_CASE("wall_clock_breakdown's stage timers count each step apart") {
  train::stage_shared shared;
  shared.add(3, train::stage_shared::phase::forward, 5'000'000);
  shared.add(4, train::stage_shared::phase::forward, 7'000'000); // step 4 started early
  shared.add(3, train::stage_shared::phase::backward, 11'000'000);
  shared.optimizer_ns += 2'000'000;
  const auto three = train::take_stage_times(shared, 3);
  CHECK(three == std::vector<double>{5.0, 11.0, 2.0});
  shared.add(4, train::stage_shared::phase::backward, 1'000'000);
  CHECK(train::take_stage_times(shared, 4) == std::vector<double>{7.0, 1.0, 0.0});
  CHECK(train::take_stage_times(shared, 3) == std::vector<double>{0.0, 0.0, 0.0}); // taken once
  // A step never taken (a run's end) gives its slot to the step 8 later.
  shared.add(5, train::stage_shared::phase::forward, 1'000'000);
  shared.add(13, train::stage_shared::phase::forward, 4'000'000);
  CHECK(train::take_stage_times(shared, 13) == std::vector<double>{4.0, 0.0, 0.0});
}

// dsactor bench train --task squad's made-up QA set (tools/bench/bench_util.hpp), run here on
// the CPU with a tiny model: every question is one window at the run's sequence length, the
// answer is where answer_start says, and the run trains on it.
TEST_CASE("the SQuAD bench's made-up QA set loads as one window per question and trains") {
  test::temp_dir dir;
  const std::string qa = tools::write_squad_set(dir.path() + "/qa", 12, 64);
  const auto set = nlohmann::json::parse(std::ifstream(qa + "/qa-train.json"));
  const auto& paragraphs = set["data"][0]["paragraphs"];
  REQUIRE(paragraphs.size() == 12);
  for (const auto& p : paragraphs) {
    const std::string context = p["context"];
    const auto& answer = p["qas"][0]["answers"][0];
    const std::string text = answer["text"];
    CHECK(context.substr(answer["answer_start"].get<std::size_t>(), text.size()) == text);
  }
  std::ofstream(dir.path() + "/squad.toml") << fmt::format(R"(train_batch_size = 4
train_steps = 2
run_dir = "{0}/run"
[model]
size = "tiny"
max_position_embeddings = 64
head = "squad"
[optimizer]
type = "AdamW"
[data]
vocab = "{1}/qa-vocab.txt"
train_file = "{1}/qa-train.json"
max_seq_length = 64
doc_stride = 32
max_query_length = 16
)",
                                                             dir.path(), qa);
  train::run_request r;
  r.config_path = dir.path() + "/squad.toml";
  CHECK(train::run_training(r) == 0);
  CHECK(test::run_losses(dir.path() + "/run").size() == 2);
}
