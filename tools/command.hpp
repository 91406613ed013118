// The dsactor subcommands: each lives in its own file and is listed once in main.cpp.
#pragma once

namespace dsa::tools {

// argv[0] is the subcommand name; returns the process exit code.
using command_fn = int (*)(int argc, char** argv);

int cmd_report(int argc, char** argv);
int cmd_bench(int argc, char** argv);

} // namespace dsa::tools
