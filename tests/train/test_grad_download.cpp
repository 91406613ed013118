// The overlapped gradient download of a device stage (actors/train/stage/grad_download.hpp)
// against a fake copier: one ticket per part, one wait per ticket whoever asks first, each
// parameter finished once, a waiting reader never holding up the worker's next part, a
// failed copy named to every reader, nothing carried into the next step. And the map from
// a backward's parts to parameters (bert::parameters_finished_by) that the CPU and the GPU
// stage both report by.
#include "actors/train/stage/grad_download.hpp"
#include "models/bert/bert_part.hpp"
#include "models/bert/parameter_specs.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

using namespace dsa;

namespace {

struct fake_copier final : train::grad_copier {
  std::vector<std::pair<std::size_t, std::vector<std::size_t>>> enqueued;
  std::vector<std::size_t> waited;
  std::function<void(std::size_t)> on_wait; // runs inside wait (a latch, a throw)
  void enqueue(std::size_t ticket, const std::vector<std::size_t>& indices) override {
    enqueued.emplace_back(ticket, indices);
  }
  void wait(std::size_t ticket) override {
    waited.push_back(ticket);
    if (on_wait) on_wait(ticket);
  }
};

struct finishes {
  std::mutex mutex;
  std::vector<std::size_t> order;
  std::function<void(std::size_t)> fn() {
    return [this](std::size_t i) {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(i);
    };
  }
};

} // namespace

TEST_CASE("grad download: a ticket per part, one wait per ticket, each parameter finished once") {
  fake_copier copier;
  finishes done;
  train::grad_download d(6, done.fn());
  d.begin_step();
  CHECK_FALSE(d.ready(5, copier)); // nothing enqueued: the caller downloads the whole set
  d.final_on_device({4, 5}, copier);
  d.final_on_device({2, 3}, copier);
  CHECK_FALSE(d.all_enqueued());
  d.final_on_device({0, 1}, copier);
  CHECK(d.all_enqueued());
  REQUIRE(copier.enqueued.size() == 3);
  CHECK(copier.enqueued[0] == std::pair<std::size_t, std::vector<std::size_t>>{0, {4, 5}});
  CHECK(copier.enqueued[2].first == 2);
  CHECK(d.ready(5, copier));
  CHECK(d.ready(4, copier));
  CHECK(d.ready(0, copier));
  CHECK(copier.waited == std::vector<std::size_t>{0, 2});
  CHECK(done.order == std::vector<std::size_t>{4, 5, 0, 1});
  CHECK(d.waits() == 2);
  // A parameter twice in a step is a bug of the caller.
  CHECK_THROWS_AS(d.final_on_device({3}, copier), std::logic_error);
  CHECK_THROWS_AS(d.final_on_device({6}, copier), std::logic_error);
  // The next step starts with nothing on the host: tickets count from 0 again.
  d.begin_step();
  CHECK_FALSE(d.ready(4, copier));
  CHECK(d.tickets() == 0);
  d.final_on_device({3}, copier);
  CHECK(copier.enqueued.back().first == 0);
}

TEST_CASE("grad download: a reader waiting for a ticket does not hold up the worker's next part") {
  fake_copier copier;
  finishes done;
  train::grad_download d(4, done.fn());
  d.begin_step();
  std::promise<void> inside, release;
  std::shared_future<void> released = release.get_future().share();
  copier.on_wait = [&](std::size_t) {
    inside.set_value();
    released.wait();
  };
  d.final_on_device({2, 3}, copier);
  std::future<bool> reader = std::async(std::launch::async, [&] { return d.ready(3, copier); });
  inside.get_future().wait(); // the reader is inside the copier's wait for ticket 0
  d.final_on_device({0, 1}, copier); // the worker goes on meanwhile
  CHECK(copier.enqueued.size() == 2);
  // A second reader of the same ticket waits for the first one's result, not the copier.
  std::future<bool> second = std::async(std::launch::async, [&] { return d.ready(2, copier); });
  release.set_value();
  CHECK(reader.get());
  CHECK(second.get());
  CHECK(copier.waited == std::vector<std::size_t>{0});
  std::multiset<std::size_t> finished(done.order.begin(), done.order.end());
  CHECK(finished == std::multiset<std::size_t>{2, 3});
}

TEST_CASE("grad download: a failed copy is every reader's error, and nothing is finished") {
  fake_copier copier;
  finishes done;
  train::grad_download d(2, done.fn());
  d.begin_step();
  copier.on_wait = [](std::size_t) { throw std::runtime_error("CUDA stage: the gradient copies failed: an illegal address"); };
  d.final_on_device({0, 1}, copier);
  CHECK_THROWS_WITH(d.ready(0, copier), "CUDA stage: the gradient copies failed: an illegal address");
  CHECK_THROWS_WITH(d.ready(1, copier), "CUDA stage: the gradient copies failed: an illegal address");
  CHECK(copier.waited.size() == 1);
  CHECK(done.order.empty());
}

TEST_CASE("parameters_finished_by: every parameter of a range belongs to exactly one part of its backward; "
          "parameters_read_by adds the tied word embedding to the pre-training head") {
  for (const bert::layer_norm_placement norm : {bert::layer_norm_placement::post, bert::layer_norm_placement::pre})
    for (const bert::head_kind head : {bert::head_kind::pretraining, bert::head_kind::squad}) {
      bert::bert_config cfg = bert::bert_config_for(bert::model_size::tiny);
      cfg.num_layers = 3;
      cfg.norm = norm;
      cfg.head = head;
      for (const bert::bert_range& range :
           {bert::bert_range::whole(cfg), bert::bert_range::layers(0, 1).with_embeddings(), bert::bert_range::layers(1, 2),
            bert::bert_range::layers(2, 3).with_head()}) {
        CAPTURE(range.to_string());
        const bert::bert_parameters params(cfg, range);
        std::vector<std::int64_t> parts;
        if (range.has_head()) parts.push_back(bert::backward_options::head_done);
        for (std::int64_t l = range.last_layer; l-- > range.first_layer;) parts.push_back(l);
        if (range.has_embeddings()) parts.push_back(bert::backward_options::embeddings_done);
        std::map<std::size_t, int> owners;
        for (std::int64_t part : parts)
          for (std::size_t i : bert::parameters_finished_by(params, part)) ++owners[i];
        CHECK(owners.size() == params.entries().size());
        for (const auto& [i, n] : owners) CHECK(n == 1);
        // The word embedding is final only after the embeddings' backward where the range has them.
        if (range.has_embeddings()) {
          bool found = false;
          for (std::size_t i : bert::parameters_finished_by(params, bert::backward_options::embeddings_done))
            found = found || params.entries()[i].spec.name == bert::word_embeddings_name();
          CHECK(found);
        }
        // What a part reads: the same, but the pre-training head also reads the tied word
        // embedding (once, where the range's last stage holds its own copy too).
        for (std::int64_t part : parts) {
          auto read = bert::parameters_read_by(params, part);
          auto finished = bert::parameters_finished_by(params, part);
          if (part == bert::backward_options::head_done && head == bert::head_kind::pretraining) {
            std::size_t words = 0;
            for (std::size_t i : read) words += params.entries()[i].spec.name == bert::word_embeddings_name();
            CHECK(words == 1);
            if (range.has_embeddings()) CHECK(read.size() == finished.size() + 1);
            else CHECK(read == finished); // the last stage's tied copy is the head's own
          } else {
            CHECK(read == finished);
          }
        }
      }
    }
}
