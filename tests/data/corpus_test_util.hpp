// Scratch directories and files for the corpus and pre-training tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace dsa::test {

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
