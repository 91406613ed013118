// fio as the peer of `dsactor bench aio`; see bench_fio.hpp.
#include "tools/bench/bench_fio.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace dsa::tools {
namespace {

// Single quotes for a shell word.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// One fio run of `rw` (write or read) on `file`: bytes per second.
expected<double> run_fio(const std::string& file, const char* rw, std::size_t bytes) {
  const std::string cmd = fmt::format(
      "fio --name=dsactor --filename={} --rw={} --bs=1M --iodepth=32 --ioengine=libaio --direct=1 --size={} "
      "--output-format=json 2>&1",
      quoted(file), rw, bytes);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  if (!pipe) return make_error(errc::io, "cannot run fio");
  std::string text;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe.get())) text.append(buf, n);
  const int status = ::pclose(pipe.release());
  // fio may print notes before the JSON object.
  const auto brace = text.find('{');
  const auto j = nlohmann::json::parse(brace == std::string::npos ? std::string() : text.substr(brace), nullptr, false);
  if (status != 0 || j.is_discarded() || !j.contains("jobs") || j["jobs"].empty())
    return make_error(errc::io, "fio --rw={} on '{}' failed: {}", rw, file, text.substr(0, 400));
  const double bw = j["jobs"][0][rw]["bw_bytes"].get<double>();
  if (!(bw > 0)) return make_error(errc::io, "fio --rw={} on '{}' reported no bandwidth", rw, file);
  return bw;
}

} // namespace

expected<transfer_rates> measure_fio(const std::string& dir, std::size_t bytes, int reps) {
  if (std::system("command -v fio >/dev/null 2>&1") != 0)
    return make_error(errc::not_found, "fio is not installed (Debian package fio)");
  const std::string file = dir + "/dsactor_bench_fio.tmp";
  transfer_rates r;
  r.direct = true;
  status result;
  for (int rep = 0; rep < reps && result; ++rep) {
    auto w = run_fio(file, "write", bytes);
    auto rd = w ? run_fio(file, "read", bytes) : expected<double>(w.err());
    if (!w || !rd) {
      result = !w ? w.err() : rd.err();
      break;
    }
    r.write_gbps = std::max(r.write_gbps, *w / 1e9);
    r.read_gbps = std::max(r.read_gbps, *rd / 1e9);
  }
  std::error_code ec;
  std::filesystem::remove(file, ec);
  if (!result) return result.err();
  return r;
}

} // namespace dsa::tools
