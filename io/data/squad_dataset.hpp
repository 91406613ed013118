// SQuAD v1.1 data set in memory and its loader for the official JSON layout:
// {"version", "data": [{title, paragraphs: [{context, qas: [{id, question,
// answers: [{text, answer_start}]}]}]}]}. The loader validates as it reads.
#pragma once

#include "core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::data {

struct squad_answer {
  std::string text;
  std::int64_t answer_start = 0; // offset in the context in code points (Python characters)
  std::size_t byte_start = 0;    // the same offset in bytes; set by squad_answer_matches
};

struct squad_question {
  std::string id;
  std::string question;
  std::vector<squad_answer> answers; // at least one; dev files hold several
};

struct squad_paragraph {
  std::string context;
  std::vector<squad_question> qas;
};

struct squad_article {
  std::string title;
  std::vector<squad_paragraph> paragraphs;
};

struct squad_dataset {
  std::string version; // "1.1" for the official files; empty when the file has none
  std::vector<squad_article> articles;

  std::int64_t question_count() const;
};

// What the loader requires of a file.
//   all:    the whole layout (training and the run's dev evaluation read the
//           titles, contexts and questions); question ids are unique.
//   scored: only what the official evaluate-v1.1 script reads: data, paragraphs,
//           qas, id, answers and each answer's text. Other fields are not read (left
//           empty or 0, whatever the file holds), and an id may repeat (the script
//           scores each occurrence). For `dsactor eval squad`.
enum class squad_fields : std::uint8_t { all, scored };

// Parses SQuAD JSON text. `source` names the input in error messages. Errors
// (errc::format) name the article (index and title), paragraph index and
// question id: a missing field, a wrong type, an empty answer list (the official
// script fails on one too) or, under squad_fields::all, a duplicate question id.
// An answer whose text differs from the context at answer_start (case, spacing,
// a wrong offset) is read as written: the official script compares answer texts
// only, and files made by hand or by other tools hold such answers. Unknown
// fields are ignored; "version" is optional.
expected<squad_dataset> parse_squad(std::string_view json_text, std::string_view source = "<squad>",
                                    squad_fields fields = squad_fields::all);
// Reads and parses a file (errc::io when it cannot be read).
expected<squad_dataset> load_squad(const std::string& path,
                                   squad_fields fields = squad_fields::all);

// The context substring [answer_start, answer_start + length(text)) in code
// points equals the text; fills byte_start when it does.
bool squad_answer_matches(std::string_view context,
                          const std::vector<std::size_t>& code_point_offsets, squad_answer& answer);

// Serializes to the official layout (ensure_ascii escapes, as Python's json.dump).
std::string squad_to_json(const squad_dataset& dataset, int indent = -1);
status write_squad(const std::string& path, const squad_dataset& dataset);

} // namespace dsa::data
