// A CUDA stage's device spans (trace names gpu_forward, gpu_backward): CUDA events recorded
// on the stage's stream around each job's kernels, placed on the trace recorder's clock and
// recorded once they have passed. The clock: an anchor event whose host time is taken right
// after the stream was found idle at one of the stage's own waits (so the anchor costs no
// extra wait of consequence); each span's times are the anchor's plus the events' elapsed
// time from it (cudaEventElapsedTime, about half a microsecond of resolution), and every
// wait moves the anchor forward, so the elapsed times stay short. CUDA builds only; all
// calls from the stage's worker with its device current.
#pragma once

#include "actors/trace/trace_recorder.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::train {

class gpu_spans {
public:
  gpu_spans() = default;
  ~gpu_spans();
  gpu_spans(const gpu_spans&) = delete;
  gpu_spans& operator=(const gpu_spans&) = delete;

  // The run's recorder (null: none, and pending spans are dropped), the stage's actor id
  // and stage index.
  void attach(actors::trace_recorder* trace, std::uint32_t actor, std::int32_t stage);
  bool on() const { return trace_ != nullptr; }
  // Around a job's kernels on `stream`: begin before the first, end after the last.
  void begin(cudaStream_t stream, actors::trace_name name, std::uint32_t step, std::uint32_t micro_batch);
  void end(cudaStream_t stream);
  // The stage has just waited for `stream` (what it enqueued has run, but for a span's end
  // event after it): moves the anchor to now, then records the pending spans.
  void after_wait(cudaStream_t stream);

private:
  struct anchor {
    cudaEvent_t event = nullptr;
    std::uint64_t host_ns = 0; // on the recorder's clock
  };
  struct pending {
    actors::trace_name name;
    std::uint32_t step = 0, micro_batch = 0;
    cudaEvent_t start = nullptr, stop = nullptr;
    std::shared_ptr<anchor> from; // the anchor recorded before `start`
  };
  cudaEvent_t take_event();
  void give_back(cudaEvent_t e);
  void new_anchor(cudaStream_t stream);
  void drop_pending();

  actors::trace_recorder* trace_ = nullptr;
  std::uint32_t actor_ = 0;
  std::int32_t stage_ = -1;
  std::shared_ptr<anchor> anchor_;
  std::vector<pending> pending_;
  std::vector<cudaEvent_t> free_;
};

} // namespace dsa::train
