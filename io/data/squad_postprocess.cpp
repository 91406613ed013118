// SQuAD post-processing: n-best spans over windows and final-text recovery.
#include "io/data/squad_postprocess.hpp"

#include "io/ckpt/atomic_file.hpp"
#include "io/data/squad_text.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace dsa::data {
namespace {

// Indexes of the n largest logits, largest first; ties keep the lower index
// first (Python's stable sort with reverse=True).
std::vector<std::int32_t> best_indexes(const std::vector<float>& logits, int n) {
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  if (order.size() > static_cast<std::size_t>(std::max(n, 0)))
    order.resize(static_cast<std::size_t>(n));
  return order;
}

struct candidate {
  std::size_t feature = 0; // index into the example's features
  std::int32_t start = 0;
  std::int32_t end = 0;
  double start_logit = 0.0;
  double end_logit = 0.0;
};

// _strip_spaces: the text without ' ' and, per kept character, its index in the text.
std::u32string strip_spaces(const std::u32string& text, std::vector<std::size_t>& ns_to_s) {
  std::u32string out;
  ns_to_s.clear();
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == U' ')
      continue;
    ns_to_s.push_back(i);
    out.push_back(text[i]);
  }
  return out;
}

std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (i > 0)
      out.push_back(' ');
    out += words[i];
  }
  return out;
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  std::string out;
  std::size_t pos = 0;
  for (std::size_t hit; (hit = text.find(from, pos)) != std::string::npos;
       pos = hit + from.size()) {
    out.append(text, pos, hit - pos);
    out.append(to);
  }
  out.append(text, pos, std::string::npos);
  text = std::move(out);
}

// The de-tokenized WordPiece text of tokens [start, end].
std::string detokenize(const std::vector<std::string>& tokens, std::int32_t start,
                       std::int32_t end) {
  std::string text =
      join_words(std::vector<std::string>(tokens.begin() + start, tokens.begin() + end + 1));
  replace_all(text, " ##", "");
  replace_all(text, "##", "");
  return join_words(python_split(python_strip(text)));
}

std::vector<double> softmax(const std::vector<double>& scores) {
  if (scores.empty())
    return {};
  double max_score = *std::max_element(scores.begin(), scores.end());
  std::vector<double> out;
  double total = 0.0;
  for (double s : scores) {
    out.push_back(std::exp(s - max_score));
    total += out.back();
  }
  for (double& p : out)
    p /= total;
  return out;
}

} // namespace

std::string squad_get_final_text(std::string_view pred_text, std::string_view orig_text,
                                 const tok::tokenizer_options& basic) {
  std::u32string tok_text = utf8_decode(join_words(tok::basic_tokenize(orig_text, basic)));
  std::u32string pred = utf8_decode(pred_text);
  std::size_t start = tok_text.find(pred);
  if (start == std::u32string::npos || pred.empty())
    return std::string(orig_text);
  std::size_t end = start + pred.size() - 1;

  std::u32string orig = utf8_decode(orig_text);
  std::vector<std::size_t> orig_ns_to_s, tok_ns_to_s;
  std::u32string orig_ns = strip_spaces(orig, orig_ns_to_s);
  std::u32string tok_ns = strip_spaces(tok_text, tok_ns_to_s);
  if (orig_ns.size() != tok_ns.size())
    return std::string(orig_text);

  // tok_s_to_ns: position in tok_text -> position without spaces (absent for spaces).
  std::unordered_map<std::size_t, std::size_t> tok_s_to_ns;
  for (std::size_t i = 0; i < tok_ns_to_s.size(); ++i)
    tok_s_to_ns[tok_ns_to_s[i]] = i;
  auto project = [&](std::size_t s) -> std::ptrdiff_t {
    auto it = tok_s_to_ns.find(s);
    if (it == tok_s_to_ns.end() || it->second >= orig_ns_to_s.size())
      return -1;
    return static_cast<std::ptrdiff_t>(orig_ns_to_s[it->second]);
  };
  std::ptrdiff_t orig_start = project(start);
  if (orig_start < 0)
    return std::string(orig_text);
  std::ptrdiff_t orig_end = project(end);
  if (orig_end < 0)
    return std::string(orig_text);
  // Python slicing: an end before the start gives "".
  if (orig_end < orig_start)
    return "";
  return utf8_encode(std::u32string_view(orig).substr(
      static_cast<std::size_t>(orig_start), static_cast<std::size_t>(orig_end - orig_start + 1)));
}

expected<std::vector<squad_prediction>> squad_postprocess(
    const std::vector<squad_example>& examples, const std::vector<squad_feature>& features,
    const std::vector<squad_raw_result>& results, const squad_postprocess_options& options) {
  std::unordered_map<std::int64_t, const squad_raw_result*> by_id;
  for (const auto& r : results)
    by_id[r.unique_id] = &r;
  std::vector<std::vector<const squad_feature*>> example_features(examples.size());
  for (const auto& f : features) {
    if (f.example_index < 0 || static_cast<std::size_t>(f.example_index) >= examples.size())
      return make_error(errc::invalid_argument,
                        "squad post-processing: feature {} names example {} of {}", f.unique_id,
                        f.example_index, examples.size());
    example_features[static_cast<std::size_t>(f.example_index)].push_back(&f);
  }

  std::vector<squad_prediction> predictions;
  for (std::size_t e = 0; e < examples.size(); ++e) {
    const squad_example& example = examples[e];
    const auto& feats = example_features[e];
    std::vector<candidate> prelim;
    for (std::size_t fi = 0; fi < feats.size(); ++fi) {
      const squad_feature& f = *feats[fi];
      auto it = by_id.find(f.unique_id);
      if (it == by_id.end())
        return make_error(errc::invalid_argument,
                          "squad post-processing: no result for feature {} (question '{}')",
                          f.unique_id, example.qas_id);
      const squad_raw_result& r = *it->second;
      if (r.start_logits.size() < f.tokens.size() || r.end_logits.size() < f.tokens.size())
        return make_error(
            errc::invalid_argument,
            "squad post-processing: feature {} has {} tokens but {} start and {} end logits",
            f.unique_id, f.tokens.size(), r.start_logits.size(), r.end_logits.size());
      const auto n_tokens = static_cast<std::int32_t>(f.tokens.size());
      auto in_doc = [&](std::int32_t i) {
        return static_cast<std::size_t>(i) < f.token_to_orig_map.size() &&
               f.token_to_orig_map[i] >= 0;
      };
      for (std::int32_t start : best_indexes(r.start_logits, options.n_best_size)) {
        for (std::int32_t end : best_indexes(r.end_logits, options.n_best_size)) {
          if (start >= n_tokens || end >= n_tokens)
            continue;
          if (!in_doc(start) || !in_doc(end))
            continue;
          if (!f.token_is_max_context[static_cast<std::size_t>(start)])
            continue;
          if (end < start)
            continue;
          if (end - start + 1 > options.max_answer_length)
            continue;
          prelim.push_back({fi, start, end, r.start_logits[static_cast<std::size_t>(start)],
                            r.end_logits[static_cast<std::size_t>(end)]});
        }
      }
    }
    std::stable_sort(prelim.begin(), prelim.end(), [](const candidate& a, const candidate& b) {
      return a.start_logit + a.end_logit > b.start_logit + b.end_logit;
    });

    squad_prediction prediction;
    prediction.qas_id = example.qas_id;
    std::unordered_set<std::string> seen;
    for (const candidate& c : prelim) {
      if (prediction.nbest.size() >= static_cast<std::size_t>(std::max(options.n_best_size, 0)))
        break;
      const squad_feature& f = *feats[c.feature];
      std::string tok_text = detokenize(f.tokens, c.start, c.end);
      auto orig_start =
          static_cast<std::size_t>(f.token_to_orig_map[static_cast<std::size_t>(c.start)]);
      auto orig_end =
          static_cast<std::size_t>(f.token_to_orig_map[static_cast<std::size_t>(c.end)]);
      std::vector<std::string> orig_words;
      for (std::size_t w = orig_start; w <= orig_end && w < example.doc_tokens().size(); ++w)
        orig_words.push_back(example.doc_tokens()[w]);
      std::string final_text =
          squad_get_final_text(tok_text, join_words(orig_words), options.basic);
      if (!seen.insert(final_text).second)
        continue;
      prediction.nbest.push_back({std::move(final_text), c.start_logit, c.end_logit, 0.0});
    }
    if (prediction.nbest.empty())
      prediction.nbest.push_back({"empty", 0.0, 0.0, 0.0});
    std::vector<double> scores;
    for (const auto& n : prediction.nbest)
      scores.push_back(n.start_logit + n.end_logit);
    std::vector<double> probabilities = softmax(scores);
    for (std::size_t i = 0; i < probabilities.size(); ++i)
      prediction.nbest[i].probability = probabilities[i];
    prediction.text = prediction.nbest[0].text;
    predictions.push_back(std::move(prediction));
  }
  return predictions;
}

std::string squad_predictions_json(const std::vector<squad_prediction>& predictions) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  for (const auto& p : predictions)
    root[p.qas_id] = p.text;
  return root.dump(4, ' ', true) + "\n";
}

std::string squad_nbest_json(const std::vector<squad_prediction>& predictions) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  for (const auto& p : predictions) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& n : p.nbest)
      list.push_back({{"text", n.text},
                      {"probability", n.probability},
                      {"start_logit", n.start_logit},
                      {"end_logit", n.end_logit}});
    root[p.qas_id] = std::move(list);
  }
  return root.dump(4, ' ', true) + "\n";
}

status write_squad_predictions(const std::string& path,
                               const std::vector<squad_prediction>& predictions) {
  return ckpt::write_file_atomic(path, squad_predictions_json(predictions));
}

} // namespace dsa::data
