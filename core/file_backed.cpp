// File-backed tensors; see file_backed.hpp.
#include "core/file_backed.hpp"

#include "core/log.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>

namespace dsa {
namespace {

struct mapping {
  std::size_t bytes = 0;
  int fd = -1; // -1: a read-only mapping of someone else's (register_read_only_mapping)
  std::string path;
};

// The live mappings by start address.
std::mutex registry_mutex;
std::map<std::uintptr_t, mapping>& registry() {
  static std::map<std::uintptr_t, mapping> m;
  return m;
}

std::size_t page_size() {
  static const auto size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// The mapping holding [p, p + bytes), copied out under the lock (fd and path stay valid
// while the caller holds a tensor of that mapping); nullopt when there is none.
bool find(const void* p, std::size_t bytes, std::uintptr_t& base, mapping& found) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& m = registry();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  if (a + bytes > it->first + it->second.bytes) return false;
  base = it->first;
  found = it->second;
  return true;
}

std::string errno_text() { return std::strerror(errno); }

std::atomic<std::int64_t> window_bytes{file_backed_default_window};

} // namespace

std::int64_t file_backed_window_bytes() { return window_bytes.load(std::memory_order_relaxed); }

void set_file_backed_window_bytes(std::int64_t bytes) {
  const auto page = static_cast<std::int64_t>(page_size());
  DSA_CHECK(bytes >= 0 && bytes % page == 0, "file-backed window of {} bytes: a multiple of {} expected", bytes, page);
  window_bytes.store(bytes == 0 ? file_backed_default_window : bytes, std::memory_order_relaxed);
}

status try_page_out(const void* p, std::size_t bytes) {
  try {
    page_out(p, bytes);
  } catch (const std::exception& e) {
    return make_error(errc::io, "{}", e.what());
  }
  return {};
}

namespace {
// A new file for `path`: unnamed in its folder where the file system allows (O_TMPFILE:
// nothing to follow, nothing left behind), else created exclusively, never through a link
// (named: the caller unlinks it once mapped). -1 and errno on failure.
int create_file(const std::string& path, bool& named) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  named = false;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  named = true;
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0 && errno == EEXIST && ::unlink(path.c_str()) == 0) fd = ::open(path.c_str(), flags, 0600);
  return fd;
}
} // namespace

expected<tensor> file_backed_zeros(const std::string& path, std::int64_t n, dtype type) {
  const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(n) * dtype_size(type), 1);
  bool named = false;
  const int fd = create_file(path, named);
  if (fd < 0) return make_error(errc::io, "{}: cannot create: {}", path, errno_text());
  auto drop = [&] {
    ::close(fd);
    if (named) ::unlink(path.c_str());
  };
  if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    drop();
    return make_error(errc::io, "{}: cannot allocate {} bytes on its disk: {}", path, bytes, std::strerror(e));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = errno_text();
    drop();
    return make_error(errc::io, "{}: cannot map {} bytes: {}", path, bytes, why);
  }
  if (named) ::unlink(path.c_str()); // the mapping and fd keep it; nothing left after a crash
  struct statfs fs {};
  if (::fstatfs(fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC))
    log_warn("{}: on tmpfs or ramfs its pages are memory (shared, outside the process's resident set): put it on a "
             "disk to take it out of memory",
             path);
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry()[reinterpret_cast<std::uintptr_t>(p)] = mapping{bytes, fd, path};
  }
  auto s = storage::wrap(p, bytes, device::cpu(), [bytes, fd](void* q) {
    {
      std::lock_guard<std::mutex> lock(registry_mutex);
      registry().erase(reinterpret_cast<std::uintptr_t>(q));
    }
    ::munmap(q, bytes);
    ::close(fd);
  });
  return tensor::from_storage(std::move(s), 0, {n}, type);
}

bool is_file_backed(const void* p, std::size_t bytes) {
  std::uintptr_t base = 0;
  mapping m;
  return find(p, bytes, base, m) && m.fd >= 0;
}

bool is_file_backed(const tensor& t) { return t.defined() && is_file_backed(t.raw_data(), t.nbytes()); }

void register_read_only_mapping(const void* base, std::size_t bytes, const std::string& path) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry()[reinterpret_cast<std::uintptr_t>(base)] = mapping{bytes, -1, path};
}

void unregister_mapping(const void* base) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().erase(reinterpret_cast<std::uintptr_t>(base));
}

void page_out(const void* p, std::size_t bytes) {
  std::uintptr_t base = 0;
  mapping m;
  if (bytes == 0 || !find(p, bytes, base, m)) return;
  // The pages overlapping the range, clipped to the mapping: a page shared with a
  // neighbouring window goes too (it is read back from the file if touched again).
  const std::size_t page = page_size();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t lo = (a - base) / page * page;
  const std::uintptr_t hi = std::min<std::uintptr_t>((a - base + bytes + page - 1) / page * page, m.bytes);
  void* at = reinterpret_cast<void*>(base + lo);
  // Unmapping first moves the pages' dirty bits to the page cache, which the write then sees.
  if (::madvise(at, hi - lo, MADV_DONTNEED) != 0)
    throw std::runtime_error(fmt::format("{}: releasing {} bytes from memory: {}", m.path, hi - lo, errno_text()));
  if (m.fd < 0) return; // read-only: its pages are the file's, read again when touched
  if (::sync_file_range(m.fd, static_cast<off_t>(lo), static_cast<off_t>(hi - lo),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0)
    throw std::runtime_error(fmt::format("{}: writing {} bytes at offset {}: {}", m.path, hi - lo, lo, errno_text()));
  (void)::posix_fadvise(m.fd, static_cast<off_t>(lo), static_cast<off_t>(hi - lo), POSIX_FADV_DONTNEED);
}

void page_out(const tensor& t) {
  if (t.defined() && t.numel() > 0) page_out(t.raw_data(), t.nbytes());
}

void zero_file_backed(tensor& t) {
  DSA_CHECK(t.is_contiguous(), "zero_file_backed: {} is not contiguous", t.describe());
  std::uintptr_t base = 0;
  mapping m;
  if (t.numel() == 0) return;
  if (!find(t.raw_data(), t.nbytes(), base, m) || m.fd < 0) {
    t.zero();
    return;
  }
  const auto a = reinterpret_cast<std::uintptr_t>(t.raw_data()) - base;
  const std::size_t page = page_size();
  // Whole pages through the file (its blocks stay allocated); the partial pages at the
  // ends, shared with other data, in memory first.
  const std::uintptr_t lo = (a + page - 1) / page * page;
  const std::uintptr_t hi = std::max<std::uintptr_t>(lo, (a + t.nbytes()) / page * page);
  auto* bytes = static_cast<unsigned char*>(t.raw_data());
  if (lo > a) std::memset(bytes, 0, std::min<std::size_t>(lo - a, t.nbytes()));
  if (hi > lo && a + t.nbytes() > hi) std::memset(bytes + (hi - a), 0, a + t.nbytes() - hi);
  if (hi <= lo) return;
  void* at = reinterpret_cast<void*>(base + lo);
  if (::madvise(at, hi - lo, MADV_DONTNEED) != 0)
    throw std::runtime_error(fmt::format("{}: releasing {} bytes from memory: {}", m.path, hi - lo, errno_text()));
  if (::fallocate(m.fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(lo),
                  static_cast<off_t>(hi - lo)) == 0)
    return;
  if (errno != EOPNOTSUPP && errno != ENOSYS)
    throw std::runtime_error(fmt::format("{}: zeroing {} bytes at offset {}: {}", m.path, hi - lo, lo, errno_text()));
  // A file system without zeroed ranges: write the zeros, a window at a time.
  const auto window = static_cast<std::uintptr_t>(file_backed_window_bytes());
  for (std::uintptr_t at_byte = lo; at_byte < hi; at_byte += window) {
    const std::size_t n = std::min<std::size_t>(window, hi - at_byte);
    std::memset(reinterpret_cast<void*>(base + at_byte), 0, n);
    page_out(reinterpret_cast<void*>(base + at_byte), n);
  }
}

} // namespace dsa
