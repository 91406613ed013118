// `dsactor run`: its phases in order (run_phases.hpp): open the run, its data and its plan,
// build the ranks of this process, train, finish, report, evaluate.
#include "actors/train/run/trainer.hpp"

#include "actors/train/eval/run_evaluate.hpp"
#include "actors/train/memory/memory_accounting.hpp"
#include "actors/train/run/run_phases.hpp"
#include "actors/train/run/signals.hpp"
#include "core/log.hpp"
#include "kernels/cpu/gemm_bf16.hpp"

namespace dsa::train {

namespace {

// A CUDA rank's device memory beside the host's: measured, and the model states planned;
// the device plan's pool peak against the pool's high-water mark.
void log_device_memory(const opened_run& run, const run_plan& plan) {
  if (run.ctx.device.device != stage_device::cuda) return;
  log_device_plan_report(plan.device, run.device_peak >= 0 ? run.device_peak : device_pool_peak(run.ctx.device));
  std::int64_t planned = 0;
  for (const auto& stage : run.ctx.stages)
    if (stage)
      planned += cuda_model_state_bytes(run.ctx.rc,
                                        bert::parameter_specs(run.ctx.rc.model, stage->named_parameters().range()));
  log_info("device memory {}; model states planned at {} per rank ({} rank(s) of this process on it)",
           device_memory_report(run.ctx.device), format_bytes(planned), run.ctx.rc.ranks);
}

// Steps 5 to 7 for a run with steps left; returns 130 when a signal stopped it.
int train_and_report(const run_request& req, opened_run& run, const run_plan& plan, process_ranks& ranks) {
  training t;
  if (!req.trace_chrome.empty()) t.report_steps = 0; // the Chrome file gets the whole trace
  if (int code = start_training(run, ranks, t)) return code;
  if (int code = run_steps(run, ranks, t)) return code;
  finished f;
  if (int code = finish_training(run, plan, ranks, t, f)) return code;
  if (run.ctx.device.device == stage_device::cuda) run.device_peak = device_pool_peak(run.ctx.device);
  if (int code = report_training(req, run, t)) return code;
  if (f.stopped) {
    log_memory_report(run.ctx.rc, *plan.memory);
    log_device_memory(run, plan);
    log_info("stopped by signal after step {}; resume with: dsactor run {} --resume", f.done + 1, req.config_path);
    return 130;
  }
  return 0;
}

// The final evaluation on the job's rank 0, when the memory plan lets it run.
int evaluate_and_report_memory(opened_run& run, const run_plan& plan) {
  const run_config& rc = run.ctx.rc;
  const host_memory_plan& memory = *plan.memory;
  if (run.lead && !plan.evaluates)
    log_warn("final evaluation skipped: it would hold the whole model's weights and gradients and one rank's "
             "activations, {}, beside the model states: a peak of {}{}, more than limits.host_memory {}; to "
             "evaluate the final checkpoint, resume it with a larger budget (the run, with nothing left to train, "
             "evaluates)",
             format_bytes(memory.evaluation), format_bytes(memory.evaluation_peak()),
             memory.evaluation_fits(rc) ? " in another process" : "", format_bytes(rc.host_memory));
  // Stages across processes: the other stages' owners send their weights to rank 0 (before
  // the job is left, after training; here when there was nothing to train).
  if (int code = move_evaluation_weights(run, plan)) return code;
  const int status = run.lead && plan.evaluates ? evaluate(rc, run.ctx.device, run.ctx.tokenizer.get(), run.ctx.stages,
                                                          run.weights_elsewhere)
                                                : 0;
  log_memory_report(rc, memory); // the evaluation included
  log_device_memory(run, plan);
  return status;
}

} // namespace

int run_training(const run_request& req) {
  install_stop_handlers();
  opened_run run;
  if (int code = open_run(req, run)) return code;
  // bf16.cpu_gemm: every GEMM of this run on bf16 operands (oneDNN), restored at its end.
  cpu::bf16_operands_scope bf16_gemm(run.ctx.rc.bf16_cpu_gemm);
  if (int code = open_data(run)) return code;
  run_plan plan;
  if (int code = plan_run(run, plan)) return code;
  process_ranks ranks;
  if (int code = build_ranks(run, ranks)) return code;
  if (run.ctx.first_step <= run.ctx.last_step) {
    if (int code = train_and_report(req, run, plan, ranks)) return code;
  } else {
    log_info("nothing to train: the checkpoint is at step {} of {}", run.ctx.first_step, run.ctx.last_step + 1);
  }
  return evaluate_and_report_memory(run, plan);
}

} // namespace dsa::train
