// SQuAD v1.1 JSON loader (validating) and writer.
#include "io/data/squad_dataset.hpp"

#include "io/ckpt/atomic_file.hpp"
#include "io/data/squad_text.hpp"

#include <nlohmann/json.hpp>

#include <unordered_set>

namespace dsa::data {
namespace {

using json = nlohmann::json;

// Where in the file a value sits, for error messages.
struct location {
  std::string_view source;
  std::int64_t article = -1;
  std::string title;
  std::int64_t paragraph = -1;
  std::string question_id;

  std::string describe() const {
    std::string out(source);
    if (article >= 0)
      out += fmt::format(": article {}", article);
    if (!title.empty())
      out += fmt::format(" ('{}')", title);
    if (paragraph >= 0)
      out += fmt::format(", paragraph {}", paragraph);
    if (!question_id.empty())
      out += fmt::format(", question '{}'", question_id);
    return out;
  }
};

const char* type_name(const json& value) {
  if (value.is_number_integer())
    return "integer";
  if (value.is_number_float())
    return "float";
  return value.type_name();
}

enum class kind { string, array, object, integer };

bool has_kind(const json& value, kind k) {
  switch (k) {
  case kind::string:
    return value.is_string();
  case kind::array:
    return value.is_array();
  case kind::object:
    return value.is_object();
  case kind::integer:
    return value.is_number_integer();
  }
  return false;
}

const char* kind_name(kind k) {
  switch (k) {
  case kind::string:
    return "string";
  case kind::array:
    return "array";
  case kind::object:
    return "object";
  case kind::integer:
    return "integer";
  }
  return "?";
}

error format_error(const location& at, std::string_view what) {
  return make_error(errc::format, "{}: {}", at.describe(), what);
}

// The field `name` of `object`, checked to exist and to be of kind `k`.
expected<const json*> field(const json& object, const char* name, kind k, const location& at,
                            std::string_view owner) {
  auto it = object.find(name);
  if (it == object.end())
    return format_error(at, fmt::format("{} has no field '{}'", owner, name));
  if (!has_kind(*it, k))
    return format_error(at, fmt::format("{} field '{}' is {}, expected {}", owner, name,
                                        type_name(*it), kind_name(k)));
  return &*it;
}

struct parse_state {
  squad_fields fields = squad_fields::all;
  std::unordered_set<std::string> seen_ids;
};

// A field that only squad_fields::all reads (evaluate-v1.1 never does): nullptr under
// squad_fields::scored, whatever the file holds there.
expected<const json*> layout_field(const json& object, const char* name, kind k, const location& at,
                                   std::string_view owner, const parse_state& state) {
  if (state.fields == squad_fields::scored)
    return nullptr;
  return field(object, name, k, at, owner);
}

status parse_answer(const json& item, std::size_t index, const location& at,
                    const parse_state& state, squad_answer& out) {
  std::string owner = fmt::format("answers[{}]", index);
  if (!item.is_object())
    return format_error(at, fmt::format("{} is {}, expected object", owner, type_name(item)));
  DSA_ASSIGN_OR_RETURN(const json* text, field(item, "text", kind::string, at, owner));
  DSA_ASSIGN_OR_RETURN(const json* start,
                       layout_field(item, "answer_start", kind::integer, at, owner, state));
  out.text = text->get<std::string>();
  if (start)
    out.answer_start = start->get<std::int64_t>();
  return {};
}

status parse_question(const json& item, location at, parse_state& state, squad_question& out) {
  if (!item.is_object())
    return format_error(at, fmt::format("a qas entry is {}, expected object", type_name(item)));
  DSA_ASSIGN_OR_RETURN(const json* id, field(item, "id", kind::string, at, "question"));
  out.id = id->get<std::string>();
  at.question_id = out.id;
  if (!state.seen_ids.insert(out.id).second && state.fields == squad_fields::all)
    return format_error(at, "duplicate question id");
  DSA_ASSIGN_OR_RETURN(const json* question,
                       layout_field(item, "question", kind::string, at, "question", state));
  DSA_ASSIGN_OR_RETURN(const json* answers, field(item, "answers", kind::array, at, "question"));
  if (question)
    out.question = question->get<std::string>();
  // evaluate-v1.1 skips an unanswered question before it reads the answers, so
  // a scored file may hold a question without answers; squad_evaluate refuses
  // it only when there is a prediction to score.
  if (answers->empty() && state.fields == squad_fields::all)
    return format_error(at, "question has no answers");
  out.answers.resize(answers->size());
  for (std::size_t i = 0; i < answers->size(); ++i)
    DSA_TRY(parse_answer((*answers)[i], i, at, state, out.answers[i]));
  return {};
}

status parse_paragraph(const json& item, location at, parse_state& state, squad_paragraph& out) {
  if (!item.is_object())
    return format_error(at, fmt::format("paragraph is {}, expected object", type_name(item)));
  DSA_ASSIGN_OR_RETURN(const json* context,
                       layout_field(item, "context", kind::string, at, "paragraph", state));
  DSA_ASSIGN_OR_RETURN(const json* qas, field(item, "qas", kind::array, at, "paragraph"));
  if (context)
    out.context = context->get<std::string>();
  out.qas.resize(qas->size());
  for (std::size_t i = 0; i < qas->size(); ++i)
    DSA_TRY(parse_question((*qas)[i], at, state, out.qas[i]));
  return {};
}

status parse_article(const json& item, location at, parse_state& state, squad_article& out) {
  if (!item.is_object())
    return format_error(at, fmt::format("article is {}, expected object", type_name(item)));
  DSA_ASSIGN_OR_RETURN(const json* title,
                       layout_field(item, "title", kind::string, at, "article", state));
  if (title)
    out.title = title->get<std::string>();
  at.title = out.title;
  DSA_ASSIGN_OR_RETURN(const json* paragraphs,
                       field(item, "paragraphs", kind::array, at, "article"));
  out.paragraphs.resize(paragraphs->size());
  for (std::size_t i = 0; i < paragraphs->size(); ++i) {
    at.paragraph = static_cast<std::int64_t>(i);
    DSA_TRY(parse_paragraph((*paragraphs)[i], at, state, out.paragraphs[i]));
  }
  return {};
}

} // namespace

std::int64_t squad_dataset::question_count() const {
  std::int64_t n = 0;
  for (const auto& article : articles)
    for (const auto& paragraph : article.paragraphs)
      n += static_cast<std::int64_t>(paragraph.qas.size());
  return n;
}

bool squad_answer_matches(std::string_view context, const std::vector<std::size_t>& offsets,
                          squad_answer& answer) {
  std::int64_t chars = static_cast<std::int64_t>(offsets.size()) - 1;
  std::int64_t length = static_cast<std::int64_t>(utf8_decode(answer.text).size());
  if (answer.answer_start < 0 || answer.answer_start + length > chars)
    return false;
  std::size_t b = offsets[static_cast<std::size_t>(answer.answer_start)];
  std::size_t e = offsets[static_cast<std::size_t>(answer.answer_start + length)];
  if (context.substr(b, e - b) != answer.text)
    return false;
  answer.byte_start = b;
  return true;
}

expected<squad_dataset> parse_squad(std::string_view json_text, std::string_view source,
                                    squad_fields fields) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return make_error(errc::format, "{}: not valid JSON: {}", source, e.what());
  }
  location at;
  at.source = source;
  if (!root.is_object())
    return format_error(at, fmt::format("top level is {}, expected object", type_name(root)));
  squad_dataset out;
  if (auto it = root.find("version"); it != root.end()) {
    if (!it->is_string())
      return format_error(at,
                          fmt::format("field 'version' is {}, expected string", type_name(*it)));
    out.version = it->get<std::string>();
  }
  DSA_ASSIGN_OR_RETURN(const json* data, field(root, "data", kind::array, at, "top level"));
  parse_state state;
  state.fields = fields;
  out.articles.resize(data->size());
  for (std::size_t i = 0; i < data->size(); ++i) {
    at.article = static_cast<std::int64_t>(i);
    DSA_TRY(parse_article((*data)[i], at, state, out.articles[i]));
  }
  return out;
}

expected<squad_dataset> load_squad(const std::string& path, squad_fields fields) {
  DSA_ASSIGN_OR_RETURN(std::string text, ckpt::read_file(path));
  return parse_squad(text, path, fields);
}

std::string squad_to_json(const squad_dataset& dataset, int indent) {
  nlohmann::ordered_json articles = nlohmann::ordered_json::array();
  for (const auto& article : dataset.articles) {
    nlohmann::ordered_json paragraphs = nlohmann::ordered_json::array();
    for (const auto& paragraph : article.paragraphs) {
      nlohmann::ordered_json qas = nlohmann::ordered_json::array();
      for (const auto& q : paragraph.qas) {
        nlohmann::ordered_json answers = nlohmann::ordered_json::array();
        for (const auto& a : q.answers)
          answers.push_back({{"answer_start", a.answer_start}, {"text", a.text}});
        qas.push_back({{"answers", std::move(answers)}, {"question", q.question}, {"id", q.id}});
      }
      paragraphs.push_back({{"context", paragraph.context}, {"qas", std::move(qas)}});
    }
    articles.push_back({{"title", article.title}, {"paragraphs", std::move(paragraphs)}});
  }
  nlohmann::ordered_json root = {{"data", std::move(articles)}, {"version", dataset.version}};
  return root.dump(indent, ' ', true);
}

status write_squad(const std::string& path, const squad_dataset& dataset) {
  return ckpt::write_file_atomic(path, squad_to_json(dataset));
}

} // namespace dsa::data
