// Included first in every test file (doctest_dep's -include): doctest 2.4.9 prints a
// `const char*` in MESSAGE, INFO and CAPTURE as its address, and its own switch for that
// (DOCTEST_CONFIG_TREAT_CHAR_STAR_AS_STRING) does not compile in that version. These
// specializations of its public StringMaker print the text instead.
#pragma once

#include <doctest/doctest.h>

namespace doctest {

template <>
struct StringMaker<const char*> {
  static String convert(const char* in) { return in ? String(in) : String("nullptr"); }
};

template <>
struct StringMaker<char*> {
  static String convert(const char* in) { return in ? String(in) : String("nullptr"); }
};

} // namespace doctest
