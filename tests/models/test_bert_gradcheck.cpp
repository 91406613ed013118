// Whole-model gradient check: every parameter tensor's analytic gradient against
// central differences of the f32 forward, for post-/pre-LN and both heads.
#include "tests/models/bert_fixture.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace {

using namespace dsa;
using bert::head_kind;
using bert::layer_norm_placement;

// Elements to probe: rows the batch really uses for the embedding tables (for the
// tied word embedding: input ids, MLM labels and ids that are both), else a spread.
std::vector<std::int64_t> probes(const bert::bert_parameters::entry& e) {
  const std::int64_t n = e.value.numel(), c = e.spec.shape.back();
  std::vector<std::int64_t> rows;
  if (e.spec.name == bert::word_embeddings_name())
    rows = {17, 41, 11, 23, 33, 3};
  else if (e.spec.name == "bert.embeddings.position_embeddings.weight")
    rows = {0, 3, 6};
  else if (e.spec.name == "bert.embeddings.token_type_embeddings.weight")
    rows = {0, 1};
  std::vector<std::int64_t> out;
  if (!rows.empty()) {
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (std::int64_t col :
           {static_cast<std::int64_t>(i) % c, (static_cast<std::int64_t>(i) * 7 + 5) % c})
        out.push_back(rows[i] * c + col);
    return out;
  }
  const std::int64_t k = std::min<std::int64_t>(n, 10);
  for (std::int64_t i = 0; i < k; ++i)
    out.push_back((i * n) / k + (i * 3) % std::max<std::int64_t>(1, n / k));
  return out;
}

// Softmax ignores a constant added to all its inputs: a key bias shifts every score
// of a query row alike, and a bias feeding every token's span logit alike (qa_outputs,
// and the LayerNorm right before the squad head) shifts every start/end logit alike.
bool zero_by_construction(const std::string& name, const bert::bert_config& cfg) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("attention.self.key.bias"))
    return true;
  if (cfg.head != head_kind::squad)
    return false;
  const std::string last_norm =
      cfg.norm == layer_norm_placement::pre
          ? "bert.encoder.final_layernorm.bias"
          : bert::layer_prefix(cfg.num_layers - 1) + "output.LayerNorm.bias";
  return name == "qa_outputs.bias" || name == last_norm;
}

void gradient_check(layer_norm_placement norm, head_kind head) {
  const bert::bert_config cfg = test::small_bert(norm, head);
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  test::randomize_parameters(part.parameters(), 7);
  const bert::bert_batch batch = test::small_batch(cfg);
  bert::forward_context ctx;
  ctx.seed = 3;

  part.parameters().zero_grad();
  test::chain_step({&part}, batch, ctx);

  const double h = 1e-2;
  const std::vector<const bert::bert_part*> chain{&part};
  for (const auto& e : part.parameters().entries()) {
    const auto idx = probes(e);
    std::vector<double> analytic, numeric;
    float* v = e.value.data<float>();
    for (auto i : idx) {
      const float saved = v[i];
      v[i] = static_cast<float>(saved + h);
      const float up_value = v[i];
      const double up = test::chain_loss(chain, batch, ctx);
      v[i] = static_cast<float>(saved - h);
      const float down_value = v[i];
      const double down = test::chain_loss(chain, batch, ctx);
      v[i] = saved;
      // Divide by the step the f32 parameter really took.
      numeric.push_back((up - down) /
                        (static_cast<double>(up_value) - static_cast<double>(down_value)));
      analytic.push_back(e.grad.data<float>()[i]);
    }
    INFO(e.spec.name);
    DSA_CHECK_CLOSE(analytic.data(), numeric.data(), static_cast<std::int64_t>(idx.size()),
                    test::finite_diff_model);
    // The probes must see a real gradient, or the comparison above proves nothing,
    // except where the gradient is zero by construction.
    double largest = 0.0;
    for (double g : numeric)
      largest = std::max(largest, std::fabs(g));
    if (!zero_by_construction(e.spec.name, cfg))
      CHECK(largest > 10 * test::finite_diff_model.abs);
  }
}

} // namespace

TEST_CASE("bert gradcheck: post-LN, pretraining head (MLM + NSP, tied decoder)") {
  gradient_check(layer_norm_placement::post, head_kind::pretraining);
}
TEST_CASE("bert gradcheck: pre-LN, pretraining head") {
  gradient_check(layer_norm_placement::pre, head_kind::pretraining);
}
TEST_CASE("bert gradcheck: post-LN, squad head") {
  gradient_check(layer_norm_placement::post, head_kind::squad);
}
TEST_CASE("bert gradcheck: pre-LN, squad head") {
  gradient_check(layer_norm_placement::pre, head_kind::squad);
}
