// CSV and JSON-lines metric files.
#include "actors/train/run/metrics.hpp"

#include "core/log.hpp"
#include "io/ckpt/atomic_file.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sys/stat.h>

namespace dsa::train {
namespace {
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return fmt::format("{}", v);
}
} // namespace

namespace {

expected<metrics_writer> open_files(const std::string& run_dir, bool append, bool header_written,
                                    metrics_writer (*make)(std::FILE*, std::FILE*, std::string, bool)) {
  std::string csv_path = run_dir + "/metrics.csv", jsonl_path = run_dir + "/metrics.jsonl";
  std::FILE* csv = std::fopen(csv_path.c_str(), append ? "a" : "w");
  if (!csv) return make_error(errc::io, "{}: cannot open: {}", csv_path, std::strerror(errno));
  std::FILE* jsonl = std::fopen(jsonl_path.c_str(), append ? "a" : "w");
  if (!jsonl) {
    std::fclose(csv);
    return make_error(errc::io, "{}: cannot open: {}", jsonl_path, std::strerror(errno));
  }
  return make(csv, jsonl, run_dir, header_written);
}

// Keeps the lines whose step (the first CSV field, or the "step" JSON key) is <= last_step;
// returns how many step lines it cut.
expected<std::int64_t> cut_file(const std::string& path, std::int64_t last_step, bool csv) {
  auto text = ckpt::read_file(path);
  if (!text) {
    if (text.err().code == errc::not_found) return std::int64_t{0};
    return text.err();
  }
  std::int64_t cut = 0;
  std::string kept;
  std::size_t begin = 0;
  bool first = true;
  while (begin < text->size()) {
    std::size_t end = text->find('\n', begin);
    if (end == std::string::npos) end = text->size();
    std::string line = text->substr(begin, end - begin);
    begin = end + 1;
    if (line.empty()) continue;
    bool keep = csv && first; // the CSV header
    first = false;
    if (!keep) {
      std::size_t at = csv ? 0 : line.find("\"step\":");
      if (at != std::string::npos) {
        at += csv ? 0 : 7;
        keep = std::strtoll(line.c_str() + at, nullptr, 10) <= last_step;
        cut += keep ? 0 : 1;
      }
    }
    if (keep) kept += line + "\n";
  }
  DSA_TRY(ckpt::write_file_atomic(path, kept));
  return cut;
}

} // namespace

expected<metrics_writer> metrics_writer::open(const std::string& run_dir) {
  return open_files(run_dir, false, false, [](std::FILE* c, std::FILE* j, std::string d, bool h) {
    return metrics_writer(c, j, std::move(d), h);
  });
}

expected<metrics_writer> metrics_writer::open_resumed(const std::string& run_dir, std::int64_t resume_step) {
  DSA_ASSIGN_OR_RETURN(const std::int64_t redone, cut_file(run_dir + "/metrics.csv", resume_step, true));
  if (auto cut = cut_file(run_dir + "/metrics.jsonl", resume_step, false); !cut) return cut.err();
  // The steps the run before had done past its checkpoint: they run again (a restart's loss).
  if (redone > 0)
    log_info("metrics: {} step(s) logged after step {}'s checkpoint run again (their rows cut)", redone, resume_step);
  struct stat st{};
  bool had_csv = ::stat((run_dir + "/metrics.csv").c_str(), &st) == 0 && st.st_size > 0;
  return open_files(run_dir, true, had_csv, [](std::FILE* c, std::FILE* j, std::string d, bool h) {
    return metrics_writer(c, j, std::move(d), h);
  });
}

metrics_writer::metrics_writer(metrics_writer&& o) noexcept
    : csv_(o.csv_), jsonl_(o.jsonl_), dir_(std::move(o.dir_)), header_written_(o.header_written_) {
  o.csv_ = o.jsonl_ = nullptr;
}

metrics_writer::~metrics_writer() {
  if (csv_) std::fclose(csv_);
  if (jsonl_) std::fclose(jsonl_);
}

status metrics_writer::write(const metrics_row& row) {
  if (!header_written_) {
    std::string header = "step,global_samples";
    for (const auto& [name, v] : row.values) header += "," + name;
    std::fprintf(csv_, "%s\n", header.c_str());
    header_written_ = true;
  }
  std::string csv = fmt::format("{},{}", row.step, row.global_samples);
  std::string json = fmt::format("{{\"step\":{},\"global_samples\":{}", row.step, row.global_samples);
  for (const auto& [name, v] : row.values) {
    csv += "," + number(v);
    json += fmt::format(",\"{}\":{}", name, std::isfinite(v) ? number(v) : "null");
  }
  json += "}";
  if (std::fprintf(csv_, "%s\n", csv.c_str()) < 0 || std::fprintf(jsonl_, "%s\n", json.c_str()) < 0 ||
      std::fflush(csv_) != 0 || std::fflush(jsonl_) != 0)
    return make_error(errc::io, "{}: writing metrics failed: {}", dir_, std::strerror(errno));
  return {};
}

} // namespace dsa::train
