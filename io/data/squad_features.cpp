// SQuAD examples and sliding-window features as in the reference run_squad.
#include "io/data/squad_features.hpp"

#include "io/data/squad_locate.hpp"
#include "io/data/squad_text.hpp"

#include <algorithm>

namespace dsa::data {
namespace {

std::string join(const std::vector<std::string>& words, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end; ++i) {
    if (i > begin)
      out.push_back(' ');
    out += words[i];
  }
  return out;
}

// Fills the training labels of `example` from `answer`; false when the answer
// cannot be recovered from the whitespace words (the reference skips those).
bool label_example(squad_example& example, const squad_answer& answer) {
  std::int64_t length = static_cast<std::int64_t>(utf8_decode(answer.text).size());
  std::int64_t chars = static_cast<std::int64_t>(example.words->char_to_word_offset.size());
  if (length == 0 || answer.answer_start < 0 || answer.answer_start + length > chars)
    return false;
  example.orig_answer_text = answer.text;
  example.start_position =
      example.words->char_to_word_offset[static_cast<std::size_t>(answer.answer_start)];
  example.end_position =
      example.words
          ->char_to_word_offset[static_cast<std::size_t>(answer.answer_start + length - 1)];
  if (example.start_position < 0)
    return false; // answer begins in leading whitespace
  std::string actual = join(example.doc_tokens(), static_cast<std::size_t>(example.start_position),
                            static_cast<std::size_t>(example.end_position) + 1);
  std::vector<std::string> answer_words = python_split(answer.text);
  std::string cleaned = join(answer_words, 0, answer_words.size());
  return actual.find(cleaned) != std::string::npos;
}

} // namespace

bool squad_is_whitespace(char32_t c) {
  return c == U' ' || c == U'\t' || c == U'\r' || c == U'\n' || c == 0x202F;
}

void squad_split_context(std::string_view context, std::vector<std::string>& doc_tokens,
                         std::vector<std::int32_t>& char_to_word_offset) {
  doc_tokens.clear();
  char_to_word_offset.clear();
  bool previous_whitespace = true;
  for (char32_t c : utf8_decode(context)) {
    if (squad_is_whitespace(c)) {
      previous_whitespace = true;
    } else {
      if (previous_whitespace)
        doc_tokens.emplace_back();
      utf8_append(doc_tokens.back(), c);
      previous_whitespace = false;
    }
    char_to_word_offset.push_back(static_cast<std::int32_t>(doc_tokens.size()) - 1);
  }
}

squad_examples squad_read_examples(const squad_dataset& dataset, squad_mode mode) {
  squad_examples out;
  for (const auto& article : dataset.articles) {
    for (const auto& paragraph : article.paragraphs) {
      auto words = std::make_shared<squad_context_words>();
      squad_split_context(paragraph.context, words->doc_tokens, words->char_to_word_offset);
      const std::u32string context =
          mode == squad_mode::training ? utf8_decode(paragraph.context) : std::u32string();
      squad_example base;
      base.words = std::move(words);
      for (const auto& qa : paragraph.qas) {
        squad_example example = base;
        example.qas_id = qa.id;
        example.question_text = qa.question;
        if (mode == squad_mode::training) {
          squad_answer answer = qa.answers.empty() ? squad_answer{} : qa.answers[0];
          squad_answer_place place = squad_locate_answer(context, answer);
          out.not_found += place == squad_answer_place::not_found ? 1 : 0;
          out.moved += place == squad_answer_place::moved ? 1 : 0;
          if (place == squad_answer_place::not_found || !label_example(example, answer)) {
            ++out.skipped;
            continue;
          }
        }
        out.examples.push_back(std::move(example));
      }
    }
  }
  return out;
}

void squad_improve_answer_span(const std::vector<std::string>& doc_sub_tokens, std::int32_t& start,
                               std::int32_t& end, const tok::bert_tokenizer& tokenizer,
                               std::string_view orig_answer_text) {
  std::vector<std::string> answer_tokens = tokenizer.tokenize(orig_answer_text);
  std::string answer = join(answer_tokens, 0, answer_tokens.size());
  for (std::int32_t new_start = start; new_start <= end; ++new_start) {
    for (std::int32_t new_end = end; new_end >= new_start; --new_end) {
      if (join(doc_sub_tokens, static_cast<std::size_t>(new_start),
               static_cast<std::size_t>(new_end) + 1) == answer) {
        start = new_start;
        end = new_end;
        return;
      }
    }
  }
}

std::vector<squad_doc_span>
squad_doc_spans(std::int32_t doc_length, std::int32_t max_tokens_for_doc, std::int32_t doc_stride) {
  std::vector<squad_doc_span> spans;
  std::int32_t start = 0;
  while (start < doc_length) {
    std::int32_t length = std::min(doc_length - start, max_tokens_for_doc);
    spans.push_back({start, length});
    if (start + length == doc_length)
      break;
    start += std::min(length, doc_stride);
  }
  return spans;
}

bool squad_is_max_context(const std::vector<squad_doc_span>& spans, std::size_t span_index,
                          std::int32_t position) {
  double best_score = 0.0;
  std::size_t best_index = spans.size();
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const auto& span = spans[i];
    std::int32_t end = span.start + span.length - 1;
    if (position < span.start || position > end)
      continue;
    std::int32_t left = position - span.start;
    std::int32_t right = end - position;
    double score = std::min(left, right) + 0.01 * span.length;
    if (best_index == spans.size() || score > best_score) {
      best_score = score;
      best_index = i;
    }
  }
  return span_index == best_index;
}

expected<std::vector<squad_feature>>
squad_convert_examples(const std::vector<squad_example>& examples,
                       const tok::bert_tokenizer& tokenizer, const squad_feature_options& options) {
  const tok::vocab& vocab = tokenizer.vocabulary();
  if (!vocab.contains("[CLS]") || !vocab.contains("[SEP]"))
    return make_error(errc::invalid_argument,
                      "squad features: the vocabulary has no [CLS] or [SEP] token");
  if (options.doc_stride < 1 || options.max_query_length < 0)
    return make_error(errc::invalid_argument,
                      "squad features: doc_stride {} must be >= 1, max_query_length {} >= 0",
                      options.doc_stride, options.max_query_length);
  const auto seq = static_cast<std::size_t>(std::max(options.max_seq_length, 0));
  std::vector<squad_feature> features;
  std::int64_t unique_id = options.first_unique_id;
  std::shared_ptr<const squad_context_words> tokenized_words;
  std::vector<std::int32_t> tok_to_orig, orig_to_tok;
  std::vector<std::string> doc;
  for (std::size_t example_index = 0; example_index < examples.size(); ++example_index) {
    const squad_example& example = examples[example_index];
    std::vector<std::string> query = tokenizer.tokenize(example.question_text);
    if (query.size() > static_cast<std::size_t>(options.max_query_length))
      query.resize(static_cast<std::size_t>(options.max_query_length));
    const auto max_tokens_for_doc =
        options.max_seq_length - static_cast<std::int32_t>(query.size()) - 3;
    if (max_tokens_for_doc < 1)
      return make_error(
          errc::invalid_argument,
          "squad features: max_seq_length {} leaves no room for the document after {} query tokens",
          options.max_seq_length, query.size());

    if (!example.words)
      return make_error(errc::invalid_argument, "squad features: example '{}' has no context words",
                        example.qas_id);
    // Questions of one paragraph share its words: sub-tokenize them once.
    if (example.words != tokenized_words) {
      tokenized_words = example.words;
      tok_to_orig.clear();
      orig_to_tok.clear();
      doc.clear();
      for (std::size_t i = 0; i < example.doc_tokens().size(); ++i) {
        orig_to_tok.push_back(static_cast<std::int32_t>(doc.size()));
        for (auto& sub : tokenizer.tokenize(example.doc_tokens()[i])) {
          tok_to_orig.push_back(static_cast<std::int32_t>(i));
          doc.push_back(std::move(sub));
        }
      }
    }
    const auto doc_length = static_cast<std::int32_t>(doc.size());
    std::int32_t tok_start = -1, tok_end = -1;
    const bool training = options.mode == squad_mode::training;
    if (training) {
      if (example.start_position < 0 || example.end_position < example.start_position ||
          example.end_position >= static_cast<std::int32_t>(example.doc_tokens().size()))
        return make_error(errc::invalid_argument,
                          "squad features: training example '{}' has no valid answer span",
                          example.qas_id);
      tok_start = orig_to_tok[static_cast<std::size_t>(example.start_position)];
      if (example.end_position < static_cast<std::int32_t>(example.doc_tokens().size()) - 1)
        tok_end = orig_to_tok[static_cast<std::size_t>(example.end_position) + 1] - 1;
      else
        tok_end = doc_length - 1;
      squad_improve_answer_span(doc, tok_start, tok_end, tokenizer, example.orig_answer_text);
    }

    std::vector<squad_doc_span> spans =
        squad_doc_spans(doc_length, max_tokens_for_doc, options.doc_stride);
    for (std::size_t span_index = 0; span_index < spans.size(); ++span_index) {
      const squad_doc_span& span = spans[span_index];
      squad_feature f;
      f.unique_id = unique_id++;
      f.example_index = static_cast<std::int32_t>(example_index);
      f.doc_span_index = static_cast<std::int32_t>(span_index);
      f.token_to_orig_map.assign(seq, -1);
      f.token_is_max_context.assign(seq, 0);
      f.tokens.push_back("[CLS]");
      f.tokens.insert(f.tokens.end(), query.begin(), query.end());
      f.tokens.push_back("[SEP]");
      f.token_type_ids.assign(f.tokens.size(), 0);
      for (std::int32_t i = 0; i < span.length; ++i) {
        std::int32_t split_index = span.start + i;
        std::size_t position = f.tokens.size();
        f.token_to_orig_map[position] = tok_to_orig[static_cast<std::size_t>(split_index)];
        f.token_is_max_context[position] =
            squad_is_max_context(spans, span_index, split_index) ? 1 : 0;
        f.tokens.push_back(doc[static_cast<std::size_t>(split_index)]);
        f.token_type_ids.push_back(1);
      }
      f.tokens.push_back("[SEP]");
      f.token_type_ids.push_back(1);
      for (const auto& t : f.tokens)
        f.input_ids.push_back(vocab.id(t));
      f.attention_mask.assign(f.input_ids.size(), 1);
      f.input_ids.resize(seq, 0);
      f.attention_mask.resize(seq, 0);
      f.token_type_ids.resize(seq, 0);
      if (training) {
        std::int32_t doc_start = span.start, doc_end = span.start + span.length - 1;
        if (tok_start >= doc_start && tok_end <= doc_end) {
          std::int32_t doc_offset = static_cast<std::int32_t>(query.size()) + 2;
          f.start_position = tok_start - doc_start + doc_offset;
          f.end_position = tok_end - doc_start + doc_offset;
        }
      }
      features.push_back(std::move(f));
    }
  }
  return features;
}

} // namespace dsa::data
