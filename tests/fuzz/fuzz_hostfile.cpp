// libFuzzer target: the host list `dsactor launch --hostfile` reads, then the selection.
#include "tools/launch/hostfile.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto hosts = dsa::tools::parse_hostfile(text, "<fuzz>");
  if (hosts) (void)dsa::tools::select_hosts(*hosts, dsa::tools::host_filter{});
  return 0;
}
