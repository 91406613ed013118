// The comms logger; see comms_logger.hpp.
#include "io/net/comms_logger.hpp"

#include "core/log.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace dsa::net {

const std::vector<std::string>& comms_logger_ops() {
  static const std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter",
                                            "broadcast", "all_to_all", "barrier"};
  return ops;
}

double busbw_factor(std::string_view op, int ranks) {
  const double n = ranks;
  if (ranks <= 1) return 1.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return (n - 1) / n;
  return 1.0;
}

comms_logger::comms_logger(comms_logger_options options, int ranks) : options_(std::move(options)), ranks_(ranks) {}

bool comms_logger::profiles(std::string_view op) const {
  if (!options_.enabled) return false;
  if (options_.prof_all) return true;
  return std::find(options_.prof_ops.begin(), options_.prof_ops.end(), op) != options_.prof_ops.end();
}

namespace {
std::string size_text(std::int64_t bytes) {
  if (bytes >= (1 << 30)) return fmt::format("{:.2f} GB", static_cast<double>(bytes) / (1 << 30));
  if (bytes >= (1 << 20)) return fmt::format("{:.2f} MB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (1 << 10)) return fmt::format("{:.2f} KB", static_cast<double>(bytes) / (1 << 10));
  return fmt::format("{} B", bytes);
}
} // namespace

void comms_logger::record(std::string_view op, std::int64_t bytes, double seconds, std::string_view caller) {
  if (!profiles(op)) return;
  const double t = std::max(seconds, 1e-9);
  const double algbw = static_cast<double>(bytes) / t / 1e9;
  const double busbw = algbw * busbw_factor(op, ranks_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& x = totals_[{std::string(op), bytes}];
    ++x.count;
    x.total_s += seconds;
    x.algbw_sum += algbw;
    x.busbw_sum += busbw;
    if (options_.debug) ++x.callers[std::string(caller)];
  }
  if (options_.verbose)
    log_info("comm op: {} | time (ms): {:.3f} | msg size: {} | algbw (GB/s): {:.3f} | busbw (GB/s): {:.3f}{}", op,
             seconds * 1e3, size_text(bytes), algbw, busbw,
             options_.debug ? fmt::format(" | caller: {}", caller) : std::string());
}

std::vector<comms_logger::row> comms_logger::rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<row> out;
  for (const auto& [key, x] : totals_) {
    row r;
    r.op = key.first;
    r.bytes = key.second;
    r.count = x.count;
    r.total_s = x.total_s;
    r.algbw_GBps = x.algbw_sum / static_cast<double>(x.count);
    r.busbw_GBps = x.busbw_sum / static_cast<double>(x.count);
    for (const auto& [name, n] : x.callers) r.callers += fmt::format("{}{} x{}", r.callers.empty() ? "" : ", ", name, n);
    out.push_back(std::move(r));
  }
  return out;
}

std::string comms_logger::summary() const {
  auto all = rows();
  if (all.empty()) return "";
  std::string text = fmt::format("{:<16} {:>12} {:>8} {:>16} {:>14} {:>14} {:>14}", "Comm. Op", "Message Size",
                                 "Count", "Total Latency(ms)", "Avg Latency(ms)", "algbw (GB/s)", "busbw (GB/s)");
  std::string last_op;
  for (const auto& r : all) {
    text += fmt::format("\n{:<16} {:>12} {:>8} {:>16.3f} {:>14.3f} {:>14.3f} {:>14.3f}", r.op == last_op ? "" : r.op,
                        size_text(r.bytes), r.count, r.total_s * 1e3, r.total_s * 1e3 / static_cast<double>(r.count),
                        r.algbw_GBps, r.busbw_GBps);
    if (!r.callers.empty()) text += "  " + r.callers;
    last_op = r.op;
  }
  return text;
}

} // namespace dsa::net
