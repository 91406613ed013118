// Private to io/ckpt: directory operations for checkpoint directories (create,
// fsync, rename, atomic exchange, removal, listing) with errors naming paths,
// and the names that checkpoint directories and their hidden leftovers use.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsa::ckpt::detail {

// The step of a name "step_<digits>" (nothing else: no suffix, no sign).
std::optional<std::uint64_t> parse_step_name(const std::string& name);

// Whether `name` is a leftover of an interrupted save, prune or replace in a
// checkpoint root (".step_<N>.{tmp,old,del}-<pid>" or "latest.tmp.<pid>") that
// no live process other than this one can still own.
bool is_stale_leftover(const std::string& name);

// Creates `path` and its missing parents (mode 0755).
status make_directories(const std::string& path);
// Creates a new directory; fails if it exists.
status make_directory(const std::string& path);
// fsync of a directory, so that entries created or renamed in it are durable.
status fsync_directory(const std::string& path);
status rename_path(const std::string& from, const std::string& to);
// Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE).
// errc::unsupported when the kernel or file system cannot.
status exchange_paths(const std::string& a, const std::string& b);
// Removes a directory tree; a missing path is success.
status remove_tree(const std::string& path);
// Names in a directory ("." and ".." excluded), unsorted. errc::not_found when missing.
expected<std::vector<std::string>> directory_entries(const std::string& path);
// Whether `path` exists and is a directory / a regular file (following links).
bool is_directory(const std::string& path);
bool is_regular_file(const std::string& path);

} // namespace dsa::ckpt::detail
