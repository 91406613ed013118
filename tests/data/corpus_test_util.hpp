// Scratch directories and files for the corpus and pre-training tests.
#pragma once

#include "io/data/corpus.hpp"

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace dsa::test {

// `documents` documents "doc<d>" of `paragraphs` paragraphs, each holding every sentence
// once, rotated by d * doc_shift + p so paragraphs and documents differ.
inline std::vector<data::document> rotated_documents(const std::vector<std::string>& sentences, int documents,
                                                     int paragraphs, int doc_shift) {
  std::vector<data::document> docs;
  for (int d = 0; d < documents; ++d) {
    data::document doc;
    doc.id = "doc" + std::to_string(d);
    for (int p = 0; p < paragraphs; ++p) {
      data::paragraph para;
      for (std::size_t s = 0; s < sentences.size(); ++s)
        para.sentences.push_back(sentences[(s + static_cast<std::size_t>(d * doc_shift + p)) % sentences.size()]);
      doc.paragraphs.push_back(para);
    }
    docs.push_back(doc);
  }
  return docs;
}

// A fresh directory under the system temporary directory, removed on destruction.
class scratch_dir {
public:
  explicit scratch_dir(const std::string& tag) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("dsa-" + tag + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return file(name);
  }
  std::string path() const { return path_.string(); }

private:
  std::filesystem::path path_;
};

} // namespace dsa::test
