// Python-compatible string helpers: UTF-8 decoding and str methods on code points.
#include "io/data/squad_text.hpp"

#include <locale.h>
#include <wctype.h>

namespace dsa::data {
namespace {

constexpr char32_t replacement = 0xFFFD;

// The C.UTF-8 locale's ctype tables hold Unicode's simple case mappings and
// classes; one process-wide handle, created on first use (thread-safe static).
locale_t unicode_locale() {
  static const locale_t handle =
      newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return handle;
}

char32_t simple_lower(char32_t c) {
  if (c < 0x80)
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  locale_t loc = unicode_locale();
  if (!loc)
    return c;
  return static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), loc));
}

bool is_cased_letter(char32_t c) {
  if (c < 0x80)
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
  locale_t loc = unicode_locale();
  if (!loc)
    return false;
  wint_t w = static_cast<wint_t>(c);
  return iswalpha_l(w, loc) && (towlower_l(w, loc) != w || towupper_l(w, loc) != w);
}

} // namespace

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Decodes the code point at text[i], sets `length` to its byte count (1 for an
// ill-formed byte, which decodes to U+FFFD).
static char32_t decode_one(std::string_view text, std::size_t i, std::size_t& length) {
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  unsigned char b0 = byte(i);
  length = 1;
  if (b0 < 0x80)
    return b0;
  std::size_t n = 0;
  char32_t c = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1;
    c = b0 & 0x1F;
    min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2;
    c = b0 & 0x0F;
    min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3;
    c = b0 & 0x07;
    min = 0x10000;
  } else
    return replacement;
  if (i + n >= text.size())
    return replacement; // truncated sequence
  for (std::size_t k = 1; k <= n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80)
      return replacement;
    c = (c << 6) | (byte(i + k) & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
    return replacement;
  length = n + 1;
  return c;
}

std::u32string utf8_decode(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (std::size_t i = 0, len = 0; i < text.size(); i += len)
    out.push_back(decode_one(text, i, len));
  return out;
}

std::string utf8_encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text)
    utf8_append(out, c);
  return out;
}

std::vector<std::size_t> utf8_code_point_offsets(std::string_view text) {
  std::vector<std::size_t> offsets;
  offsets.reserve(text.size() + 1);
  std::size_t len = 0;
  for (std::size_t i = 0; i < text.size(); i += len) {
    offsets.push_back(i);
    decode_one(text, i, len);
  }
  offsets.push_back(text.size());
  return offsets;
}

bool python_is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::vector<std::string> python_split(std::string_view text) {
  std::vector<std::string> words;
  std::string current;
  bool in_word = false;
  for (std::size_t i = 0, len = 0; i < text.size(); i += len) {
    char32_t c = decode_one(text, i, len);
    if (python_is_space(c)) {
      if (in_word)
        words.push_back(std::move(current));
      current.clear();
      in_word = false;
    } else {
      current.append(text.substr(i, len));
      in_word = true;
    }
  }
  if (in_word)
    words.push_back(std::move(current));
  return words;
}

std::string python_strip(std::string_view text) {
  std::u32string cps = utf8_decode(text);
  std::size_t begin = 0, end = cps.size();
  while (begin < end && python_is_space(cps[begin]))
    ++begin;
  while (end > begin && python_is_space(cps[end - 1]))
    --end;
  return utf8_encode(std::u32string_view(cps).substr(begin, end - begin));
}

std::u32string python_lower(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    char32_t c = text[i];
    if (c == 0x130) { // LATIN CAPITAL LETTER I WITH DOT ABOVE: full mapping is two code points
      out.push_back(U'i');
      out.push_back(0x307);
    } else if (c == 0x3A3) { // GREEK CAPITAL SIGMA: final form at the end of a word
      bool after_cased = i > 0 && is_cased_letter(text[i - 1]);
      bool before_cased = i + 1 < text.size() && is_cased_letter(text[i + 1]);
      out.push_back(after_cased && !before_cased ? char32_t{0x3C2} : char32_t{0x3C3});
    } else {
      out.push_back(simple_lower(c));
    }
  }
  return out;
}

std::string python_lower(std::string_view text) {
  bool ascii = true;
  for (char c : text)
    ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(text);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z')
        c = static_cast<char>(c + 32);
    return out;
  }
  return utf8_encode(python_lower(utf8_decode(text)));
}

bool python_is_word_char(char32_t c) {
  if (c < 0x80)
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  locale_t loc = unicode_locale();
  return loc && iswalnum_l(static_cast<wint_t>(c), loc);
}

} // namespace dsa::data
