// Python-compatible string helpers for SQuAD: UTF-8 <-> code points (SQuAD's
// answer_start counts code points, as Python's str does), str.isspace,
// str.split(), str.lower() and the \w class of Python's re module.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::data {

// Decodes UTF-8; an ill-formed byte becomes U+FFFD (one per byte).
std::u32string utf8_decode(std::string_view text);
std::string utf8_encode(std::u32string_view text);
void utf8_append(std::string& out, char32_t c);

// Byte offset of every code point of `text`, plus text.size() at the end
// (size = code points + 1). Maps a Python character offset to a byte offset.
std::vector<std::size_t> utf8_code_point_offsets(std::string_view text);

// Python's str.isspace() for one character.
bool python_is_space(char32_t c);
// Python's str.split() with no argument: splits on runs of Unicode whitespace.
std::vector<std::string> python_split(std::string_view text);
// Python's str.strip() with no argument.
std::string python_strip(std::string_view text);
// Python's str.lower(): Unicode lower-casing (simple mappings, plus U+0130 and
// the final-sigma rule that Python applies).
std::string python_lower(std::string_view text);
std::u32string python_lower(std::u32string_view text);
// Membership in \w of Python's re module on str patterns (alphanumerics and '_').
bool python_is_word_char(char32_t c);

} // namespace dsa::data
