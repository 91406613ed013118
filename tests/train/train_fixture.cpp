// Tiny corpus and config for run tests.
#include "tests/train/train_fixture.hpp"

#include "tests/support/compare.hpp"

#include "actors/train/run/run_checkpoint.hpp"
#include "actors/train/run/trainer.hpp"
#include "core/philox.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace dsa::test {
namespace fs = std::filesystem;

temp_dir::temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "dsactor-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  REQUIRE(mkdtemp(buf.data()) != nullptr);
  path_ = buf.data();
}

temp_dir::~temp_dir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string write_tiny_corpus(const std::string& dir) {
  static const char* words[] = {"the", "river", "ran", "past", "old", "mill", "where", "children", "played",
                                "every", "summer", "and", "sang", "songs", "about", "green", "hills", "far",
                                "away", "from", "town", "market", "bread", "was", "warm", "sold", "early"};
  const int nwords = sizeof words / sizeof words[0];
  std::string corpus = dir + "/corpus";
  fs::create_directories(corpus);
  philox_stream rng{99, 0, 0, 0, 0};
  std::uint64_t k = 0;
  for (int d = 0; d < 24; ++d) {
    std::ofstream out(fmt::format("{}/doc{:02}.txt", corpus, d));
    for (int s = 0; s < 12; ++s) {
      int len = 5 + static_cast<int>(rng.uniform(k++) * 8);
      std::string sentence;
      for (int w = 0; w < len; ++w) {
        sentence += (w ? " " : "");
        sentence += words[static_cast<int>(rng.uniform(k++) * nwords) % nwords];
      }
      out << sentence << ".\n";
    }
  }
  return corpus;
}

std::string tiny_config(const std::string& dir, const std::string& extra) {
  return fmt::format(R"(train_batch_size = 8
train_micro_batch_size_per_gpu = 2
train_steps = 5
steps_per_print = 0
seed = 7
gradient_clipping = 1.0
run_dir = "{0}/run"

[model]
size = "custom"
num_layers = 4
hidden_size = 32
num_heads = 2
intermediate_size = 64
max_position_embeddings = 32
hidden_dropout = 0.0
attention_dropout = 0.0

[optimizer]
type = "AdamW"
params = {{ lr = 1e-3, weight_decay = 0.01 }}

[data.prepare]
corpus = "{1}"
out_dir = "{0}/data"
vocab_size = 160
seq_length = 32
max_predictions = 5
dupe_factor = 2
holdout_docs = 2
instances_per_shard = 128

[checkpoint]
dir = "{0}/ckpt"
{2}
)",
                     dir, write_tiny_corpus(dir), extra);
}

int run_config(const std::string& dir, const std::string& name, const std::string& config_text,
               const std::vector<std::string>& overrides, bool resume) {
  std::string path = dir + "/" + name + ".toml";
  std::ofstream(path) << config_text;
  train::run_request r;
  r.config_path = path;
  r.overrides = overrides;
  r.resume = resume;
  return train::run_training(r);
}

ckpt::loaded_checkpoint load_run_checkpoint(const std::string& checkpoint_dir, const std::string& which) {
  auto ck = ckpt::load_checkpoint(checkpoint_dir, which);
  REQUIRE_MESSAGE(ck.has_value(), (ck.has_value() ? "" : ck.err().message));
  return std::move(*ck);
}

void check_same_bits(const ckpt::tensor_groups& a, const ckpt::tensor_groups& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [group, tensors] : a) {
    REQUIRE(b.count(group) == 1);
    for (const auto& [name, t] : tensors) {
      INFO(group << "/" << name);
      REQUIRE(b.at(group).count(name) == 1);
      const auto& u = b.at(group).at(name);
      REQUIRE(u.nbytes() == t.nbytes());
      CHECK(std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0);
    }
  }
}

ckpt::tensor_groups whole_groups(const ckpt::loaded_checkpoint& ck) {
  ckpt::tensor_groups out;
  out["model"] = ck.groups.at("model");
  const auto stages = ck.manifest.state.at("stages").get<std::uint32_t>();
  for (std::uint32_t s = 0; s < stages; ++s) {
    auto st = train::optimizer_state_of(ck, s);
    REQUIRE_MESSAGE(st.has_value(), (st.has_value() ? "" : st.err().message));
    auto& group = out[fmt::format("optimizer_{}", s)];
    for (const auto& [name, t] : st->tensors) group[name] = t;
    tensor count = tensor::empty({1}, dtype::i64);
    count.data<std::int64_t>()[0] = st->step;
    group["optimizer_step_count"] = count;
  }
  return out;
}

void check_same_state(const ckpt::loaded_checkpoint& a, const ckpt::loaded_checkpoint& b) {
  check_same_bits(whole_groups(a), whole_groups(b));
}

void check_close_state(const ckpt::loaded_checkpoint& got, const ckpt::loaded_checkpoint& want, const tolerance& tol,
                       const tolerance& first_moments, const std::function<bool(const std::string&)>& skip) {
  const auto a = whole_groups(got), b = whole_groups(want);
  REQUIRE(a.size() == b.size());
  for (const auto& [group, tensors] : b) {
    REQUIRE(a.count(group) == 1);
    for (const auto& [name, t] : tensors) {
      INFO(group << ": " << name);
      REQUIRE(a.at(group).count(name) == 1);
      if (skip && skip(name)) continue;
      const tensor& u = a.at(group).at(name);
      REQUIRE(u.shape() == t.shape());
      REQUIRE(u.type() == t.type());
      const bool first_moment = name.find(".exp_avg") != std::string::npos && name.find(".exp_avg_sq") == std::string::npos;
      if (t.type() == dtype::f32)
        DSA_CHECK_CLOSE(u.data<float>(), t.data<float>(), t.numel(), first_moment ? first_moments : tol);
      else
        CHECK(std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0);
    }
  }
}

std::vector<double> run_losses(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(nlohmann::json::parse(line)["Train/Samples/train_loss"].get<double>());
  return out;
}

} // namespace dsa::test
