// Tensors whose memory is a shared mapping of a file (on an NVMe swap folder), for state
// too large to keep resident that is swept window by window: ZeRO's gradient partition
// under a tight host budget. Each pass reads or writes a window through the mapping, then
// hands it back with page_out(): its pages leave the process (madvise), are written to the
// file and waited for (sync_file_range), and leave the page cache (posix_fadvise), so
// neither the resident set nor the page cache keeps more than the windows in use.
//
// The file is created at its full size with its blocks allocated (posix_fallocate), so on
// ext4 or XFS a later write through the mapping never meets a full disk (which a shared
// mapping could only report as SIGBUS): a full disk is an error at creation, naming the
// file. (A copy-on-write file system, btrfs or ZFS, may still need blocks when a page is
// rewritten.) The file has no name (O_TMPFILE) or is unlinked once mapped, so nothing is
// left behind by a crash. On tmpfs or ramfs it would stay in memory: a warning says so.
//
// page_out() and zero_file_backed() take any tensor: for one not in such a mapping they do
// nothing (page_out) or zero it in memory (zero_file_backed), so passes can call them
// unconditionally.
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsa {

// (n) zeros of `type` in a new file at `path` (replaced if it exists), mapped shared.
expected<tensor> file_backed_zeros(const std::string& path, std::int64_t n, dtype type);

// Whether [p, p + bytes) lies in a mapping made by file_backed_zeros (that is alive).
bool is_file_backed(const void* p, std::size_t bytes);
bool is_file_backed(const tensor& t);

// Writes the pages overlapping [p, p + bytes) to their file and drops them from memory;
// the values stay (read back from the file when touched again). Nothing outside such a
// mapping. Throws naming the file when the write fails (the data would be lost).
void page_out(const void* p, std::size_t bytes);
void page_out(const tensor& t); // t contiguous (a view is fine)

// A read-only (PROT_READ) mapping of a file made elsewhere (a mapped checkpoint), so that
// page_out drops its pages too (they are the file's: read again when touched; never
// written, since the mapping cannot be). Unregister before unmapping.
void register_read_only_mapping(const void* base, std::size_t bytes, const std::string& path);
void unregister_mapping(const void* base);

// Zeros a contiguous tensor: a file-backed one through the file (its blocks zeroed, none
// of its pages left in memory), any other in memory.
void zero_file_backed(tensor& t);

// The bytes a pass over a file-backed tensor touches between two page_out calls: 4 MiB.
constexpr std::int64_t file_backed_default_window = 4 << 20;
std::int64_t file_backed_window_bytes();
// Tests: a smaller window (a positive multiple of the page size), so a tiny model's passes
// span several; 0 restores the default. Set it before a run, not during one.
void set_file_backed_window_bytes(std::int64_t bytes);

// page_out for code that reports errors as a status: the write's failure as an error.
status try_page_out(const void* p, std::size_t bytes);

} // namespace dsa
