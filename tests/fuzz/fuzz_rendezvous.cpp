// libFuzzer target: the rendezvous frames' payload decoders, and the frame reader that cuts
// a connection's bytes into frames (length, type); the first byte picks one.
#include "io/net/rendezvous_frame.hpp"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto* p = reinterpret_cast<const std::byte*>(data);
  const dsa::net::bytes payload(p + 1, p + size);
  if (data[0] % 6 == 5) { // a connection's bytes, arriving in two pieces
    dsa::net::frame_buffer frames;
    const std::size_t cut = payload.size() / 2;
    frames.append(payload.data(), cut);
    for (int piece = 0; piece < 2; ++piece) {
      if (piece == 1) frames.append(payload.data() + cut, payload.size() - cut);
      for (;;) {
        auto f = frames.next(std::size_t(1) << 16, "fuzz");
        if (!f || !*f) break;
      }
    }
    return 0;
  }
  switch (data[0] % 6) {
  case 0: (void)dsa::net::decode_hello(payload); break;
  case 1: (void)dsa::net::decode_blobs(payload); break;
  case 2: (void)dsa::net::decode_abort(payload); break;
  case 3: (void)dsa::net::decode_keyed(payload); break;
  default: (void)dsa::net::decode_clock(payload); break;
  }
  return 0;
}
