// fp16 loss scaling as DeepSpeed does it: a static scale, or a dynamic scale in one of
// DeepSpeed's two flavours (runtime/fp16/fused_optimizer.py and loss_scaler.py):
//
//   fp16_optimizer (non-ZeRO FP16_Optimizer, no hysteresis):
//     overflow: scale = max(scale / 2, min_scale); last_overflow = it
//     else:     stable = it - last_overflow - 1; if stable > 0 and stable % window == 0: scale *= 2
//     it += 1
//   zero (ZeRO DynamicLossScaler, with hysteresis):
//     overflow: if hysteresis == 1 or cur_hysteresis == 1:
//                 error when scale == min_scale ("Current loss scale already at minimum - ...")
//                 else scale = max(scale / 2, min_scale)
//               else cur_hysteresis -= 1
//               last_overflow = it
//     else:     if consecutive_hysteresis: cur_hysteresis = hysteresis
//               stable as above; on growth: scale *= 2 and cur_hysteresis = hysteresis
//     it += 1
//
// Every overflow skips the optimizer step (and the LR schedule step). The log line on an
// overflow is DeepSpeed's, e.g.
//   "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"
//   "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, but hysteresis is 2.
//    Reducing hysteresis to 1"   (one line)
// with scales printed as Python's int() prints them (truncated). Not thread-safe; one per optimizer.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace dsa::optim {

enum class loss_scaler_flavour : std::uint8_t { fp16_optimizer, zero };

// DeepSpeed "fp16" section keys and defaults.
struct loss_scaler_params {
  double loss_scale = 0.0;               // 0: dynamic; > 0: static scale
  std::int64_t initial_scale_power = 16; // initial dynamic scale 2^power
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;           // ZeRO flavour only
  bool consecutive_hysteresis = false;   // ZeRO flavour only
  double min_loss_scale = 1.0;
  loss_scaler_flavour flavour = loss_scaler_flavour::zero;
};

// Everything a checkpoint needs to resume bit-exactly.
struct loss_scaler_state {
  double cur_scale = 1.0;
  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  std::int64_t cur_hysteresis = 2;
};

struct loss_scale_update {
  bool skip_step = false; // true on overflow
  std::string message;    // the log line, empty when nothing is logged
};

class loss_scaler {
public:
  explicit loss_scaler(const loss_scaler_params& params = {}, int rank = 0);

  bool dynamic() const { return params_.loss_scale <= 0.0; }
  double scale() const { return state_.cur_scale; }

  // Records one optimizer step's overflow result. Logs the message at info level on rank 0.
  // Errors only in the ZeRO flavour, when an overflow arrives at the minimum scale.
  expected<loss_scale_update> update(bool overflow);

  const loss_scaler_state& state() const { return state_; }
  void load_state(const loss_scaler_state& state) { state_ = state; }
  const loss_scaler_params& params() const { return params_; }

private:
  loss_scale_update update_fp16_optimizer(bool overflow);
  expected<loss_scale_update> update_zero(bool overflow);
  bool window_elapsed() const;
  std::string overflow_prefix() const;

  loss_scaler_params params_;
  loss_scaler_state state_;
  int rank_;
};

// The "fp16" section (enabled, loss_scale, initial_scale_power, loss_scale_window,
// hysteresis, consecutive_hysteresis, min_loss_scale). Every problem is recorded in
// `problems`, naming the key; a bad value keeps its default.
loss_scaler_params read_loss_scaler_params(const config& cfg, loss_scaler_flavour flavour,
                                           config_problems& problems,
                                           std::string_view key = "fp16");
// As read_loss_scaler_params, with every problem in one error.
expected<loss_scaler_params> parse_loss_scaler_params(const config& cfg, loss_scaler_flavour flavour,
                                                      std::string_view key = "fp16");

} // namespace dsa::optim
