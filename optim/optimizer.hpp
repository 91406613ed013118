// Adam, AdamW and LAMB over parameter groups, through kernels/cpu/{adam,lamb}.
// Owns no parameters: groups hold tensors (f32 master params, f32 grads, f32 m and v,
// optionally an f16/bf16 working copy written in the same pass). Gradients must arrive
// already unscaled and clipped (grad_clip.hpp). One thread calls step(); the kernels
// parallelize inside.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/adam.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::optim {

// onebit_adam, zeroone_adam, onebit_lamb: DeepSpeed's OneBitAdam, ZeroOneAdam and OneBitLamb
// (optim/onebit_adam.hpp, zeroone_adam.hpp, onebit_lamb.hpp), which the runtime's shard runs
// itself (actors/train/shard/compressed_shard.hpp); optimizer::create refuses them.
enum class optimizer_type : std::uint8_t { adam, adamw, lamb, onebit_adam, zeroone_adam, onebit_lamb };

// DeepSpeed's name of the type ("Adam", "AdamW", "Lamb", "OneBitAdam", ...).
const char* optimizer_name(optimizer_type type);

// Whether `type` exchanges compressed state itself (1-bit Adam, 0/1 Adam, 1-bit LAMB).
inline bool compressed_type(optimizer_type type) {
  return type == optimizer_type::onebit_adam || type == optimizer_type::zeroone_adam ||
         type == optimizer_type::onebit_lamb;
}

// DeepSpeed's "optimizer" section. Quirk kept: type "Adam" with adam_w_mode true (the default)
// is AdamW (decoupled decay); type "AdamW" is always decoupled; adam_w_mode false gives L2.
struct optimizer_config {
  optimizer_type type = optimizer_type::adamw;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true; // Adam only
  double max_coeff = 10.0; // Lamb only
  double min_coeff = 0.01; // Lamb only
  // The compressed optimizers' schedules and LAMB factors (DeepSpeed's names and defaults).
  std::int64_t freeze_step = 100000;        // OneBitAdam, OneBitLamb
  bool dummy_first_step = false;            // the three compressed: DeepSpeed's initialization step (dsactor's key)
  std::int64_t var_freeze_step = 100000;    // ZeroOneAdam
  std::int64_t var_update_scaler = 16;      // ZeroOneAdam
  std::int64_t local_step_scaler = 32678;   // ZeroOneAdam
  std::int64_t local_step_clipper = 16;     // ZeroOneAdam
  double coeff_beta = 0.9;                  // OneBitLamb
  double factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1; // OneBitLamb

  bool decoupled_decay() const { return type == optimizer_type::adamw || adam_w_mode; }
  bool compressed() const { return compressed_type(type); }
  bool lamb_like() const { return type == optimizer_type::lamb || type == optimizer_type::onebit_lamb; }
};

// Parses cfg[key] = {type, params{lr, betas, eps, weight_decay, bias_correction, adam_w_mode,
// max_coeff, min_coeff}}; type is matched case-insensitively as DeepSpeed does. The
// compressed types take freeze_step (OneBitAdam, OneBitLamb), var_freeze_step,
// var_update_scaler, local_step_scaler, local_step_clipper (ZeroOneAdam), coeff_beta,
// factor_max, factor_min, factor_threshold, max_coeff, min_coeff (OneBitLamb), and accept
// DeepSpeed's cuda_aware and comm_backend_name, which dsactor's transport makes moot
// (bias_correction is honoured, default true; false gives DeepSpeed's arithmetic, which
// ignores it). Every
// problem (naming the key; keys not valid for the type are unknown; an unknown type lists
// the known ones) is recorded in `problems` and the value keeps its default.
optimizer_config read_optimizer_config(const config& cfg, config_problems& problems,
                                       std::string_view key = "optimizer");
// As read_optimizer_config, with every problem in one error.
expected<optimizer_config> parse_optimizer_config(const config& cfg, std::string_view key = "optimizer");

// One parameter and its state. param, grad, m, v: f32, same number of elements, contiguous CPU.
// m and v may be left undefined: the optimizer creates them as zeros.
// half_copy: undefined, or an f16/bf16 tensor of the same size receiving the updated param.
struct param_slot {
  std::string name; // HuggingFace name, e.g. "bert.encoder.layer.0.attention.self.query.weight"
  tensor param;
  tensor grad;
  tensor m;
  tensor v;
  tensor half_copy;
};

struct param_group {
  std::string name;
  std::vector<param_slot> params;
  double weight_decay = 0.0;
  double lr = 1e-3;
};

// BERT's convention: no weight decay for names ending in "bias" or containing "LayerNorm".
bool bert_no_decay(std::string_view hf_name);
// Splits parameters into group "decay" (weight_decay) and "no_decay" (0), both at lr; empty
// groups are left out. Order within a group follows the input.
std::vector<param_group> bert_param_groups(std::vector<param_slot> params, double weight_decay, double lr);

// The element rule's parameters of one Adam or AdamW step of a tensor (optimizer::step's,
// and a GPU shard's): the config's betas, eps, mode and bias correction, the tensor's group
// lr and weight decay, and the 1-based step count.
cpu::adam_params adam_step_params(const optimizer_config& cfg, double lr, double weight_decay, std::int64_t step);

// Optimizer state for checkpoints: "<param name>.exp_avg" and "<param name>.exp_avg_sq" f32
// tensors (copies or views, see below), and the number of steps taken.
struct optimizer_state {
  std::map<std::string, tensor> tensors;
  std::int64_t step = 0;
};

class optimizer {
public:
  // Checks every slot (shapes, dtypes, unique names) and allocates missing m, v.
  static expected<optimizer> create(const optimizer_config& cfg, std::vector<param_group> groups);

  // Sets every group's lr (what a schedule does), or the betas (OneCycle momentum).
  void set_lr(double lr);
  void set_betas(double beta1, double beta2);

  // One update of every parameter from its grad; increments the step count first
  // (bias correction uses the 1-based count).
  void step();
  // The same step a parameter at a time (an update streamed over the backward): begin_step()
  // once, then step_param(name) once for every parameter, in any order. Adam and AdamW only
  // (LAMB's trust ratios are kept in group order); the same bits as step().
  void begin_step();
  status step_param(const std::string& name);
  std::int64_t step_count() const { return step_; }

  const optimizer_config& settings() const { return cfg_; }
  const std::vector<param_group>& groups() const { return groups_; }
  std::vector<param_group>& groups() { return groups_; }
  // Trust ratios applied by the last LAMB step, one per parameter in group order.
  const std::vector<float>& last_lamb_coeffs() const { return lamb_coeffs_; }

  // The state as copies (independent of later steps).
  optimizer_state save_state() const;
  // The state as views of the live moments: no copy, for writing a checkpoint
  // while no step runs (the caller holds the updates back until it is written).
  optimizer_state state_views() const;
  // Restores m, v (copied into the existing tensors) and the step count; every parameter's
  // two tensors must be present with matching sizes.
  status load_state(const optimizer_state& state);

private:
  optimizer(const optimizer_config& cfg, std::vector<param_group> groups) : cfg_(cfg), groups_(std::move(groups)) {}

  optimizer_config cfg_;
  std::vector<param_group> groups_;
  void update(param_group& g, param_slot& slot);

  // begin_step's: each parameter's group and place by name, for step_param.
  std::map<std::string, std::pair<std::size_t, std::size_t>> by_name_;
  bool stepping_ = false; // begin_step() came, and no step() since

  std::int64_t step_ = 0;
  std::vector<float> lamb_work_;
  std::vector<float> lamb_coeffs_;
};

} // namespace dsa::optim
