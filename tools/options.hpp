// Command-line parsing shared by the subcommands (Boost.Program_options).
#pragma once

#include <boost/program_options.hpp>

#include <optional>
#include <string_view>

namespace dsa::tools {

namespace po = boost::program_options;

// Parses argv into vm. `--help` prints the options (then `epilog`) and yields 0; a bad
// or missing option prints the error, naming it, and yields 2; otherwise nullopt (go on).
std::optional<int> parse_options(int argc, char** argv, const po::options_description& opts,
                                 po::variables_map& vm, std::string_view command,
                                 std::string_view epilog = "",
                                 const po::positional_options_description* positional = nullptr);

} // namespace dsa::tools
