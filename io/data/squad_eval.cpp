// SQuAD v1.1 evaluation with the official script's normalization and F1.
#include "io/data/squad_eval.hpp"

#include "io/ckpt/atomic_file.hpp"
#include "io/data/squad_text.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dsa::data {
namespace {

// Python's string.punctuation.
bool is_ascii_punctuation(char32_t c) {
  return c < 0x80 && c != 0 &&
         std::strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", static_cast<int>(c)) != nullptr;
}

// re.sub(r'\b(a|an|the)\b', ' ', text) on a lower-cased str: a word boundary
// lies between a \w and a non-\w character (or the text's ends).
std::u32string remove_articles(const std::u32string& text) {
  auto word = [&](std::size_t i) { return i < text.size() && python_is_word_char(text[i]); };
  std::u32string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    bool boundary_before = word(i) && (i == 0 || !word(i - 1));
    if (boundary_before) {
      std::size_t matched = 0;
      for (std::u32string_view article : {U"a", U"an", U"the"}) {
        std::size_t n = article.size();
        if (text.compare(i, n, article.data(), n) == 0 && !word(i + n)) {
          matched = n;
          break;
        }
      }
      if (matched > 0) {
        out.push_back(U' ');
        i += matched;
        continue;
      }
    }
    out.push_back(text[i]);
    ++i;
  }
  return out;
}

std::vector<std::string> normalized_tokens(std::string_view text) {
  return python_split(squad_normalize_answer(text));
}

} // namespace

std::string squad_normalize_answer(std::string_view text) {
  std::u32string lowered = python_lower(utf8_decode(text));
  std::u32string no_punctuation;
  no_punctuation.reserve(lowered.size());
  for (char32_t c : lowered)
    if (!is_ascii_punctuation(c))
      no_punctuation.push_back(c);
  std::string spaced = utf8_encode(remove_articles(no_punctuation));
  std::string out;
  for (const auto& word : python_split(spaced)) {
    if (!out.empty())
      out.push_back(' ');
    out += word;
  }
  return out;
}

int squad_exact_match(std::string_view prediction, std::string_view ground_truth) {
  return squad_normalize_answer(prediction) == squad_normalize_answer(ground_truth) ? 1 : 0;
}

double squad_f1(std::string_view prediction, std::string_view ground_truth) {
  std::vector<std::string> predicted = normalized_tokens(prediction);
  std::vector<std::string> truth = normalized_tokens(ground_truth);
  // Multiset intersection size, as Counter(a) & Counter(b).
  std::unordered_map<std::string, std::int64_t> counts;
  for (const auto& t : truth)
    ++counts[t];
  std::int64_t same = 0;
  for (const auto& t : predicted) {
    auto it = counts.find(t);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0)
    return 0.0;
  double precision = 1.0 * static_cast<double>(same) / static_cast<double>(predicted.size());
  double recall = 1.0 * static_cast<double>(same) / static_cast<double>(truth.size());
  return (2 * precision * recall) / (precision + recall);
}

expected<squad_scores> squad_evaluate(const squad_dataset& dataset,
                                      const squad_predictions& predictions) {
  squad_scores scores;
  std::int64_t exact = 0;
  double f1 = 0.0;
  for (const auto& article : dataset.articles) {
    for (const auto& paragraph : article.paragraphs) {
      for (const auto& qa : paragraph.qas) {
        ++scores.total;
        auto it = predictions.find(qa.id);
        if (it == predictions.end()) {
          scores.unanswered.push_back(qa.id);
          continue;
        }
        if (qa.answers.empty()) // the official script fails here too (max of no values)
          return make_error(errc::format, "question '{}' has a prediction but no answers to score it against",
                            qa.id);
        int best_exact = 0;
        double best_f1 = 0.0;
        for (std::size_t i = 0; i < qa.answers.size(); ++i) {
          int e = squad_exact_match(it->second, qa.answers[i].text);
          double f = squad_f1(it->second, qa.answers[i].text);
          best_exact = i == 0 ? e : std::max(best_exact, e);
          best_f1 = i == 0 ? f : std::max(best_f1, f);
        }
        exact += best_exact;
        f1 += best_f1;
      }
    }
  }
  if (scores.total == 0)
    return make_error(errc::invalid_argument, "the data set holds no questions");
  scores.exact_match = 100.0 * static_cast<double>(exact) / static_cast<double>(scores.total);
  scores.f1 = 100.0 * f1 / static_cast<double>(scores.total);
  return scores;
}

expected<squad_predictions> parse_squad_predictions(std::string_view json_text,
                                                    std::string_view source) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text.begin(), json_text.end());
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::format, "{}: not valid JSON: {}", source, e.what());
  }
  if (!root.is_object())
    return make_error(errc::format, "{}: top level is {}, expected an object {{id: answer}}",
                      source, root.type_name());
  squad_predictions out;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it.value().is_string())
      return make_error(errc::format, "{}: prediction for question '{}' is {}, expected string",
                        source, it.key(), it.value().type_name());
    out.emplace(it.key(), it.value().get<std::string>());
  }
  return out;
}

expected<squad_predictions> load_squad_predictions(const std::string& path) {
  DSA_ASSIGN_OR_RETURN(std::string text, ckpt::read_file(path));
  return parse_squad_predictions(text, path);
}

std::string python_float_repr(double value) {
  if (std::isnan(value))
    return "NaN"; // json.dumps spelling
  if (std::isinf(value))
    return value > 0 ? "Infinity" : "-Infinity";
  std::string out = fmt::format("{}", value);
  if (out.find_first_of(".e") == std::string::npos)
    out += ".0";
  return out;
}

std::string squad_scores_json(const squad_scores& scores) {
  return fmt::format("{{\"exact_match\": {}, \"f1\": {}}}", python_float_repr(scores.exact_match),
                     python_float_repr(scores.f1));
}

} // namespace dsa::data
