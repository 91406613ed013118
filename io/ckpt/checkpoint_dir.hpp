// Checkpoint directories, independent of the model: named groups of tensors
// (one safetensors file each) and a manifest with the caller's state and a
// size and CRC32C per file.
//
//   <root>/step_00000100/manifest.json
//                        model.safetensors         (group "model": HF parameter names)
//                        optimizer_0.safetensors   (group "optimizer_0", one per partition)
//                        <group>.safetensors       (any other group the caller names)
//   <root>/latest          "step_00000100\n": the newest complete checkpoint
//
// A save writes <root>/.step_<N>.tmp-<pid>/, fsyncs every file and the
// directory, renames it to step_<N>, fsyncs <root>, then replaces `latest`
// atomically and prunes. A crash at any point leaves `latest` naming a complete
// checkpoint (the previous one or the new one); hidden leftovers (.step_*) are
// ignored by readers and removed by the next save. Not thread-safe: one saver
// per root.
#pragma once

#include "core/error.hpp"
#include "io/ckpt/checkpoint_manifest.hpp"
#include "io/ckpt/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsa::ckpt {

// Tensor groups by group name (see valid_group_name): "model", "optimizer_0", ...
using tensor_groups = std::map<std::string, named_tensors>;

// What a save stores. Tensors must be contiguous CPU tensors.
struct checkpoint_contents {
  std::uint64_t step = 0;
  std::uint64_t global_samples = 0;
  nlohmann::json state = nlohmann::json::object(); // config, RNG, data cursor, ... (an object)
  tensor_groups groups;
};

// What to do when step_<N> already exists (from an earlier run).
enum class overwrite_policy {
  refuse,  // fail with errc::invalid_argument before writing anything
  replace, // write the new one, then swap it in atomically (renameat2 RENAME_EXCHANGE)
};

struct save_options {
  std::size_t keep_last = 0; // complete checkpoints kept after the save; 0 keeps all
  overwrite_policy overwrite = overwrite_policy::refuse;
  // Files other writers already put in staging_dir(root, step) (stage_group's results):
  // the save writes its own groups there too, checks each staged file is present with
  // its size, lists them in the manifest, removes anything else found there, and
  // renames the folder into place. Empty: a save by one writer, in a private folder.
  std::vector<checkpoint_file> staged;
};

// Saves by several writers (ZeRO ranks, each writing the optimizer state of its own
// partition): every writer stages its groups with stage_group; once all have (the
// caller's barrier), one writer saves with save_options::staged listing every staged
// file. Until that save renames the folder, readers see the previous checkpoint; a
// crash leaves a hidden folder that the next save of a later step removes.
std::string staging_dir(const std::string& root, std::uint64_t step);
// Writes "<group>.safetensors" (fsynced) into staging_dir(root, step), created if
// missing; returns its manifest entry (size and CRC32C of what reached the file).
expected<checkpoint_file> stage_group(const std::string& root, std::uint64_t step, const std::string& group,
                                      const named_tensors& tensors);
// The same, tensor by tensor (write_safetensors_streamed): only the tensor being written
// needs to be in memory; the same bytes as stage_group of those tensors.
expected<checkpoint_file> stage_group_streamed(const std::string& root, std::uint64_t step, const std::string& group,
                                               const std::map<std::string, tensor_spec>& specs,
                                               const tensor_source& source);

struct saved_checkpoint {
  std::string dir;                 // <root>/step_<N>
  std::vector<std::string> pruned; // checkpoint directories removed by keep_last
};

// Writes a checkpoint under `root` (created if missing), points `latest` at it,
// and prunes to keep_last, never removing the one just written. On failure
// nothing visible under `root` changes (`latest` and existing checkpoints stay).
expected<saved_checkpoint> save_checkpoint(const std::string& root,
                                           const checkpoint_contents& contents,
                                           const save_options& options = {});

// "step_00000100" for step 100 (at least 8 digits).
std::string checkpoint_dir_name(std::uint64_t step);

struct checkpoint_ref {
  std::uint64_t step = 0;
  std::string dir; // <root>/step_<N>
};

// Complete checkpoints under `root`, by ascending step: directories named
// step_<digits> that hold a manifest.json. Contents are not verified here.
// A missing root is an empty list.
expected<std::vector<checkpoint_ref>> list_checkpoints(const std::string& root);

// The checkpoint directory `which` names: "latest" (what <root>/latest names),
// "step_00000100" or "100" (under root), or a path containing '/' (used as is).
// errc::not_found when `latest` or the directory does not exist.
expected<std::string> resolve_checkpoint(const std::string& root, const std::string& which);

// Reads manifest.json of `dir` (its step must match the directory's name); checks no file.
expected<checkpoint_manifest> read_checkpoint_manifest(const std::string& dir);

// Reads manifest.json of `dir` and checks every file it lists (present, size,
// CRC32C) without parsing tensors. Errors name `dir` and the file at fault:
// errc::not_found (missing file), errc::format (size or checksum mismatch,
// corrupt manifest, step differing from the directory name), errc::unsupported
// (unknown format_version).
expected<checkpoint_manifest> verify_checkpoint(const std::string& dir);

struct load_options {
  std::vector<std::string> groups; // groups to load; empty loads all
  // Map the files read-only (map_safetensors) instead of reading them: their pages are the
  // page cache's, and readers page them out as they go (under a host budget). The tensors
  // must then never be written.
  bool map = false;
};

struct loaded_checkpoint {
  std::string dir;
  checkpoint_manifest manifest; // step, global_samples, state, files
  tensor_groups groups;
};

// Verifies the manifest and the files of the requested groups (as
// verify_checkpoint), then reads their tensors. A requested group that the
// manifest does not list is errc::not_found.
expected<loaded_checkpoint> load_checkpoint_dir(const std::string& dir,
                                                const load_options& options = {});

// resolve_checkpoint(root, which), then load_checkpoint_dir.
expected<loaded_checkpoint> load_checkpoint(const std::string& root, const std::string& which,
                                            const load_options& options = {});

} // namespace dsa::ckpt
