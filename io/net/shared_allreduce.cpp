// Shared-memory allreduce: region setup over the transport, then segments through the
// slots with counters and futex wake-ups (see shared_allreduce.hpp).
#include "io/net/shared_allreduce.hpp"

#include "io/net/communicator.hpp"
#include "io/net/fp32_sum.hpp"
#include "io/net/process_watch.hpp"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <functional>
#include <linux/futex.h>
#include <random>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace dsa::net {

namespace {

// 64 Ki elements (256 KiB of f32): a segment stays in the L2/L3 caches while it
// travels; 16 slots (4 MiB) per ring let a rank run well ahead of its peers, so ranks
// that share a core in turns still move megabytes per turn.
constexpr std::int64_t segment_elems = 64 * 1024;
// A slot has a page to spare: its segment starts at the offset that puts it half a page
// away from the writer's copy of it (see placed()).
constexpr std::size_t slot_bytes = segment_elems * sizeof(float) + 4096;
constexpr int slot_count = 16;
constexpr std::size_t line = 64;
constexpr std::uint64_t region_magic = 0x44534153484d3031ull; // "DSASHM01"

// Control block lines: 0 magic and nonce, 1 futex word and sleepers, 2 `reduced` (own
// chunk's segments summed and in the result ring), 3.. `contributed[c]` (segments of
// chunk c in this rank's ring for c), then `taken[c]` (results of chunk c copied out).
std::size_t control_bytes(int ranks) {
  const std::size_t used = line * (3 + 2 * static_cast<std::size_t>(ranks));
  return (used + 4095) / 4096 * 4096;
}

std::size_t total_bytes(int ranks) {
  return control_bytes(ranks) + static_cast<std::size_t>(ranks + 1) * slot_count * slot_bytes;
}

std::atomic<std::uint64_t>& counter(std::byte* region, std::size_t index) {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(region + line * index);
}
std::atomic<std::uint32_t>& bell(std::byte* region) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(region + line);
}
std::atomic<std::uint32_t>& sleepers(std::byte* region) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(region + line + 4);
}
std::atomic<std::uint64_t>& reduced(std::byte* region) {
  return counter(region, 2);
}
std::atomic<std::uint64_t>& contributed(std::byte* region, int c) {
  return counter(region, 3 + static_cast<std::size_t>(c));
}
std::atomic<std::uint64_t>& taken(std::byte* region, int ranks, int c) {
  return counter(region, 3 + static_cast<std::size_t>(ranks + c));
}
std::byte* contribution_slot(std::byte* region, int ranks, int c, std::int64_t k) {
  return region + control_bytes(ranks) +
         (static_cast<std::size_t>(c) * slot_count + static_cast<std::size_t>(k % slot_count)) *
             slot_bytes;
}
std::byte* result_slot(std::byte* region, int ranks, std::int64_t k) {
  return contribution_slot(region, ranks, ranks, k);
}

// Where in `slot` the segment goes whose elements start at byte `at` of the writer's
// buffer (whose address is `writer_page_offset` past a page boundary): half a page
// past the same page offset. A copy whose destination is a little ahead of its source
// modulo 4096 stalls on 4K aliasing (loads wait on earlier stores to the same low 12
// address bits; here rep movsb ran 3-4x slower); half a page apart, neither the
// writer's copy in nor the readers' copies out come near that (for readers whose
// buffers sit at the writer's page offset give or take a quarter page: malloc's).
std::byte* placed(std::byte* slot, std::uint64_t writer_page_offset, std::int64_t at) {
  const std::uint64_t shift = (writer_page_offset + static_cast<std::uint64_t>(at) + 2048) % 4096;
  return slot + (shift & ~std::uint64_t{63});
}

// mine: (n) = result: (n) = partial + mine, element by element in fp32 (sum_to_f32's
// bits), in one pass instead of a sum and a copy.
void sum_twice(float* mine, float* __restrict result, const float* partial, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = partial[i] + mine[i];
    mine[i] = v;
    result[i] = v;
  }
}

static_assert(std::atomic<std::uint64_t>::is_always_lock_free &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "counters shared between processes must be lock-free");

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Stores `value`, then rings the group's bell (in rank 0's region) and wakes whoever
// sleeps on it.
void publish(std::byte* bell_region, std::atomic<std::uint64_t>& c, std::uint64_t value) {
  c.store(value, std::memory_order_release);
  bell(bell_region).fetch_add(1);
  if (sleepers(bell_region).load() > 0)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell(bell_region)), FUTEX_WAKE, INT_MAX,
            nullptr, nullptr, 0);
}

// Waits until the group's bell has moved on from `seen` (some rank published): spins,
// then sleeps on it, asking the transport every 10 ms whether the group was aborted.
status wait_for_bell(transport& t, std::byte* bell_region, std::uint32_t seen) {
  for (int i = 0; i < 2048; ++i) {
    if (bell(bell_region).load() != seen)
      return {};
    cpu_relax();
  }
  for (;;) {
    sleepers(bell_region).fetch_add(1);
    timespec timeout{0, 10 * 1000 * 1000};
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell(bell_region)), FUTEX_WAIT, seen,
            &timeout, nullptr, 0);
    sleepers(bell_region).fetch_sub(1);
    if (bell(bell_region).load() != seen)
      return {};
    if (auto reason = t.aborted())
      return make_error(errc::runtime,
                        "rank {}: shared-memory allreduce stopped waiting for its peers: {}",
                        t.rank(), reason->to_string());
  }
}

// What a rank tells the others about its region.
struct region_offer {
  std::uint64_t host = 0;
  std::int64_t pid = 0;
  std::int64_t fd = -1;
  std::uint64_t nonce = 0;
  std::int64_t ok = 0;
};

// Sends `payload` (same size on every rank) to every peer and receives every peer's,
// as messages of `call` with block `block`.
expected<std::vector<bytes>> exchange(transport& t, wire_header call, std::int64_t block,
                                      const void* payload, std::size_t payload_bytes) {
  call.block = block;
  call.payload_bytes = static_cast<std::int64_t>(payload_bytes);
  const int n = t.size(), r = t.rank();
  for (int step = 1; step < n; ++step)
    DSA_TRY(wire_send(t, (r + step) % n, call, payload));
  std::vector<bytes> from(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p)
    if (p != r) {
      DSA_ASSIGN_OR_RETURN(bytes got, wire_recv(t, p, call));
      from[static_cast<std::size_t>(p)].assign(got.begin() + wire_header_bytes, got.end());
    }
  return from;
}

// Maps rank `who`'s region through its memfd; nullptr when it cannot.
std::byte* map_peer(const region_offer& who, std::size_t bytes_expected) {
  const std::string path = "/proc/" + std::to_string(who.pid) + "/fd/" + std::to_string(who.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return nullptr;
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == bytes_expected)
    map = ::mmap(nullptr, bytes_expected, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED)
    return nullptr;
  auto* region = static_cast<std::byte*>(map);
  // The pid named a process of this host; the nonce proves it is the peer's region.
  std::uint64_t magic = 0, nonce = 0;
  std::memcpy(&magic, region, 8);
  std::memcpy(&nonce, region + 8, 8);
  if (magic != region_magic || nonce != who.nonce) {
    ::munmap(map, bytes_expected);
    return nullptr;
  }
  return region;
}

} // namespace

std::uint64_t this_host_number() {
  return std::hash<std::string>{}(this_process().host_key) | 1; // never 0
}

shared_regions::shared_regions(int ranks, int rank)
    : ranks_(ranks), rank_(rank), region_bytes_(total_bytes(ranks)),
      maps_(static_cast<std::size_t>(ranks), nullptr) {}

shared_regions::~shared_regions() {
  for (std::byte* m : maps_)
    if (m)
      ::munmap(m, region_bytes_);
}

expected<std::unique_ptr<shared_regions>> shared_regions::connect(transport& t,
                                                                 const wire_header& call,
                                                                 std::uint64_t host) {
  const int n = t.size(), r = t.rank();
  std::unique_ptr<shared_regions> self(new shared_regions(n, r));
  region_offer mine;
  mine.host = host;
  mine.pid = ::getpid();
  mine.nonce = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  const int fd = ::memfd_create("dsactor-allreduce", MFD_CLOEXEC);
  mine.fd = fd;
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(self->region_bytes_)) == 0) {
    void* map = ::mmap(nullptr, self->region_bytes_, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map != MAP_FAILED) {
      auto* own = static_cast<std::byte*>(map);
      std::memcpy(own, &region_magic, 8);
      std::memcpy(own + 8, &mine.nonce, 8);
      self->maps_[static_cast<std::size_t>(r)] = own;
      mine.ok = 1;
    }
  }
  auto offers = exchange(t, call, -2, &mine, sizeof mine);
  std::int64_t mapped = mine.ok;
  if (offers)
    for (int p = 0; p < n && mapped; ++p) {
      if (p == r)
        continue;
      region_offer theirs;
      std::memcpy(&theirs, (*offers)[static_cast<std::size_t>(p)].data(), sizeof theirs);
      if (!theirs.ok || theirs.host != host) {
        mapped = 0;
        break;
      }
      self->maps_[static_cast<std::size_t>(p)] = map_peer(theirs, self->region_bytes_);
      mapped = self->maps_[static_cast<std::size_t>(p)] != nullptr;
    }
  // Every peer has opened this rank's memfd (or given up) before it answers below.
  auto answers = offers ? exchange(t, call, -3, &mapped, sizeof mapped)
                        : expected<std::vector<bytes>>(offers.err());
  if (fd >= 0)
    ::close(fd);
  DSA_TRY(answers);
  bool everyone = mapped != 0;
  for (int p = 0; p < n; ++p)
    if (p != r) {
      std::int64_t theirs = 0;
      std::memcpy(&theirs, (*answers)[static_cast<std::size_t>(p)].data(), sizeof theirs);
      everyone = everyone && theirs != 0;
    }
  if (!everyone)
    return std::unique_ptr<shared_regions>();
  return self;
}

status shared_regions::allreduce(transport& t, const wire_header& call, void* data,
                                 const std::vector<std::uint64_t>& page_offsets) {
  const int n = ranks_, r = rank_;
  const std::size_t width = dtype_size(call.type);
  auto* d = static_cast<std::byte*>(data);
  std::byte* own = region(r);
  const std::uint64_t epoch = ++calls_ << 32;
  auto done = [&](std::int64_t k) { return epoch | static_cast<std::uint64_t>(k + 1); };
  std::vector<chunk> parts;
  for (int c = 0; c < n; ++c)
    parts.push_back(partition(call.count, n, c));
  // Segment k of chunk c: its first element and length (0 past the chunk's end).
  auto seg_at = [&](int c, std::int64_t k) {
    return parts[static_cast<std::size_t>(c)].offset + k * segment_elems;
  };
  auto seg_len = [&](int c, std::int64_t k) {
    return std::max<std::int64_t>(
        0, std::min(segment_elems, parts[static_cast<std::size_t>(c)].count - k * segment_elems));
  };
  acc_.resize(segment_elems);
  std::byte* bell_region = region(0);
  auto ready = [](std::byte*, const std::atomic<std::uint64_t>& c, std::uint64_t target) {
    return c.load(std::memory_order_acquire) >= target;
  };
  // Next segment to contribute to chunk c (A), to sum (B), to copy out of chunk c (C).
  std::vector<std::int64_t> next_a(static_cast<std::size_t>(n), 0), next_c = next_a;
  std::int64_t next_b = 0;
  auto nseg = [&](int c) {
    return (parts[static_cast<std::size_t>(c)].count + segment_elems - 1) / segment_elems;
  };
  // A: this rank's values of segment k of chunk c into its ring for c, once the owner
  // has summed what the slot held slot_count segments ago.
  auto try_a = [&](int c) {
    const std::int64_t k = next_a[static_cast<std::size_t>(c)];
    if (k >= nseg(c) || (k >= slot_count &&
                         !ready(region(c), reduced(region(c)), done(k - slot_count))))
      return false;
    const std::int64_t at = seg_at(c, k) * static_cast<std::int64_t>(width);
    std::memcpy(placed(contribution_slot(own, n, c, k), page_offsets[static_cast<std::size_t>(r)], at),
                d + at, static_cast<std::size_t>(seg_len(c, k)) * width);
    publish(bell_region, contributed(own, c), done(k));
    ++next_a[static_cast<std::size_t>(c)];
    return true;
  };
  // B: segment k of this rank's chunk in the ring's order, once every peer's values are
  // in and every peer has copied out what the result slot held slot_count segments ago.
  auto try_b = [&]() {
    const std::int64_t k = next_b;
    if (k >= nseg(r))
      return false;
    for (int j = 1; j < n; ++j) {
      std::byte* peer = region((r + j) % n);
      if (!ready(peer, contributed(peer, r), done(k)) ||
          (k >= slot_count && !ready(peer, taken(peer, n, r), done(k - slot_count))))
        return false;
    }
    const std::int64_t len = seg_len(r, k);
    const std::int64_t at = seg_at(r, k) * static_cast<std::int64_t>(width);
    std::byte* mine = d + at;
    auto from = [&](int j) {
      const int p = (r + j) % n;
      return placed(contribution_slot(region(p), n, r, k), page_offsets[static_cast<std::size_t>(p)],
                    at);
    };
    const float* partial = reinterpret_cast<const float*>(from(1));
    if (call.type != dtype::f32 || n > 2) {
      widen_to_f32(acc_.data(), from(1), call.type, len);
      for (int j = 2; j < n; ++j)
        add_to_f32(acc_.data(), from(j), call.type, len, widened_);
      partial = acc_.data();
    }
    std::byte* result = placed(result_slot(own, n, k), page_offsets[static_cast<std::size_t>(r)], at);
    if (call.type == dtype::f32) {
      sum_twice(reinterpret_cast<float*>(mine), reinterpret_cast<float*>(result), partial, len);
    } else {
      sum_to_f32(acc_.data(), partial, mine, call.type, len, widened_);
      narrow_from_f32(mine, call.type, acc_.data(), len);
      std::memcpy(result, mine, static_cast<std::size_t>(len) * width);
    }
    publish(bell_region, reduced(own), done(k));
    ++next_b;
    return true;
  };
  // C: segment k of chunk c's result, from its owner's ring (after A of the same
  // segment, which read these elements: the owner summed them first).
  auto try_c = [&](int c) {
    const std::int64_t k = next_c[static_cast<std::size_t>(c)];
    if (k >= nseg(c) ||
        !ready(region(c), reduced(region(c)), done(k)))
      return false;
    const std::int64_t at = seg_at(c, k) * static_cast<std::int64_t>(width);
    std::memcpy(d + at,
                placed(result_slot(region(c), n, k), page_offsets[static_cast<std::size_t>(c)], at),
                static_cast<std::size_t>(seg_len(c, k)) * width);
    publish(bell_region, taken(own, n, c), done(k));
    ++next_c[static_cast<std::size_t>(c)];
    return true;
  };
  auto finished = [&]() {
    if (next_b < nseg(r))
      return false;
    for (int c = 0; c < n; ++c)
      if (c != r && next_c[static_cast<std::size_t>(c)] < nseg(c))
        return false;
    return true;
  };
  // Whatever is ready is done, in the order that frees the peers soonest; the rank
  // sleeps only when nothing is, until some rank has published something.
  while (!finished()) {
    const std::uint32_t seen = bell(bell_region).load();
    bool progressed = false;
    for (int j = 1; j < n; ++j)
      while (try_a((r + j) % n))
        progressed = true;
    while (try_b())
      progressed = true;
    for (int j = 1; j < n; ++j)
      while (try_c((r + j) % n))
        progressed = true;
    if (!progressed)
      DSA_TRY(wait_for_bell(t, bell_region, seen));
  }
  return {};
}

} // namespace dsa::net
