// Which of this machine's addresses a connection to a host leaves from: the address of the
// interface the routing table picks for it. The launcher's rendezvous server listens there
// (reachable by the host list's hosts), never on every interface unless asked.
#pragma once

#include "core/error.hpp"

#include <string>

namespace dsa::net {

// `host` (a name or an IPv4 address) resolved, and this machine's IPv4 address a packet to
// it would leave from (a UDP socket's connect, which sends nothing). An unknown name or no
// route is an error naming the host.
expected<std::string> local_address_towards(const std::string& host);

// Whether the IPv4 `address` is a loopback one (127.0.0.0/8): this machine only.
inline bool is_loopback(const std::string& address) { return address.rfind("127.", 0) == 0; }

// The name of the interface that holds the IPv4 `address` (getifaddrs): "eth0"; an error
// when none does.
expected<std::string> interface_of(const std::string& address);

} // namespace dsa::net
