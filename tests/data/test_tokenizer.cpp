// BERT tokenizer cases checked by hand: clean-up, CJK, accents, punctuation, WordPiece.
#include "models/tokenizer/bert_tokenizer.hpp"
#include "models/tokenizer/unicode.hpp"

#include <doctest/doctest.h>

using namespace dsa::tok;
using strings = std::vector<std::string>;

namespace {
tokenizer_options uncased() {
  return {};
}
tokenizer_options cased() {
  tokenizer_options o;
  o.case_mode = casing::keep;
  return o;
}
} // namespace

TEST_CASE("unicode: classes, lower-casing and decomposition") {
  CHECK(is_punctuation(U'!'));
  CHECK(is_punctuation(U'$')); // ASCII range, though Sc
  CHECK(is_punctuation(U'^'));
  CHECK(is_punctuation(0x00BF)); // ¿ Po
  CHECK(is_punctuation(0x3002)); // 。 Po
  CHECK_FALSE(is_punctuation(U'a'));
  CHECK(is_whitespace(U'\t'));
  CHECK(is_whitespace(0x00A0)); // NO-BREAK SPACE, Zs
  CHECK(is_whitespace(0x3000));
  CHECK_FALSE(is_control(U'\n'));
  CHECK(is_control(0x0007));
  CHECK(is_control(0x200B)); // ZERO WIDTH SPACE is Cf
  std::u32string s;
  append_lower(s, 0x00C9); // É
  append_lower(s, 0x0394); // Δ
  append_lower(s, 0x0416); // Ж
  CHECK(s == U"\u00e9\u03b4\u0436");
  std::u32string d;
  append_nfd(d, 0x00E9);
  CHECK(d == U"e\u0301");
  d.clear();
  append_nfd(d, 0x1EC7); // ệ -> e + dot below + circumflex
  CHECK(d == U"e\u0323\u0302");
  d.clear();
  append_nfd(d, 0xD55C); // 한 -> three jamo
  CHECK(d == U"\u1112\u1161\u11ab");
  CHECK(utf8_encode(utf8_decode("h\xc3\xa9llo \xe4\xb8\xad")) == "h\xc3\xa9llo \xe4\xb8\xad");
  CHECK(utf8_decode("a\xff"
                    "b") == U"a\ufffdb");
}

TEST_CASE("basic tokenizer: accents are stripped uncased and kept cased") {
  CHECK(basic_tokenize("H\xc3\xa9llo W\xc3\xb6rld", uncased()) == strings{"hello", "world"});
  CHECK(basic_tokenize("H\xc3\xa9llo W\xc3\xb6rld", cased()) ==
        strings{"H\xc3\xa9llo", "W\xc3\xb6rld"});
  // Greek and Cyrillic lower-case; Greek tonos is stripped.
  CHECK(basic_tokenize("\xce\x86\xce\xb8\xce\xae\xce\xbd\xce\xb1 "
                       "\xd0\x9c\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0",
                       uncased()) == strings{"\xce\xb1\xce\xb8\xce\xb7\xce\xbd\xce\xb1",
                                             "\xd0\xbc\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0"});
}

TEST_CASE("basic tokenizer: punctuation splits") {
  CHECK(basic_tokenize("don't!", uncased()) == strings{"don", "'", "t", "!"});
  CHECK(basic_tokenize("a.b,c ($5)", uncased()) ==
        strings{"a", ".", "b", ",", "c", "(", "$", "5", ")"});
  CHECK(basic_tokenize("\xc2\xbfQu\xc3\xa9?", uncased()) == strings{"\xc2\xbf", "que", "?"});
}

TEST_CASE("basic tokenizer: CJK ideographs are spaced out") {
  // 中文abc -> 中 文 abc ; hiragana is not in the ideograph blocks.
  CHECK(basic_tokenize("\xe4\xb8\xad\xe6\x96\x87"
                       "abc",
                       uncased()) == strings{"\xe4\xb8\xad", "\xe6\x96\x87", "abc"});
  CHECK(basic_tokenize("\xe3\x81\x82\xe3\x81\x84", uncased()) ==
        strings{"\xe3\x81\x82\xe3\x81\x84"});
  tokenizer_options no_cjk;
  no_cjk.tokenize_chinese_chars = false;
  CHECK(basic_tokenize("\xe4\xb8\xad\xe6\x96\x87", no_cjk) == strings{"\xe4\xb8\xad\xe6\x96\x87"});
}

TEST_CASE("basic tokenizer: control characters removed, whitespace normalised") {
  CHECK(basic_tokenize(std::string("he\0llo\x07 wo\xef\xbf\xbdrld", 17), uncased()) ==
        strings{"hello", "world"});
  CHECK(basic_tokenize("a\tb\r\nc\xc2\xa0"
                       "d\xe2\x80\x8b"
                       "e",
                       uncased()) == strings{"a", "b", "c", "de"});
  CHECK(basic_tokenize("   \t\n ", uncased()).empty());
}

TEST_CASE("wordpiece: greedy longest match with ## continuations") {
  vocab v = vocab::from_tokens({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff",
                                "##able", "runn", "##ing", "want", "##want", "##ed", "wa", ",",
                                "\xc3\xa9t\xc3\xa9"});
  bert_tokenizer tok(v);
  CHECK(tok.tokenize("unaffable") == strings{"un", "##aff", "##able"});
  CHECK(tok.tokenize("UNwant\xc3\xa9"
                     "d,running") == strings{"un", "##want", "##ed", ",", "runn", "##ing"});
  CHECK(tok.tokenize("unknownword") == strings{"[UNK]"});
  CHECK(tok.tokenize("wants") == strings{"[UNK]"}); // "##s" missing: the whole word is unknown
  CHECK(tok.encode("unaffable") == std::vector<std::int32_t>{5, 6, 7});
  CHECK(tok.encode("xyz") == std::vector<std::int32_t>{1});

  tokenizer_options keep = cased();
  bert_tokenizer cased_tok(v, keep);
  CHECK(cased_tok.tokenize("\xc3\xa9t\xc3\xa9") == strings{"\xc3\xa9t\xc3\xa9"});
  CHECK(cased_tok.tokenize("Unaffable") == strings{"[UNK]"});
}

TEST_CASE("wordpiece: words over 100 code points are [UNK]") {
  std::vector<std::string> tokens{"[UNK]", "a", "##a"};
  bert_tokenizer tok(vocab::from_tokens(tokens));
  CHECK(tok.tokenize(std::string(100, 'a')).size() == 100);
  CHECK(tok.tokenize(std::string(101, 'a')) == strings{"[UNK]"});
  // 100 two-byte characters are 100 code points, not 200.
  std::vector<std::string> accented{"[UNK]", "\xc3\xa9", "##\xc3\xa9"};
  std::string word;
  for (int i = 0; i < 100; ++i)
    word += "\xc3\xa9";
  bert_tokenizer cased_tok(vocab::from_tokens(accented), cased());
  CHECK(cased_tok.tokenize(word).size() == 100);
  CHECK(cased_tok.tokenize(word + "\xc3\xa9") == strings{"[UNK]"});
}

TEST_CASE("vocab: ids, unknown tokens and special ids") {
  vocab v = vocab::from_tokens({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello"});
  CHECK(v.size() == 6);
  CHECK(v.id("hello") == 5);
  CHECK(v.id("nope") == 1);
  CHECK(v.pad_id() == 0);
  CHECK(v.cls_id() == 2);
  CHECK(v.sep_id() == 3);
  CHECK(v.mask_id() == 4);
  CHECK(v.token(5) == "hello");
  auto missing = vocab::load("/nonexistent/vocab.txt");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message.find("/nonexistent/vocab.txt") != std::string::npos);
}
