// The mode of a shard whose fp32 masters and Adam/AdamW moments live on a device (a CUDA
// rank without offload_optimizer, as DeepSpeed places them): the decision (skip, unscale
// and clip, lr) is shard_base's, on the host; each step uploads the reduced gradients the
// reducer wrote into host buffers and runs the fused Adam step there
// (optimizer_device.hpp), the working copy written in the same pass; the version is read
// back for the stage. A whole stage only (ZeRO stage 0, or 1 on one rank); Adam and AdamW
// (LAMB and the compressed optimizers are refused at start-up). Checkpoints are whole and
// named as whole_shard's ("master.<name>", "<name>.exp_avg", "<name>.exp_avg_sq",
// "optimizer_step_count"), so they move between CPU and GPU runs.
#pragma once

#include "actors/train/shard/optimizer_device.hpp"
#include "actors/train/shard/shard_base.hpp"

#include <memory>
#include <vector>

namespace dsa::train {

class device_shard final : public shard_base {
public:
  // options.device: where the state lives (taken over).
  explicit device_shard(shard_options options);
  void init(const std::vector<tensor>& initial) override;
  std::vector<tensor> gradient_buffers() override { return grads_; }
  state_payload payload() const override;
  shard_bytes held_bytes() const override;

private:
  void advance(std::uint32_t step, const step_decision& d) override;
  void publish(const step_decision& d, std::vector<tensor>& out) override;
  bool can_speculate() const override { return true; }
  void back_up() override;
  void roll_back() override;

  std::shared_ptr<optimizer_device> device_;
  optim::optimizer_config cfg_;  // the betas may change (0/1 Adam's schedule does not run here; set_betas does)
  std::vector<tensor> grads_;    // host f32, in stage order: the reducer's reduced gradients
  std::vector<double> decay_;    // per parameter: its weight decay (0 for bert_no_decay names)
  std::int64_t steps_ = 0;       // optimizer steps taken (the bias correction's t)
  struct backup {
    std::vector<tensor> masters, m, v, grads;
    std::int64_t steps = 0;
    double beta1 = 0, beta2 = 0;
  } backup_;
};

} // namespace dsa::train
