// Progress of a run: a one-line bar with rate and ETA on a terminal, plain
// periodic log lines otherwise (every steps_per_print steps).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dsa::train {

struct step_report {
  std::int64_t step = 0; // optimizer steps done
  double loss = 0;
  double lr = 0;
  double loss_scale = 1;
  double samples_per_s = 0;
  std::string extra; // e.g. "fwd 12.1 ms bwd 25.3 ms step 3.2 ms" with wall_clock_breakdown
};

enum class progress_style : std::uint8_t { bar, lines };

class progress {
public:
  // total_steps: the run's length; print_every: steps_per_print for the line style (0: never).
  progress(std::int64_t first_step, std::int64_t total_steps, std::int64_t print_every, progress_style style);
  // Style chosen from whether stderr is a terminal.
  static progress_style detect_style();

  void update(const step_report& r);
  void finish();

  // "1h02m", "3m05s", "12s".
  static std::string format_duration(double seconds);

private:
  std::int64_t first_step_, total_, every_;
  progress_style style_;
  std::chrono::steady_clock::time_point start_;
  bool bar_open_ = false;
};

} // namespace dsa::train
