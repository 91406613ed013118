// How far the backward has finished a step's gradients, for an update streamed over it
// (host_stream, update_stream): the backward finishes them last first, so what is final is
// a suffix, told as "from `first` on" (in whatever unit the stream counts: parameters, or
// partition elements); a new step's first part resets it. Also the time its last part came
// (the update's time after the backward counts from there) and a cancel that ends every
// wait.
//
// Threads: advance and cancel from the shard actor's thread; wait_final and check from the
// shard's worker.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace dsa::train {

class gradient_frontier {
public:
  // Of `step` (whose units are [0, size)), everything from `from` on is final; `last`: the
  // step's last part (everything is).
  void advance(std::uint32_t step, std::int64_t from, std::int64_t size, bool last);
  void cancel();

  struct seen {
    bool cancelled = false;
    bool final = false; // the unit asked for is final
    bool early = false; // ... before the step's last part came
  };
  // Whether unit `at` of `step` is final (no wait).
  seen check(std::uint32_t step, std::int64_t at);
  // Waits until unit `at` of `step` is final or the run is cancelled; adds the time waited
  // to `waited`.
  seen wait_final(std::uint32_t step, std::int64_t at, std::chrono::steady_clock::duration& waited);
  // When the update's time after the backward began: the step's last part's arrival, or
  // `started` when that came first or the last part has not come.
  std::chrono::steady_clock::time_point after_backward(std::chrono::steady_clock::time_point started);

private:
  seen look(std::uint32_t step, std::int64_t at) const; // under mu_

  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false; // parts of step_ came
  std::uint32_t step_ = 0;
  std::int64_t from_ = 0;
  bool all_final_ = false; // the step's last part came, at all_final_at_
  std::chrono::steady_clock::time_point all_final_at_;
  bool cancelled_ = false;
};

} // namespace dsa::train
