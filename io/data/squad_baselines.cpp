// Trivial SQuAD baselines: first sentence and random span.
#include "io/data/squad_baselines.hpp"

#include "io/data/squad_rng.hpp"
#include "io/data/squad_text.hpp"

namespace dsa::data {

std::string squad_first_sentence(std::string_view context) {
  for (std::size_t i = 0; i < context.size(); ++i) {
    char c = context[i];
    if ((c == '.' || c == '!' || c == '?') && (i + 1 == context.size() || context[i + 1] == ' ' ||
                                               context[i + 1] == '\t' || context[i + 1] == '\n'))
      return python_strip(context.substr(0, i + 1));
  }
  return python_strip(context);
}

squad_predictions squad_baseline_predictions(const squad_dataset& dataset, squad_baseline baseline,
                                             std::uint64_t seed) {
  squad_predictions out;
  for (const auto& article : dataset.articles) {
    for (const auto& paragraph : article.paragraphs) {
      const std::string first = squad_first_sentence(paragraph.context);
      const std::vector<std::string> words = python_split(paragraph.context);
      for (const auto& qa : paragraph.qas) {
        if (baseline == squad_baseline::first_sentence || words.empty()) {
          out[qa.id] = first;
          continue;
        }
        squad_rng rng(squad_hash(qa.id, seed));
        std::size_t start = rng.below(words.size());
        std::size_t length = 1 + rng.below(4);
        std::string span;
        for (std::size_t i = start; i < std::min(words.size(), start + length); ++i) {
          if (!span.empty())
            span.push_back(' ');
          span += words[i];
        }
        out[qa.id] = span;
      }
    }
  }
  return out;
}

expected<squad_baseline_scores> squad_evaluate_baselines(const squad_dataset& dataset,
                                                         std::uint64_t seed) {
  squad_baseline_scores out;
  DSA_ASSIGN_OR_RETURN(out.first_sentence,
                       squad_evaluate(dataset, squad_baseline_predictions(
                                                   dataset, squad_baseline::first_sentence, seed)));
  DSA_ASSIGN_OR_RETURN(out.random_span,
                       squad_evaluate(dataset, squad_baseline_predictions(
                                                   dataset, squad_baseline::random_span, seed)));
  return out;
}

} // namespace dsa::data
