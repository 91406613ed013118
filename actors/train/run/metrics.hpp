// Training metrics in the run directory: metrics.csv and metrics.jsonl, one
// row per optimizer step, with DeepSpeed's monitor names
// (Train/Samples/train_loss, Train/Samples/lr, Train/Samples/loss_scale),
// keyed by global samples as DeepSpeed's monitors are.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dsa::train {

struct metrics_row {
  std::int64_t step = 0;
  std::int64_t global_samples = 0;
  // (name, value) in a fixed order; the first row fixes the CSV columns.
  std::vector<std::pair<std::string, double>> values;
};

class metrics_writer {
public:
  // Opens metrics.csv and metrics.jsonl in `run_dir`: new files, or, when resuming from
  // the checkpoint after `resume_step` optimizer steps, the existing files cut to their
  // rows of steps <= resume_step (rows of a crashed run's later steps are dropped).
  static expected<metrics_writer> open(const std::string& run_dir);
  static expected<metrics_writer> open_resumed(const std::string& run_dir, std::int64_t resume_step);
  metrics_writer(metrics_writer&& o) noexcept;
  metrics_writer& operator=(metrics_writer&&) = delete;
  metrics_writer(const metrics_writer&) = delete;
  ~metrics_writer();

  // Writes one row to both files and flushes them (a crash loses at most this row).
  status write(const metrics_row& row);

private:
  metrics_writer(std::FILE* csv, std::FILE* jsonl, std::string dir, bool header_written)
      : csv_(csv), jsonl_(jsonl), dir_(std::move(dir)), header_written_(header_written) {}
  std::FILE* csv_ = nullptr;
  std::FILE* jsonl_ = nullptr;
  std::string dir_;
  bool header_written_ = false;
};

} // namespace dsa::train
