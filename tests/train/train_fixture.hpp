// A tiny self-contained pre-training setup for tests of `dsactor run`: a
// generated corpus, a config for a 4-layer hidden-32 BERT, and helpers to run
// and to read back checkpoints.
#pragma once

#include "io/ckpt/checkpoint_dir.hpp"
#include "tests/support/tolerances.hpp"

#include <functional>
#include <string>
#include <vector>

namespace dsa::test {

// Config overrides `a` followed by `b` (the tests' --set lists).
inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A fresh directory under the system temp folder, removed on destruction.
class temp_dir {
public:
  temp_dir();
  ~temp_dir();
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

// Writes a deterministic plain-text corpus (one document per file) into dir/corpus.
std::string write_tiny_corpus(const std::string& dir);

// A run config (TOML text) over the tiny corpus; `extra` is appended (top-level keys
// must come before tables, so extra holds only tables or is applied with overrides).
std::string tiny_config(const std::string& dir, const std::string& extra = "");

// Runs `dsactor run` in process on `config_text` (written to dir/name.toml).
int run_config(const std::string& dir, const std::string& name, const std::string& config_text,
               const std::vector<std::string>& overrides = {}, bool resume = false);

// The model group of a run's checkpoint `which` ("latest", a step number).
ckpt::loaded_checkpoint load_run_checkpoint(const std::string& checkpoint_dir, const std::string& which);

// Every step's training loss ("Train/Samples/train_loss") from run_dir's metrics.jsonl.
std::vector<double> run_losses(const std::string& run_dir);

// Every tensor of every group of `a` has the bits of the same tensor in `b`, and the
// groups and names match (doctest checks).
void check_same_bits(const ckpt::tensor_groups& a, const ckpt::tensor_groups& b);
// A checkpoint's groups in whole form: ZeRO's per-rank optimizer partitions
// ("optimizer_<s>_rank<r>") assembled into "optimizer_<s>" as a resume does (bits kept).
ckpt::tensor_groups whole_groups(const ckpt::loaded_checkpoint& ck);
// check_same_bits of the two checkpoints' whole forms.
void check_same_state(const ckpt::loaded_checkpoint& a, const ckpt::loaded_checkpoint& b);
// The same groups and names; every f32 tensor of `got` within `tol` of `want`'s (the
// first moments, exp_avg, within `first_moments`: they keep the gradients' scale and
// sign, which Adam's updates hide); other tensors bit for bit.
// For runs whose gradient sums differ in order only (ZeRO's per-micro-batch reduction).
// Tensors whose name `skip` accepts are left out (a parameter whose gradient is rounding
// noise, which two arithmetics turn into different steps).
void check_close_state(const ckpt::loaded_checkpoint& got, const ckpt::loaded_checkpoint& want, const tolerance& tol,
                       const tolerance& first_moments = zero3_first_moments,
                       const std::function<bool(const std::string&)>& skip = {});

} // namespace dsa::test
