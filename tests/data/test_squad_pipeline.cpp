// SQuAD end to end on generated data: QA from a corpus -> features over
// several windows -> oracle logits at the labelled positions -> post-processing
// -> official EM/F1. The oracle must score 100: every mapping step is exact.
#include "io/data/squad_eval.hpp"
#include "io/data/squad_postprocess.hpp"
#include "io/data/squad_qa_gen.hpp"
#include "models/tokenizer/vocab_builder.hpp"

#include "tests/data/corpus_test_util.hpp"

#include <doctest/doctest.h>

using namespace dsa::data;

namespace {

std::vector<document> corpus() {
  std::vector<std::string> sentences = {
      "The meeting was held in Dallas on March 4, 1961, after a long delay.",
      "He bought 12 apples and Mr. John F. Smith paid for them with Wilson's money.",
      "The committee praised the investigation of the election (1958-1960).",
      "Caf\xC3\xA9 owners in M\xC3\xBC"
      "nchen said the price rose in 1958.",
      "Later the Draft Act was passed by the Senate in Washington.",
      "The   river flooded the valley, and  the farmers lost 300 cattle.",
  };
  return dsa::test::rotated_documents(sentences, 6, 2, 2);
}

dsa::tok::bert_tokenizer tokenizer_for(const std::vector<document>& docs, int size) {
  dsa::tok::word_counter counter(dsa::tok::tokenizer_options{});
  for (const auto& d : docs)
    for (const auto& p : d.paragraphs)
      for (const auto& s : p.sentences)
        counter.add_text(s);
  dsa::tok::vocab_build_options o;
  o.size = size;
  return dsa::tok::bert_tokenizer(
      dsa::tok::vocab::from_tokens(dsa::tok::build_wordpiece_vocab(counter.counts(), o)));
}

} // namespace

TEST_CASE("squad pipeline: oracle logits through windows recover every generated answer") {
  auto docs = corpus();
  qa_gen_options go;
  go.dev_fraction = 0.0;
  go.questions_per_paragraph = 6;
  auto qa = generate_qa_from_corpus(docs, go);
  REQUIRE(qa);
  const squad_dataset& data = qa->train;
  REQUIRE(data.question_count() >= 40);
  // A small vocabulary splits words into pieces; short windows split every context.
  for (int vocab_size : {120, 400}) {
    auto tokenizer = tokenizer_for(docs, vocab_size);
    squad_examples ex = squad_read_examples(data, squad_mode::training);
    CHECK(ex.skipped == 0);
    REQUIRE(ex.examples.size() == static_cast<std::size_t>(data.question_count()));
    squad_feature_options fo;
    fo.max_seq_length = 48;
    fo.doc_stride = 16;
    fo.max_query_length = 20;
    fo.mode = squad_mode::training;
    auto features = squad_convert_examples(ex.examples, tokenizer, fo);
    REQUIRE(features);
    CHECK(features->size() > 2 * ex.examples.size()); // several windows per example
    std::vector<squad_raw_result> results;
    std::int64_t labelled = 0;
    for (const auto& f : *features) {
      squad_raw_result r{f.unique_id, std::vector<float>(48, -5.0f), std::vector<float>(48, -5.0f)};
      if (f.start_position > 0) {
        r.start_logits[static_cast<std::size_t>(f.start_position)] = 10.0f;
        r.end_logits[static_cast<std::size_t>(f.end_position)] = 10.0f;
        ++labelled;
      }
      results.push_back(std::move(r));
    }
    CHECK(labelled >= static_cast<std::int64_t>(ex.examples.size()));
    squad_postprocess_options po;
    auto predictions = squad_postprocess(ex.examples, *features, results, po);
    REQUIRE(predictions);
    squad_predictions by_id;
    for (const auto& p : *predictions)
      by_id[p.qas_id] = p.text;
    auto scores = squad_evaluate(data, by_id);
    REQUIRE(scores);
    CHECK(scores->unanswered.empty());
    // A span is recoverable when some window holds all of it and is its start token's max-context
    // window (the reference skips other starts). Those answers must come back exactly, not only
    // after normalization: casing, accents and punctuation come from the context.
    std::vector<bool> recoverable(ex.examples.size(), false);
    for (const auto& f : *features)
      if (f.start_position > 0 &&
          f.token_is_max_context[static_cast<std::size_t>(f.start_position)])
        recoverable[static_cast<std::size_t>(f.example_index)] = true;
    std::size_t i = 0, n_recoverable = 0;
    for (const auto& a : data.articles)
      for (const auto& p : a.paragraphs)
        for (const auto& q : p.qas) {
          if (recoverable[i++]) {
            ++n_recoverable;
            INFO("vocab ", vocab_size, " question ", q.id, ": ", q.question);
            CHECK(by_id[q.id] == q.answers[0].text);
          }
        }
    INFO("vocab ", vocab_size, ": ", n_recoverable, " of ", i, " recoverable");
    CHECK(n_recoverable * 10 >= i * 9);
    if (vocab_size == 400)
      CHECK(n_recoverable == i); // whole words: every answer fits a best window
    if (n_recoverable == i) {
      CHECK(scores->exact_match == 100.0);
      CHECK(squad_scores_json(*scores) == R"({"exact_match": 100.0, "f1": 100.0})");
    }
  }
}
