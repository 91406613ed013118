// File-backed tensors (core/file_backed.hpp): values survive page_out, paged-out windows
// leave memory and the page cache, zeroing goes through the file, a file that cannot be
// made is named, and the windowed sum of squares equals the one pass bit for bit.
#include "core/file_backed.hpp"
#include "optim/grad_clip.hpp"

#include <doctest/doctest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace dsa;

namespace {

// A folder for the files, in the build tree (a disk file system, not tmpfs, on the test
// machines; the residency checks say so when it is not).
struct scratch {
  std::string path;
  scratch() {
    char tmpl[] = "file_backed_XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    REQUIRE(made != nullptr);
    path = std::filesystem::absolute(made).string();
  }
  ~scratch() { std::filesystem::remove_all(path); }
};

// Whether page residency (mincore) tells whether a page left memory: on ext4 and XFS, where
// the write-back and the page cache are the kernel's own; elsewhere (tmpfs keeps its pages,
// overlay and network file systems cache their own way) the checks only say so.
bool residency_checked(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return false;
  const bool disk = s.f_type == EXT4_SUPER_MAGIC || s.f_type == XFS_SUPER_MAGIC;
  if (!disk) MESSAGE("the scratch folder is not on ext4 or XFS: page residency not checked");
  return disk;
}

// Pages of [p, p + bytes) resident in the page cache (mincore on the file mapping).
std::size_t resident_pages(const void* p, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const std::size_t n = (reinterpret_cast<std::uintptr_t>(p) + bytes - a + page - 1) / page;
  std::vector<unsigned char> v(n);
  REQUIRE(::mincore(reinterpret_cast<void*>(a), n * page, v.data()) == 0);
  std::size_t count = 0;
  for (unsigned char c : v) count += c & 1;
  return count;
}

} // namespace

TEST_CASE("file_backed: values survive page_out, and the paged-out pages leave memory") {
  scratch dir;
  const std::int64_t n = 3 * (1 << 20) + 5; // several windows and a ragged end
  auto made = file_backed_zeros(dir.path + "/acc.swp", n, dtype::f32);
  REQUIRE_MESSAGE(made.has_value(), made.err().message);
  tensor t = *made;
  CHECK(is_file_backed(t));
  CHECK_FALSE(is_file_backed(tensor::zeros({16}, dtype::f32)));
  // The file is gone from the folder already; the mapping keeps it.
  CHECK(std::filesystem::is_empty(dir.path));
  float* p = t.data<float>();
  bool zeros = true;
  for (std::int64_t i = 0; i < n; ++i) zeros = zeros && p[i] == 0.0f;
  CHECK(zeros);
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 1000) * 0.5f;
  CHECK(resident_pages(p, t.nbytes()) > 0);
  page_out(t);
  const bool checked = residency_checked(dir.path);
  if (checked) CHECK(resident_pages(p, t.nbytes()) == 0);
  bool same = true;
  for (std::int64_t i = 0; i < n; ++i) same = same && p[i] == static_cast<float>(i % 1000) * 0.5f;
  CHECK(same);
  // A view: its pages go (read-around may bring its neighbours in; only the view's are checked).
  tensor view = t.slice_rows(1 << 20, 2 << 20);
  page_out(t); // all out again after the read above
  volatile float sink = 0.0f;
  for (std::int64_t i = 0; i < view.numel(); i += 1024) sink = sink + view.data<float>()[i];
  if (checked) CHECK(resident_pages(view.raw_data(), view.nbytes()) > 0);
  page_out(view);
  if (checked) CHECK(resident_pages(view.raw_data(), view.nbytes()) == 0);
  // Tensors elsewhere: page_out does nothing, and says nothing.
  tensor plain = tensor::zeros({1024}, dtype::f32);
  page_out(plain);
  CHECK(plain.data<float>()[3] == 0.0f);
}

TEST_CASE("file_backed: zeroing goes through the file, an unaligned view's ends in memory") {
  scratch dir;
  const std::int64_t n = (1 << 20) + 777;
  auto made = file_backed_zeros(dir.path + "/z.swp", n, dtype::f32);
  REQUIRE(made.has_value());
  tensor t = *made;
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = 1.0f;
  page_out(t);
  // A view that starts and ends inside pages: its elements zero, its neighbours kept.
  tensor view = t.slice_rows(1001, n - 333);
  zero_file_backed(view);
  bool right = true;
  for (std::int64_t i = 0; i < n; ++i) right = right && p[i] == ((i >= 1001 && i < n - 333) ? 0.0f : 1.0f);
  CHECK(right);
  zero_file_backed(t);
  // Zeroed through the file: at most the partial page at its end was written in memory.
  if (residency_checked(dir.path)) CHECK(resident_pages(p, t.nbytes()) <= 1);
  bool zero = true;
  for (std::int64_t i = 0; i < n; ++i) zero = zero && p[i] == 0.0f;
  CHECK(zero);
  // Any other tensor is zeroed in memory.
  tensor plain = tensor::zeros({10}, dtype::f32);
  plain.data<float>()[9] = 2.0f;
  zero_file_backed(plain);
  CHECK(plain.data<float>()[9] == 0.0f);
}

TEST_CASE("file_backed: a file that cannot be made, or has no room, is named") {
  auto bad = file_backed_zeros("/nonexistent-dir-for-dsactor/g.swp", 16, dtype::f32);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.find("/nonexistent-dir-for-dsactor/g.swp") != std::string::npos);
  // A disk without room for it (a file-size limit stands in for a full disk): refused at
  // creation naming the file, before any write through the mapping could fail.
  scratch dir;
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = before;
  small.rlim_cur = 1 << 20;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  auto full = file_backed_zeros(dir.path + "/full.swp", 4 << 20, dtype::f32);
  ::setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, previous);
  REQUIRE_FALSE(full.has_value());
  CHECK(full.err().message.find(dir.path + "/full.swp") != std::string::npos);
  CHECK(full.err().message.find("cannot allocate") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir.path)); // nothing left behind
}

TEST_CASE("file_backed: the window can be made smaller for tests, in whole pages") {
  CHECK(file_backed_window_bytes() == file_backed_default_window);
  set_file_backed_window_bytes(16384);
  CHECK(file_backed_window_bytes() == 16384);
  set_file_backed_window_bytes(0);
  CHECK(file_backed_window_bytes() == file_backed_default_window);
}

TEST_CASE("file_backed: the windowed sum of squares is the one pass's, bit for bit") {
  scratch dir;
  const std::int64_t n = 2 * (1 << 20) + 4099;
  auto made = file_backed_zeros(dir.path + "/s.swp", n, dtype::f32);
  REQUIRE(made.has_value());
  tensor t = *made;
  tensor plain = tensor::zeros({n}, dtype::f32);
  std::uint32_t x = 12345;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = static_cast<float>(static_cast<std::int32_t>(x)) * 1e-9f;
    t.data<float>()[i] = v;
    plain.data<float>()[i] = v;
  }
  page_out(t);
  const double a = optim::sum_of_squares(t), b = optim::sum_of_squares(plain);
  CHECK(std::memcmp(&a, &b, sizeof a) == 0);
  if (residency_checked(dir.path)) CHECK(resident_pages(t.raw_data(), t.nbytes()) == 0); // paged out as it went
}
