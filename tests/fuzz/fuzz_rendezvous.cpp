// libFuzzer target: the rendezvous frames' payload decoders; the first byte picks one.
#include "io/net/rendezvous_frame.hpp"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto* p = reinterpret_cast<const std::byte*>(data);
  const dsa::net::bytes payload(p + 1, p + size);
  switch (data[0] % 5) {
  case 0: (void)dsa::net::decode_hello(payload); break;
  case 1: (void)dsa::net::decode_blobs(payload); break;
  case 2: (void)dsa::net::decode_abort(payload); break;
  case 3: (void)dsa::net::decode_keyed(payload); break;
  default: (void)dsa::net::decode_clock(payload); break;
  }
  return 0;
}
