// Which hosts of a job still answer, before `dsactor launch --max_restarts` starts it again:
// each one's `ssh -o BatchMode=yes -o ConnectTimeout=T HOST true`, all at once, each killed
// after 2T; localhost always answers.
#pragma once

#include "tools/launch/hostfile.hpp"

#include <string>
#include <vector>

namespace dsa::tools {

// [i]: whether hosts[i] answered over `ssh` (the client program's path) within
// `timeout_s` seconds.
std::vector<bool> hosts_answering(const std::vector<host_slots>& hosts, const std::string& ssh, int timeout_s);

} // namespace dsa::tools
