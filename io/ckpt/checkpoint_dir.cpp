// Checkpoint directories: save (temporary directory, fsync, rename, `latest`,
// prune), listing, resolution of "latest", verification and load.
#include "io/ckpt/checkpoint_dir.hpp"

#include "io/ckpt/atomic_file.hpp"
#include "io/ckpt/checkpoint_fs.hpp"
#include "io/ckpt/crc32c.hpp"
#include "core/test_fault.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

namespace dsa::ckpt {
namespace {

constexpr const char* manifest_name = "manifest.json";
constexpr const char* latest_name = "latest";

std::string join(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

std::string hidden_name(const std::string& dir_name, const char* kind) {
  return fmt::format(".{}.{}-{}", dir_name, kind, static_cast<long>(::getpid()));
}

// The last component of a directory path ("a/step_1/" gives "step_1").
std::string base_name(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Removes the temporary directory of a failed save.
class temp_dir_guard {
public:
  explicit temp_dir_guard(std::string path) : path_(std::move(path)) {}
  ~temp_dir_guard() {
    if (!path_.empty())
      (void)detail::remove_tree(path_); // best effort: the error being reported is the earlier one
  }
  temp_dir_guard(const temp_dir_guard&) = delete;
  temp_dir_guard& operator=(const temp_dir_guard&) = delete;
  void release() { path_.clear(); }

private:
  std::string path_;
};

status check_contents(const std::string& root, const checkpoint_contents& contents) {
  if (root.empty())
    return make_error(errc::invalid_argument, "checkpoint root directory is an empty path");
  if (!contents.state.is_object())
    return make_error(errc::invalid_argument,
                      "checkpoint state of step {} must be a JSON object, not {}", contents.step,
                      contents.state.type_name());
  for (const auto& [group, tensors] : contents.groups)
    if (!valid_group_name(group))
      return make_error(errc::invalid_argument,
                        "checkpoint group name '{}' is not 1 to 64 of [A-Za-z0-9_-]", group);
  return {};
}

constexpr const char* staging_suffix = ".staging";

// The step of a staging folder's name (".step_<N>.staging"), if it is one.
std::optional<std::uint64_t> staging_step(const std::string& name) {
  const std::size_t n = std::char_traits<char>::length(staging_suffix);
  if (name.size() <= n + 1 || name[0] != '.' || name.compare(name.size() - n, n, staging_suffix) != 0)
    return std::nullopt;
  return detail::parse_step_name(name.substr(1, name.size() - n - 1));
}

// Best effort: a leftover that cannot be removed now is retried on the next save.
// Staging folders of earlier steps are leftovers too (a crash between staging and commit).
void remove_stale_leftovers(const std::string& root, std::uint64_t saving) {
  auto names = detail::directory_entries(root);
  if (!names)
    return;
  for (const std::string& name : *names) {
    const auto staged = staging_step(name);
    if (detail::is_stale_leftover(name) || (staged && *staged < saving))
      (void)detail::remove_tree(join(root, name));
  }
}

// Writes one group's file into `dir` (fsynced) and returns its manifest entry.
expected<checkpoint_file> write_group(const std::string& dir, const std::string& group, const named_tensors& tensors) {
  checkpoint_file f;
  f.group = group;
  f.name = group + ".safetensors";
  std::string path = join(dir, f.name);
  // "format":"pt" is the metadata HuggingFace loaders expect of a safetensors file.
  DSA_TRY(write_safetensors(path, tensors, {{"format", "pt"}}));
  // Digest what reached the file, not what we meant to write.
  DSA_ASSIGN_OR_RETURN(file_digest digest, digest_file(path));
  f.bytes = digest.bytes;
  f.crc32c = digest.crc32c;
  return f;
}

// The staged files in `dir`: each present with its size; anything else there is removed
// (a crashed earlier attempt's files).
status adopt_staged(const std::string& dir, const std::vector<checkpoint_file>& staged,
                    const checkpoint_contents& contents) {
  for (const auto& f : staged) {
    if (!valid_group_name(f.group) || f.name != f.group + ".safetensors" || contents.groups.count(f.group))
      return make_error(errc::invalid_argument, "staged checkpoint file '{}' of group '{}' is misnamed or a duplicate",
                        f.name, f.group);
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(join(dir, f.name), ec);
    if (ec || bytes != f.bytes)
      return make_error(errc::io, "staged checkpoint file '{}' is {} (expected {} bytes)", join(dir, f.name),
                        ec ? "missing" : fmt::format("{} bytes", bytes), f.bytes);
  }
  DSA_ASSIGN_OR_RETURN(auto names, detail::directory_entries(dir));
  for (const auto& name : names) {
    const bool listed = std::any_of(staged.begin(), staged.end(), [&](const auto& f) { return f.name == name; });
    if (!listed) DSA_TRY(detail::remove_tree(join(dir, name)));
  }
  return {};
}

// Writes every group and the manifest (listing `staged` too) into `dir`; each file is fsynced.
status write_contents(const std::string& dir, const checkpoint_contents& contents,
                      const std::vector<checkpoint_file>& staged) {
  checkpoint_manifest manifest;
  manifest.step = contents.step;
  manifest.global_samples = contents.global_samples;
  manifest.state = contents.state;
  manifest.files = staged;
  for (const auto& [group, tensors] : contents.groups) {
    DSA_ASSIGN_OR_RETURN(auto f, write_group(dir, group, tensors));
    manifest.files.push_back(std::move(f));
  }
  std::sort(manifest.files.begin(), manifest.files.end(),
            [](const checkpoint_file& a, const checkpoint_file& b) { return a.group < b.group; });
  DSA_ASSIGN_OR_RETURN(std::string text, manifest_to_json(manifest));
  DSA_TRY(write_file_atomic(join(dir, manifest_name), text));
  return detail::fsync_directory(dir);
}

// Swaps the finished `temp` in for an existing `target`, atomically where the
// file system allows; otherwise moves the old one aside first.
status replace_directory(const std::string& root, const std::string& temp,
                         const std::string& target) {
  status swapped = detail::exchange_paths(temp, target);
  if (swapped) {
    DSA_TRY(detail::fsync_directory(root));
    (void)detail::remove_tree(temp); // now the old checkpoint; a leftover is cleaned later
    return {};
  }
  if (swapped.err().code != errc::unsupported)
    return swapped;
  std::string old = join(root, hidden_name(base_name(target), "old"));
  DSA_TRY(detail::rename_path(target, old));
  status moved = detail::rename_path(temp, target);
  if (!moved) {
    (void)detail::rename_path(old, target);
    return moved;
  }
  DSA_TRY(detail::fsync_directory(root));
  (void)detail::remove_tree(old);
  return {};
}

// Removes the oldest complete checkpoints beyond keep_last, sparing `just_saved`.
// Each is first renamed to a hidden name so that a half-removed directory never
// looks like a checkpoint.
expected<std::vector<std::string>> prune(const std::string& root, std::uint64_t just_saved,
                                         std::size_t keep_last) {
  std::vector<std::string> removed;
  if (keep_last == 0)
    return removed;
  DSA_ASSIGN_OR_RETURN(std::vector<checkpoint_ref> all, list_checkpoints(root));
  std::vector<checkpoint_ref> others;
  for (checkpoint_ref& ref : all)
    if (ref.step != just_saved)
      others.push_back(std::move(ref));
  std::size_t keep_others = keep_last - 1;
  if (others.size() <= keep_others)
    return removed;
  others.resize(others.size() - keep_others); // ascending: the oldest come first
  for (const checkpoint_ref& ref : others) {
    std::string doomed = join(root, hidden_name(base_name(ref.dir), "del"));
    DSA_TRY(detail::rename_path(ref.dir, doomed));
    DSA_TRY(detail::remove_tree(doomed));
    removed.push_back(ref.dir);
  }
  DSA_TRY(detail::fsync_directory(root));
  return removed;
}

} // namespace

std::string checkpoint_dir_name(std::uint64_t step) {
  return fmt::format("step_{:08d}", step);
}

std::string staging_dir(const std::string& root, std::uint64_t step) {
  return join(root, "." + checkpoint_dir_name(step) + staging_suffix);
}

expected<checkpoint_file> stage_group(const std::string& root, std::uint64_t step, const std::string& group,
                                      const named_tensors& tensors) {
  if (!valid_group_name(group))
    return make_error(errc::invalid_argument, "checkpoint group name '{}' is not 1 to 64 of [A-Za-z0-9_-]", group);
  const std::string dir = staging_dir(root, step);
  DSA_TRY(detail::make_directories(dir));
  DSA_ASSIGN_OR_RETURN(auto f, write_group(dir, group, tensors));
  DSA_TRY(detail::fsync_directory(dir));
  return f;
}

expected<checkpoint_file> stage_group_streamed(const std::string& root, std::uint64_t step, const std::string& group,
                                               const std::map<std::string, tensor_spec>& specs,
                                               const tensor_source& source) {
  if (!valid_group_name(group))
    return make_error(errc::invalid_argument, "checkpoint group name '{}' is not 1 to 64 of [A-Za-z0-9_-]", group);
  const std::string dir = staging_dir(root, step);
  DSA_TRY(detail::make_directories(dir));
  checkpoint_file f;
  f.group = group;
  f.name = group + ".safetensors";
  const std::string path = join(dir, f.name);
  DSA_TRY(write_safetensors_streamed(path, specs, {{"format", "pt"}}, source));
  DSA_ASSIGN_OR_RETURN(file_digest digest, digest_file(path)); // what reached the file
  f.bytes = digest.bytes;
  f.crc32c = digest.crc32c;
  DSA_TRY(detail::fsync_directory(dir));
  return f;
}

expected<saved_checkpoint> save_checkpoint(const std::string& root,
                                           const checkpoint_contents& contents,
                                           const save_options& options) {
  DSA_TRY(check_contents(root, contents));
  DSA_TRY(detail::make_directories(root));
  remove_stale_leftovers(root, contents.step);
  std::string name = checkpoint_dir_name(contents.step);
  std::string target = join(root, name);
  std::error_code ec;
  bool exists =
      std::filesystem::symlink_status(target, ec).type() != std::filesystem::file_type::not_found;
  if (exists && options.overwrite == overwrite_policy::refuse)
    return make_error(errc::invalid_argument,
                      "checkpoint '{}' already exists (from an earlier run?); remove it or save "
                      "with overwrite_policy::replace",
                      target);
  const bool staged = !options.staged.empty();
  std::string temp = staged ? staging_dir(root, contents.step) : join(root, hidden_name(name, "tmp"));
  if (!staged) DSA_TRY(detail::make_directory(temp));
  temp_dir_guard guard(temp);
  if (staged) DSA_TRY(adopt_staged(temp, options.staged, contents));
  DSA_TRY(write_contents(temp, contents, options.staged));
  test_fault::at(test_fault::phase::commit, static_cast<std::int64_t>(contents.step));
  if (exists) {
    DSA_TRY(replace_directory(root, temp, target));
  } else {
    DSA_TRY(detail::rename_path(temp, target));
    DSA_TRY(detail::fsync_directory(root));
  }
  guard.release();
  DSA_TRY(write_file_atomic(join(root, latest_name), name + "\n"));
  saved_checkpoint saved;
  saved.dir = target;
  auto pruned = prune(root, contents.step, options.keep_last);
  if (!pruned)
    return make_error(pruned.err().code,
                      "saved checkpoint '{}' but pruning to keep_last={} failed: {}", target,
                      options.keep_last, pruned.err().message);
  saved.pruned = std::move(*pruned);
  return saved;
}

expected<std::vector<checkpoint_ref>> list_checkpoints(const std::string& root) {
  std::vector<checkpoint_ref> out;
  auto names = detail::directory_entries(root);
  if (!names) {
    if (names.err().code == errc::not_found)
      return out;
    return names.err();
  }
  for (const std::string& name : *names) {
    auto step = detail::parse_step_name(name);
    std::string dir = join(root, name);
    if (step && detail::is_directory(dir) && detail::is_regular_file(join(dir, manifest_name)))
      out.push_back({*step, dir});
  }
  std::sort(out.begin(), out.end(), [](const checkpoint_ref& a, const checkpoint_ref& b) {
    return a.step != b.step ? a.step < b.step : a.dir < b.dir;
  });
  return out;
}

expected<std::string> resolve_checkpoint(const std::string& root, const std::string& which) {
  std::string dir;
  if (which == latest_name) {
    std::string latest = join(root, latest_name);
    auto text = read_file(latest);
    if (!text) {
      if (text.err().code == errc::not_found)
        return make_error(errc::not_found, "no checkpoint to load in '{}': '{}' does not exist",
                          root, latest);
      return text.err();
    }
    std::string name = *text;
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
      name.pop_back();
    if (!detail::parse_step_name(name))
      return make_error(errc::format, "'{}' names '{}', not a step_<N> directory", latest, name);
    dir = join(root, name);
    if (!detail::is_directory(dir))
      return make_error(errc::not_found, "'{}' names '{}', which does not exist", latest, dir);
    return dir;
  }
  if (which.find('/') != std::string::npos)
    dir = which;
  else if (detail::parse_step_name(which))
    dir = join(root, which);
  else if (auto step = detail::parse_step_name("step_" + which))
    dir = join(root, checkpoint_dir_name(*step));
  else
    return make_error(errc::invalid_argument,
                      "'{}' names no checkpoint: expected 'latest', a step number, 'step_<N>' or "
                      "a directory path",
                      which);
  if (!detail::is_directory(dir))
    return make_error(errc::not_found, "checkpoint directory '{}' does not exist", dir);
  return dir;
}

namespace {

status verify_file(const std::string& dir, const checkpoint_file& f) {
  auto digest = digest_file(join(dir, f.name));
  if (!digest) {
    if (digest.err().code == errc::not_found)
      return make_error(errc::not_found, "checkpoint '{}': missing file '{}'", dir, f.name);
    return make_error(digest.err().code, "checkpoint '{}': {}", dir, digest.err().message);
  }
  if (digest->bytes != f.bytes)
    return make_error(errc::format,
                      "checkpoint '{}': size mismatch in '{}': {} bytes, the manifest says {} "
                      "(truncated or overwritten)",
                      dir, f.name, digest->bytes, f.bytes);
  if (digest->crc32c != f.crc32c)
    return make_error(errc::format,
                      "checkpoint '{}': checksum mismatch in '{}': crc32c {:08x}, the manifest "
                      "says {:08x} (corrupted)",
                      dir, f.name, digest->crc32c, f.crc32c);
  return {};
}

// The manifest entries of the requested groups (all when none are named).
expected<std::vector<checkpoint_file>> select_files(const std::string& dir,
                                                    const checkpoint_manifest& manifest,
                                                    const std::vector<std::string>& groups) {
  if (groups.empty())
    return manifest.files;
  std::vector<checkpoint_file> out;
  for (const std::string& group : groups) {
    auto it = std::find_if(manifest.files.begin(), manifest.files.end(),
                           [&](const checkpoint_file& f) { return f.group == group; });
    if (it == manifest.files.end()) {
      std::vector<std::string> have;
      for (const checkpoint_file& f : manifest.files)
        have.push_back(f.group);
      return make_error(errc::not_found, "checkpoint '{}' has no group '{}' (it has: {})", dir,
                        group, fmt::join(have, ", "));
    }
    out.push_back(*it);
  }
  return out;
}

} // namespace

expected<checkpoint_manifest> read_checkpoint_manifest(const std::string& dir) {
  std::string path = join(dir, manifest_name);
  auto text = read_file(path);
  if (!text) {
    if (text.err().code == errc::not_found)
      return make_error(errc::not_found, "checkpoint '{}': missing file '{}'", dir, manifest_name);
    return make_error(text.err().code, "checkpoint '{}': {}", dir, text.err().message);
  }
  DSA_ASSIGN_OR_RETURN(checkpoint_manifest manifest, parse_manifest(*text, path));
  auto named_step = detail::parse_step_name(base_name(dir));
  if (named_step && *named_step != manifest.step)
    return make_error(errc::format, "checkpoint '{}': manifest '{}' says step {}", dir, path,
                      manifest.step);
  return manifest;
}

expected<checkpoint_manifest> verify_checkpoint(const std::string& dir) {
  DSA_ASSIGN_OR_RETURN(checkpoint_manifest manifest, read_checkpoint_manifest(dir));
  for (const checkpoint_file& f : manifest.files)
    DSA_TRY(verify_file(dir, f));
  return manifest;
}

expected<loaded_checkpoint> load_checkpoint_dir(const std::string& dir,
                                                const load_options& options) {
  loaded_checkpoint out;
  out.dir = dir;
  DSA_ASSIGN_OR_RETURN(out.manifest, read_checkpoint_manifest(dir));
  DSA_ASSIGN_OR_RETURN(std::vector<checkpoint_file> files,
                       select_files(dir, out.manifest, options.groups));
  // Every file is checked before any is parsed: a corrupt checkpoint fails on
  // its checksum, never halfway through loading tensors.
  for (const checkpoint_file& f : files)
    DSA_TRY(verify_file(dir, f));
  for (const checkpoint_file& f : files) {
    auto file = options.map ? map_safetensors(join(dir, f.name)) : read_safetensors(join(dir, f.name));
    if (!file)
      return make_error(file.err().code, "checkpoint '{}': {}", dir, file.err().message);
    out.groups[f.group] = std::move(file->tensors);
  }
  return out;
}

expected<loaded_checkpoint> load_checkpoint(const std::string& root, const std::string& which,
                                            const load_options& options) {
  DSA_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint(root, which));
  return load_checkpoint_dir(dir, options);
}

} // namespace dsa::ckpt
