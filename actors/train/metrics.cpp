// CSV and JSON-lines metric files.
#include "actors/train/metrics.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
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

expected<metrics_writer> metrics_writer::open(const std::string& run_dir, bool append) {
  std::string csv_path = run_dir + "/metrics.csv", jsonl_path = run_dir + "/metrics.jsonl";
  struct stat st{};
  bool had_csv = append && ::stat(csv_path.c_str(), &st) == 0 && st.st_size > 0;
  std::FILE* csv = std::fopen(csv_path.c_str(), append ? "a" : "w");
  if (!csv) return make_error(errc::io, "{}: cannot open: {}", csv_path, std::strerror(errno));
  std::FILE* jsonl = std::fopen(jsonl_path.c_str(), append ? "a" : "w");
  if (!jsonl) {
    std::fclose(csv);
    return make_error(errc::io, "{}: cannot open: {}", jsonl_path, std::strerror(errno));
  }
  return metrics_writer(csv, jsonl, run_dir, had_csv);
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
