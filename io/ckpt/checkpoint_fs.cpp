// Directory operations for checkpoint directories; POSIX calls with EINTR
// retried and errors naming the paths.
#include "io/ckpt/checkpoint_fs.hpp"

#include "io/ckpt/posix_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

namespace dsa::ckpt::detail {
namespace {

bool all_digits(std::string_view s) {
  if (s.empty())
    return false;
  for (char c : s)
    if (c < '0' || c > '9')
      return false;
  return true;
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  if (!all_digits(s) || s.size() > 20)
    return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10)
      return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// The pid after `marker` at the end of `name`, when the part before it is
// checked by `prefix_ok`.
template <class PrefixOk>
std::optional<std::uint64_t> pid_after(const std::string& name, std::string_view marker,
                                       PrefixOk prefix_ok) {
  std::size_t at = name.rfind(marker);
  if (at == std::string::npos || !prefix_ok(std::string_view(name).substr(0, at)))
    return std::nullopt;
  return parse_u64(std::string_view(name).substr(at + marker.size()));
}

bool owner_gone_or_self(std::uint64_t pid) {
  if (pid == static_cast<std::uint64_t>(::getpid()))
    return true;
  if (pid == 0 || pid > static_cast<std::uint64_t>(INT32_MAX))
    return true;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

} // namespace

std::optional<std::uint64_t> parse_step_name(const std::string& name) {
  constexpr std::string_view prefix = "step_";
  if (name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  return parse_u64(std::string_view(name).substr(prefix.size()));
}

bool is_stale_leftover(const std::string& name) {
  auto hidden_step = [](std::string_view s) {
    return s.size() > 1 && s[0] == '.' && parse_step_name(std::string(s.substr(1))).has_value();
  };
  for (std::string_view marker : {".tmp-", ".old-", ".del-"})
    if (auto pid = pid_after(name, marker, hidden_step))
      return owner_gone_or_self(*pid);
  if (auto pid = pid_after(name, ".tmp.", [](std::string_view s) { return s == "latest"; }))
    return owner_gone_or_self(*pid);
  return false;
}

status make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec)
    return make_error(errc::io, "cannot create directory '{}': {}", path, ec.message());
  if (!is_directory(path))
    return make_error(errc::io, "'{}' exists and is not a directory", path);
  return {};
}

status make_directory(const std::string& path) {
  if (retry_eintr([&] { return ::mkdir(path.c_str(), 0755); }) != 0)
    return sys_error("cannot create directory", path, errno);
  return {};
}

status fsync_directory(const std::string& path) {
  int fd = retry_eintr([&] { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
  if (fd < 0)
    return sys_error("cannot open directory", path, errno);
  unique_fd dir(fd);
  DSA_TRY(fsync_fd(dir, path));
  return dir.close(path);
}

status rename_path(const std::string& from, const std::string& to) {
  if (retry_eintr([&] { return ::rename(from.c_str(), to.c_str()); }) != 0)
    return make_error(errc::io, "cannot rename '{}' to '{}': {}", from, to, std::strerror(errno));
  return {};
}

status exchange_paths(const std::string& a, const std::string& b) {
  if (retry_eintr([&] {
        return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE);
      }) == 0)
    return {};
  int err = errno;
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP)
    return make_error(errc::unsupported, "cannot exchange '{}' and '{}' atomically: {}", a, b,
                      std::strerror(err));
  return make_error(errc::io, "cannot exchange '{}' and '{}': {}", a, b, std::strerror(err));
}

status remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec)
    return make_error(errc::io, "cannot remove '{}': {}", path, ec.message());
  return {};
}

expected<std::vector<std::string>> directory_entries(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) {
    int err = errno;
    if (err == ENOENT)
      return make_error(errc::not_found, "directory '{}' does not exist", path);
    return sys_error("cannot open directory", path, err);
  }
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..")
      names.push_back(std::move(name));
    errno = 0;
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0)
    return sys_error("cannot list directory", path, err);
  return names;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

} // namespace dsa::ckpt::detail
