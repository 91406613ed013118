// Corpus readers: Brown (tagged) and plain text, chosen by layout.
#include "io/data/corpus.hpp"
#include "io/data/corpus_brown.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dsa::data {
namespace {

namespace fs = std::filesystem;

expected<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(errc::not_found, "cannot open corpus file '{}'", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad())
    return make_error(errc::io, "read error in corpus file '{}'", path.string());
  return ss.str();
}

// Regular, non-hidden files of a directory, sorted by name.
expected<std::vector<fs::path>> list_files(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!name.empty() && name[0] != '.' && it->is_regular_file(ec))
      files.push_back(it->path());
  }
  if (ec)
    return make_error(errc::io, "cannot list corpus directory '{}': {}", dir.string(),
                      ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return std::string(s.substr(b, e - b));
}

// Blocks of non-blank lines, separated by blank lines.
std::vector<std::vector<std::string>> blocks(const std::string& text) {
  std::vector<std::vector<std::string>> out(1);
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string t = trim(line);
    if (t.empty()) {
      if (!out.back().empty())
        out.emplace_back();
    } else {
      out.back().push_back(std::move(t));
    }
  }
  if (out.back().empty())
    out.pop_back();
  return out;
}

status require_documents(const std::vector<document>& docs, const std::string& path) {
  if (docs.empty())
    return make_error(errc::format, "corpus '{}' holds no documents", path);
  return {};
}

} // namespace

expected<std::vector<document>> read_brown_corpus(const std::string& dir) {
  DSA_ASSIGN_OR_RETURN(auto files, list_files(dir));
  std::vector<document> docs;
  for (const auto& f : files) {
    std::string name = f.filename().string();
    if (!is_brown_file_name(name))
      continue;
    DSA_ASSIGN_OR_RETURN(auto text, read_file(f));
    document doc = parse_brown_document(text, name);
    if (!doc.paragraphs.empty())
      docs.push_back(std::move(doc));
  }
  if (docs.empty())
    return make_error(errc::format, "'{}' holds no Brown corpus files (ca01 ... cr09)", dir);
  return docs;
}

expected<std::vector<document>> read_text_corpus(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return make_error(errc::not_found, "corpus '{}' does not exist", path);
  std::vector<document> docs;
  if (fs::is_directory(path, ec)) {
    DSA_ASSIGN_OR_RETURN(auto files, list_files(path));
    for (const auto& f : files) {
      DSA_ASSIGN_OR_RETURN(auto text, read_file(f));
      document doc{f.filename().string(), {}};
      for (auto& b : blocks(text))
        doc.paragraphs.push_back(paragraph{std::move(b)});
      if (!doc.paragraphs.empty())
        docs.push_back(std::move(doc));
    }
  } else {
    DSA_ASSIGN_OR_RETURN(auto text, read_file(path));
    std::string name = fs::path(path).filename().string();
    for (auto& b : blocks(text)) {
      document doc{name + "#" + std::to_string(docs.size()), {}};
      doc.paragraphs.push_back(paragraph{std::move(b)});
      docs.push_back(std::move(doc));
    }
  }
  DSA_TRY(require_documents(docs, path));
  return docs;
}

namespace {

std::size_t text_bytes(const document& d) {
  std::size_t n = 0;
  for (const auto& p : d.paragraphs)
    for (const auto& s : p.sentences) n += s.size() + 1;
  return n;
}

// Gathers documents into blocks of at least max_bytes and hands each on.
struct block_sink {
  std::size_t max_bytes;
  const std::function<status(std::vector<document>&&)>& fn;
  std::vector<document> docs;
  std::size_t bytes = 0, total = 0;
  status add(document d) {
    if (d.paragraphs.empty()) return {};
    bytes += text_bytes(d);
    docs.push_back(std::move(d));
    ++total;
    return bytes >= max_bytes ? flush() : status{};
  }
  status flush() {
    if (docs.empty()) return {};
    std::vector<document> out = std::move(docs);
    docs.clear();
    bytes = 0;
    return fn(std::move(out));
  }
};

} // namespace

status for_each_document_block(const std::string& path, std::size_t max_bytes,
                               const std::function<status(std::vector<document>&&)>& block) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return make_error(errc::not_found, "corpus '{}' does not exist", path);
  block_sink sink{std::max<std::size_t>(max_bytes, 1), block, {}};
  if (fs::is_directory(path, ec)) {
    DSA_ASSIGN_OR_RETURN(auto files, list_files(path));
    bool brown = false;
    for (const auto& f : files) brown = brown || is_brown_file_name(f.filename().string());
    for (const auto& f : files) {
      const std::string name = f.filename().string();
      if (brown && !is_brown_file_name(name)) continue;
      DSA_ASSIGN_OR_RETURN(auto text, read_file(f));
      document doc;
      if (brown) {
        doc = parse_brown_document(text, name);
      } else {
        doc.id = name;
        for (auto& b : blocks(text)) doc.paragraphs.push_back(paragraph{std::move(b)});
      }
      DSA_TRY(sink.add(std::move(doc)));
    }
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error(errc::not_found, "cannot open corpus file '{}'", path);
    const std::string name = fs::path(path).filename().string();
    std::string line;
    std::size_t index = 0;
    document doc{name + "#0", {paragraph{}}};
    auto finish = [&]() -> status {
      if (doc.paragraphs.front().sentences.empty()) return {};
      DSA_TRY(sink.add(std::move(doc)));
      doc = document{name + "#" + std::to_string(++index), {paragraph{}}};
      return {};
    };
    while (std::getline(in, line)) {
      std::string t = trim(line);
      if (t.empty()) {
        DSA_TRY(finish());
      } else {
        doc.paragraphs.front().sentences.push_back(std::move(t));
      }
    }
    if (in.bad()) return make_error(errc::io, "read error in corpus file '{}'", path);
    DSA_TRY(finish());
  }
  DSA_TRY(sink.flush());
  if (sink.total == 0) return make_error(errc::format, "corpus '{}' holds no documents", path);
  return {};
}

expected<std::vector<document>> read_corpus(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    DSA_ASSIGN_OR_RETURN(auto files, list_files(path));
    for (const auto& f : files)
      if (is_brown_file_name(f.filename().string()))
        return read_brown_corpus(path);
  }
  return read_text_corpus(path);
}

} // namespace dsa::data
