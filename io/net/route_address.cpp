// The local address towards a host; see route_address.hpp.
#include "io/net/route_address.hpp"

#include "io/ckpt/posix_file.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace dsa::net {

expected<std::string> local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0 || !found)
    return make_error(errc::invalid_argument, "host '{}': cannot resolve it: {}", host, ::gai_strerror(rc));
  sockaddr_in peer{};
  std::memcpy(&peer, found->ai_addr, sizeof peer);
  ::freeaddrinfo(found);
  ckpt::unique_fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return make_error(errc::io, "a socket to find the route to '{}': {}", host, std::strerror(errno));
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&peer), sizeof peer) != 0)
    return make_error(errc::io, "no route to host '{}': {}", host, std::strerror(errno));
  sockaddr_in mine{};
  socklen_t len = sizeof mine;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&mine), &len) != 0)
    return make_error(errc::io, "the local address towards '{}': {}", host, std::strerror(errno));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &mine.sin_addr, text, sizeof text);
  return std::string(text);
}

expected<std::string> interface_of(const std::string& address) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return make_error(errc::io, "listing the interfaces: {}", std::strerror(errno));
  std::string name;
  for (const ifaddrs* i = all; i && name.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    if (address == text) name = i->ifa_name;
  }
  ::freeifaddrs(all);
  if (name.empty()) return make_error(errc::invalid_argument, "no interface holds the address {}", address);
  return name;
}

} // namespace dsa::net
