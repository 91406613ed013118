// SQuAD v1.1 exact match and F1 with the official evaluate-v1.1 semantics:
// normalize (lower-case, drop ASCII punctuation, drop the articles a/an/the as
// whole words, collapse whitespace), token-level F1 over the normalized words,
// the maximum over the ground truths, unanswered questions score 0, and the
// averages scaled by 100.
#pragma once

#include "core/error.hpp"
#include "io/data/squad_dataset.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsa::data {

// {question id: predicted answer text}
using squad_predictions = std::unordered_map<std::string, std::string>;

std::string squad_normalize_answer(std::string_view text);
// Both return what the official script adds per question (1/0 and [0, 1]).
int squad_exact_match(std::string_view prediction, std::string_view ground_truth);
double squad_f1(std::string_view prediction, std::string_view ground_truth);

struct squad_scores {
  double exact_match = 0.0;            // percent
  double f1 = 0.0;                     // percent
  std::int64_t total = 0;              // questions in the data set
  std::vector<std::string> unanswered; // ids without a prediction, in file order
};

// Scores every question of `dataset` (errc::invalid_argument when it has none,
// where the official script divides by zero).
expected<squad_scores> squad_evaluate(const squad_dataset& dataset,
                                      const squad_predictions& predictions);

// Reads predictions.json: one object of string values (errors name the id).
expected<squad_predictions> parse_squad_predictions(std::string_view json_text,
                                                    std::string_view source);
expected<squad_predictions> load_squad_predictions(const std::string& path);

// Python's repr() of a float (shortest round trip, "100.0" not "100").
std::string python_float_repr(double value);
// The official script's result line: {"exact_match": 81.2, "f1": 88.1}
std::string squad_scores_json(const squad_scores& scores);

} // namespace dsa::data
