// dsactor report: lands with the tools work.
#include "tools/command.hpp"

namespace dsa::tools {
int cmd_report(int, char**) { return 0; }
} // namespace dsa::tools
