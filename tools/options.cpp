// Option parsing with uniform --help and error handling.
#include "tools/options.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace dsa::tools {

std::optional<int> parse_options(int argc, char** argv, const po::options_description& opts,
                                 po::variables_map& vm, std::string_view command,
                                 std::string_view epilog,
                                 const po::positional_options_description* positional) {
  try {
    auto parser = po::command_line_parser(argc, argv).options(opts);
    if (positional)
      parser.positional(*positional);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      fmt::print("{}{}", fmt::to_string(fmt::streamed(opts)), epilog);
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    fmt::print(stderr, "dsactor {}: {}\n{}", command, e.what(),
               fmt::to_string(fmt::streamed(opts)));
    return 2;
  }
  return std::nullopt;
}

} // namespace dsa::tools
