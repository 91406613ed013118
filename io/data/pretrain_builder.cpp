// Sentence-pair instance creation (Google create_pretraining_data semantics).
#include "io/data/pretrain_builder.hpp"

namespace dsa::data {
namespace {

struct instance_context {
  const std::vector<tokenized_document>& documents;
  const masking_vocab& vocab;
  const pretrain_options& options;
  prep_rng& rng;
};

pretrain_instance make_instance(const std::vector<std::int32_t>& a,
                                const std::vector<std::int32_t>& b, bool is_random_next,
                                const instance_context& ctx) {
  pretrain_instance inst;
  inst.input_ids.reserve(a.size() + b.size() + 3);
  inst.input_ids.push_back(ctx.vocab.cls_id);
  inst.input_ids.insert(inst.input_ids.end(), a.begin(), a.end());
  inst.input_ids.push_back(ctx.vocab.sep_id);
  inst.token_type_ids.assign(inst.input_ids.size(), 0);
  inst.input_ids.insert(inst.input_ids.end(), b.begin(), b.end());
  inst.input_ids.push_back(ctx.vocab.sep_id);
  inst.token_type_ids.resize(inst.input_ids.size(), 1);
  inst.next_sentence_label = is_random_next ? 1 : 0;
  mask_instance(inst, ctx.vocab, ctx.options.masking, ctx.rng);
  return inst;
}

// Google's create_instances_from_document for documents[index].
void instances_from_document(std::vector<pretrain_instance>& out, std::size_t index,
                             const instance_context& ctx) {
  const tokenized_document& document = ctx.documents[index];
  prep_rng& rng = ctx.rng;
  const std::int64_t max_num_tokens = ctx.options.max_seq_length - 3;
  std::int64_t target_length = max_num_tokens;
  if (rng.uniform_real() < ctx.options.short_seq_prob)
    target_length = rng.uniform_int(2, max_num_tokens);

  std::vector<const std::vector<std::int32_t>*> chunk;
  std::int64_t chunk_length = 0;
  std::int64_t i = 0;
  const auto n = static_cast<std::int64_t>(document.size());
  while (i < n) {
    chunk.push_back(&document[static_cast<std::size_t>(i)]);
    chunk_length += static_cast<std::int64_t>(document[static_cast<std::size_t>(i)].size());
    if (i == n - 1 || chunk_length >= target_length) {
      const auto chunk_size = static_cast<std::int64_t>(chunk.size());
      std::int64_t a_end = chunk_size >= 2 ? rng.uniform_int(1, chunk_size - 1) : 1;
      std::vector<std::int32_t> a, b;
      for (std::int64_t j = 0; j < a_end; ++j)
        a.insert(a.end(), chunk[j]->begin(), chunk[j]->end());
      bool is_random_next = false;
      if (chunk_size == 1 || rng.uniform_real() < 0.5) {
        is_random_next = true;
        const std::int64_t target_b_length = target_length - static_cast<std::int64_t>(a.size());
        const auto doc_count = static_cast<std::int64_t>(ctx.documents.size());
        std::int64_t random_index = 0;
        for (int tries = 0; tries < 10; ++tries) {
          random_index = rng.uniform_int(0, doc_count - 1);
          if (random_index != static_cast<std::int64_t>(index))
            break;
        }
        const tokenized_document& other = ctx.documents[static_cast<std::size_t>(random_index)];
        std::int64_t start = rng.uniform_int(0, static_cast<std::int64_t>(other.size()) - 1);
        for (auto j = static_cast<std::size_t>(start); j < other.size(); ++j) {
          b.insert(b.end(), other[j].begin(), other[j].end());
          if (static_cast<std::int64_t>(b.size()) >= target_b_length)
            break;
        }
        i -= chunk_size - a_end; // put the unused sentences back
      } else {
        for (std::int64_t j = a_end; j < chunk_size; ++j)
          b.insert(b.end(), chunk[j]->begin(), chunk[j]->end());
      }
      truncate_seq_pair(a, b, static_cast<std::size_t>(max_num_tokens), rng);
      // Google asserts both are non-empty; a one-document corpus can give an empty B.
      if (!a.empty() && !b.empty())
        out.push_back(make_instance(a, b, is_random_next, ctx));
      chunk.clear();
      chunk_length = 0;
    }
    ++i;
  }
}

} // namespace

std::vector<tokenized_document> tokenize_documents(const std::vector<document>& documents,
                                                   const tok::bert_tokenizer& tokenizer) {
  std::vector<tokenized_document> out;
  for (const auto& doc : documents) {
    tokenized_document t;
    for (const auto& p : doc.paragraphs)
      for (const auto& s : p.sentences) {
        auto ids = tokenizer.encode(s);
        if (!ids.empty())
          t.push_back(std::move(ids));
      }
    if (!t.empty())
      out.push_back(std::move(t));
  }
  return out;
}

std::pair<std::vector<tokenized_document>, std::vector<tokenized_document>>
split_holdout(std::vector<tokenized_document> documents, std::int64_t holdout, std::uint64_t seed) {
  std::vector<std::size_t> order(documents.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  prep_rng rng(derive_seed(seed, 0x686f6c646f7574ull)); // "holdout"
  rng.shuffle(order);
  std::vector<std::uint8_t> held(documents.size(), 0);
  for (std::size_t k = 0; k < order.size() && static_cast<std::int64_t>(k) < holdout; ++k)
    held[order[k]] = 1;
  std::pair<std::vector<tokenized_document>, std::vector<tokenized_document>> out;
  for (std::size_t i = 0; i < documents.size(); ++i)
    (held[i] ? out.second : out.first).push_back(std::move(documents[i]));
  return out;
}

void truncate_seq_pair(std::vector<std::int32_t>& a, std::vector<std::int32_t>& b,
                       std::size_t max_tokens, prep_rng& rng) {
  while (a.size() + b.size() > max_tokens) {
    auto& longer = a.size() > b.size() ? a : b;
    DSA_CHECK(!longer.empty(), "truncate_seq_pair on empty segments");
    if (rng.uniform_real() < 0.5)
      longer.erase(longer.begin());
    else
      longer.pop_back();
  }
}

std::vector<pretrain_instance>
create_pretraining_instances(std::vector<tokenized_document> documents, const masking_vocab& vocab,
                             const pretrain_options& options) {
  DSA_CHECK(options.max_seq_length >= 5, "max_seq_length {} is too short for [CLS] A [SEP] B [SEP]",
            options.max_seq_length);
  std::vector<pretrain_instance> out;
  if (documents.empty())
    return out;
  prep_rng rng(options.seed);
  rng.shuffle(documents);
  instance_context ctx{documents, vocab, options, rng};
  const auto total = static_cast<std::int64_t>(documents.size()) * options.dupe_factor;
  std::int64_t done = 0;
  for (int pass = 0; pass < options.dupe_factor; ++pass)
    for (std::size_t d = 0; d < documents.size(); ++d) {
      instances_from_document(out, d, ctx);
      if (options.progress)
        options.progress(++done, total);
    }
  rng.shuffle(out);
  return out;
}

} // namespace dsa::data
