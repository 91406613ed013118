// Progress bar and periodic log lines.
#include "actors/train/run/progress.hpp"

#include "core/log.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace dsa::train {

progress::progress(std::int64_t first_step, std::int64_t total_steps, std::int64_t print_every,
                   progress_style style)
    : first_step_(first_step), total_(total_steps), every_(print_every), style_(style),
      start_(std::chrono::steady_clock::now()) {}

progress_style progress::detect_style() {
  return ::isatty(STDERR_FILENO) ? progress_style::bar : progress_style::lines;
}

std::string progress::format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "--";
  auto s = static_cast<std::int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

void progress::update(const step_report& r) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::int64_t done = r.step - first_step_;
  double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - r.step) : -1;
  std::string stats = fmt::format("loss {:.4f} | lr {:.3e} | scale {:g} | {:.1f} samples/s | ETA {}", r.loss, r.lr,
                                  r.loss_scale, r.samples_per_s, format_duration(eta));
  if (!r.extra.empty()) stats += " | " + r.extra;
  if (style_ == progress_style::bar) {
    constexpr int width = 24;
    int filled = total_ > 0 ? static_cast<int>(width * r.step / total_) : 0;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r\033[K[%s] step %lld/%lld | %s", bar.c_str(), static_cast<long long>(r.step),
                 static_cast<long long>(total_), stats.c_str());
    std::fflush(stderr);
    bar_open_ = true;
  } else if (every_ > 0 && (r.step % every_ == 0 || r.step == total_)) {
    log_info("step {}/{} | {}", r.step, total_, stats);
  }
}

void progress::finish() {
  if (bar_open_) std::fputc('\n', stderr);
  bar_open_ = false;
}

} // namespace dsa::train
