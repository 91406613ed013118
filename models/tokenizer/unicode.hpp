// The Unicode facts the BERT tokenizer needs (character class, lower-casing,
// canonical decomposition) and UTF-8 decoding/encoding. Tables cover all of
// Unicode at the version of the generator's Python (tools/gen_unicode_tables.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::tok {

enum class char_class : std::uint8_t {
  other = 0,
  punctuation = 1,    // general category P*
  space = 2,          // general category Zs
  control = 3,        // general category C* (Cc, Cf, Cn, Co, Cs)
  nonspacing_mark = 4 // general category Mn
};

char_class classify(char32_t cp);

// HuggingFace's predicates: whitespace is ' ', \t, \n, \r and Zs; control is C*
// except \t, \n, \r; punctuation is ASCII 33-47, 58-64, 91-96, 123-126 and P*.
bool is_whitespace(char32_t cp);
bool is_control(char32_t cp);
bool is_punctuation(char32_t cp);
bool is_cjk_ideograph(char32_t cp); // the CJK Unified Ideograph blocks BERT spaces out

// Appends the lower-case form (Python's str.lower per code point; U+0130 gives two).
void append_lower(std::u32string& out, char32_t cp);
// Appends the full canonical decomposition (NFD of one code point; Hangul included).
// Marks are not canonically re-ordered across code points.
void append_nfd(std::u32string& out, char32_t cp);

// Decodes UTF-8; every malformed sequence becomes one U+FFFD.
std::u32string utf8_decode(std::string_view text);
void utf8_append(std::string& out, char32_t cp);
std::string utf8_encode(std::u32string_view text);

namespace detail {
struct class_range {
  std::uint32_t first;
  std::uint8_t klass;
};
struct code_map {
  std::uint32_t from;
  std::uint32_t to;
};
struct decomposition {
  std::uint32_t cp;
  std::uint16_t offset;
  std::uint8_t length;
};
extern const class_range class_ranges[];
extern const std::size_t class_range_count;
extern const code_map lower_map[];
extern const std::size_t lower_map_count;
extern const std::uint32_t decomposition_pool[];
extern const decomposition decompositions[];
extern const std::size_t decomposition_count;
} // namespace detail

} // namespace dsa::tok
