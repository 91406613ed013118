// Finding a SQuAD training answer in its context when answer_start does not
// point at the answer text: hand-made files and other tools write offsets that
// are off, and answer texts that differ from the context in case or spacing.
#pragma once

#include "io/data/squad_dataset.hpp"

#include <cstdint>
#include <string_view>

namespace dsa::data {

enum class squad_answer_place : std::uint8_t {
  at_offset, // the context holds the text at answer_start: nothing changed
  moved,     // found elsewhere, or only up to case and whitespace: answer rewritten
  not_found, // neither: the answer is left as it was
};

// Looks for answer.text in `context` (decoded code points), in this order:
//   1. exactly at answer_start;
//   2. exactly, anywhere: the occurrence whose start is nearest answer_start;
//   3. up to case and whitespace (both sides lower-cased per character as
//      Python's str.lower, runs of Unicode whitespace as one space, the answer
//      stripped): the nearest such occurrence.
// Nearest ties go to the earlier occurrence. When moved, answer_start becomes
// the occurrence's code-point offset and text the context's own characters
// there, so that the labels come from the context as the reference run_squad
// expects. An empty (or all-whitespace) text is never found.
squad_answer_place squad_locate_answer(std::u32string_view context, squad_answer& answer);

} // namespace dsa::data
