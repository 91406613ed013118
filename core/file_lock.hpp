// An exclusive advisory lock on a file (flock), the way a process claims a folder it owns
// (the NVMe swap folders: a rank holds its lock while it runs; the kernel lets it go when
// the process dies, however it dies).
#pragma once

#include "core/error.hpp"

#include <string>

namespace dsa {

// Opens (creating it if missing) and locks `path` without waiting: the descriptor, -1 when
// another process (or another descriptor of this one) holds the lock, or an error naming
// the file.
expected<int> try_lock_file(const std::string& path);

// Removes `dir` and its lock file `lock` when no process holds that lock (its owner is
// gone): whether it did. A folder whose lock is held, or cannot be read, is left alone.
bool remove_unowned_folder(const std::string& lock, const std::string& dir);

} // namespace dsa
