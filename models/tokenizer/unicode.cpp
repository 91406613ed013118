// Lookups into the generated Unicode tables, plus UTF-8 decoding and encoding.
#include "models/tokenizer/unicode.hpp"

#include <algorithm>

namespace dsa::tok {

char_class classify(char32_t cp) {
  if (cp > 0x10FFFF)
    return char_class::control;
  const auto* begin = detail::class_ranges;
  const auto* end = begin + detail::class_range_count;
  const auto* it =
      std::upper_bound(begin, end, static_cast<std::uint32_t>(cp),
                       [](std::uint32_t c, const detail::class_range& r) { return c < r.first; });
  return static_cast<char_class>((it - 1)->klass); // ranges start at U+0000
}

bool is_whitespace(char32_t cp) {
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r')
    return true;
  return classify(cp) == char_class::space;
}

bool is_control(char32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r')
    return false;
  return classify(cp) == char_class::control;
}

bool is_punctuation(char32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126))
    return true;
  return classify(cp) == char_class::punctuation;
}

bool is_cjk_ideograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

void append_lower(std::u32string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  if (cp == 0x130) { // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
    out.push_back(U'i');
    out.push_back(0x307);
    return;
  }
  const auto* begin = detail::lower_map;
  const auto* end = begin + detail::lower_map_count;
  const auto* it =
      std::lower_bound(begin, end, static_cast<std::uint32_t>(cp),
                       [](const detail::code_map& m, std::uint32_t c) { return m.from < c; });
  out.push_back(it != end && it->from == cp ? static_cast<char32_t>(it->to) : cp);
}

void append_nfd(std::u32string& out, char32_t cp) {
  if (cp < 0xC0) {
    out.push_back(cp);
    return;
  }
  // Hangul syllables: arithmetic decomposition (Unicode ch. 3.12).
  constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
  constexpr char32_t t_count = 28, n_count = 21 * 28, s_count = 19 * 21 * 28;
  if (cp >= s_base && cp < s_base + s_count) {
    char32_t s = cp - s_base;
    out.push_back(l_base + s / n_count);
    out.push_back(v_base + (s % n_count) / t_count);
    if (s % t_count)
      out.push_back(t_base + s % t_count);
    return;
  }
  const auto* begin = detail::decompositions;
  const auto* end = begin + detail::decomposition_count;
  const auto* it =
      std::lower_bound(begin, end, static_cast<std::uint32_t>(cp),
                       [](const detail::decomposition& d, std::uint32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  for (int i = 0; i < it->length; ++i)
    out.push_back(detail::decomposition_pool[it->offset + i]);
}

std::u32string utf8_decode(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  std::size_t i = 0, n = text.size();
  while (i < n) {
    auto b0 = static_cast<unsigned char>(text[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int len = b0 >= 0xF0 && b0 <= 0xF4  ? 4
              : b0 >= 0xE0 && b0 < 0xF0 ? 3
              : b0 >= 0xC2 && b0 < 0xE0 ? 2
                                        : 0;
    char32_t cp = len == 4 ? b0 & 0x07 : len == 3 ? b0 & 0x0F : b0 & 0x1F;
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80)
        ok = false;
      cp = (cp << 6) | (b & 0x3F);
    }
    // Overlong 3/4-byte forms, surrogates and values past U+10FFFF are malformed.
    if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
               (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      while (i < n && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80)
        ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text)
    utf8_append(out, cp);
  return out;
}

} // namespace dsa::tok
