// Trivial SQuAD baselines, printed next to a fine-tuned model's scores: the
// first sentence of the context, and a random span of 1-4 words.
#pragma once

#include "core/error.hpp"
#include "io/data/squad_dataset.hpp"
#include "io/data/squad_eval.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace dsa::data {

enum class squad_baseline : std::uint8_t { first_sentence, random_span };

// The context up to and including the first '.', '!' or '?' followed by
// whitespace or the end (the whole context when there is none).
std::string squad_first_sentence(std::string_view context);

// One prediction per question. random_span draws per question from
// (seed, question id), so it does not depend on file order.
squad_predictions squad_baseline_predictions(const squad_dataset& dataset, squad_baseline baseline,
                                             std::uint64_t seed);

struct squad_baseline_scores {
  squad_scores first_sentence;
  squad_scores random_span;
};
expected<squad_baseline_scores> squad_evaluate_baselines(const squad_dataset& dataset,
                                                         std::uint64_t seed);

} // namespace dsa::data
