// Corpus readers: Brown's tagged format on a hand-written sample, plain-text layouts.
#include "io/data/corpus.hpp"
#include "io/data/corpus_brown.hpp"
#include "tests/data/corpus_test_util.hpp"

#include <doctest/doctest.h>

using namespace dsa::data;
using strings = std::vector<std::string>;

TEST_CASE("brown: tags dropped, quotes undone, punctuation attached") {
  CHECK(brown_detokenize("\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ./.") ==
        "The jury said \"no evidence.\"");
  CHECK(brown_detokenize("``/`` Only/rb a/at handful/nn ''/'' ,/, the/at jury/nn said/vbd ./.") ==
        "\"Only a handful,\" the jury said.");
  CHECK(brown_detokenize("He/pps said/vbd ,/, ``/`` Nothing/pn ''/'' ./.") ==
        "He said, \"Nothing.\"");
  CHECK(brown_detokenize("more/ap '/' pro/nn '/' letters/nns than/cs '/' con/nn '/' ./.") ==
        "more 'pro' letters than 'con'.");
  CHECK(brown_detokenize("little/ap appetite/nn ;/. ;/.") == "little appetite;");
  CHECK(brown_detokenize("where/wrb ?/. ?/.") == "where?");
  CHECK(brown_detokenize("won/vbn by/in Ivan/np Allen/np Jr./np ./.") == "won by Ivan Allen Jr.");
  CHECK(brown_detokenize("a/at fee/nn (/( $100/nns )/) and/cc 1/2/cd men/nns --/-- tall/jj") ==
        "a fee ($100) and 1/2 men -- tall");
  CHECK(brown_detokenize("I'm/ppss+bem full/jj") == "I'm full");
}

TEST_CASE("brown: paragraphs, headlines and documents") {
  dsa::test::scratch_dir dir("brown");
  dir.write("ca01", "\n\n\tThe/at jury/nn said/vbd ./.\n"
                    "It/pps agreed/vbd ./.\n\n\n"
                    "\t``/`` Yes/rb ''/'' ,/, he/pps said/vbd ./.\n\n\n\n"
                    "Merger/nn-hl proposed/vbn-hl \n"
                    "However/wrb ,/, the/at jury/nn said/vbd so/rb ./.\n\n");
  dir.write("cb02", "\tSecond/od document/nn ./.\n");
  dir.write("README", "not a corpus file\n");
  dir.write("cats.txt", "ca01 news\n");
  auto docs = read_corpus(dir.path());
  REQUIRE(docs.has_value());
  REQUIRE(docs->size() == 2);
  const document& d = (*docs)[0];
  CHECK(d.id == "ca01");
  REQUIRE(d.paragraphs.size() == 4);
  CHECK(d.paragraphs[0].sentences == strings{"The jury said.", "It agreed."});
  CHECK(d.paragraphs[1].sentences == strings{"\"Yes,\" he said."});
  CHECK(d.paragraphs[2].sentences == strings{"Merger proposed"});
  CHECK(d.paragraphs[3].sentences == strings{"However, the jury said so."});
  CHECK((*docs)[1].id == "cb02");
  CHECK((*docs)[1].paragraphs[0].sentences == strings{"Second document."});
}

TEST_CASE("text corpus: one file with blank-line separated documents") {
  dsa::test::scratch_dir dir("text");
  std::string path = dir.write(
      "corpus.txt", "First sentence.\nSecond one.\n\n\n  Another document.  \n\nThird.\n");
  auto docs = read_corpus(path);
  REQUIRE(docs.has_value());
  REQUIRE(docs->size() == 3);
  CHECK((*docs)[0].paragraphs[0].sentences == strings{"First sentence.", "Second one."});
  CHECK((*docs)[1].paragraphs[0].sentences == strings{"Another document."});
  CHECK((*docs)[2].id == "corpus.txt#2");
}

TEST_CASE("text corpus: a directory, one document per file, paragraphs by blank lines") {
  dsa::test::scratch_dir dir("textdir");
  dir.write("b.txt", "B one.\n\nB two.\nB three.\n");
  dir.write("a.txt", "A one.\n");
  dir.write(".hidden", "skip me\n");
  auto docs = read_corpus(dir.path());
  REQUIRE(docs.has_value());
  REQUIRE(docs->size() == 2);
  CHECK((*docs)[0].id == "a.txt");
  REQUIRE((*docs)[1].paragraphs.size() == 2);
  CHECK((*docs)[1].paragraphs[1].sentences == strings{"B two.", "B three."});
}

TEST_CASE("corpus errors name the path") {
  auto missing = read_corpus("/nonexistent/corpus");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == dsa::errc::not_found);
  CHECK(missing.err().message.find("/nonexistent/corpus") != std::string::npos);
  dsa::test::scratch_dir dir("empty");
  std::string path = dir.write("empty.txt", "\n\n   \n");
  auto empty = read_corpus(path);
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.err().message.find("empty.txt") != std::string::npos);
  auto no_brown = read_brown_corpus(dir.path());
  CHECK_FALSE(no_brown.has_value());
}

// A corpus read a block at a time: the same documents in the same order as read_corpus,
// each block holding at least the asked bytes (or ending the corpus), no document split.
TEST_CASE("corpus blocks: the documents of read_corpus, a block at a time") {
  dsa::test::scratch_dir dir("blocks");
  std::string text;
  for (int d = 0; d < 40; ++d) text += "Document " + std::to_string(d) + " first.\nAnd second.\n\n";
  const std::string file = dir.write("corpus.txt", text);
  for (const std::string& path : {file, dir.path()}) {
    CAPTURE(path);
    auto whole = read_corpus(path);
    REQUIRE(whole.has_value());
    std::vector<document> streamed;
    std::vector<std::size_t> sizes;
    auto st = for_each_document_block(path, 100, [&](std::vector<document>&& block) -> dsa::status {
      sizes.push_back(block.size());
      for (auto& d : block) streamed.push_back(std::move(d));
      return {};
    });
    REQUIRE(st.has_value());
    REQUIRE(streamed.size() == whole->size());
    for (std::size_t i = 0; i < streamed.size(); ++i) {
      CHECK(streamed[i].id == (*whole)[i].id);
      REQUIRE(streamed[i].paragraphs.size() == (*whole)[i].paragraphs.size());
      for (std::size_t p = 0; p < streamed[i].paragraphs.size(); ++p)
        CHECK(streamed[i].paragraphs[p].sentences == (*whole)[i].paragraphs[p].sentences);
    }
    if (path == file) {
      // 30 bytes a document: blocks of 4 (120 bytes >= 100), the last one what is left.
      CHECK(sizes.size() == 10);
      CHECK(sizes.front() == 4);
    }
  }
  // The block's error stops the read and comes back.
  int calls = 0;
  auto stopped = for_each_document_block(file, 1, [&](std::vector<document>&&) -> dsa::status {
    ++calls;
    return dsa::make_error(dsa::errc::io, "disk full");
  });
  CHECK_FALSE(stopped.has_value());
  CHECK(calls == 1);
  auto missing = for_each_document_block("/nonexistent/corpus", 100, [](std::vector<document>&&) { return dsa::status{}; });
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message.find("/nonexistent/corpus") != std::string::npos);
}
