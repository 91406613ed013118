// Names of error codes and the failure path of DSA_CHECK.
#include "core/error.hpp"

#include <cstdio>

namespace dsa {

const char* errc_name(errc code) {
  switch (code) {
  case errc::invalid_argument: return "invalid argument";
  case errc::config: return "config error";
  case errc::io: return "I/O error";
  case errc::format: return "format error";
  case errc::not_found: return "not found";
  case errc::unsupported: return "unsupported";
  case errc::runtime: return "runtime error";
  case errc::protocol: return "protocol error";
  }
  return "error";
}

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "dsactor: check failed: %s at %s:%d: %s\n", expr, file, line, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

} // namespace dsa
